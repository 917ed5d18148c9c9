"""`authoring.calibration_file` function by function, each one's whole output pinned: the findings of a
small gate module against a calibration document built here (every message as the user reads it),
the staleness reasons, speed goals and the known-bad's check, the schema check's every problem, the
drift table `compact_drift` makes, the machine facts, the file's exact bytes, and a round trip of
every field through `write_calibration` → `read_calibration`. No model: fast."""

from __future__ import annotations

import json
import platform
import shlex
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.authoring import calibration_check as cc
from pytest_mlxgate.authoring import calibration_file as cf
from pytest_mlxgate.authoring.calibration_check import Findings, module_findings
from pytest_mlxgate.authoring.calibration_file import (
    FORMAT,
    GateSource,
    Limit,
    compact_drift,
    machine_versions,
    read_calibration,
    render,
    schema_problems,
    write_calibration,
)
from pytest_mlxgate.verdicts.calibration import CHECK_RULE

GATE = '''"""A small gate to check."""
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below

pytestmark = [pytest.mark.mlx_lever("g", env="G", ref="0", cand="1"), pytest.mark.mlx_kl(prompts=4, tokens=24)]

KNOWN_BAD = "BROKEN"
LIMIT = 0.5


def test_drift(paired):
    assert_kl_below(paired, mean=0.01, top1=0.9, p99=LIMIT)


def test_speed(paired):
    assert_faster(paired, decode=1.1)
'''

#: The serving code digest as these tests have it (the real one takes half a second to compute).
SERVING: dict[str, Any] = {
    "files": {"kl/arms.py": "1" * 64, "serving/batch.py": "2" * 64, "serving/caches.py": "3" * 64},
    "digest": "0123456789abcdef" * 4,
}


def serving_code() -> dict[str, Any]:
    return {"files": dict(SERVING["files"]), "digest": SERVING["digest"]}


@pytest.fixture(autouse=True)
def _this_serving_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "serving_code", serving_code)


NOTE = "not checked (not a literal): test_drift: assert_kl_below(p99=LIMIT)"


def _row(value: float, lower: float, upper: float) -> dict[str, float]:
    return {"value": value, "lower": lower, "upper": upper}


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    module = tmp_path / "gates" / "test_g.py"
    module.parent.mkdir()
    module.write_text(GATE)
    return module


def _good(module: Path) -> dict[str, Any]:
    """A calibration the gate's limits keep, measured on this code (nothing stale)."""
    return {
        "calibration_format": FORMAT,
        "serving_code": serving_code(),
        "gate": GateSource.read(module).digest,
        "model": {"name": None, "repo": None, "commit": "c" * 40},
        "aa_floor": {"mean": 1e-5, "top1": 0.9999, "chunk": 8},
        "drift": {"metrics": {"mean": _row(5e-4, 2e-4, 1e-3), "top1": _row(0.995, 0.99, 0.998)}},
        "known_bad": {"declared": True, "value": "BROKEN", "drift": {"metrics": {"mean": _row(0.6, 0.5, 0.7)}}},
        "speed": {"contexts": {"16": {"decode": {"ratio": 1.3, "lower": 1.2, "upper": 1.4}}}},
        "suggested": {"breaks": None, "accepted": None},
    }


