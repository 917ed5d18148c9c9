"""`authoring.calibration_run` function by function, on made-up measurements (no model): the calibration
document field by field, the speed record as the file holds it, the gate's limits by test, the known-bad's
measurement and every way it ends, what `keep_calibration` writes or says, and `--mlx-aa`'s check.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_mlxgate.authoring import calibration_run as run_module
from pytest_mlxgate.authoring.calibration_check import Findings
from pytest_mlxgate.authoring.calibration_file import FORMAT, GateSource, Limit, compact_drift
from pytest_mlxgate.authoring.calibration_run import calibration_document, check_before_aa, keep_calibration
from pytest_mlxgate.errors import CalibrationError, LeverError, NonFiniteLogitsError, StaleCalibrationWarning
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.verdicts.calibration import CHECK_RULE

ENV = Lever("flag", "env", "MLXGATE_FLAG", "0", "1")
WEIGHTS = Lever("w", "weights", None, None, {"bits": 4, "group_size": 64})
EMBEDDED = {
    "name": "smollm2-135m",
    "repo_id": "mlxgate/SmolLM2-135M-Instruct-f32",
    "commit": "c0ffee",
    "dtype": "float32",
}
GEMMA = {"name": "gemma3-270m", "repo_id": "mlxgate/gemma-3-270m-Q4_K_M-f32", "commit": "beef"}


@dataclass
class _Arm:
    described: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return self.described


@dataclass
class _Run:
    lever: Lever = ENV
    candidate: _Arm = field(default_factory=lambda: _Arm(EMBEDDED))
    reference: _Arm | None = None
    machine: dict[str, str] = field(default_factory=lambda: {"device": "cpu", "chip": "x"})
    said: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.said.append(text)


def _paired(tmp_path: Path, run: _Run | None = None, *, module: object = None, **options: Any) -> Any:
    config = SimpleNamespace(rootpath=tmp_path, getoption=lambda name, default=None: options.get(name, default))
    item = SimpleNamespace(path=tmp_path / "gates" / "test_g.py", config=config, module=module)
    return SimpleNamespace(run=run or _Run(), item=item, nodeid="gates/test_g.py::test_drift")


def _gate(tmp_path: Path, limits: list[Limit] | None = None) -> GateSource:
    return GateSource(
        path=tmp_path / "gates" / "test_g.py",
        limits=limits or [],
        not_literal=[],
        declares_known_bad=True,
        known_bad="m:bad",
        digest={"digest": "d", "parts": {}},
    )


# -- the speed record as the file holds it ----------------------------------------------------------


def test_no_speed_measured_is_an_empty_record() -> None:
    assert run_module._compact_speed({}) == {}


def test_each_context_keeps_both_ratios_their_intervals_the_arms_medians_peak_memory_and_kv_bytes() -> None:
    speed = {
        "shape": {"contexts": [16, 64]},
        "memory_method": "rss",
        "load_seen": {"max": 0.1},
        "weights_bytes": {"reference": 400, "candidate": 100},
        "contexts": {
            16: {
                "reference": {"prefill_tps": 100.0, "decode_tps": 10.0, "kv_bytes": 2000},
                "candidate": {"prefill_tps": 150.0, "decode_tps": 12.0, "kv_bytes": 500},
                "prefill": {"ratio": 1.5, "ratio_ci": [1.4, 1.6], "other": 1},
                "decode": {"ratio": 1.2, "ratio_ci": [1.1]},  # an interval with one end
                "peak": {"ratio": 0.8, "ratio_ci": [0.7, 0.9]},
                "kv": {"ratio": 0.25},
            },
            "64": {
                "prefill": {"ratio": 2.0},  # no interval, no arms' medians
                "decode": "not measured",  # not an estimate: left out
                "reference": None,
            },
        },
    }
    assert run_module._compact_speed(speed) == {
        "shape": {"contexts": [16, 64]},
        "contexts": {
            "16": {
                "prefill": {"ratio": 1.5, "lower": 1.4, "upper": 1.6, "reference_tps": 100.0, "candidate_tps": 150.0},
                "decode": {"ratio": 1.2, "lower": 1.1, "upper": None, "reference_tps": 10.0, "candidate_tps": 12.0},
                "peak": {"ratio": 0.8, "lower": 0.7, "upper": 0.9},
                "kv": {"ratio": 0.25, "reference_bytes": 2000, "candidate_bytes": 500},
            },
            "64": {
                "prefill": {"ratio": 2.0, "lower": None, "upper": None, "reference_tps": None, "candidate_tps": None},
                "kv": {"ratio": None, "reference_bytes": None, "candidate_bytes": None},
            },
        },
        "weights": {"reference": 400, "candidate": 100, "ratio": 0.25},
        "memory_method": "rss",
        "load_seen": {"max": 0.1},
    }


@pytest.mark.parametrize(
    "weights",
    [{"reference": 400}, {"candidate": 100}, {"reference": 0, "candidate": 100}, {"reference": 400, "candidate": 0}],
)
def test_a_weights_ratio_needs_both_arms_bytes(weights: dict[str, int]) -> None:
    compact = run_module._compact_speed({"weights_bytes": weights})
    assert compact == {"shape": None, "contexts": {}, "weights": weights, "memory_method": None, "load_seen": None}


def test_a_speed_record_with_nothing_in_it_but_its_shape() -> None:
    compact = run_module._compact_speed({"shape": "s", "contexts": None, "weights_bytes": None})
    assert compact == {"shape": "s", "contexts": {}, "weights": {}, "memory_method": None, "load_seen": None}


# -- the gate's limits, by test and assertion -------------------------------------------------------


def test_the_gate_s_limits_on_the_calibrated_model_by_test_and_assertion(tmp_path: Path) -> None:
    gate = _gate(
        tmp_path,
        [
            Limit("test_drift", "assert_kl_below", "mean", 1e-3),
            Limit("test_drift", "assert_kl_below", "p99", 1e-2),
            Limit("test_drift", "assert_kl_below", "mean", 5e-3, model="gemma3-270m"),
            Limit("test_speed", "assert_faster", "decode", 1.1, at=16),
            Limit("test_speed", "assert_smaller", "kv", 0.5, at=None),
        ],
    )
    assert run_module._limits(gate, None) == {
        "test_drift: assert_kl_below": {"mean": 1e-3, "p99": 1e-2},
        "test_speed: assert_faster": {"decode": 1.1, "at": 16},
        "test_speed: assert_smaller": {"kv": 0.5},
    }
    assert run_module._limits(gate, "gemma3-270m")["test_drift: assert_kl_below"] == {"mean": 5e-3, "p99": 1e-2}


# -- the document -----------------------------------------------------------------------------------

MOMENT = datetime(2024, 2, 3, 4, 5, 6, 789, tzinfo=UTC)


class _Clock:
    @staticmethod
    def now(tz: object) -> datetime:
        assert tz is UTC
        return MOMENT


@pytest.fixture
def measured_here(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The facts of this checkout and machine, as stand-ins that show what they were asked about."""
    asked: list[Path] = []

    def git_state(root: Path) -> tuple[str, bool]:
        asked.append(root)
        return "abc123", True

    monkeypatch.setattr(run_module, "git_state", git_state)
    monkeypatch.setattr(run_module, "machine_versions", lambda machine: ({"of": dict(machine)}, {"mlx": "0.1"}))
    monkeypatch.setattr(run_module, "serving_code", lambda: {"digest": "serving"})
    monkeypatch.setattr(run_module, "compact_drift", lambda stats: {"compact": dict(stats)})
    monkeypatch.setattr(run_module, "datetime", _Clock)
    return asked


