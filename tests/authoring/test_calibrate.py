"""--mlx-calibrate: the limit rule's invariants (every suggestion is cleared by the lever it was measured
on, sits above the A/A floor by the rule's factors, and is never looser than the quality bounds; a lever
beyond them gets nothing to paste unless the module accepts it, and then says so), the notes where it
cannot size a limit, the known-bad step, and a real calibration session whose pasted suggestions then
pass the same gate."""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.verdicts.calibration import (
    FLOOR_FACTOR,
    LEVER_FACTOR,
    QUALITY_BOUNDS,
    accept_broken_reason,
    beyond_quality_bounds,
    nice_ceil,
    suggest_limits,
)
from pytest_mlxgate.verdicts.calibration_text import calibration_lines
from pytest_mlxgate.verdicts.known_bad_step import known_bad_step

REPO = Path(__file__).resolve().parents[2]

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
    return {
        "mean": mean[0],
        "mean_ci": [mean[0] * 0.8, mean[1]],
        "p99": p99[0],
        "quantile_ci": {"p99": [p99[0] * 0.8, p99[1]]},
        "top1": top1[0],
        "top1_ci": [top1[1], 1.0],
    }


def _pasted(line: str) -> dict[str, float]:
    """The limits a suggested `assert_kl_below(...)` line asks for, run as the code it is."""
    pasted: dict[str, float] = {}
    eval(compile(line, "<suggested>", "eval"), {"assert_kl_below": lambda _, **kw: pasted.update(kw), "paired": None})
    return pasted


#: Levers within the quality bounds: mean's upper bound (1.3 x mean) below 2, p99's (1.5 x p99) below 10.
within_mean = st.floats(min_value=1e-9, max_value=1.5, allow_nan=False)
within_p99 = st.floats(min_value=1e-9, max_value=6.0, allow_nan=False)
AT_LEAST = 1 - 1e-9  # float rounding: 10 * 3e-9 is 3.0000000000000004e-8, its round number 3e-8


@given(mean=within_mean, p99=within_p99, miss=st.floats(min_value=1e-4, max_value=0.2), floor=st.floats(0, 1e-3))
def test_every_suggested_limit_clears_the_lever_and_the_floor_by_the_rule_or_sits_at_the_quality_bound(
    mean: float, p99: float, miss: float, floor: float
) -> None:
    kl = _kl((mean, mean * 1.3), (p99, p99 * 1.5), (1 - miss / 2, 1 - miss))
    floors = {"mean": floor, "p99": floor * 3, "top1": 1 - floor}
    s = suggest_limits(kl, floors, None)
    limits = s["kl_limits"]
    assert s["breaks"] is None and s["accepted"] is None
    for key, bound, floor_value in (("mean", mean * 1.3, floor), ("p99", p99 * 1.5, floor * 3)):
        rule = max(LEVER_FACTOR * bound, FLOOR_FACTOR * floor_value)
        assert bound <= limits[key] <= QUALITY_BOUNDS[key]  # the lever clears it; never looser than the bound
        if limits[key] < rule * AT_LEAST:  # short of the rule's room only at the quality bound, saying so
            assert limits[key] == QUALITY_BOUNDS[key]
            assert any(n.startswith(f"{key} KL: capped at the quality bound") for n in s["notes"])
    # the lever's own lower bound clears its top-1 limit; the rule's room for misses, or the quality bound
    assert QUALITY_BOUNDS["top1"] <= limits["top1"] < 1 - miss
    if 1 - limits["top1"] < LEVER_FACTOR * miss * (1 - 1e-9):
        assert limits["top1"] == QUALITY_BOUNDS["top1"] and any("top-1: capped" in n for n in s["notes"])
    assert s["code"][0].startswith("assert_kl_below(paired, mean=")
    assert _pasted(s["code"][0]) == limits  # the code, pasted, asks exactly for the limits the rule gave
    assert s["known_bad"] is not None  # with every suggestion, the step that shows the limits catch something