def _write(module: Path, doc: dict[str, Any], model: str | None = None) -> Path:
    path = cf.calibration_path(module, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _findings(module: Path, shown: str = "gates/test_g.py", **over: Any) -> Findings:
    """What module_findings should say of a file that needs no refresh of another model."""
    return Findings(
        module=shown,
        file=cf.calibration_path(module),
        refresh=f"pytest {shlex.quote(shown)} --mlx-calibrate",
        shown_file=str(Path(shown).parent / "calibration" / "test_g.json"),
        **over,
    )


# -- module_findings ------------------------------------------------------------------------------------


def test_a_file_the_limits_keep_gives_only_the_not_literal_note(gate: Path) -> None:
    _write(gate, _good(gate))
    assert module_findings(gate, shown_as="gates/test_g.py") == _findings(gate, notes=[NOTE])


def test_without_shown_as_messages_name_the_module_as_given(gate: Path) -> None:
    _write(gate, _good(gate))
    found = module_findings(gate)
    assert (found.module, found.shown_file) == (str(gate), str(gate.parent / "calibration" / "test_g.json"))
    assert found.refresh == f"pytest {shlex.quote(str(gate))} --mlx-calibrate"


def test_a_shown_path_with_a_space_is_shell_quoted_in_the_refresh_command(gate: Path) -> None:
    _write(gate, _good(gate))
    found = module_findings(gate, shown_as="my gates/test_g.py")
    assert found.refresh == "pytest 'my gates/test_g.py' --mlx-calibrate"
    assert found.shown_file == "my gates/calibration/test_g.json"


@pytest.mark.parametrize(
    ("model", "candidate"), [("gemma3-270m", "gemma3-270m"), ("org--name", "org/name")], ids=["built-in", "hub"]
)
def test_a_model_without_its_file_is_missing_and_names_the_candidate_that_measures_it(
    gate: Path, model: str, candidate: str
) -> None:
    _write(gate, _good(gate))  # the embedded model's file: not this model's
    assert module_findings(gate, shown_as="gates/test_g.py", model=model) == Findings(
        module="gates/test_g.py",
        file=gate.parent / "calibration" / model / "test_g.json",
        refresh=f"pytest gates/test_g.py --mlx-calibrate --mlx-candidate {candidate}",
        shown_file=f"gates/calibration/{model}/test_g.json",
        missing=True,
    )


def test_no_file_is_missing_with_nothing_else_said(gate: Path) -> None:
    assert module_findings(gate, shown_as="gates/test_g.py") == _findings(gate, missing=True)


def test_a_file_that_does_not_read_is_the_one_problem(gate: Path) -> None:
    path = cf.calibration_path(gate)
    path.parent.mkdir()
    path.write_text("[]")
    assert module_findings(gate, shown_as="gates/test_g.py") == _findings(
        gate,
        problems=[f"{path}: not a calibration file (no calibration_format); calibrate again to rewrite it"],
    )


@pytest.mark.parametrize(
    ("held", "model", "said", "move_to"),
    [
        ({"name": "gemma3-270m"}, None, "gemma3-270m", "calibration/gemma3-270m/test_g.json"),
        ({"repo": "org/name"}, None, "org/name", "calibration/org--name/test_g.json"),
        ({"name": "smollm2-135m", "repo": None}, "gemma3-270m", "smollm2-135m", "calibration/test_g.json"),
    ],
)
def test_a_file_of_another_model_is_the_one_problem_and_says_where_it_belongs(
    gate: Path, held: dict[str, Any], model: str | None, said: str, move_to: str
) -> None:
    doc = _good(gate)
    doc["model"] = held
    doc["serving_code"] = {"files": {"x.py": "0"}, "digest": "0" * 64}  # stale, but never looked at
    path = _write(gate, doc, model)
    found = module_findings(gate, shown_as="gates/test_g.py", model=model)
    shown = f"gates/{path.relative_to(gate.parent)}"
    assert found.problems == [
        f"{shown} holds a calibration of {said}, not of {model or 'smollm2-135m'} whose file this is: move it to "
        f"{move_to}, or calibrate again"
    ]
    assert (found.stale, found.notes) == ([], [])


@pytest.mark.parametrize(
    "held", [{"name": "smollm2-135m"}, {"name": None, "repo": None}, {}], ids=["the embedded model", "none", "empty"]
)
def test_a_file_of_this_model_or_of_none_named_is_checked(gate: Path, held: dict[str, Any]) -> None:
    doc = _good(gate)
    doc["model"] = held
    _write(gate, doc)
    assert module_findings(gate, shown_as="gates/test_g.py") == _findings(gate, notes=[NOTE])


def test_a_model_s_own_file_of_that_model_is_checked(gate: Path) -> None:
    doc = _good(gate)
    doc["model"] = {"name": "gemma3-270m", "repo": None}
    _write(gate, doc, "gemma3-270m")
    found = module_findings(gate, shown_as="gates/test_g.py", model="gemma3-270m")
    assert (found.problems, found.stale, found.missing, found.notes) == ([], [], False, [NOTE])


@pytest.mark.parametrize(
    ("suggested", "test", "expected"),
    [
        ({"breaks": {"message": "KL 3.2 is beyond 2"}, "accepted": None}, None, True),
        ({"breaks": {"message": "KL 3.2 is beyond 2"}, "accepted": None}, "test_speed", True),
        ({"breaks": {"message": "KL 3.2 is beyond 2"}, "accepted": "known"}, None, False),
        ({"breaks": {"message": "KL 3.2 is beyond 2"}}, "test_other", False),  # no limits to check
        ({"breaks": {}, "accepted": None}, None, False),
        (None, None, False),
    ],
)
def test_a_calibration_showing_the_lever_breaks_the_model_is_a_problem_unless_accepted(
    gate: Path, suggested: dict[str, Any] | None, test: str | None, expected: bool
) -> None:
    doc = _good(gate)
    doc["suggested"] = suggested
    _write(gate, doc)
    problems = module_findings(gate, test=test).problems
    said = ["the calibration shows the lever breaks the model: KL 3.2 is beyond 2"]
    assert problems == (said if expected else [])


def test_kl_limits_are_checked_at_the_lever_s_bound_on_the_gate_s_side_and_the_floor(gate: Path) -> None:
    doc = _good(gate)
    # mean: its upper end leaves x1.7 of room; its lower end (never read) would leave plenty
    doc["drift"]["metrics"]["mean"] = _row(1e-3, 1e-6, 6e-3)
    # top1: its lower end is beyond the limit; its upper end (never read) would pass
    doc["drift"]["metrics"]["top1"] = _row(0.95, 0.85, 0.999)
    doc["aa_floor"] = {"mean": 2e-3, "top1": 0.9999, "chunk": 8}  # mean's floor too close
    _write(gate, doc)
    assert module_findings(gate).problems == [
        "mean=0.01 leaves the lever's 95% bound 6.0e-3 only x1.7 of room, less than x2: the gate may flip on a "
        "noisier run of the same lever (the tightest limit the check accepts here: mean=0.02)",
        "mean=0.01 sits x5 above the A/A floor 2.0e-3, less than x10: the gate's verdict may be decided by noise "
        "(the reference against itself) (the tightest limit the check accepts here: mean=0.02)",
        "top1=0.9: the lever's 95% bound 85.0% is beyond it, so the gate does not pass the lever it was "
        "calibrated on (the tightest limit the check accepts here: top1=0.7)",
    ]


def test_an_integer_floor_is_a_floor_and_a_metric_the_file_lacks_has_no_bound(gate: Path) -> None:
    doc = _good(gate)
    doc["aa_floor"] = {"mean": 1}  # an int, as JSON may hold it
    doc["drift"]["metrics"].pop("top1")
    _write(gate, doc)
    assert module_findings(gate).problems == [
        "mean=0.01 sits x0.01 above the A/A floor 1, less than x10: the gate's verdict may be decided by noise "
        "(the reference against itself) (no limit within the quality bound keeps the rule here: the lever is too "
        "close to it)",
        "top1: the calibration has no 95% bound for the lever (too few prompts), so the limit's room is unknown",
    ]


def test_a_file_with_no_drift_floor_or_speed_names_every_limit_it_cannot_check(gate: Path) -> None:
    doc = _good(gate)
    for name in ("drift", "aa_floor", "speed", "known_bad"):
        doc[name] = None
    _write(gate, doc)
    assert module_findings(gate).problems == [
        "mean: the calibration has no 95% bound for the lever (too few prompts), so the limit's room is unknown",
        "top1: the calibration has no 95% bound for the lever (too few prompts), so the limit's room is unknown",
        "test_speed: assert_faster(decode=1.1): the calibration measured no speed",
    ]


def test_a_speed_goal_is_checked_against_the_file_s_speed(gate: Path) -> None:
    doc = _good(gate)
    doc["speed"]["contexts"]["16"]["decode"] = {"ratio": 1.1, "lower": 1.05, "upper": 1.2}
    _write(gate, doc)
    expected = [
        "decode=1.1 @16 tokens: the lever's interval lower end is x1.05 (x1.1), so it is not shown to meet the "
        "goal it is gated on"
    ]
    assert module_findings(gate).problems == expected
    assert module_findings(gate, test="test_speed").problems == expected
    assert module_findings(gate, test="test_drift").problems == []


def _bad_passes(gate: Path) -> dict[str, Any]:
    doc = _good(gate)
    doc["known_bad"]["drift"]["metrics"]["mean"] = _row(6e-3, 5e-3, 8e-3)  # within mean=0.01
    return doc


KNOWN_BAD_PASSES = (
    "KNOWN_BAD = 'BROKEN' is not shown to fail the gate's KL limits (inconclusive: top1 [—, —] vs limit 0.9; "
    "mean [0.005, 0.008] vs limit 0.01): limits that pass a broken variant may pass a broken kernel"
)


@pytest.mark.parametrize(
    ("test", "expected"),
    [(None, [KNOWN_BAD_PASSES]), ("test_drift", [KNOWN_BAD_PASSES]), ("test_speed", []), ("test_other", [])],
)
def test_the_known_bad_is_checked_with_the_whole_gate_or_a_test_with_kl_limits(
    gate: Path, test: str | None, expected: list[str]
) -> None:
    _write(gate, _bad_passes(gate))
    assert module_findings(gate, test=test).problems == expected


def test_a_file_with_no_model_named_is_checked(gate: Path) -> None:
    doc = _good(gate)
    doc["model"] = None
    _write(gate, doc)
    assert module_findings(gate, shown_as="gates/test_g.py") == _findings(gate, notes=[NOTE])


PER_MODEL_GATE = """
from pytest_mlxgate import assert_kl_below

KNOWN_BAD = "BROKEN"


def test_drift(paired):
    assert_kl_below(paired, mean=0.01, models={"gemma3-270m": {"mean": 1.0}})


def test_gemma(paired):
    assert_kl_below(paired, models={"gemma3-270m": {"p99": 5.0}})
"""

GEMMA_KNOWN_BAD = (
    "KNOWN_BAD = 'BROKEN' is not shown to fail the gate's KL limits ({}): limits that pass a broken variant may "
    "pass a broken kernel"
)


@pytest.mark.parametrize("test", [None, "test_gemma", "test_drift"])
def test_a_model_s_own_limits_are_what_its_file_and_known_bad_are_checked_against(
    tmp_path: Path, test: str | None
) -> None:
    """gemma3-270m's mean=1.0 (not the gate's 0.01) against its file: room enough, but it passes the known-bad;
    test_gemma has KL limits on gemma3-270m only, so checking it alone checks the known-bad there too."""
    module = tmp_path / "test_m.py"
    module.write_text(PER_MODEL_GATE)
    doc = _good(module)
    doc["model"] = {"name": "gemma3-270m"}
    doc["drift"]["metrics"]["mean"] = _row(1e-3, 1e-6, 6e-3)  # the gate's own mean=0.01 leaves x1.7 of room
    doc["drift"]["metrics"]["p99"] = _row(0.1, 0.05, 0.2)
    _write(module, doc, "gemma3-270m")
    assert module_findings(module, model="gemma3-270m", test=test).problems == [
        GEMMA_KNOWN_BAD.format("inconclusive: p99 [—, —] vs limit 5; mean [0.5, 0.7] vs limit 1")
    ]
    doc["model"] = None
    _write(module, doc)
    assert module_findings(module, test=test).problems == (
        []
        if test == "test_gemma"
        else [
            "mean=0.01 leaves the lever's 95% bound 6.0e-3 only x1.7 of room, less than x2: the gate may flip on "
            "a noisier run of the same lever (the tightest limit the check accepts here: mean=0.015)"
        ]
    )


# -- _stale ---------------------------------------------------------------------------------------------


def _gate_source(parts: dict[str, str], **over: Any) -> GateSource:
    fields: dict[str, Any] = {
        "path": Path("gates/test_g.py"),
        "limits": [],
        "not_literal": [],
        "declares_known_bad": False,
        "known_bad": None,
        "digest": {"digest": "d", "parts": parts},
    }
    fields.update(over)
    return GateSource(**fields)


def _fresh(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "calibration_format": FORMAT,
        "serving_code": serving_code(),
        "gate": {"digest": "d", "parts": {"pytestmark": "a", "KNOWN_BAD": "b"}},
        "versions": {"mlx": version("mlx"), "mlx_lm": version("mlx-lm")},
    }
    doc.update(over)
    return doc


def test_a_file_measured_on_this_code_is_not_stale() -> None:
    assert cc._stale(_fresh(), _gate_source({"pytestmark": "a", "KNOWN_BAD": "b"})) == []


def test_every_reason_a_file_is_stale_is_said_in_order() -> None:
    now = serving_code()
    files = dict(now["files"])
    first, second = sorted(files)[:2]
    files[second] = "0" * 64
    files["zz_gone.py"] = "1" * 64
    del files[first]
    doc = _fresh(
        calibration_format=0,
        serving_code={"files": files, "digest": "abcdef0123456789"},
        gate={"parts": {"pytestmark": "a", "KNOWN_BAD": "old", "gone.py": "x"}},
        versions={"mlx": "0.0.1", "mlx_lm": "0.0.2"},
    )
    gate = _gate_source({"pytestmark": "a", "KNOWN_BAD": "b", "mine.py": "y"})
    assert cc._stale(doc, gate) == [
        f"written in calibration format 0, this code reads {FORMAT}",
        f"the serving code changed since it was measured ({first}, {second}, zz_gone.py; serving code digest "
        f"abcdef012345 then, {now['digest'][:12]} now)",
        "the gate's own declarations changed since (KNOWN_BAD, gone.py, mine.py)",
        f"measured with mlx 0.0.1, installed here: {version('mlx')}",
        f"measured with mlx-lm 0.0.2, installed here: {version('mlx-lm')}",
    ]


def test_a_file_without_serving_code_gate_or_versions_is_stale_for_each_file_and_declaration() -> None:
    now = serving_code()
    gate = _gate_source({"pytestmark": "a"})
    assert cc._stale({"calibration_format": FORMAT}, gate) == [
        f"the serving code changed since it was measured ({', '.join(sorted(now['files']))}; serving code digest "
        f"None then, {now['digest'][:12]} now)",
        "the gate's own declarations changed since (pytestmark)",
    ]


@pytest.mark.parametrize("then", ["", None])
def test_a_version_not_recorded_is_no_reason(then: str | None) -> None:
    doc = _fresh(versions={"mlx": then, "mlx_lm": then})
    assert cc._stale(doc, _gate_source({"pytestmark": "a", "KNOWN_BAD": "b"})) == []


def test_a_distribution_not_installed_here_is_no_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def only_mlx(dist: str) -> str:
        if dist == "mlx":
            return "9.9"
        raise PackageNotFoundError(dist)

    monkeypatch.setattr(cc, "version", only_mlx)
    doc = _fresh(versions={"mlx": "1.0", "mlx_lm": "1.0"})
    assert cc._stale(doc, _gate_source({"pytestmark": "a", "KNOWN_BAD": "b"})) == [
        "measured with mlx 1.0, installed here: 9.9"
    ]


# -- _speed_problems ------------------------------------------------------------------------------------

SPEED = {
    "contexts": {
        "768": {
            "decode": {"ratio": 1.5, "lower": 1.4, "upper": 1.6},
            "prefill": {"ratio": 1.25, "lower": 1.2, "upper": 1.3},
            "kv": {"ratio": 0.3, "lower": 0.1, "upper": 0.9},
            "peak": {"ratio": 0.8, "lower": 0.7, "upper": 0.85},
        },
        "1024": {
            "decode": {"ratio": 1.0, "lower": 0.9, "upper": 1.1},
            "prefill": {"ratio": 1.3, "lower": 1.25, "upper": 1.35},
            "kv": {"ratio": 0.35, "lower": 0.1, "upper": 0.9},
            "peak": {"ratio": 0.82, "lower": 0.75, "upper": 0.95},
        },
        "64": {"decode": {"ratio": 1.2, "lower": 1.15, "upper": 1.3}},
    },
    "weights": {"ratio": 0.28},
}


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (Limit("t", "assert_faster", "decode", 0.9), []),  # at the lower end
        (
            Limit("t", "assert_faster", "decode", 1.2),
            [
                "decode=1.2 @1024 tokens: the lever's interval lower end is x0.9 (x1), so it is not shown to meet "
                "the goal it is gated on"
            ],
        ),
        (Limit("t", "assert_faster", "decode", 1.2, at=768), []),
        (Limit("t", "assert_faster", "decode", 1.15, at=64), []),
        (
            Limit("t", "assert_faster", "decode", 1.2, at="all"),
            [
                "decode=1.2 @64 tokens: the lever's interval lower end is x1.15 (x1.2), so it is not shown to meet "
                "the goal it is gated on",
                "decode=1.2 @1024 tokens: the lever's interval lower end is x0.9 (x1), so it is not shown to meet "
                "the goal it is gated on",
            ],
        ),
        (
            Limit("t", "assert_faster", "prefill", 1.3),
            [
                "prefill=1.3 @1024 tokens: the lever's interval lower end is x1.25 (x1.3), so it is not shown to "
                "meet the goal it is gated on"
            ],
        ),
        (
            Limit("t", "assert_faster", "decode", 1.2, at=512),
            ["decode=1.2 at=512: the calibration did not measure that context (it has 64, 768, 1024)"],
        ),
        (Limit("t", "assert_smaller", "kv", 0.35), []),
        (
            Limit("t", "assert_smaller", "kv", 0.34),
            ["kv=0.34 @1024 tokens: the lever measures x0.35, over the goal it is gated on"],
        ),
        (
            Limit("t", "assert_smaller", "kv", 0.32, at="all"),
            [
                "kv=0.32 @64 tokens: the calibration did not measure the lever's kv ratio",
                "kv=0.32 @1024 tokens: the lever measures x0.35, over the goal it is gated on",
            ],
        ),
        (Limit("t", "assert_smaller", "memory", 0.95), []),  # the upper end, not the ratio
        (
            Limit("t", "assert_smaller", "memory", 0.9),
            ["memory=0.9 @1024 tokens: the lever measures x0.95, over the goal it is gated on"],
        ),
        (Limit("t", "assert_smaller", "memory", 0.85, at=768), []),
        (Limit("t", "assert_smaller", "weights", 0.28), []),
        (
            Limit("t", "assert_smaller", "weights", 0.25),
            ["weights=0.25 (weights): the lever measures x0.28, over the goal it is gated on"],
        ),
    ],
    ids=repr,
)
def test_a_speed_goal_against_the_file_s_speed(limit: Limit, expected: list[str]) -> None:
    assert cc._speed_problems(limit, SPEED) == expected