CALIBRATION = {
    "module": "gates/test_g.py",
    "shape": {"tokens": 24},
    "floors": {"mean": 1e-8},
    "aa_chunk": 16,
    "kl": {"mean": 0.01},
    "speed": {"weights_bytes": {"reference": 4, "candidate": 2}},
    "suggested": {
        "kl_limits": {"mean": 0.1},
        "speed_goals": {"decode": 1.0},
        "code": ["assert_kl_below(paired, mean=0.1)"],
        "notes": ["n"],
        "breaks": ["b"],
        "accepted": "why",
        "known_bad": "not kept",
    },
}


def _document(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return {
        "calibration_format": FORMAT,
        "module": "gates/test_g.py",
        "command": "pytest gates/test_g.py --mlx-calibrate",
        "measured_at": "2024-02-03T04:05:06Z",
        "code": {"commit": "abc123", "dirty": True},
        "serving_code": {"digest": "serving"},
        "gate": {"digest": "d", "parts": {}},
        "model": {
            "name": "smollm2-135m",
            "repo": "mlxgate/SmolLM2-135M-Instruct-f32",
            "commit": "c0ffee",
            "dtype": "float32",
        },
        "machine": {"of": {"device": "cpu", "chip": "x"}},
        "versions": {"mlx": "0.1"},
        "lever": ENV.to_json(),
        "shape": {"tokens": 24},
        "aa_floor": {"mean": 1e-8, "chunk": 16},
        "drift": {"compact": {"mean": 0.01}},
        "known_bad": {"declared": False},
        "speed": {
            "shape": None,
            "contexts": {},
            "weights": {"reference": 4, "candidate": 2, "ratio": 0.5},
            "memory_method": None,
            "load_seen": None,
        },  # fmt: skip
        "limits": {"test_drift: assert_kl_below": {"mean": 1e-3}},
        "suggested": {
            "kl_limits": {"mean": 0.1},
            "speed_goals": {"decode": 1.0},
            "code": ["assert_kl_below(paired, mean=0.1)"],
            "notes": ["n"],
            "breaks": ["b"],
            "accepted": "why",
        },
        "check_rule": CHECK_RULE,
        **changes,
    }


LIMITS = [
    Limit("test_drift", "assert_kl_below", "mean", 1e-3),
    Limit("test_drift", "assert_kl_below", "mean", 9e-3, model="gemma3-270m"),
]


def test_the_document_holds_every_part_of_the_measurement(tmp_path: Path, measured_here: list[Path]) -> None:
    paired = _paired(tmp_path)
    doc = calibration_document(paired, CALIBRATION, _gate(tmp_path, LIMITS), None)
    assert doc == _document(tmp_path)
    assert list(doc) == list(_document(tmp_path))
    assert measured_here == [tmp_path / "gates"]  # the gate's checkout


def test_the_document_keeps_the_known_bad_and_another_model_s_limits(tmp_path: Path, measured_here: list[Path]) -> None:
    paired = _paired(tmp_path, _Run(candidate=_Arm(GEMMA)))
    known_bad = {"declared": True, "value": 2}
    doc = calibration_document(paired, CALIBRATION, _gate(tmp_path, LIMITS), known_bad)
    assert doc == _document(
        tmp_path,
        model={"name": "gemma3-270m", "repo": "mlxgate/gemma-3-270m-Q4_K_M-f32", "commit": "beef", "dtype": None},
        known_bad=known_bad,
        limits={"test_drift: assert_kl_below": {"mean": 9e-3}},
    )


def test_a_two_model_document_names_its_reference(tmp_path: Path, measured_here: list[Path]) -> None:
    reference = _Arm({"name": "ref", "repo_id": "org/ref", "commit": "r1"})
    paired = _paired(tmp_path, _Run(lever=WEIGHTS, reference=reference))
    doc = calibration_document(paired, CALIBRATION, _gate(tmp_path), None)
    assert doc["model"] == {
        "name": "smollm2-135m",
        "repo": "mlxgate/SmolLM2-135M-Instruct-f32",
        "commit": "c0ffee",
        "dtype": "float32",
        "reference": {"name": "ref", "repo": "org/ref", "commit": "r1"},
    }
    assert doc["lever"] == WEIGHTS.to_json()
    # a reference arm of a one-model lever (or none at all) is not named
    one = calibration_document(_paired(tmp_path, _Run(reference=reference)), CALIBRATION, _gate(tmp_path), None)
    assert "reference" not in one["model"]
    none = calibration_document(_paired(tmp_path, _Run(lever=WEIGHTS)), CALIBRATION, _gate(tmp_path), None)
    assert "reference" not in none["model"]


def test_a_measurement_with_only_what_it_must_have(tmp_path: Path, measured_here: list[Path]) -> None:
    bare = {"module": Path("gates/test_g.py"), "floors": {"mean": 1e-8}, "kl": {}, "suggested": {}}
    doc = calibration_document(_paired(tmp_path), bare, _gate(tmp_path), None)
    assert doc == _document(
        tmp_path,
        shape={},
        aa_floor={"mean": 1e-8, "chunk": None},
        drift={"compact": {}},
        speed={},
        limits={},
        suggested=dict.fromkeys(("kl_limits", "speed_goals", "code", "notes", "breaks", "accepted")),
    )
    assert doc["module"] == "gates/test_g.py" and isinstance(doc["module"], str)


# -- the known-bad, measured beside the lever -------------------------------------------------------


@dataclass
class _BadArm:
    lever: Lever
    outcome: object

    def kl(self) -> Any:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        stats = self.outcome
        return SimpleNamespace(lever=self.lever, stats=SimpleNamespace(to_json=lambda: stats))


def _planted(monkeypatch: pytest.MonkeyPatch, outcome: object, lever: Lever | None = None) -> list[tuple[Any, Any]]:
    asked: list[tuple[Any, Any]] = []

    def known_bad_paired(paired: Any, bad: object) -> _BadArm:
        asked.append((paired, bad))
        if isinstance(outcome, Exception) and bad == "unbuildable":
            raise outcome
        return _BadArm(lever or Lever("flag", "env", "MLXGATE_FLAG", "0", str(bad)), outcome)

    monkeypatch.setattr(run_module, "known_bad_paired", known_bad_paired)
    return asked


BAD_STATS = {"n_prompts": 4, "n_tokens": 24, "mean": 0.5, "mean_ci": [0.4, 0.6], "top1": 0.2, "top1_ci": [0.1, 0.3]}


def _measure(tmp_path: Path, bad: object, limits: list[Limit] | None = None, model: str | None = None) -> Any:
    paired = _paired(tmp_path, module=SimpleNamespace(KNOWN_BAD=bad))
    module = tmp_path / "gates" / "test_g.py"
    return paired, run_module._measure_known_bad(paired, _gate(tmp_path, limits), module, model)


@pytest.mark.parametrize(
    ("limits", "verdict"),
    [
        ([], {"verdict": "no limits", "limits": []}),
        (
            [Limit("test_drift", "assert_kl_below", "mean", 0.1)],
            {"verdict": "fail", "limits": ["mean [0.4, 0.6] vs limit 0.1"]},
        ),
        (
            [Limit("test_drift", "assert_kl_below", "mean", 1.0)],
            {"verdict": "pass", "limits": ["mean [0.4, 0.6] vs limit 1"]},
        ),
        ([Limit("test_speed", "assert_faster", "decode", 1.0)], {"verdict": "no limits", "limits": []}),  # no KL limit
    ],
    ids=["no-limits", "caught", "passed", "speed-only"],
)
def test_a_measured_known_bad_keeps_its_lever_its_drift_and_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: list[Limit], verdict: dict[str, Any]
) -> None:
    asked = _planted(monkeypatch, BAD_STATS)
    paired, entry = _measure(tmp_path, "7", limits)
    assert entry == {
        "declared": True,
        "value": "7",
        "lever": Lever("flag", "env", "MLXGATE_FLAG", "0", "7").to_json(),
        "drift": compact_drift(BAD_STATS),
        "verdict_when_measured": verdict,
    }
    assert asked == [(paired, "7")]
    assert paired.run.said == ["calibration: the known-bad variant KNOWN_BAD = '7'"]