kl_value = st.floats(min_value=0.0, max_value=60.0, allow_nan=False)
fraction = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def measurements(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, float]]:
    """Any lever's KL statistics (intervals around their values, or none) and any A/A floors."""
    mean, p99, top1 = draw(kl_value), draw(kl_value), draw(fraction)
    spread = draw(st.floats(min_value=0.0, max_value=2.0))
    kl = {
        "mean": mean,
        "mean_ci": [max(0.0, mean - spread), mean + spread],
        "p99": p99,
        "quantile_ci": {"p99": [max(0.0, p99 - 2 * spread), p99 + 2 * spread]},
        "top1": top1,
        "top1_ci": [max(0.0, top1 - spread / 10), min(1.0, top1 + spread / 10)],
    }
    if draw(st.booleans()):  # one prompt: no intervals at all
        kl = {**kl, "mean_ci": [None, None], "quantile_ci": {"p99": [None, None]}, "top1_ci": [None, None]}
    floors = {"mean": draw(st.floats(0, 0.5)), "p99": draw(st.floats(0, 3.0)), "top1": draw(fraction)}
    return kl, floors


def _render(s: dict[str, Any]) -> str:
    return "\n".join(calibration_lines({"module": "gates/test_x.py", "lever": "x", "shape": {}, "suggested": s}))


@given(measurements())
def test_no_suggestion_is_ever_beyond_the_quality_bounds(m: tuple[dict[str, Any], dict[str, float]]) -> None:
    kl, floors = m
    s = suggest_limits(kl, floors, None)
    for key, limit in s["kl_limits"].items():
        assert (limit >= QUALITY_BOUNDS[key]) if key == "top1" else (limit <= QUALITY_BOUNDS[key]), (key, limit)
    for line in s["code"]:
        if line.startswith("assert_kl_below("):
            assert _pasted(line) == s["kl_limits"]  # what is pasted is what was checked above


@given(measurements())
def test_a_calibration_beyond_the_quality_bounds_never_prints_pasteable_limits(
    m: tuple[dict[str, Any], dict[str, float]],
) -> None:
    kl, floors = m
    speed = {"contexts": {"64": {"decode": {"ratio": 3.0, "ratio_ci": [2.5, 3.5]}, "kv": {"ratio": 0.3}}}}
    s = suggest_limits(kl, floors, speed)
    beyond = beyond_quality_bounds(kl)
    if not beyond:
        assert s["breaks"] is None
        return
    assert (s["code"], s["kl_limits"], s["speed_goals"], s["accepted"], s["known_bad"]) == ([], {}, {}, None, None)
    text = _render(s)
    assert "assert_kl_below(" not in text and "assert_faster(" not in text
    assert "a gate limit that passes it would pass a broken model" in text
    assert ("this lever breaks the model" in text) == any(b["point_beyond"] for b in beyond)
    assert 'pytest.mark.mlx_calibrate(accept_broken="' in text  # how to accept it, explicitly
    for b in beyond:
        assert f"{b['metric']} " in s["breaks"]["message"] and "BEYOND the quality bound" in s["breaks"]["message"]


@given(
    measurements(), st.text(min_size=1, max_size=40).filter(lambda t: "".join(c for c in t if c.isprintable()).strip())
)
def test_an_accepted_break_says_so_in_the_code_the_text_and_the_record(
    m: tuple[dict[str, Any], dict[str, float]], reason: str
) -> None:
    kl, floors = m
    s = suggest_limits(kl, floors, None, accept_broken=reason)
    one_line = " ".join("".join(c if c.isprintable() else " " for c in reason).split())  # a comment holds one line
    if not beyond_quality_bounds(kl):  # nothing to accept: limits stay capped, and a note says it is not needed
        assert s["accepted"] is None and any("acceptance is not needed" in n for n in s["notes"])
        return
    assert s["accepted"] == one_line and s["breaks"]["beyond"]
    text = _render(s)
    assert f"ACCEPTED beyond the quality bounds (mlx_calibrate(accept_broken=...)): {one_line}" in text
    for line in s["code"]:  # every limit line carries the acceptance, and still parses as the limits
        if line.startswith("assert_kl_below("):
            assert line.endswith(f"  # beyond the quality bounds, accepted: {one_line}")
            assert _pasted(line) == s["kl_limits"]
            assert s["known_bad"] is not None and "known-bad step" in text