@pytest.mark.parametrize(
    ("limit", "speed", "expected"),
    [
        (
            Limit("test_speed", "assert_faster", "decode", 1.5),
            {},
            ["test_speed: assert_faster(decode=1.5): the calibration measured no speed"],
        ),
        (
            Limit("test_mem", "assert_smaller", "kv", 0.5, at="all"),
            {"contexts": None},
            ["test_mem: assert_smaller(kv=0.5): the calibration measured no speed"],
        ),
        (
            Limit("t", "assert_smaller", "weights", 0.5),
            {"contexts": {}},
            ["weights=0.5 (weights): the calibration did not measure the lever's weights ratio"],
        ),
        (
            Limit("t", "assert_smaller", "weights", 0.5),
            {"weights": None},
            ["weights=0.5 (weights): the calibration did not measure the lever's weights ratio"],
        ),
        (
            Limit("t", "assert_smaller", "kv", 0.5),
            {"contexts": {"16": {"kv": None}}},
            ["kv=0.5 @16 tokens: the calibration did not measure the lever's kv ratio"],
        ),
        (
            Limit("t", "assert_faster", "decode", 1.5),
            {"contexts": {"16": {"decode": None}}},
            ["decode=1.5 @16 tokens: the calibration has no interval for the lever's decode speed"],
        ),
        (
            Limit("t", "assert_smaller", "memory", 0.5),
            {"contexts": {"16": {"memory": {"upper": 0.1}}}},  # memory is the file's "peak"
            ["memory=0.5 @16 tokens: the calibration did not measure the lever's memory ratio"],
        ),
    ],
)
def test_a_speed_goal_the_file_cannot_check_says_what_is_missing(
    limit: Limit, speed: dict[str, Any], expected: list[str]
) -> None:
    assert cc._speed_problems(limit, speed) == expected