def test_a_known_bad_is_judged_by_the_calibrated_model_s_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(monkeypatch, BAD_STATS)
    limits = [
        Limit("test_drift", "assert_kl_below", "mean", 1.0),
        Limit("test_drift", "assert_kl_below", "mean", 0.1, model="gemma3-270m"),
    ]
    _, entry = _measure(tmp_path, "7", limits, model="gemma3-270m")
    assert entry["verdict_when_measured"] == {"verdict": "fail", "limits": ["mean [0.4, 0.6] vs limit 0.1"]}


@pytest.mark.parametrize(
    ("bad", "value"),
    [(2, 2), (0.5, 0.5), ({"bits": 2}, {"bits": 2}), ([1, 2], "[1, 2]"), (None, None)],
    ids=["int", "float", "dict", "list", "none"],
)
def test_a_known_bad_value_is_kept_as_declared_or_by_its_repr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object, value: object
) -> None:
    _planted(monkeypatch, BAD_STATS)
    _, entry = _measure(tmp_path, bad)
    assert (entry or {}).get("value") == value
    assert (entry is None) == (bad is None)  # none declared: nothing measured


def test_a_whole_lever_known_bad_is_kept_as_its_lever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lever = Lever("rope", "patch", "mlx.core.fast.rope", None, "m:broken")
    _planted(monkeypatch, BAD_STATS, lever)
    mark = pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken")
    paired, entry = _measure(tmp_path, mark)
    assert entry["value"] == entry["lever"] == lever.to_json()
    assert paired.run.said == [
        "calibration: the known-bad variant KNOWN_BAD = mlx_lever 'rope' (patch mlx.core.fast.rope: original → "
        "m:broken, path=prefill)"
    ]