def test_the_anchors_the_quality_bounds_were_chosen_from() -> None:
    """The loosest lever this project gates (4-bit weights on the embedded model, gates/test_weights.py's
    figures) still gets limits, capped; the issue's float16-accumulating RMSNorm (mean KL 8.4, top-1 0%)
    and 2-bit weights (15.1, 0%) get none."""
    four_bit = {
        "mean": 0.66,
        "mean_ci": [0.54, 0.78],
        "p99": 2.8,
        "quantile_ci": {"p99": [2.6, 3.0]},
        "top1": 0.559,
        "top1_ci": [0.462, 0.656],
    }
    s = suggest_limits(four_bit, {"mean": 0.0, "p99": 0.0, "top1": 1.0}, None)
    assert s["kl_limits"] == {"mean": 2.0, "p99": 10.0, "top1": 0.3}  # each at its bound: the rule's x4 is looser
    assert sum("capped at the quality bound" in n for n in s["notes"]) == 3
    for mean, top1 in ((8.4, 0.0), (15.1, 0.0), (2.19, 0.312)):  # the last: RoPE's cache offset dropped
        broken = {
            "mean": mean,
            "mean_ci": [mean * 0.8, mean * 1.2],
            "p99": mean * 3,
            "quantile_ci": {"p99": [mean * 2, mean * 4]},
            "top1": top1,
            "top1_ci": [top1 * 0.7, top1 * 1.3],
        }
        s = suggest_limits(broken, {"mean": 0.0, "p99": 0.0, "top1": 1.0}, None)
        assert s["code"] == [] and "this lever breaks the model" in s["breaks"]["message"], mean


#: A lever beyond every quality bound (the issue's float16-accumulating RMSNorm's figures), with its worst token.
BROKEN = {
    "mean": 8.4,
    "mean_ci": [7.0, 9.8],
    "p99": 25.0,
    "quantile_ci": {"p99": [20.0, 30.0]},
    "top1": 0.0,
    "top1_ci": [0.0, 0.05],
    "worst": [{"prompt": 3, "position": 17, "token_id": 42, "kl": 31.5, "ref_top1": 42, "cand_top1": 7}],
}


def test_a_broken_lever_s_worst_tokens_are_named_as_text_and_the_table_keeps_its_columns() -> None:
    """The breaks' worst positions name their tokens through the tokenizer's text (an id it has no text
    for stays an id); the table's header names each column its rows fill."""
    broken = BROKEN
    s = suggest_limits(broken, {"mean": 0.0, "p99": 0.0, "top1": 1.0}, None, tokens={"42": " Paris"})
    assert "prompt 3 position 17, next token ' Paris': KL 32, top-1 ' Paris' -> '<7>'" in s["breaks"]["message"]
    lines = _render(s).splitlines()
    header = lines[1]
    assert re.split(r"\s{2,}", header.strip()) == ["measured", "lever", "95% bound", "A/A floor", "quality bound"]
    rows = [line for line in lines[2:5] if line.strip().startswith(("mean KL", "p99 KL", "top-1"))]
    assert len(rows) == 3 and all(len(row) == len(header) for row in rows)  # right-aligned under their headers


