"""`mlxgate plan kv`: the greedy meets its target with the fewest bytes it can find, never upgrades what
needs no upgrade, and a search on a real (tiny) model ends in a plan whose gate run is its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.explain.plan_kv import PLAIN_OPTION, Option, greedy_plan

OPTIONS = [Option(4, 64), Option(6, 64), Option(8, 64), Option(8, 32)]
#: Quantization noise falls about 4x per bit: each option's drift relative to 4-bit g64's.
SCALE = {Option(4, 64): 1.0, Option(6, 64): 1 / 16, Option(8, 64): 1 / 256, Option(8, 32): 1 / 300}


@settings(max_examples=200, deadline=None)
@given(
    sens=st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=12),
    sizes=st.lists(st.sampled_from([128.0, 256.0, 512.0]), min_size=12, max_size=12),
    share=st.floats(1e-4, 2.0),
)
def test_the_greedy_meets_its_target_and_upgrades_nothing_it_need_not(
    sens: list[float], sizes: list[float], share: float
) -> None:
    layers = {i: sizes[i] for i in range(len(sens))}

    def drift(i: int, o: Option) -> float:
        return 0.0 if o.bits is None else sens[i] * SCALE[o]

    cheapest = sum(sens)
    target = cheapest * share
    plan = greedy_plan(layers, OPTIONS, drift, target=target, itemsize=2)
    assert set(plan) == set(layers) and all(o in [*OPTIONS, PLAIN_OPTION] for o in plan.values())
    assert sum(drift(i, o) for i, o in plan.items()) <= target + 1e-12  # plain is always there: always met
    if target >= cheapest:
        assert all(o == Option(4, 64) for o in plan.values())  # nothing to buy
    plain_bytes = sum(PLAIN_OPTION.bytes_per_value(2) * s for s in layers.values())
    assert sum(o.bytes_per_value(2) * layers[i] for i, o in plan.items()) <= plain_bytes
    # resuming from a plan that meets the target changes nothing (the search's later rounds start there)
    assert greedy_plan(layers, OPTIONS, drift, target=target, start=plan, itemsize=2) == plan


def test_the_byte_cost_counts_packed_bits_and_a_scale_and_bias_per_group() -> None:
    assert Option(8, 64).bytes_per_value(4) == 1 + 8 / 64
    assert Option(4, 32).bytes_per_value(2) == 0.5 + 4 / 32
    assert PLAIN_OPTION.bytes_per_value(2) == 2


GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=24, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, mean=0.02, top1=0.5)
"""


@pytest.mark.slow  # a search (2 layers x 4 options) and one gate run on the tiny llama, in subprocesses
def test_a_search_writes_a_plan_its_record_and_is_verified_by_running_the_gate(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "kv_config.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_mlxgate.cli",
            "plan",
            "kv",
            "--gate",
            str(gate),
            "--model",
            str(tiny_kv_model_dir),
            "--out",
            str(out),
            "--bits",
            "2,8",
            "--group-sizes",
            "32,64",
            "--selection",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"},
    )
    record = json.loads(out.with_suffix(".search.json").read_text())
    verification = record["verification"]
    # --out holds a verified plan or none: an unverified one stays beside it, saying so
    unverified = tmp_path / "kv_config.unverified.json"
    assert out.is_file() != unverified.is_file() and out.is_file() == verification["verified"], done.stderr
    plan = json.loads((out if out.is_file() else unverified).read_text())
    assert set(plan["layers"]) == {"0", "1"}
    assert list(verification["verdicts"]) == [f"{gate.name}::test_drift"]
    # the exit status is the gate's verdict on its own prompts, never the search's hope
    assert (done.returncode == 0) == verification["verified"], done.stderr
    assert ("VERIFIED: passes" in done.stderr) == verification["verified"]
    uniform = {u["option"]: u for u in record["uniform"]}
    assert set(uniform) == {"2-bit g32", "2-bit g64", "8-bit g32", "8-bit g64"}
    passing = [u["bytes_per_token"] for u in uniform.values() if u["passes"]]
    if record["chosen"] == "mixed" and passing:
        assert record["bytes_per_token"] < min(passing)  # a mixed plan must cost less than every uniform one
    assert all(r["verdict"] in ("pass", "fail", "inconclusive") for r in record["rounds"])


@pytest.mark.parametrize("where", ["missing-folder/kv_config.json", "a-folder", "read-only/kv_config.json"])
def test_an_out_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Before: found after the whole search (524 s here), a raw FileNotFoundError, the result gone."""
    from pytest_mlxgate.cli import main

    (tmp_path / "a-folder").mkdir()
    (tmp_path / "read-only").mkdir(mode=0o500)
    if where.startswith("read-only") and os.access(tmp_path / "read-only", os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    code = main(
        ["plan", "kv", "--gate", str(gate), "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / where)]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"--out {tmp_path / where}:" in err and "give a file in a folder you can write" in err, err
    assert "Traceback" not in err and not list(tmp_path.rglob("*.probe"))