def test_a_module_that_is_not_python_has_no_known_bad(tmp_path: Path) -> None:
    paired = _paired(tmp_path)  # item.module None
    assert run_module._measure_known_bad(paired, _gate(tmp_path), tmp_path / "gates" / "test_g.py", None) is None


def test_a_module_with_no_known_bad_measures_none(tmp_path: Path) -> None:
    paired = _paired(tmp_path, module=SimpleNamespace())
    assert run_module._measure_known_bad(paired, _gate(tmp_path), tmp_path / "gates" / "test_g.py", None) is None
    assert paired.run.said == []


@pytest.mark.parametrize(
    ("described", "model"),
    [
        (EMBEDDED, None),
        ({"name": "gemma3-270m", "repo_id": None}, "gemma3-270m"),  # a built-in by its alias
        ({"name": "tiny", "repo_id": "org/tiny"}, "org--tiny"),  # a hub model by its repo
        ({"name": "./models/tiny"}, None),  # a local folder names no model
    ],
)
def test_a_measurement_belongs_to_its_candidate_s_calibration(
    tmp_path: Path, described: dict[str, Any], model: str | None
) -> None:
    assert run_module._model_of(_paired(tmp_path, _Run(candidate=_Arm(described)))) == model


def test_a_known_bad_with_non_finite_logits_is_kept_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _planted(monkeypatch, NonFiniteLogitsError("NaN at token 3"))
    _, entry = _measure(tmp_path, "7")
    assert entry == {"declared": True, "value": "7", "non_finite": True, "message": "NaN at token 3"}