def _gate_limits() -> dict[str, dict[str, float]]:
    """Every `assert_kl_below(...)` in this project's gates/, as {file: limits}."""
    found: dict[str, dict[str, float]] = {}
    for path in sorted((REPO / "gates").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "assert_kl_below":
                found[path.name] = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return found


def test_every_project_gate_s_limits_sit_within_the_quality_bounds() -> None:
    limits = _gate_limits()
    assert {"test_weights.py", "test_kv_cache.py", "test_fused_norms_rope.py"} <= set(limits)
    for name, asked in limits.items():
        for key, cap in QUALITY_BOUNDS.items():
            if key in asked:
                assert asked[key] >= cap if key == "top1" else asked[key] <= cap, (name, key, asked[key])


@pytest.mark.parametrize(
    ("kind", "target", "ref", "declare", "cand_value"),
    [
        (
            "patch",
            "mlx.core.fast.rms_norm",
            "pytest_mlxgate.reference_ops:rms_norm",
            'KNOWN_BAD = "mymod:broken"',
            "mymod:broken",
        ),
        ("patch", "mlx.core.fast.rms_norm", None, 'KNOWN_BAD = "mymod:broken"', "mymod:broken"),
        ("env", "MLX_PERF_KERNEL", "0", 'KNOWN_BAD = "BROKEN"', "BROKEN"),
        ("kv", None, "plain", "KNOWN_BAD = 2", "2"),
        ("weights", None, "weights as loaded", "KNOWN_BAD = 2", "2"),
    ],
)
def test_the_known_bad_step_names_what_to_plant_and_a_command_that_must_fail(
    kind: str, target: str | None, ref: str | None, declare: str, cand_value: str
) -> None:
    step = known_bad_step("gates/my gate.py", {"kind": kind, "name": "lv", "target": target, "ref": ref})
    assert step["declare"] == declare
    compile(step["declare"], "<declare>", "exec")
    argv = shlex.split(step["command"])
    assert argv[:2] == ["pytest", "gates/my gate.py"]
    assert argv[argv.index("--mlx-lever") + 1] == "lv" and argv[argv.index("--mlx-cand-value") + 1] == cand_value
    assert argv[argv.index("--mlx-ref-value") + 1] == {
        None: "original" if kind == "patch" else "unset",
        "weights as loaded": "none",
    }.get(ref, ref)
    if target:
        assert target in step["what"]


def test_a_context_lever_s_known_bad_step_is_a_whole_lever_on_the_gate_s_path() -> None:
    """A context lever (mx.compile on/off, fused ops plain/fused) has no broken value: the step plants a whole
    lever, on the gate's path, that `authoring.known_bad` accepts as written."""
    from pytest_mlxgate.levers.parsing import lever_from_marker

    lever = {"kind": "context", "name": "mx_compile", "target": "pytest_mlxgate.reference_ops:compiled", "ref": "off"}
    step = known_bad_step("gates/test_c.py", {**lever, "path": "serving"})
    assert step["declare"].startswith("KNOWN_BAD = pytest.mark.mlx_lever(")
    mark = eval(step["declare"].removeprefix("KNOWN_BAD = "), {"pytest": pytest})
    planted = lever_from_marker(mark.mark)
    assert (planted.kind, planted.ref, planted.path) == ("patch", None, "serving")
    assert "whole lever" in step["what"] and "pytest_mlxgate.reference_ops:compiled" in step["what"]
    argv = shlex.split(step["command"])
    assert argv[:2] == ["pytest", "gates/test_c.py"] and argv[argv.index("--mlx-lever") + 1].startswith("patch:")


def test_a_model_lever_s_known_bad_step_is_another_model() -> None:
    step = known_bad_step("gates/test_m.py", {"kind": "model", "name": "model"})
    assert step["declare"] is None and step["command"] == "pytest gates/test_m.py --mlx-candidate BROKEN_MODEL"


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((), {}, "takes only accept_broken="),
        (("why",), {}, "takes only accept_broken="),
        ((), {"accept_broken": "  "}, "give the reason as text"),
        ((), {"accept_broken": True}, "give the reason as text"),
        ((), {"accept_broken": "x", "limits": 3}, "got limits"),
    ],
)
def test_an_acceptance_without_a_reason_is_refused(args: tuple[Any, ...], kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        accept_broken_reason(args, kwargs, "marker mlx_calibrate on gates/test_x.py::test_drift")
    assert accept_broken_reason((), {"accept_broken": " lossy\n on purpose "}, "m") == "lossy on purpose"


def test_a_record_from_before_the_quality_bounds_still_renders() -> None:
    old = {
        "rule": "rule: ...",
        "rows": [{"metric": "mean KL", "key": "mean", "value": 1e-3, "bound": 2e-3, "floor": 1e-8}],
        "kl_limits": {"mean": 1e-2},
        "speed_goals": {},
        "notes": [],
        "code": ["assert_kl_below(paired, mean=0.01)"],
    }
    text = _render(old)
    assert "assert_kl_below(paired, mean=0.01)" in text and "then plant a known-bad variant" in text


def test_an_identical_lever_gets_no_kl_limit_and_says_why() -> None:
    kl = _kl((0.0, 0.0), (0.0, 0.0), (1.0, 1.0))
    s = suggest_limits(kl, {"mean": 0.0, "p99": 0.0, "top1": 1.0}, None)
    assert s["kl_limits"] == {} and s["code"] == []
    assert any("identical on this backend" in n for n in s["notes"])
    assert "no limit could be sized" in "\n".join(
        calibration_lines({"module": "gates/test_x.py", "lever": "x", "shape": {}, "suggested": s})
    )


def test_a_lever_identical_here_gets_limits_from_the_floor_alone() -> None:
    s = suggest_limits(_kl((0.0, 0.0), (0.0, 0.0), (1.0, 1.0)), {"mean": 3e-10, "p99": 2e-9, "top1": 0.998}, None)
    assert s["kl_limits"] == {"mean": 3e-9, "p99": 2e-8, "top1": 0.98}
    assert s["code"] == ["assert_kl_below(paired, mean=3e-9, p99=2e-8, top1=0.98)"]


def _speed(decode: tuple[float, float, float], kv: float | None, weights: tuple[int, int] | None = None) -> dict:
    ctx = {
        "prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1]},
        "decode": {"ratio": decode[0], "ratio_ci": [decode[1], decode[2]]},
        "kv": {"ratio": kv},
    }
    speed: dict[str, Any] = {"contexts": {"64": {**ctx, "decode": {"ratio": 9.0, "ratio_ci": [9.0, 9.0]}}, "256": ctx}}
    if weights:
        speed["weights_bytes"] = {"reference": weights[0], "candidate": weights[1]}
    return speed


def test_speed_goals_keep_half_the_shown_speed_up_at_the_longest_context() -> None:
    s = suggest_limits(_kl((1e-3, 2e-3), (1e-2, 2e-2), (0.99, 0.98)), {}, _speed((1.5, 1.4, 1.6), 0.28, (100, 25)))
    assert s["speed_goals"] == {"decode": 1.2, "kv": 0.31, "weights": 0.28}  # not @64's x9: the longest context
    assert "prefill" not in s["speed_goals"] and any("prefill @256: not shown faster" in n for n in s["notes"])
    assert s["code"][1:] == ["assert_faster(paired, decode=1.2)", "assert_smaller(paired, kv=0.31, weights=0.28)"]


def test_a_slower_lever_gets_no_speed_goal() -> None:
    s = suggest_limits(_kl((1e-3, 2e-3), (1e-2, 2e-2), (0.99, 0.98)), {}, _speed((0.86, 0.8, 0.92), 1.0))
    assert s["speed_goals"] == {} and len(s["code"]) == 1
    assert any("decode @256: not shown faster here (x0.86, lower bound 0.80)" in n for n in s["notes"])


CAL_GATE = """
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv4", kv=True, ref="plain", cand={{"bits": 4, "group_size": 64}}, path="serving"),
    pytest.mark.mlx_kl(prompts=4, tokens=24, decode=6),
    pytest.mark.mlx_speed(contexts=(16,), decode=2, repetitions=3),
]


def test_drift(paired):
    {drift}


def test_speed(paired):
    {speed}
"""


@pytest.mark.slow  # three pytester sessions on the tiny model
def test_calibration_measures_suggests_and_its_suggestions_pass_the_gate(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(
        test_kv=CAL_GATE.format(drift="pytest.fail('no limits yet')", speed="pytest.fail('no goals yet')")
    )
    report, db = tmp_path / "r.json", tmp_path / "h.sqlite"
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-allow-untrained"]
    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate", f"--mlx-report={report}", f"--mlx-db={db}")
    result.assert_outcomes(skipped=2)  # no verdict: neither a pass nor the bodies' failures
    out = result.stdout.str()
    assert "mlxgate calibration" in out and "test_kv.py — calibration, no verdict" in out
    assert "A/A: reference arm with prefill chunk" in out and "speed (both arms interleaved)" in out
    code = [
        line.strip()
        for line in out.splitlines()
        if line.strip().startswith(("assert_kl_below(", "assert_faster(", "assert_smaller("))
    ]
    assert code and code[0].startswith("assert_kl_below(paired, mean=")
    assert "this lever breaks the model" not in out  # 4-bit KV keeps the tiny model: within the quality bounds
    assert "known-bad step" in out and "--mlx-lever kv4 --mlx-ref-value plain --mlx-cand-value 2" in out
    doc = json.loads(report.read_text())
    assert doc["gates"] == [] and [c["module"] for c in doc["calibrations"]] == ["test_kv.py"]
    cal = doc["calibrations"][0]
    assert cal["suggested"]["code"] == code and cal["floors"]["mean"] >= 0 and cal["speed"]["contexts"]["16"]
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM quality_runs").fetchone() == (0,)

    kv_goal = [c for c in code if c.startswith("assert_smaller(")]  # a bytes goal is a memory gate's
    assert kv_goal and re.search(r"kv=0\.\d+", kv_goal[0])  # 4-bit KV is shown smaller
    pytester.makepyfile(test_kv=CAL_GATE.format(drift=code[0], speed=kv_goal[0]))
    result = pytester.runpytest_subprocess(*common)
    result.assert_outcomes(passed=2)  # the same lever, measured again, clears what its calibration suggested

    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate", "--mlx-aa")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlx-aa and --mlx-calibrate: choose one*"])


