"""The terminal's calibration block (`verdicts.calibration_text`) line for line, from records built by
hand so that each branch shows: the table's columns (an interval, an exact ratio, a row from before the
quality bounds), the notes, a break refused or accepted, the code to paste or why there is none, the
known-bad step or the known-bad variant measured (each verdict), and the calibration file."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.verdicts.calibration_text import _kept_lines, calibration_lines, known_bad_lines

HEADER = "  measured                   lever           95% bound   A/A floor  quality bound"
ROWS = [
    {"metric": "mean KL", "key": "mean", "value": 1e-3, "bound": 1.2e-3, "floor": 1e-5, "quality_bound": 2.0},
    {"metric": "p99 KL", "key": "p99", "value": None, "bound": None, "floor": None, "quality_bound": 10.0},
    {"metric": "top-1", "key": "top1", "value": 0.99, "bound": 0.98, "floor": 0.9999, "quality_bound": 0.3},
    {"metric": "decode tok/s @128", "key": "decode", "value": 2.0, "interval": [1.8, 2.2]},
    {"metric": "KV bytes @128", "key": "kv", "value": 0.53, "interval": [0.53, 0.53]},
]
TABLE = [
    "gates/test_kv.py — calibration, no verdict (kv4: plain → 4-bit; 4 prompts x 32 tokens)",
    HEADER,
    "  mean KL                   1.0e-3              1.2e-3      1.0e-5           <= 2",
    "  p99 KL                         —                   —           —          <= 10",
    "  top-1                      99.0%               98.0%      100.0%       >= 30.0%",
    "  decode tok/s @128             ×2        [×1.8, ×2.2]                           ",
    "  KV bytes @128              ×0.53               exact                           ",
    "  rule: R",
]
CODE = ["assert_kl_below(paired, mean=5e-3, top1=0.9)", "assert_smaller(paired, kv=0.59)"]
PASTE = ["  suggested limits (paste into the gate):", *(f"    {c}" for c in CODE)]
STEP = {"what": "a KV setting X", "declare": "KNOWN_BAD = 2", "command": "pytest gates/test_kv.py --mlx-lever kv4"}
STEP_LINES = [
    "  known-bad step (limits never shown to fail a broken variant may pass one): plant a KV setting X, and show "
    "these limits fail it:",
    "    KNOWN_BAD = 2   (in gates/test_kv.py: its test_known_bad runs test_drift on it and passes only when that "
    "fails)",
    "    pytest gates/test_kv.py --mlx-lever kv4   (once, by hand: must fail)",
]
BREAKS = {"beyond": [{"key": "mean"}], "message": "this lever breaks the model: M", "accept": "add the marker"}
REFUSED = [
    "  this lever breaks the model: M",
    "  fix the lever and calibrate again; or, if this much change is what you mean to ship, accept it explicitly: "
    "add the marker",
]
ACCEPTED = "  ACCEPTED beyond the quality bounds (mlx_calibrate(accept_broken=...)): drafts only"


def _calibration(**suggested: Any) -> dict[str, Any]:
    s = {"rule": "rule: R", "rows": ROWS, "notes": [], "code": CODE, "known_bad": STEP, **suggested}
    return {
        "module": "gates/test_kv.py",
        "lever": "kv4: plain → 4-bit",
        "shape": {"prompts": 4, "tokens": 32},
        "suggested": s,
    }


@pytest.mark.parametrize(
    ("suggested", "after_table"),
    [
        ({}, [*PASTE, *STEP_LINES]),
        ({"notes": ["one", "two"]}, ["  note: one", "  note: two", *PASTE, *STEP_LINES]),
        # a break refused: its message and how to accept it, and nothing to paste whatever the record holds
        ({"breaks": BREAKS, "notes": ["n"]}, ["  note: n", *REFUSED]),
        ({"breaks": BREAKS, "accepted": None, "code": [], "known_bad": None}, REFUSED),
        # a break accepted: said first, then its message, the limits and the step
        (
            {"breaks": BREAKS, "accepted": "drafts only"},
            [ACCEPTED, "  this lever breaks the model: M", *PASTE, *STEP_LINES],
        ),
        ({"accepted": "drafts only"}, [ACCEPTED, *PASTE, *STEP_LINES]),
        # nothing sized: no code, no step
        ({"code": [], "known_bad": None}, ["  no limit could be sized from this measurement (see the notes)"]),
        ({"code": []}, ["  no limit could be sized from this measurement (see the notes)", *STEP_LINES]),
        # the step dropped (a declared known-bad) vs a record from before the step: the step in words
        ({"known_bad": None}, PASTE),
        ({"known_bad": {}}, PASTE),
    ],
)
def test_the_suggestion_block_line_for_line(suggested: dict[str, Any], after_table: list[str]) -> None:
    assert calibration_lines(_calibration(**suggested)) == [*TABLE, *after_table]


def test_a_record_from_before_the_known_bad_step_says_it_in_words() -> None:
    calibration = _calibration()
    del calibration["suggested"]["known_bad"]
    assert calibration_lines(calibration) == [*TABLE, *PASTE, "  then plant a known-bad variant and check it fails"]
    calibration["suggested"]["code"] = []
    assert calibration_lines(calibration)[len(TABLE) :] == [
        "  no limit could be sized from this measurement (see the notes)"
    ]


def test_a_record_from_before_the_quality_bounds_and_without_a_shape() -> None:
    old = {
        "module": "gates/test_old.py",
        "lever": "old",
        "suggested": {
            "rule": "rule: old",
            "rows": [
                {"metric": "mean KL", "key": "mean", "value": 0.0, "bound": 2e-3, "floor": 1e-8},
                {"metric": "top-1", "key": "top1", "value": 1.0, "bound": 1.0, "floor": 1.0, "quality_bound": None},
                {"metric": "prefill tok/s @8", "key": "prefill", "value": None, "interval": [None, 1.1]},
            ],
            "notes": [],
            "code": [],
        },
    }
    assert calibration_lines(old) == [
        "gates/test_old.py — calibration, no verdict (old; None prompts x None tokens)",
        HEADER,
        "  mean KL                        0              2.0e-3      1.0e-8               ",
        "  top-1                     100.0%              100.0%      100.0%               ",
        "  prefill tok/s @8               —           [—, ×1.1]                           ",
        "  rule: old",
        "  no limit could be sized from this measurement (see the notes)",
    ]


@pytest.mark.parametrize(
    ("step", "module", "lines"),
    [
        (
            {"what": "W", "declare": 'KNOWN_BAD = "B"', "command": "pytest g.py"},
            None,
            [
                '    KNOWN_BAD = "B"   (in the gate: its test_known_bad runs test_drift on it and passes only when '
                "that fails)",
                "    pytest g.py   (once, by hand: must fail)",
            ],
        ),
        (
            {"what": "W", "declare": None, "command": "pytest g.py --mlx-candidate BROKEN_MODEL"},
            "gates/g.py",
            ["    pytest g.py --mlx-candidate BROKEN_MODEL   (once, by hand: must fail)"],
        ),
        (
            {"what": "W", "declare": "KNOWN_BAD = 2", "command": None},
            "",
            [
                "    KNOWN_BAD = 2   (in the gate: its test_known_bad runs test_drift on it and passes only when "
                "that fails)"
            ],
        ),
        ({"what": "W"}, "gates/g.py", []),
    ],
)
def test_the_known_bad_step_lines(step: dict[str, Any], module: str | None, lines: list[str]) -> None:
    head = (
        "  known-bad step (limits never shown to fail a broken variant may pass one): plant W, and show these "
        "limits fail it:"
    )
    assert known_bad_lines(step, module) == [head, *lines]
    assert known_bad_lines(step) == known_bad_lines(step, None)


# -- what was kept: the known-bad variant as measured, and the calibration file -------------------------

DRIFT = {
    "metrics": {
        "mean": {"value": 0.9, "lower": 0.8, "upper": 1.0},
        "p99": {"value": 6.0, "lower": None},
        "top1": {"value": 0.4, "lower": 0.35, "upper": 0.45},
    }
}
FIGURES = "mean KL 0.9 [0.8, 1], p99 KL 6 [—, —], top-1 40.0% [35.0%, 45.0%]"


@pytest.mark.parametrize(
    ("verdict", "caught"),
    [
        ("fail", "fails the gate's limits (caught)"),
        ("pass", "PASSES the gate's limits"),
        ("inconclusive", "is NOT shown to fail the gate's limits"),
        ("no limits", "the gate has no KL limits yet (the suggested ones must fail it: test_known_bad checks)"),
        ("error", "measured"),
        (None, "measured"),
    ],
)
def test_a_declared_known_bad_s_figures_and_what_the_gate_made_of_it(verdict: str | None, caught: str) -> None:
    bad = {"declared": True, "value": "mymod:broken", "drift": DRIFT, "verdict_when_measured": {"verdict": verdict}}
    assert _kept_lines({"known_bad_result": bad}) == [f"  known-bad KNOWN_BAD = 'mymod:broken': {FIGURES}: {caught}"]


def test_a_declared_known_bad_measured_without_figures_or_verdict() -> None:
    lever = {"name": "bad", "kind": "patch", "target": "m.f", "ref": "original", "cand": "mymod:b", "path": "serving"}
    bad = {"declared": True, "value": lever, "drift": None}
    assert _kept_lines({"known_bad_result": bad}) == [
        "  known-bad KNOWN_BAD = mlx_lever 'bad' (patch m.f: original → mymod:b, path=serving): mean KL — [—, —], "
        "p99 KL — [—, —], top-1 — [—, —]: measured"
    ]
    assert _kept_lines({"known_bad_result": {**bad, "drift": {"metrics": None}}}) == _kept_lines(
        {"known_bad_result": bad}
    )


@pytest.mark.parametrize("value", [{"bits": 2}, "mymod:nan"])
def test_a_declared_known_bad_with_nan_logits(value: object) -> None:
    bad = {"declared": True, "value": value, "non_finite": True, "drift": DRIFT}
    assert _kept_lines({"known_bad_result": bad}) == [
        f"  known-bad KNOWN_BAD = {value!r}: NaN or inf logits (the gate goes red on them)"
    ]


@pytest.mark.parametrize(
    "bad", [None, "fail", {"declared": False, "value": 2, "drift": DRIFT}, {"value": 2, "non_finite": True}]
)
def test_no_known_bad_line_without_a_declared_one(bad: object) -> None:
    assert _kept_lines({"known_bad_result": bad}) == []


@pytest.mark.parametrize(
    ("file", "lines"),
    [
        (
            {"path": "gates/calibration/test_kv.json", "written": True},
            [
                "  calibration file: gates/calibration/test_kv.json written (commit it; --mlx-aa and the calibration "
                "files' test check the limits against it)"
            ],
        ),
        (
            {"path": "gates/calibration/test_kv.json", "written": False, "why": "kept: it is newer"},
            ["  calibration file: gates/calibration/test_kv.json kept: it is newer"],
        ),
        ({"path": "p.json"}, ["  calibration file: p.json None"]),
        (None, []),
        ("gates/calibration/test_kv.json", []),
    ],
)
def test_the_calibration_file_line(file: object, lines: list[str]) -> None:
    assert _kept_lines({"file": file}) == lines


def test_a_declared_known_bad_replaces_the_step_and_follows_the_suggestion() -> None:
    calibration = {
        **_calibration(),
        "known_bad_result": {"declared": True, "value": 2, "non_finite": True},
        "file": {"path": "f.json", "written": False, "why": "not written"},
    }
    assert calibration_lines(calibration) == [
        *TABLE,
        *PASTE,
        "  known-bad KNOWN_BAD = 2: NaN or inf logits (the gate goes red on them)",
        "  calibration file: f.json not written",
    ]
    assert calibration["suggested"]["known_bad"] == STEP  # the record itself is left as it was
    undeclared = {**calibration, "known_bad_result": {"declared": False}}
    assert calibration_lines(undeclared) == [*TABLE, *PASTE, *STEP_LINES, "  calibration file: f.json not written"]


@settings(max_examples=200, deadline=None)
@given(x=st.floats(min_value=-1e12, max_value=1e12, allow_nan=False) | st.sampled_from([100.0, 100.5, 0.01, 99.9]))
def test_a_kl_figure_reads_in_two_digits_or_short_scientific(x: float) -> None:
    """`_sci`: two significant digits between 0.01 and 100, else a mantissa and an unpadded exponent (4.2e-4):
    never Python's `1e+02` or `4.2e-04`, and the number read back is the figure to its two digits."""
    from pytest_mlxgate.verdicts.calibration import _sci

    said = _sci(x)
    assert "e+" not in said and "e-0" not in said and "E" not in said, said
    if x != 0 and not 1e-2 <= abs(x) < 1e2:
        assert "e" in said, said
    assert float(said) == pytest.approx(x, rel=0.06, abs=0), said


@pytest.mark.parametrize(
    ("x", "said"),
    [
        (0.01, "0.01"),
        (0.0099, "9.9e-3"),
        (99.4, "99"),
        (99.5, "1.0e2"),
        (100.0, "1.0e2"),
        (4.2e-4, "4.2e-4"),
        (0.0, "0"),
    ],
)
def test_a_kl_figure_s_words_at_the_edges(x: float, said: str) -> None:
    from pytest_mlxgate.verdicts.calibration import _sci

    assert _sci(x) == said