@pytest.mark.parametrize(("bad", "model", "file"), [
    ("unbuildable", None, "gates/calibration/test_g.json"),
    ("7", None, "gates/calibration/test_g.json"),
    ("7", "gemma3-270m", "gates/calibration/gemma3-270m/test_g.json"),
])  # fmt: skip
def test_a_known_bad_that_cannot_be_measured_fails_the_calibration_naming_the_file_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str, model: str | None, file: str
) -> None:
    _planted(monkeypatch, LeverError("no such kernel"))
    with pytest.raises(CalibrationError) as e:
        _measure(tmp_path, bad, model=model)
    assert str(e.value) == (
        f"gates/test_g.py: the known-bad variant KNOWN_BAD = {bad!r} could not be measured, so the calibration "
        f"file was not written ({file} is left as it was): no such kernel"
    )


def test_an_unmeasured_whole_lever_is_named_as_built_once_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(monkeypatch, LeverError("boom"), Lever("rope", "patch", "mlx.core.fast.rope", None, "m:broken"))
    mark = pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken")
    with pytest.raises(CalibrationError, match=r"KNOWN_BAD = mlx_lever 'rope' \(patch mlx.core.fast.rope: original"):
        _measure(tmp_path, mark)


# -- keep_calibration: write the file, or say why not -----------------------------------------------

GATE_SOURCE = """
import pytest
from pytest_mlxgate import assert_kl_below

KNOWN_BAD = "7"


def test_drift(paired):
    assert_kl_below(paired, mean=1e-3)
"""


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """keep_calibration with its measurement and writer standing in: what each was given."""
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "test_g.py").write_text(GATE_SOURCE)
    seen: dict[str, Any] = {"written": []}

    def measure(paired: Any, gate: GateSource, module: Path, model: str | None) -> dict[str, Any]:
        seen["measured"] = (paired, gate.known_bad, module, model)
        return {"declared": True, "value": "7"}

    def document(paired: Any, calibration: Any, gate: GateSource, known_bad: Any) -> dict[str, Any]:
        seen["document"] = (paired, calibration, gate.known_bad, known_bad)
        usable = {"drift": {"metrics": {"mean": {"lower": 0.1, "upper": 0.2}}}, "aa_floor": {"mean": 0}}
        return seen.get("doc") or {**usable, "known_bad": known_bad}

    monkeypatch.setattr(run_module, "_measure_known_bad", measure)
    monkeypatch.setattr(run_module, "calibration_document", document)
    monkeypatch.setattr(run_module, "write_calibration", lambda path, doc: seen["written"].append((path, doc)))
    return seen


