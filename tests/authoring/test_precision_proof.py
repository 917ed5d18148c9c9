"""No proof inside the precision's own error: in bfloat16 a limit sized in float32 can sit below what the plain
bf16 path already costs against the float32 oracle. Real sessions on the tiny model: such a limit's check reads
inconclusive (never a fail on rounding) and its record never says proven; the oracle rules prove theirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gate_folder import gate_folder

from pytest_mlxgate.common.format import figure
from pytest_mlxgate.results.model import limits_from_words

KNOWN_BAD_OPS = Path(__file__).resolve().parents[2] / "gates" / "known_bad_ops.py"

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever(
        "fused_norms_rope", context="pytest_mlxgate.reference_ops:fast_ops", ref="plain", cand="fused", path="serving"
    ),
    pytest.mark.mlx_kl(prompts=4, tokens=32, decode=8),
]

KNOWN_BAD = pytest.mark.mlx_lever(
    "rope_base_off", patch="mlx.core.fast.rope", ref=None, cand="known_bad_ops:rope_base_off", path="serving"
)


def test_drift(paired):
    assert_kl_below(paired, {limits})
"""


@pytest.fixture
def gates(pytester: pytest.Pytester) -> pytest.Pytester:
    return gate_folder(pytester, known_bad_ops=KNOWN_BAD_OPS.read_text())


def _run(p: pytest.Pytester, model: Path, tmp: Path, *more: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    report = tmp / "r.json"
    result = p.runpytest_inprocess(
        *more,
        f"--mlx-candidate={model}",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "--mlx-prove=auto",
        "--mlx-speed=off",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    (record,) = json.loads(report.read_text())["gates"]
    return result, record


def test_a_float32_limit_below_bf16_s_own_rounding_is_inconclusive_and_never_proven(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_fused=GATE.format(limits="mean=3e-7, p99=3e-6, top1=0.5"))
    result, record = _run(
        gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16", "--mlx-inconclusive=warn", "--mlx-explain-budget=0"
    )
    result.assert_outcomes(passed=1)  # warn: the record keeps what it is
    limits = record["limits_from"]
    assert limits["status"] == "unproven" and limits["dtype"] == "bfloat16"
    assert {"mean", "p99"} <= set(limits["inside_precision"]) and "top1" not in limits["inside_precision"]
    assert limits["precision_floor"]["mean"] > 3e-7  # plain bf16 sits this far from the float32 oracle
    assert "own distance from float32" in limits["why"] and "relative=" in limits["why"]
    shown = figure(limits["precision_floor"]["mean"])  # each says the figure it rests on
    assert f"mean {shown}" in limits["why"]
    assert record["verdict"] == "inconclusive"  # the candidate's drift is bf16's rounding: never a fail on it
    mean = next(c for c in record["checks"] if c["key"] == "mean")
    assert mean["verdict"] == "inconclusive" and "own distance from float32" in mean["method"]
    assert f"(the plain path's {mean['metric']} {shown})" in mean["method"]
    assert "inside bfloat16's own rounding" in limits_from_words(limits)


def test_the_oracle_rules_prove_themselves_on_the_known_bad_in_bfloat16(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_fused=GATE.format(limits="relative=2.0"))
    result, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16")
    result.assert_outcomes(passed=1)
    limits = record["limits_from"]
    assert limits["status"] == "proven", limits
    assert limits["known_bad"]["verdict"] == "fail"
    assert any(f.startswith("site error vs f32") for f in limits["known_bad"]["figures"])
    assert record["verdict"] == "pass"


def test_limits_inside_the_rounding_beside_relative_leave_the_verdict_to_the_oracle_and_say_so(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_fused=GATE.format(limits="mean=3e-7, p99=3e-6, top1=0.5, relative=2.0"))
    # a failing gate is explained within this budget (tests/conftest.py turns it off for the rest)
    result, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16", "--mlx-explain-budget=3")
    result.assert_outcomes(passed=1)
    limits = record["limits_from"]
    assert limits["set_aside"] is True and {"mean", "p99"} <= set(limits["inside_precision"])
    assert limits["status"] == "proven"  # by the known-bad failing the rules that judged: the oracle's and top-1
    keys = [c["key"] for c in record["checks"]]
    assert "mean" not in keys and "p99" not in keys and {"relative", "site", "top1"} <= set(keys)
    words = limits_from_words(limits)
    assert words is not None and "(set aside: the float32 oracle's rules judge)" in words
    assert words.startswith(f"limits but mean, p99 proven on {tiny_model_dir} (cpu, bfloat16)")  # not those
    # the oracle's rules passed: the absolute limits' fails (inside the rounding) ask for no attribution
    assert "attribution" not in record and not record["phases"].get("explain")


def test_in_float32_a_proof_has_no_precision_floor(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_fused=GATE.format(limits="mean=3e-7, p99=3e-6, top1=0.5"))
    _, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-explain-budget=0")
    limits = record["limits_from"]
    assert "precision_floor" not in limits and "inside_precision" not in limits
    assert limits["status"] in ("proven", "unproven", "refuted")


def test_a_known_bad_is_judged_on_each_oracle_rule_the_gate_asked_at_the_gate_s_own_limits() -> None:
    from pytest_mlxgate.authoring.proof import Proof
    from pytest_mlxgate.kl.oracle import OracleDistances, relative_check
    from pytest_mlxgate.kl.site import SiteCheck, _Call

    plain, bad = [1e-3, 1.1e-3, 0.9e-3, 1e-3], [5e-3, 6e-3, 4e-3, 5e-3]
    distances = OracleDistances("bfloat16", False, ("a", "b", "c", "d"), tuple(plain), tuple(bad), (1, 1, 1, 1))
    calls = [_Call("mlx.core.fast.rope", at, f, (0.05, 0.06), (0.01, 0.012), (0.02, 0.03), 0.0, 0.0, 1.0)
             for at in range(2) for f in range(3)]  # fmt: skip
    site = SiteCheck(1, calls)
    gate = [relative_check(distances, 2.0, 1e-5), site.check(2.0), site.check_float32()]
    assert all(c is not None for c in gate)
    proof = Proof(floors={}, known_bad_oracle=distances.state(), known_bad_site=site.state())
    judged = proof.oracle_checks([c for c in gate if c is not None])
    assert [(c["key"], c["verdict"]) for c in judged] == [("relative", "fail"), ("site", "fail"), ("site_f32", "fail")]
    assert Proof(floors={}).oracle_checks([c for c in gate if c is not None]) == []  # nothing measured: nothing judged