# -- _known_bad_problems --------------------------------------------------------------------------------

KL = [Limit("t", "assert_kl_below", "mean", 0.01), Limit("t", "assert_kl_below", "top1", 0.9)]
SPEED_ONLY = [Limit("t", "assert_faster", "decode", 1.1)]


def _known_bad_gate(limits: list[Limit] = KL, declares: bool = True) -> GateSource:
    return _gate_source({}, limits=limits, declares_known_bad=declares)


CAUGHT = {"metrics": {"mean": _row(0.6, 0.5, 0.7)}}
MISSED = {"metrics": {"mean": _row(6e-3, 5e-3, 8e-3), "top1": _row(0.95, 0.93, 0.97)}}


@pytest.mark.parametrize(
    ("known_bad", "gate", "expected"),
    [
        ({"declared": True, "value": "BROKEN", "drift": CAUGHT}, _known_bad_gate(), []),
        (
            {"declared": True, "value": "BROKEN", "drift": MISSED},
            _known_bad_gate(),
            [
                "KNOWN_BAD = 'BROKEN' is not shown to fail the gate's KL limits (pass: mean [0.005, 0.008] vs "
                "limit 0.01; top1 [0.93, 0.97] vs limit 0.9): limits that pass a broken variant may pass a "
                "broken kernel"
            ],
        ),
        (
            {"declared": True, "value": {"bits": 4}, "drift": {"metrics": {"mean": {"lower": 5e-3}}}},
            _known_bad_gate(),
            [
                "KNOWN_BAD = {'bits': 4} is not shown to fail the gate's KL limits (inconclusive: mean [0.005, —] "
                "vs limit 0.01; top1 [—, —] vs limit 0.9): limits that pass a broken variant may pass a broken "
                "kernel"
            ],
        ),
        ({"declared": True, "value": "BROKEN", "drift": MISSED}, _known_bad_gate(declares=False), []),
        ({"declared": True, "value": "BROKEN", "drift": MISSED}, _known_bad_gate(SPEED_ONLY), []),
        ({"declared": True, "value": "BROKEN", "drift": MISSED, "non_finite": True}, _known_bad_gate(), []),
        ({"declared": True, "value": "BROKEN", "non_finite": True}, _known_bad_gate(), []),
        (
            {"declared": True, "value": "BROKEN"},
            _known_bad_gate(),
            ["KNOWN_BAD = 'BROKEN': the calibration holds no measurement of it"],
        ),
        (
            {"declared": True, "value": 2, "drift": [1, 2]},
            _known_bad_gate(),
            ["KNOWN_BAD = 2: the calibration holds no measurement of it"],
        ),
        (
            {"declared": False},
            _known_bad_gate(),
            ["KNOWN_BAD: the calibration was measured before the gate declared it and holds no measurement of it"],
        ),
        (
            {},
            _known_bad_gate(),
            ["KNOWN_BAD: the calibration was measured before the gate declared it and holds no measurement of it"],
        ),  # fmt: skip
        (None, _known_bad_gate(), []),
        ("BROKEN", _known_bad_gate(), []),
    ],
)
def test_the_known_bad_s_measurement_against_the_gate_s_kl_limits(
    known_bad: Any, gate: GateSource, expected: list[str]
) -> None:
    assert cc._known_bad_problems({"known_bad": known_bad}, gate) == expected