def test_a_usable_measurement_of_the_gate_is_written(tmp_path: Path, kept: dict[str, Any]) -> None:
    paired = _paired(tmp_path)
    calibration: dict[str, Any] = {"module": "gates/test_g.py"}
    keep_calibration(paired, calibration)
    module = tmp_path / "gates" / "test_g.py"
    assert kept["measured"] == (paired, "7", module, None)
    assert kept["document"] == (paired, calibration, "7", {"declared": True, "value": "7"})
    path = tmp_path / "gates" / "calibration" / "test_g.json"
    assert kept["written"] == [
        (path, {"drift": {"metrics": {"mean": {"lower": 0.1, "upper": 0.2}}}, "aa_floor": {"mean": 0},
                "known_bad": {"declared": True, "value": "7"}}),
    ]  # fmt: skip
    assert calibration == {
        "module": "gates/test_g.py",
        "file": {"path": "gates/calibration/test_g.json", "written": True},
        "known_bad_result": {"declared": True, "value": "7"},
    }


def test_a_bfloat16_calibration_is_written_beside_the_float32_one_never_over_it(
    tmp_path: Path, kept: dict[str, Any]
) -> None:
    paired = _paired(tmp_path, _Run(candidate=_Arm({**EMBEDDED, "dtype": "bfloat16"})))
    calibration: dict[str, Any] = {}
    keep_calibration(paired, calibration)
    ((path, _),) = kept["written"]
    assert path == tmp_path / "gates" / "calibration" / "test_g.bfloat16.json"
    assert calibration["file"] == {"path": "gates/calibration/test_g.bfloat16.json", "written": True}


def test_another_model_s_calibration_goes_to_its_own_folder(tmp_path: Path, kept: dict[str, Any]) -> None:
    paired = _paired(tmp_path, _Run(candidate=_Arm(GEMMA)))
    calibration: dict[str, Any] = {}
    keep_calibration(paired, calibration)
    assert kept["measured"][3] == "gemma3-270m"
    assert calibration["file"] == {"path": "gates/calibration/gemma3-270m/test_g.json", "written": True}
    assert kept["written"][0][0] == tmp_path / "gates" / "calibration" / "gemma3-270m" / "test_g.json"


def test_a_file_outside_the_root_is_named_by_its_whole_path(tmp_path: Path, kept: dict[str, Any]) -> None:
    paired = _paired(tmp_path)
    paired.item.config.rootpath = tmp_path / "elsewhere"
    calibration: dict[str, Any] = {}
    keep_calibration(paired, calibration)
    assert calibration["file"]["path"] == str(tmp_path / "gates" / "calibration" / "test_g.json")


NOT_THE_GATE = (
    "made this another measurement than the gate's own (a calibration file holds the gate as its module declares it)"
)


@pytest.mark.parametrize("there", [False, True])
def test_a_measurement_of_other_sizes_writes_nothing_and_says_why(
    tmp_path: Path, kept: dict[str, Any], there: bool
) -> None:
    path = tmp_path / "gates" / "calibration" / "test_g.json"
    if there:
        path.parent.mkdir()
        path.write_text("{}")
    paired = _paired(tmp_path, mlx_kl_prompts=4, mlx_lever="x", mlx_speed_reps=0, mlx_reference="r")
    calibration: dict[str, Any] = {}
    keep_calibration(paired, calibration)
    kept_words = "the one there is kept" if there else "none is there yet"
    assert calibration == {
        "file": {
            "path": "gates/calibration/test_g.json",
            "written": False,
            "why": f"not written: --mlx-kl-prompts, --mlx-speed-reps, --mlx-lever {NOT_THE_GATE} ({kept_words})",
        },
        "known_bad_result": {"declared": True, "value": "7"},
    }
    assert kept["written"] == []