@pytest.mark.parametrize(
    ("lever_lower", "floor", "limit", "note"),
    [
        (1.0, 1.0, None, "top-1: the arms agree on every token here, so the rule has nothing to scale"),
        (0.5, None, None, "top-1: the lever disagrees too often for a top-1 limit to mean anything"),
    ],
)
def test_a_top1_limit_the_rule_cannot_size_is_none_with_its_reason(
    lever_lower: float, floor: float | None, limit: float | None, note: str
) -> None:
    from pytest_mlxgate.verdicts.calibration import _kl_limit

    notes: list[str] = []
    assert _kl_limit("top1", "top-1", lever_lower, floor, capped=False, notes=notes) == limit
    assert notes == [note]


# -- the calibration block, line for line: what a gate's author reads and pastes ----------------------

RULE_LINE = (
    "  rule: each KL limit >= 4x the lever's 95% upper bound and >= 10x the A/A floor, rounded up to "
    "1/1.5/2/3/5/7 x 10^k; top-1 by the same rule on 1 - top-1; all capped by the quality bounds (mean KL <= 2, "
    "p99 KL <= 10, top-1 >= 30%); speed goals half the speed-up the interval's lower end shows; bytes (KV, "
    "weights) their exact ratio + 10%"
)
WRITTEN = (
    "  calibration file: gates/calibration/{}.json written (commit it; --mlx-aa and the calibration files' test "
    "check the limits against it)"
)