def test_the_known_bad_is_checked_against_the_model_s_own_limits() -> None:
    limits = [Limit("t", "assert_kl_below", "mean", 0.01), Limit("t", "assert_kl_below", "mean", 1.0, model="m")]
    doc = {"known_bad": {"declared": True, "value": "B", "drift": CAUGHT}}
    assert cc._known_bad_problems(doc, _known_bad_gate(limits)) == []
    assert cc._known_bad_problems(doc, _known_bad_gate(limits), "m") == [
        "KNOWN_BAD = 'B' is not shown to fail the gate's KL limits (pass: mean [0.5, 0.7] vs limit 1): limits "
        "that pass a broken variant may pass a broken kernel"
    ]


# -- schema_problems ------------------------------------------------------------------------------------


def _full() -> dict[str, Any]:
    """Every part schema_problems reads, each well formed, at its boundaries."""
    return {
        "calibration_format": FORMAT,
        "model": {"name": "smollm2-135m", "commit": "c" * 40, "repo": None},
        "machine": {"device": "cpu"},
        "aa_floor": {"mean": 0, "top1": 1.0, "same_top": 0.0, "ln_ppl": -0.5, "chunk": "x", "other": -1},
        "drift": {
            "n_prompts": 4,
            "metrics": {
                "mean": _row(0.0, 0.0, 0.0),
                "ln_ppl": _row(-0.2, -0.3, -0.1),
                "top1": _row(1.0, 0.0, 1.0),
                "p99": {"value": 2, "lower": None, "upper": None},
            },
        },
        "known_bad": {"declared": True, "drift": {"metrics": {"max": _row(3.0, 3.0, 3.0)}}},
        "speed": {"contexts": {"16": {"decode": {"ratio": 1.5}, "kv": {"ratio": None}, "n": 3}, "32": None}},
        "suggested": {},
    }


def test_a_well_formed_document_at_its_boundaries_has_no_problem() -> None:
    assert schema_problems(_full()) == []
    assert schema_problems({}) == []
    for name in ("model", "machine", "aa_floor", "drift", "known_bad", "speed", "suggested"):
        assert schema_problems({name: None}) == [], name


@pytest.mark.parametrize("name", ["model", "machine", "aa_floor", "drift", "known_bad", "speed", "suggested"])
def test_a_part_that_is_not_an_object_is_named_with_its_type(name: str) -> None:
    problems = schema_problems({name: "text"})
    assert problems[0] == f"{name} is str, not an object"
    assert problems[1:] == (["drift is not an object of metrics"] if name == "drift" else [])


def test_every_wrong_figure_and_part_is_named_in_order() -> None:
    doc: dict[str, Any] = {
        "calibration_format": FORMAT + 1,
        "model": {"name": 3, "commit": ["c"]},
        "aa_floor": {"mean": -1e-3, "top1": 1.5, "same_top": -0.1, "p99": "x", "p90": True, "chunk": -4},
        "drift": {
            "metrics": {
                "mean": _row(float("inf"), 0.3, 0.2),
                "p90": _row(0.1, -0.5, 0.2),
                "top1": {"value": 0.9, "lower": 0.95, "upper": 0.9},
                "p99": [1, 2],
                "max": {"value": -1, "lower": None, "upper": None},
            }
        },
        "known_bad": {"drift": {"metrics": "x"}},
        "speed": {"contexts": {"16": {"decode": {"ratio": "fast"}, "kv": {"ratio": True}}, "long": {}, "8": "x"}},
    }
    assert schema_problems(doc) == [
        f"calibration_format {FORMAT + 1} is newer than this code's {FORMAT}: run the mlxgate that wrote it",
        "model.name is not text",
        "model.commit is not text",
        "aa_floor.mean -0.001 is a KL below 0",
        "aa_floor.top1 1.5 is an agreement rate outside [0, 1]",
        "aa_floor.same_top -0.1 is an agreement rate outside [0, 1]",
        "aa_floor.p99 'x' is not a finite number",
        "aa_floor.p90 True is not a finite number",
        "drift.metrics.mean.value inf is not a finite number",
        "drift.metrics.mean: lower 0.3 > upper 0.2",
        "drift.metrics.p90.lower -0.5 is a KL below 0",
        "drift.metrics.top1: lower 0.95 > upper 0.9",
        "drift.metrics.p99 is list, not {value, lower, upper}",
        "drift.metrics.max.value -1 is a KL below 0",
        "known_bad.drift is not an object of metrics",
        "speed.contexts.16.decode.ratio 'fast' is not a number",
        "speed.contexts.16.kv.ratio True is not a number",
        "speed.contexts key 'long' is not a context length in tokens",
    ]


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        (FORMAT, []),
        (FORMAT - 1, []),
        ("2", []),
        (
            FORMAT + 1,
            [f"calibration_format {FORMAT + 1} is newer than this code's {FORMAT}: run the mlxgate that wrote it"],
        ),
    ],
)
def test_only_a_newer_format_is_a_schema_problem(fmt: Any, expected: list[str]) -> None:
    assert schema_problems({"calibration_format": fmt}) == expected


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("mean", 0.0, None),
        ("mean", -1e-12, "is a KL below 0"),
        ("top1", 0.0, None),
        ("top1", 1.0, None),
        ("top1", -1e-12, "is an agreement rate outside [0, 1]"),
        ("top1", 1 + 1e-12, "is an agreement rate outside [0, 1]"),
        ("same_top", 1.01, "is an agreement rate outside [0, 1]"),
        ("ln_ppl", -3.0, None),
        ("p999", float("nan"), "is not a finite number"),
        ("p90", None, None),
    ],
)
def test_a_figure_s_range_depends_on_its_metric(key: str, value: float | None, expected: str | None) -> None:
    problems = schema_problems({"drift": {"metrics": {key: {"value": value}}}})
    assert problems == ([] if expected is None else [f"drift.metrics.{key}.value {value!r} {expected}"])


