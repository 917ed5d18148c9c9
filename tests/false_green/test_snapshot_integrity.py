"""False green from the model's files: a gate must never run on bytes that are not the model it names.

Each scenario is a real pytest session (pytester, a subprocess) with a gate that would pass on any
model that loads: a cached hub snapshot whose config.json blob was edited in place at the same size
(the issue's rope_theta edit: only sizes were checked, and the header said "verified, cached"), and a
local candidate directory whose model.safetensors is cut short (mlx_lm's raw RuntimeError traceback).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from fakehub import FakeHub
from gate_sources import PERTURB

from pytest_mlxgate.hub import snapshot_download

pytestmark = pytest.mark.slow  # pytester gate sessions in subprocesses


# Limits no drift reaches: on any model that loads, this gate passes.
GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=50.0)
"""


@pytest.fixture
def gate(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(perturb=PERTURB, test_gate=GATE)
    pytester.syspathinsert()
    pytester.makeini("[pytest]\n")
    return pytester


def _verdicts(db: Path) -> list[str]:
    """Every verdict the run put in its history: an error may be recorded, never a pass."""
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return [row[0] for row in conn.execute("SELECT verdict FROM quality_runs")]
        except sqlite3.OperationalError:  # no table: nothing was recorded
            return []


def _no_false_green(result: pytest.RunResult) -> str:
    text = result.stdout.str() + result.stderr.str()
    assert result.ret != 0
    assert not any("passed" in line for line in result.stdout.lines[-1:])
    assert "Traceback" not in text and "RuntimeError" not in text and "[load_safetensors]" not in text
    return text


@pytest.mark.parametrize("dist", [["-p", "no:xdist"], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_cached_snapshot_edited_in_place_at_the_same_size_is_refused_not_verified(
    gate: pytest.Pytester, hub: FakeHub, hf_env: object, tiny_model_dir: Path, tmp_path: Path, dist: list[str]
) -> None:
    if dist[0] == "-n":
        pytest.importorskip("xdist")
    repo = f"falsegreen/tiny-edited-{dist[-1].replace(':', '')}"
    hub.add_repo(repo, {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()})
    cache = tmp_path / "hub-cache"
    snap = snapshot_download(repo, cache_dir=cache, endpoint=hub.endpoint)
    blob = Path(os.path.realpath(snap / "config.json"))
    data = blob.read_bytes()
    at = data.index(b'"rope_theta": 10000.0') + len(b'"rope_theta": ')
    with open(blob, "r+b") as f:  # 10000.0 -> 90000.0: same inode, same size, another model
        f.seek(at)
        f.write(b"9")
    assert blob.stat().st_size == len(data)

    result = gate.runpytest_subprocess(
        f"--mlx-candidate={repo}",
        f"--mlx-cache-dir={cache}",
        "--mlx-offline",
        f"--mlx-db={tmp_path / 'results.sqlite'}",
        "-p",
        "no:randomly",
        *dist,
    )
    text = _no_false_green(result)
    assert "config.json: its content changed since it was verified" in text
    assert f"Fix: run `mlxgate get {repo} --cache-dir {cache}` with network" in text
    assert "(verified" not in text  # the header never vouches for it
    if dist[0] == "-n":
        assert result.ret == pytest.ExitCode.USAGE_ERROR  # the controller refuses before any worker starts
    else:
        result.assert_outcomes(errors=1)
        assert f"mlxgate: {repo} (resolved on first use)" in text
    assert "pass" not in _verdicts(tmp_path / "results.sqlite")


def test_a_local_candidate_with_a_truncated_safetensors_says_which_file_and_why(
    gate: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 65536)  # an interrupted copy

    result = gate.runpytest_subprocess(
        f"--mlx-candidate={model}", f"--mlx-db={tmp_path / 'results.sqlite'}", "-p", "no:randomly", "-p", "no:xdist"
    )
    text = _no_false_green(result)
    result.assert_outcomes(errors=1)
    assert "pass" not in _verdicts(tmp_path / "results.sqlite")
    assert (
        f"mlxgate: cannot load the candidate '{model}' ({model}): model.safetensors: it holds {size - 65536} "
        f"bytes but its header says its tensors end at byte {size} (65536 bytes missing): truncated"
    ) in text
    assert f"Fix: copy or convert the model into {model} again" in text