def test_a_kv_lever_s_calibration_block_reads_line_for_line() -> None:
    """Every figure in its column, the limits the rule gives (mean 4 x 1.5e-3 -> 7e-3, p99 4 x 0.014 -> 0.07,
    top-1 1 - 4 x 0.025 -> 0.9, prefill half of the lower end's 20% -> 1.1, KV 0.53 x 1.1 -> 0.59), the
    known-bad caught, the file written; then a NaN known-bad and a file left as it was."""
    kl = {
        "mean": 1.2e-3,
        "mean_ci": [9e-4, 1.5e-3],
        "p99": 1.1e-2,
        "quantile_ci": {"p99": [8e-3, 1.4e-2]},
        "top1": 0.985,
        "top1_ci": [0.975, 0.995],
    }
    speed = {
        "contexts": {
            "128": {
                "prefill": {"ratio": 1.3, "ratio_ci": [1.2, 1.4]},
                "decode": {"ratio": 1.02, "ratio_ci": [0.95, 1.1]},
                "kv": {"ratio": 0.53},
            }
        },
        "weights_bytes": {"reference": 100, "candidate": 100},
    }
    lever = {"name": "kv", "kind": "kv", "cand": {"bits": 8, "group_size": 64}}
    s = suggest_limits(kl, {"mean": 2e-8, "p99": 1e-7, "top1": 0.9999}, speed, module="gates/test_kv.py", lever=lever)
    bad_drift = {
        "metrics": {
            "mean": {"value": 0.9, "lower": 0.8, "upper": 1.0},
            "p99": {"value": 6.0, "lower": 5.0, "upper": 7.0},
            "top1": {"value": 0.4, "lower": 0.35, "upper": 0.45},
        }
    }
    calibration = {
        "module": "gates/test_kv.py",
        "lever": "kv: plain → 8-bit g64 · path=serving",
        "shape": {"prompts": 16, "tokens": 128},
        "suggested": s,
        "known_bad_result": {
            "declared": True,
            "value": {"bits": 2},
            "drift": bad_drift,
            "verdict_when_measured": {"verdict": "fail"},
        },
        "file": {"path": "gates/calibration/test_kv.json", "written": True},
    }
    table = [
        "gates/test_kv.py — calibration, no verdict (kv: plain → 8-bit g64 · path=serving; 16 prompts x 128 tokens)",
        "  measured                   lever           95% bound   A/A floor  quality bound",
        "  mean KL                   1.2e-3              1.5e-3      2.0e-8           <= 2",
        "  p99 KL                     0.011               0.014      1.0e-7          <= 10",
        "  top-1                      98.5%               97.5%      100.0%       >= 30.0%",
        "  prefill tok/s @128          ×1.3        [×1.2, ×1.4]                           ",
        "  decode tok/s @128          ×1.02       [×0.95, ×1.1]                           ",
        "  KV bytes @128              ×0.53               exact                           ",
        RULE_LINE,
        "  note: decode @128: not shown faster here (x1.02, lower bound 0.95): no goal",
        "  suggested limits (paste into the gate):",
        "    assert_kl_below(paired, mean=7e-3, p99=0.07, top1=0.9)",
        "    assert_faster(paired, prefill=1.1)",
        "    assert_smaller(paired, kv=0.59)",
    ]
    assert calibration_lines(calibration) == [
        *table,
        "  known-bad KNOWN_BAD = {'bits': 2}: mean KL 0.9 [0.8, 1], p99 KL 6 [5, 7], top-1 40.0% [35.0%, 45.0%]: "
        "fails the gate's limits (caught)",
        WRITTEN.format("test_kv"),
    ]
    nan = {"declared": True, "value": "mymod:nan", "non_finite": True}
    kept = {"path": "gates/calibration/test_kv.json", "written": False, "why": "not written: --mlx-kl-prompts ..."}
    assert calibration_lines({**calibration, "known_bad_result": nan, "file": kept}) == [
        *table,
        "  known-bad KNOWN_BAD = 'mymod:nan': NaN or inf logits (the gate goes red on them)",
        "  calibration file: gates/calibration/test_kv.json not written: --mlx-kl-prompts ...",
    ]