def test_a_drift_without_metrics_or_of_the_wrong_kind() -> None:
    assert schema_problems({"drift": {}}) == []
    assert schema_problems({"drift": {"metrics": None}}) == ["drift is not an object of metrics"]
    assert schema_problems({"drift": {"metrics": [1]}}) == ["drift is not an object of metrics"]
    assert schema_problems({"drift": [1], "known_bad": {"drift": "x"}}) == [
        "drift is list, not an object",
        "drift is not an object of metrics",
        "known_bad.drift is not an object of metrics",
    ]
    assert schema_problems({"known_bad": {"drift": None}}) == []
    assert schema_problems({"known_bad": {"drift": {"metrics": {"top1": {"upper": 2}}}}}) == [
        "known_bad.drift.metrics.top1.upper 2 is an agreement rate outside [0, 1]"
    ]


# -- compact_drift --------------------------------------------------------------------------------------

STATS = {
    "n_prompts": 16,
    "n_tokens": 2048,
    "mean": 1e-3,
    "mean_ci": [8e-4, 1.2e-3],
    "median": 5e-4,
    "p90": 2e-3,
    "p95": 3e-3,
    "p99": 6e-3,
    "p999": 1.5e-2,
    "max": 0.25,
    "ln_ppl_ratio": -0.01,
    "ln_ppl_ratio_ci": (-0.02, 0.005),
    "top1": 0.98,
    "top1_ci": [0.97, 0.99],
    "same_top": 0.95,
    "same_top_ci": [0.93, 0.96],
    "quantile_ci": {
        "median": [4e-4, 6e-4],
        "p90": [1.8e-3, 2.2e-3],
        "p95": [2.7e-3, 3.3e-3],
        "p99": [5e-3, 7e-3],
        "p999": [1e-2, 2e-2],
        "mean": [9, 9],  # never read: the mean has its own interval
    },
    "ln_ppl": 5.0,  # never read: ln_ppl is the ratio's
}


def test_every_metric_s_value_and_interval_is_kept() -> None:
    assert compact_drift(STATS) == {
        "n_prompts": 16,
        "n_tokens": 2048,
        "metrics": {
            "mean": {"value": 1e-3, "lower": 8e-4, "upper": 1.2e-3},
            "median": {"value": 5e-4, "lower": 4e-4, "upper": 6e-4},
            "p90": {"value": 2e-3, "lower": 1.8e-3, "upper": 2.2e-3},
            "p95": {"value": 3e-3, "lower": 2.7e-3, "upper": 3.3e-3},
            "p99": {"value": 6e-3, "lower": 5e-3, "upper": 7e-3},
            "p999": {"value": 1.5e-2, "lower": 1e-2, "upper": 2e-2},
            "max": {"value": 0.25, "lower": 0.25, "upper": 0.25},
            "ln_ppl": {"value": -0.01, "lower": -0.02, "upper": 0.005},
            "top1": {"value": 0.98, "lower": 0.97, "upper": 0.99},
            "same_top": {"value": 0.95, "lower": 0.93, "upper": 0.96},
        },
    }
    assert list(compact_drift(STATS)["metrics"]) == list(cf.KL_KEYS)


def test_a_record_with_nothing_measured_has_no_metrics() -> None:
    assert compact_drift({}) == {"n_prompts": None, "n_tokens": None, "metrics": {}}
    assert compact_drift({"quantile_ci": None, "max": None}) == {"n_prompts": None, "n_tokens": None, "metrics": {}}


@pytest.mark.parametrize(
    ("stats", "metrics"),
    [
        ({"mean": 1}, {"mean": {"value": 1.0, "lower": None, "upper": None}}),
        ({"mean_ci": [0.1, 0.2]}, {"mean": {"value": None, "lower": 0.1, "upper": 0.2}}),
        ({"mean": 0.1, "mean_ci": [0.05]}, {"mean": {"value": 0.1, "lower": 0.05, "upper": None}}),
        ({"mean": 0.1, "mean_ci": [0.05, 0.2, 0.3]}, {"mean": {"value": 0.1, "lower": 0.05, "upper": 0.2}}),
        ({"mean": 0.1, "mean_ci": "0.05-0.2"}, {"mean": {"value": 0.1, "lower": None, "upper": None}}),
        ({"top1_ci": [None, 0.9]}, {"top1": {"value": None, "lower": None, "upper": 0.9}}),
        (
            {"mean": float("nan"), "mean_ci": [float("-inf"), True]},
            {"mean": {"value": None, "lower": None, "upper": None}},
        ),
        (
            {"p99": 0.5, "quantile_ci": {"p90": [0.1, 0.2]}},
            {"p90": {"value": None, "lower": 0.1, "upper": 0.2}, "p99": {"value": 0.5, "lower": None, "upper": None}},
        ),
        ({"max": float("inf")}, {"max": {"value": None, "lower": None, "upper": None}}),
        ({"ln_ppl": 1.0, "ln_ppl_ci": [0.5, 1.5]}, {}),
        ({"same_top_ci": (0.5, 0.6)}, {"same_top": {"value": None, "lower": 0.5, "upper": 0.6}}),
    ],
)
def test_each_part_of_a_metric_is_kept_as_a_finite_float_or_none(
    stats: dict[str, Any], metrics: dict[str, Any]
) -> None:
    table = compact_drift(stats)
    assert table == {"n_prompts": None, "n_tokens": None, "metrics": metrics}
    for row in table["metrics"].values():
        assert all(x is None or type(x) is float for x in row.values())


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(value=finite, lower=finite, upper=finite, key=st.sampled_from(["median", "p90", "p95", "p99", "p999"]))
def test_a_quantile_s_interval_is_read_from_quantile_ci(value: float, lower: float, upper: float, key: str) -> None:
    row = compact_drift({key: value, "quantile_ci": {key: [lower, upper]}})["metrics"]
    assert row == {key: {"value": value, "lower": lower, "upper": upper}}


# -- machine_versions -----------------------------------------------------------------------------------


def test_a_run_s_machine_facts_give_the_machine_and_the_versions() -> None:
    machine = {"device": "gpu", "blas": "accelerate", "mlx": "0.1", "mlx-lm": "0.2", "mlx_lm": "0.3", "ram": "x"}
    machine |= {"chip": "Apple M3 Max", "tf32": "off"}
    versions = {
        "mlx": "0.1",
        "mlx_lm": "0.2",
        "python": platform.python_version(),
        "pytest_mlxgate": version("pytest-mlxgate"),
    }
    facts = {"device": "gpu", "blas": "accelerate", "chip": "Apple M3 Max", "tf32": "off"}
    assert machine_versions(machine) == ({**facts, **versions}, versions)


