"""A damaged reference-cache entry heals: it is a miss said once, the reference arm is recomputed
and the entry replaced; the verdict is the one an intact cache gives, and the next run hits.

Real pytest sessions (pytester, subprocesses) on the tiny llama, one gate module with a KL gate
and a capability gate (a JSONL task), so both caches are exercised. The KL entry is damaged where
it used to hurt most: a byte of the zip central directory at the end of the .npz (the compression
method), which made numpy raise NotImplementedError on every later run until deleted by hand.
The healing run goes under xdist (-n 2): the workers find the damage, the controller says it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # three pytester gate sessions in subprocesses

GATE = """
import pytest
from pytest_mlxgate import assert_capability_at_least, assert_kl_below, jsonl_task

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]
jsonl_task("colors", "colors.jsonl", max_new_tokens=3)


def test_drift(paired):
    assert_kl_below(paired, mean=1e-6)


def test_capability(paired):
    assert_capability_at_least(paired, "colors", max_drop=0.6)
"""


@pytest.fixture
def gate(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    (pytester.path / "colors.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Say {w}:", "target": w}) + "\n" for w in ("red", "blue", "green"))
    )
    pytester.makepyfile(test_gate=GATE)
    return pytester


def _run(p: pytest.Pytester, model: Path, cache: Path, report: Path, *more: str) -> tuple[pytest.RunResult, Any]:
    report.unlink(missing_ok=True)
    result = p.runpytest_subprocess(
        f"--mlx-candidate={model}",
        f"--mlx-report={report}",
        f"--mlx-reference-cache={cache}",
        "--mlx-db=off",
        "--mlx-allow-untrained",
        "-p",
        "no:randomly",
        *more,
    )
    records = json.loads(report.read_text())["gates"] if report.is_file() else []
    return result, {r["mode"]: r for r in records}


def _verdicts(records: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on whether the reference came from the cache."""
    kl, cap = records["gate"], records["capability"]  # a KL gate's mode is "gate"
    return {
        "kl": (
            kl["verdict"],
            kl["stats"]["mean"],
            kl["stats"]["max"],
            kl["stats"]["same_top"],
            kl["stats"]["n_tokens"],
        ),
        "capability": (
            cap["verdict"],
            cap["tasks"]["colors"]["ref_score"],
            cap["tasks"]["colors"]["cand_score"],
            [i["reference"] for i in cap["tasks"]["colors"]["items"]],
        ),
    }


def _sources(records: dict[str, Any]) -> tuple[str, str]:
    return records["gate"]["reference_source"], records["capability"]["tasks"]["colors"]["reference_source"]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_entry_is_said_once_recomputed_replaced_and_then_hit(
    gate: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cache, report = tmp_path / "refcache", tmp_path / "report.json"
    first, records = _run(gate, tiny_model_dir, cache, report)
    first.assert_outcomes(passed=2)
    assert _sources(records) == ("computed", "computed")
    baseline = _verdicts(records)
    (kl_entry,) = cache.glob("*.npz")
    (cap_entry,) = (cache / "capability").glob("cap-*.json")

    data = kl_entry.read_bytes()
    central = data.rfind(b"PK\x01\x02")  # the zip central directory's last file header
    assert central > len(data) // 2
    _flip(kl_entry, central + 10)  # its compression method: 0 becomes 255
    _flip(cap_entry, cap_entry.stat().st_size // 2)
    # an entry nobody uses any more (another key), over the cap that run 2 is given: evicted by its store
    orphan = cache / ("e" * 40 + ".npz")
    orphan.write_bytes(b"\0" * 10_000)
    os.utime(orphan, (1e9, 1e9))
    cap = kl_entry.stat().st_size + cap_entry.stat().st_size + 1_000

    # under xdist: the workers find the damage, the controller must say it
    second, records = _run(gate, tiny_model_dir, cache, report, f"--mlx-reference-cache-max={cap}", "-n", "2")
    out = second.stdout.str() + second.stderr.str()
    second.assert_outcomes(passed=2)
    assert "Traceback" not in out and "NotImplementedError" not in out and "Error:" not in out, out
    said = [line for line in second.stdout.lines if "is damaged" in line]
    assert len(said) == 2, said  # once per damaged entry
    assert any(str(kl_entry) in line for line in said) and any(str(cap_entry) in line for line in said), said
    assert all("recomputing the reference arm and replacing the entry" in line for line in said), said
    assert _sources(records) == ("computed", "computed")
    assert _verdicts(records) == baseline
    assert not orphan.exists()  # --mlx-reference-cache-max reached the store
    assert kl_entry.read_bytes().startswith(b"mlxgate-entry 1") and cap_entry.is_file()  # replaced in place

    third, records = _run(gate, tiny_model_dir, cache, report)
    third.assert_outcomes(passed=2)
    assert "is damaged" not in third.stdout.str()
    assert _sources(records) == ("cache", "cache")  # the healed entries serve
    assert _verdicts(records) == baseline