def test_a_broken_lever_s_calibration_block_reads_line_for_line() -> None:
    """No limits: the figures beyond the quality bounds, the worst token by its text, the way to accept it,
    and a known-bad that passes the gate's limits said in capitals."""
    broken = BROKEN
    lever = {"name": "norm", "kind": "patch", "target": "mlx.core.fast.rms_norm"}
    floors = {"mean": 0.0, "p99": 0.0, "top1": 1.0}
    s = suggest_limits(broken, floors, None, module="gates/test_norm.py", lever=lever, tokens={"42": " Paris"})
    calibration = {
        "module": "gates/test_norm.py",
        "lever": "norm: original → f16_rms_norm · path=prefill",
        "shape": {"prompts": 8, "tokens": 64},
        "suggested": s,
        "known_bad_result": {
            "declared": True,
            "value": "mymod:broken",
            "drift": {"metrics": {"mean": {"value": 9.0, "lower": 8.0, "upper": 10.0}}},
            "verdict_when_measured": {"verdict": "pass"},
        },
        "file": {"path": "gates/calibration/test_norm.json", "written": True},
    }
    assert calibration_lines(calibration) == [
        "gates/test_norm.py — calibration, no verdict (norm: original → f16_rms_norm · path=prefill; 8 prompts x 64 "
        "tokens)",
        "  measured                   lever           95% bound   A/A floor  quality bound",
        "  mean KL                      8.4                 9.8           0           <= 2",
        "  p99 KL                        25                  30           0          <= 10",
        "  top-1                       0.0%                0.0%      100.0%       >= 30.0%",
        RULE_LINE,
        "  this lever breaks the model: mean KL 8.4 [7, 9.8] (BEYOND the quality bound <= 2), p99 KL 25 [20, 30] "
        "(BEYOND the quality bound <= 10), top-1 0.0% [0.0%, 5.0%] (BEYOND the quality bound >= 30.0%); worst "
        "tokens: prompt 3 position 17, next token ' Paris': KL 32, top-1 ' Paris' -> '<7>'; a gate limit that "
        "passes it would pass a broken model, so none is suggested",
        "  fix the lever and calibrate again; or, if this much change is what you mean to ship, accept it "
        'explicitly: add pytest.mark.mlx_calibrate(accept_broken="why this much change is what you mean to ship") '
        "to the module's pytestmark and calibrate again (the suggestion and the record then carry the reason)",
        "  known-bad KNOWN_BAD = 'mymod:broken': mean KL 9 [8, 10], p99 KL — [—, —], top-1 — [—, —]: PASSES the "
        "gate's limits",
        WRITTEN.format("test_norm"),
    ]