def test_facts_missing_read_unknown_and_mlx_lm_by_either_name() -> None:
    mine = version("pytest-mlxgate")
    python = platform.python_version()
    assert machine_versions({}) == (
        {
            "device": "unknown",
            "blas": "unknown",
            "chip": "unknown",
            "tf32": "unknown",
            "mlx": "unknown",
            "mlx_lm": "unknown",
            "python": python,
            "pytest_mlxgate": mine,
        },
        {"mlx": "unknown", "mlx_lm": "unknown", "python": python, "pytest_mlxgate": mine},
    )
    assert machine_versions({"mlx_lm": "0.3"})[1]["mlx_lm"] == "0.3"


def test_a_package_not_installed_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing(dist: str) -> str:
        raise PackageNotFoundError(dist)

    monkeypatch.setattr(cf, "version", nothing)
    machine, versions = machine_versions({"mlx": "0.1"})
    assert versions["pytest_mlxgate"] == machine["pytest_mlxgate"] == "unknown"


# -- render and the round trip --------------------------------------------------------------------------


def test_the_file_s_bytes() -> None:
    doc = {
        "zeta": (1, float("nan")),
        "drift": {"metrics": {"p99": {"value": float("inf")}, "mean": {"value": 0.5}}, 2: "two", 10: "ten"},
        "alpha": "µ→",
        "module": "gates/test_x.py",
        "calibration_format": 1,
    }
    assert (
        render(doc)
        == (
            "{\n"
            ' "calibration_format": 1,\n'
            ' "module": "gates/test_x.py",\n'
            ' "drift": {\n'
            '  "10": "ten",\n'
            '  "2": "two",\n'
            '  "metrics": {\n'
            '   "mean": {\n'
            '    "value": 0.5\n'
            "   },\n"
            '   "p99": {\n'
            '    "value": null\n'
            "   }\n"
            "  }\n"
            " },\n"
            ' "alpha": "µ→",\n'
            ' "zeta": [\n'
            "  1,\n"
            "  null\n"
            " ]\n"
            "}\n"
        ).encode()
    )


def _every_field(module: Path) -> dict[str, Any]:
    """A document with every field `--mlx-calibrate` writes, each holding something of its own."""
    return {
        "calibration_format": FORMAT,
        "module": "gates/test_g.py",
        "command": "pytest gates/test_g.py --mlx-calibrate",
        "measured_at": "2025-01-02T03:04:05Z",
        "code": {"commit": "a" * 40, "dirty": False},
        "serving_code": serving_code(),
        "gate": GateSource.read(module).digest,
        "model": {"name": "smollm2-135m", "repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "commit": "b" * 40},
        "machine": {"device": "cpu", "blas": "openblas", "mlx": "0.1", "mlx_lm": "0.2", "python": "3.12.0"},
        "versions": {"mlx": "0.1", "mlx_lm": "0.2", "python": "3.12.0", "pytest_mlxgate": "0.3"},
        "lever": {"kind": "env", "name": "g", "target": "G", "ref": "0", "cand": "1", "path": "prefill"},
        "shape": {"prompts": 4, "tokens": 24, "decode": None},
        "aa_floor": {"mean": 1e-5, "p99": 1e-4, "top1": 0.9999, "chunk": 8},
        "drift": compact_drift(STATS),
        "known_bad": {
            "declared": True,
            "value": "BROKEN",
            "drift": compact_drift({**STATS, "mean": 0.5, "mean_ci": [0.4, 0.6]}),
            "verdict_when_measured": {"verdict": "fail", "limits": ["mean [0.4, 0.6] vs limit 0.01"]},
        },
        "speed": {
            "contexts": {"16": {"decode": {"ratio": 1.3, "lower": 1.2, "upper": 1.4, "reference_tps": 10.0}}},
            "weights": {"ratio": 0.3},
        },
        "limits": {"test_drift: assert_kl_below": {"mean": 0.01, "top1": 0.9}},
        "suggested": {
            "kl_limits": {"mean": 0.003},
            "speed_goals": {"decode": 1.1},
            "code": ["assert_kl_below(paired, mean=3e-3)"],
            "notes": ["a note"],
            "breaks": None,
            "accepted": None,
        },
        "check_rule": CHECK_RULE,
    }


def test_every_field_reads_back_as_written(gate: Path) -> None:
    doc = _every_field(gate)
    assert list(doc) == list(cf._FIELDS)
    path = cf.calibration_path(gate)
    write_calibration(path, doc)
    back = read_calibration(path)
    assert back is not None
    assert list(back) == list(cf._FIELDS)
    for name in cf._FIELDS:
        assert back[name] == doc[name], name
    metrics = back["drift"]["metrics"]
    assert (metrics["p99"]["lower"], metrics["p99"]["upper"]) == (5e-3, 7e-3)  # a quantile's interval, read back
    assert (metrics["max"]["lower"], metrics["max"]["upper"]) == (0.25, 0.25)
    assert path.read_bytes() == render(doc)
    assert module_findings(gate).problems == []


def test_a_module_s_source_is_read_without_importing_it(gate: Path) -> None:
    source = GateSource.read(gate)
    assert source.limits == [
        Limit("test_drift", "assert_kl_below", "mean", 0.01),
        Limit("test_drift", "assert_kl_below", "top1", 0.9),
        Limit("test_speed", "assert_faster", "decode", 1.1),
    ]
    assert (source.not_literal, source.declares_known_bad, source.known_bad) == (
        ["test_drift: assert_kl_below(p99=LIMIT)"],
        True,
        "BROKEN",
    )
    assert sorted(source.digest["parts"]) == ["KNOWN_BAD", "pytestmark"]


# -- known_bad_verdict ----------------------------------------------------------------------------------

BAD = {"metrics": {"mean": _row(0.1, 0.05, 0.2), "top1": _row(0.8, 0.7, 0.9)}}


@pytest.mark.parametrize(
    ("key", "limit", "verdict", "text"),
    [
        ("mean", 0.01, "fail", "mean [0.05, 0.2] vs limit 0.01"),
        ("mean", 0.05, "inconclusive", "mean [0.05, 0.2] vs limit 0.05"),  # at the lower end: not beyond it
        ("mean", 0.1, "inconclusive", "mean [0.05, 0.2] vs limit 0.1"),
        ("mean", 0.2, "pass", "mean [0.05, 0.2] vs limit 0.2"),  # at the upper end: within it
        ("mean", 0.5, "pass", "mean [0.05, 0.2] vs limit 0.5"),
        ("top1", 0.95, "fail", "top1 [0.7, 0.9] vs limit 0.95"),
        ("top1", 0.9, "inconclusive", "top1 [0.7, 0.9] vs limit 0.9"),  # at the upper end: not beyond it
        ("top1", 0.7, "pass", "top1 [0.7, 0.9] vs limit 0.7"),  # at the lower end: within it
        ("p99", 0.5, "inconclusive", "p99 [—, —] vs limit 0.5"),  # not measured
    ],
)
def test_a_known_bad_s_interval_against_one_limit(key: str, limit: float, verdict: str, text: str) -> None:
    assert cc.known_bad_verdict(BAD, [Limit("t", "assert_kl_below", key, limit)]) == (verdict, [text])


def test_one_crossed_limit_fails_and_is_all_that_is_shown() -> None:
    limits = [Limit("t", "assert_kl_below", k, v) for k, v in (("mean", 0.5), ("top1", 0.9), ("mean", 0.01))]
    assert cc.known_bad_verdict(BAD, limits) == ("fail", ["mean [0.05, 0.2] vs limit 0.01"])
    both = [*limits, Limit("t", "assert_kl_below", "top1", 0.95)]
    assert cc.known_bad_verdict(BAD, both) == (
        "fail",
        ["mean [0.05, 0.2] vs limit 0.01", "top1 [0.7, 0.9] vs limit 0.95"],
    )


def test_unclear_limits_come_before_passed_ones() -> None:
    limits = [Limit("t", "assert_kl_below", k, v) for k, v in (("mean", 0.5), ("top1", 0.9), ("same_top", 1e-4))]
    drift = {"metrics": {**BAD["metrics"], "same_top": {"lower": None, "upper": 0.5}}}
    assert cc.known_bad_verdict(drift, limits) == (
        "inconclusive",
        ["top1 [0.7, 0.9] vs limit 0.9", "same_top [—, 0.5] vs limit 0.0001", "mean [0.05, 0.2] vs limit 0.5"],
    )
    assert cc.known_bad_verdict({"metrics": None}, limits[:1]) == ("inconclusive", ["mean [—, —] vs limit 0.5"])
    assert cc.known_bad_verdict({}, []) == ("pass", [])


# -- unusable -------------------------------------------------------------------------------------------

NO_INTERVAL = "the lever's mean KL has no 95% interval (too few prompts): nothing to check a limit against"


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"drift": {"metrics": {"mean": _row(1, 0.5, 2)}}, "aa_floor": {"mean": 0.0}}, None),
        ({"drift": {"metrics": {"mean": _row(1, 0, 0)}}, "aa_floor": {"mean": 0.0}}, None),  # 0 is an end
        ({"drift": {"metrics": {"mean": _row(1, 0.5, 2)}}, "aa_floor": {}}, "no A/A floor was measured"),
        ({"drift": {"metrics": {"mean": _row(1, 0.5, 2)}}}, "no A/A floor was measured"),
        ({"drift": {"metrics": {"mean": {"value": 1, "lower": 0.5}}}, "aa_floor": {"mean": 0.0}}, NO_INTERVAL),
        ({"drift": {"metrics": {"mean": {"value": 1, "upper": 2}}}, "aa_floor": {"mean": 0.0}}, NO_INTERVAL),
        ({"drift": {"metrics": {"mean": None}}, "aa_floor": {"mean": 0.0}}, NO_INTERVAL),
        ({"drift": {"metrics": None}, "aa_floor": {"mean": 0.0}}, NO_INTERVAL),
        ({"drift": None}, NO_INTERVAL),
        ({}, NO_INTERVAL),
    ],
)
def test_why_a_measurement_may_not_replace_a_file(doc: dict[str, Any], why: str | None) -> None:
    assert cf.unusable(doc) == why


