"""--mlx-calibrate: the limit rule's invariants (every suggestion is cleared by the lever it was measured
on and sits above the A/A floor by the rule's factors), the notes where it cannot size a limit, and a
real calibration session whose pasted suggestions then pass the same gate."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.authoring.calibrate import (
    FLOOR_FACTOR,
    LEVER_FACTOR,
    calibration_lines,
    nice_ceil,
    suggest_limits,
)

ROUND = {1.0, 1.5, 2.0, 3.0, 5.0, 7.0}


@given(st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_nice_ceil_is_the_next_round_number_at_or_above(x: float) -> None:
    y = nice_ceil(x)
    assert y >= x * (1 - 1e-9)
    assert y < x * (5 / 3) * (1 + 1e-9)  # the widest gap between round steps is 3 -> 5
    mantissa = y / 10 ** math.floor(math.log10(y) + 1e-12)
    assert any(math.isclose(mantissa, r, rel_tol=1e-9) for r in ROUND | {10.0})


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_nice_ceil_refuses_what_has_no_round_number_above(bad: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        nice_ceil(bad)


def _kl(mean: tuple[float, float], p99: tuple[float, float], top1: tuple[float, float]) -> dict[str, Any]:
    return {"mean": mean[0], "mean_ci": [mean[0] * 0.8, mean[1]], "p99": p99[0],
            "quantile_ci": {"p99": [p99[0] * 0.8, p99[1]]}, "top1": top1[0], "top1_ci": [top1[1], 1.0]}


positive = st.floats(min_value=1e-9, max_value=5.0, allow_nan=False)


@given(mean=positive, p99=positive, miss=st.floats(min_value=1e-4, max_value=0.2), floor=st.floats(0, 1e-3))
def test_every_suggested_limit_clears_the_lever_and_the_floor_by_the_rule(
        mean: float, p99: float, miss: float, floor: float) -> None:
    kl = _kl((mean, mean * 1.3), (p99, p99 * 1.5), (1 - miss / 2, 1 - miss))
    floors = {"mean": floor, "p99": floor * 3, "top1": 1 - floor}
    s = suggest_limits(kl, floors, None)
    limits = s["kl_limits"]
    at_least = 1 - 1e-9  # float rounding: 10 * 3e-9 is 3.0000000000000004e-8, its round number 3e-8
    assert limits["mean"] >= LEVER_FACTOR * mean * 1.3 * at_least and limits["mean"] >= FLOOR_FACTOR * floor * at_least
    assert limits["p99"] >= LEVER_FACTOR * p99 * 1.5 * at_least and limits["p99"] >= FLOOR_FACTOR * floor * 3 * at_least
    if "top1" in limits:  # the lever's own lower bound clears its limit, with the rule's room for misses
        assert 1 - limits["top1"] >= LEVER_FACTOR * miss * (1 - 1e-9)
        assert limits["top1"] < 1 - miss
    else:
        assert any("top-1" in n for n in s["notes"])
    assert s["code"][0].startswith("assert_kl_below(paired, mean=")
    pasted: dict[str, float] = {}
    eval(compile(s["code"][0], "<suggested>", "eval"), {"assert_kl_below": lambda _, **kw: pasted.update(kw),
                                                        "paired": None})
    assert pasted == limits  # the code, pasted, asks exactly for the limits the rule gave


def test_an_identical_lever_gets_no_kl_limit_and_says_why() -> None:
    kl = _kl((0.0, 0.0), (0.0, 0.0), (1.0, 1.0))
    s = suggest_limits(kl, {"mean": 0.0, "p99": 0.0, "top1": 1.0}, None)
    assert s["kl_limits"] == {} and s["code"] == []
    assert any("identical on this backend" in n for n in s["notes"])
    assert "no limit could be sized" in "\n".join(calibration_lines(
        {"module": "gates/test_x.py", "lever": "x", "shape": {}, "suggested": s}))


def test_a_lever_identical_here_gets_limits_from_the_floor_alone() -> None:
    s = suggest_limits(_kl((0.0, 0.0), (0.0, 0.0), (1.0, 1.0)), {"mean": 3e-10, "p99": 2e-9, "top1": 0.998}, None)
    assert s["kl_limits"] == {"mean": 3e-9, "p99": 2e-8, "top1": 0.98}
    assert s["code"] == ["assert_kl_below(paired, mean=3e-9, p99=2e-8, top1=0.98)"]


def _speed(decode: tuple[float, float, float], kv: float | None, weights: tuple[int, int] | None = None) -> dict:
    ctx = {"prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1]},
           "decode": {"ratio": decode[0], "ratio_ci": [decode[1], decode[2]]}, "kv": {"ratio": kv}}
    speed: dict[str, Any] = {"contexts": {"64": {**ctx, "decode": {"ratio": 9.0, "ratio_ci": [9.0, 9.0]}},
                                          "256": ctx}}
    if weights:
        speed["weights_bytes"] = {"reference": weights[0], "candidate": weights[1]}
    return speed


def test_speed_goals_keep_half_the_shown_speed_up_at_the_longest_context() -> None:
    s = suggest_limits(_kl((1e-3, 2e-3), (1e-2, 2e-2), (0.99, 0.98)), {}, _speed((1.5, 1.4, 1.6), 0.28, (100, 25)))
    assert s["speed_goals"] == {"decode": 1.2, "kv": 0.31, "weights": 0.28}  # not @64's x9: the longest context
    assert "prefill" not in s["speed_goals"] and any("prefill @256: not shown faster" in n for n in s["notes"])
    assert s["code"][1] == "assert_faster(paired, decode=1.2, kv=0.31, weights=0.28)"


def test_a_slower_lever_gets_no_speed_goal() -> None:
    s = suggest_limits(_kl((1e-3, 2e-3), (1e-2, 2e-2), (0.99, 0.98)), {}, _speed((0.86, 0.8, 0.92), 1.0))
    assert s["speed_goals"] == {} and len(s["code"]) == 1
    assert any("decode @256: not shown faster here (x0.86, lower bound 0.80)" in n for n in s["notes"])


CAL_GATE = '''
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv4", kv=True, ref="plain", cand={{"bits": 4, "group_size": 64}}, path="serving"),
    pytest.mark.mlx_kl(prompts=4, tokens=24, decode=6),
    pytest.mark.mlx_speed(contexts=(16,), decode=2, repetitions=3),
]


def test_drift(paired):
    {drift}


def test_speed(paired):
    {speed}
'''


@pytest.mark.slow  # three pytester sessions on the tiny model
def test_calibration_measures_suggests_and_its_suggestions_pass_the_gate(
        pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_kv=CAL_GATE.format(drift="pytest.fail('no limits yet')",
                                                speed="pytest.fail('no goals yet')"))
    report, db = tmp_path / "r.json", tmp_path / "h.sqlite"
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-allow-untrained"]
    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate", f"--mlx-report={report}", f"--mlx-db={db}")
    result.assert_outcomes(skipped=2)  # no verdict: neither a pass nor the bodies' failures
    out = result.stdout.str()
    assert "mlxgate calibration" in out and "test_kv.py — calibration, no verdict" in out
    assert "A/A: reference arm with prefill chunk" in out and "speed (both arms interleaved)" in out
    code = [line.strip() for line in out.splitlines() if line.strip().startswith(("assert_kl_below(", "assert_faster("))]
    assert code and code[0].startswith("assert_kl_below(paired, mean=")
    doc = json.loads(report.read_text())
    assert doc["gates"] == [] and [c["module"] for c in doc["calibrations"]] == ["test_kv.py"]
    cal = doc["calibrations"][0]
    assert cal["suggested"]["code"] == code and cal["floors"]["mean"] >= 0 and cal["speed"]["contexts"]["16"]
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM quality_runs").fetchone() == (0,)

    kv_goal = [c for c in code if c.startswith("assert_faster(")]
    assert kv_goal and re.search(r"kv=0\.\d+", kv_goal[0])  # 4-bit KV is shown smaller: a bytes goal
    pytester.makepyfile(test_kv=CAL_GATE.format(drift=code[0], speed=kv_goal[0]))
    result = pytester.runpytest_subprocess(*common)
    result.assert_outcomes(passed=2)  # the same lever, measured again, clears what its calibration suggested

    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate", "--mlx-aa")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlx-aa and --mlx-calibrate: choose one*"])