@pytest.mark.parametrize(
    "option",
    ["mlx_kl_prompts", "mlx_kl_tokens", "mlx_kl_decode", "mlx_speed_contexts", "mlx_speed_decode", "mlx_speed_reps",
     "mlx_lever", "mlx_ref_value", "mlx_cand_value", "mlx_prompts_file"],
)  # fmt: skip
def test_each_option_that_changes_the_measurement_is_named(tmp_path: Path, option: str) -> None:
    config = SimpleNamespace(getoption=lambda name, default=None: "" if name == option else default)
    assert run_module._not_the_gate(config) == f"not written: --{option.replace('_', '-')} {NOT_THE_GATE}"  # type: ignore[arg-type]


def test_an_unusable_measurement_writes_nothing_and_says_why(tmp_path: Path, kept: dict[str, Any]) -> None:
    kept["doc"] = {"drift": {"metrics": {"mean": {"lower": None, "upper": 0.2}}}, "known_bad": {"declared": False}}
    calibration: dict[str, Any] = {}
    keep_calibration(_paired(tmp_path), calibration)
    assert calibration == {
        "file": {
            "path": "gates/calibration/test_g.json",
            "written": False,
            "why": "the lever's mean KL has no 95% interval (too few prompts): nothing to check a limit against "
            "(none is there yet)",
        },
        "known_bad_result": {"declared": False},
    }
    assert kept["written"] == []


# -- --mlx-aa: the test's limits against its file -------------------------------------------------


def _item(tmp_path: Path, candidate: str | None, *, originalname: str | None = "test_drift") -> Any:
    config = SimpleNamespace(getoption=lambda name, default=None: candidate if name == "mlx_candidate" else default)
    item = SimpleNamespace(
        path=tmp_path / "gates" / "test_g.py",
        nodeid="gates/test_g.py::test_drift[a]",
        config=config,
        name="test_drift[a]",
    )
    if originalname is not None:
        item.originalname = originalname
    return item


@pytest.fixture
def findings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {"found": Findings(module="gates/test_g.py", file=tmp_path / "c.json", refresh="pytest x")}

    def module_findings(module: Path, **kw: Any) -> Findings:
        seen["asked"] = (module, kw)
        found: Findings = seen["found"]
        return found

    monkeypatch.setattr(run_module, "module_findings", module_findings)
    return seen


@pytest.mark.parametrize(
    ("candidate", "model"),
    [
        (None, None),
        ("smollm2-135m", None),
        ("gemma3-270m", "gemma3-270m"),
        ("org/tiny", "org--tiny"),
        ("org/tiny@0123456789abcdef0123456789abcdef01234567", "org--tiny"),
        ("./models/tiny", None),
        ("/models/org/tiny", None),
    ],
)
def test_aa_reads_the_file_of_the_model_it_runs_on(
    tmp_path: Path, findings: dict[str, Any], candidate: str | None, model: str | None
) -> None:
    check_before_aa(_item(tmp_path, candidate))
    assert findings["asked"] == (
        tmp_path / "gates" / "test_g.py",
        {"shown_as": "gates/test_g.py", "test": "test_drift", "model": model},
    )


def test_aa_names_a_test_with_no_original_name_by_its_name(tmp_path: Path, findings: dict[str, Any]) -> None:
    check_before_aa(_item(tmp_path, None, originalname=None))
    assert findings["asked"][1]["test"] == "test_drift[a]"


def test_a_gate_never_calibrated_is_checked_against_the_floor_alone(tmp_path: Path, findings: dict[str, Any]) -> None:
    findings["found"].missing = True
    findings["found"].stale = ["old"]
    findings["found"].problems = ["wrong"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_before_aa(_item(tmp_path, None))  # returns before any warning or failure


def test_a_stale_file_warns_and_a_limit_it_shows_wrong_fails(tmp_path: Path, findings: dict[str, Any]) -> None:
    found = findings["found"]
    found.stale = ["the gate changed"]
    with pytest.warns(StaleCalibrationWarning) as caught:
        check_before_aa(_item(tmp_path, None))
    assert [str(w.message) for w in caught] == [found.stale_text()]
    found.problems = ["mean 1e-3 is below the floor"]
    with pytest.warns(StaleCalibrationWarning), pytest.raises(pytest.fail.Exception) as e:
        check_before_aa(_item(tmp_path, None))
    assert str(e.value) == found.problem_text() and e.value.pytrace is False


def test_a_file_that_is_fresh_and_right_says_nothing(tmp_path: Path, findings: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_before_aa(_item(tmp_path, None))