# -- _known_bad_objects and calibration_model -----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ('KNOWN_BAD = "mymod:broken"', ["mymod:broken"]),
        ('KNOWN_BAD: str = "pkg.mod:broken.f"', ["pkg.mod:broken.f"]),
        ("KNOWN_BAD: str", []),
        ('KNOWN_BAD = "BROKEN"', []),
        ("KNOWN_BAD = 2", []),
        ('OTHER = "mymod:broken"', []),
        ("KNOWN_BAD = name", []),
        (
            'KNOWN_BAD = pytest.mark.mlx_lever("x:y", patch="m:f", ref="a:ref", cand="b:cand", context="c:ctx", '
            'path="p:q", other="o:x")',
            ["m:f", "a:ref", "b:cand", "c:ctx"],
        ),
        ('KNOWN_BAD = mlx_lever("n", patch="m.f", ref=None, cand=kernels)', []),
        ('KNOWN_BAD = other_call(cand="b:cand")', []),  # not a lever: the call is no literal
        ('A = B = "x:y"\nKNOWN_BAD = "k:v"', ["k:v"]),
    ],
)
def test_the_module_attr_names_known_bad_declares(source: str, names: list[str]) -> None:
    import ast

    assert cf._known_bad_objects(ast.parse(source)) == names


def test_a_known_bad_s_own_file_is_part_of_the_gate_s_digest(tmp_path: Path) -> None:
    module = tmp_path / "test_k.py"
    module.write_text('import json\nfrom known.sub import x\nKNOWN_BAD = "kernels.sub:broken"\n')
    (tmp_path / "kernels.py").write_text("def broken(): ...\n")
    (tmp_path / "known.py").write_text("x = 1\n")
    (tmp_path / "json.py").mkdir()  # a folder of that name is no module
    parts = GateSource.read(module).digest["parts"]
    assert sorted(parts) == ["KNOWN_BAD", "kernels.py", "known.py"]


@pytest.mark.parametrize(
    ("name", "repo", "model"),
    [
        ("smollm2-135m", None, None),
        ("smollm2-135m", "mlxgate/SmolLM2-135M-Instruct-f32", None),
        ("x", "mlxgate/SmolLM2-135M-Instruct-f32", None),
        ("gemma3-270m", None, "gemma3-270m"),
        ("y", "mlxgate/gemma-3-270m-Q4_K_M-f32", "gemma3-270m"),
        ("org/name", "org/name", "org--name"),
        ("/a/local/dir", None, None),
        (None, None, None),
        (None, "org/name", "org--name"),
        ("gemma3-270m", "org/name", "gemma3-270m"),
    ],
)
def test_the_per_model_calibration_a_candidate_belongs_to(
    name: str | None, repo: str | None, model: str | None
) -> None:
    assert cf.calibration_model(name, repo) == model


def test_a_gate_source_read_keeps_the_file_it_was_read_from(gate: Path) -> None:
    """seed 44's survivor (`GateSource.read` with its path dropped): the path travels with what was read."""
    assert GateSource.read(gate).path == gate
