"""`authoring.proof` function by function, on made-up arms (no model): every field of a `LimitsProof`,
every branch of `vouch` with the whole `limits_from` entry and message it writes, a known-bad's figure
for each verdict and direction, a check at the floor, the cache key and the cache's hit, miss and wait.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from report_records import synthetic_scores

from pytest_mlxgate.authoring import proof as proof_module
from pytest_mlxgate.authoring import proof_measure
from pytest_mlxgate.authoring.calibration_file import GateSource
from pytest_mlxgate.authoring.proof import NOTES, PROOF_FORMAT, LimitsProof, Proof, limits_proof
from pytest_mlxgate.common.format import figure
from pytest_mlxgate.common.keys import canonical_json, key_digest
from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.results.wire import Check
from pytest_mlxgate.stats.kl_stats import summarize
from pytest_mlxgate.verdicts.conclude import Conclusion

MODEL, BACKEND = "e4b", "metal"
SHOWN_FILE = "gates/calibration/mlx-community--gemma-4-e4b/test_gate.json"
COMMAND = "pytest gates/test_gate.py --mlx-candidate e4b --mlx-calibrate"
NODEID, RERUN = "gates/test_gate.py::test_drift", "pytest gates/test_gate.py::test_drift --mlx-candidate e4b"
HINT = (
    f"make this model's limits its own: {COMMAND} (writes {SHOWN_FILE}; then give the limits it suggests as "
    "models={'e4b': {...}} and commit both)"
)
HINT_GATE = (
    f"make this model's limits its own: {COMMAND} (writes {SHOWN_FILE}; then paste the limits it suggests into "
    "the gate and commit both)"
)


@dataclass
class _Paired:
    nodeid: str = NODEID
    rerun: str = RERUN
    run: Any = None
    item: Any = None


def _stats(mean: tuple[float, float], top1: tuple[float, float] = (0.99, 1.0)) -> dict[str, Any]:
    return {
        "n_prompts": 16,
        "mean": sum(mean) / 2,
        "mean_ci": list(mean),
        "top1": sum(top1) / 2,
        "top1_ci": list(top1),
    }


def _limits(
    *,
    floors: dict[str, float] | None = None,
    bad: dict[str, Any] | None = None,
    known_bad: object = "kernels:broken",
    file: Path | None = None,
    prove: bool = True,
    require: bool = False,
    unprovable: str | None = None,
    own_entry: bool = True,
    error: str | None = None,
    non_finite: str | None = None,
) -> LimitsProof:
    made = LimitsProof(
        paired=_Paired(),  # type: ignore[arg-type]  # vouch reads its nodeid and rerun (and _named its lever)
        model=MODEL,
        backend=BACKEND,
        file=file,
        shown_file=SHOWN_FILE,
        calibrate_command=COMMAND,
        prove=prove,
        require=require,
        known_bad=known_bad,
        unprovable=unprovable,
        own_entry=own_entry,
    )
    made._proof = Proof(
        floors=floors if floors is not None else {"mean": 1e-8, "top1": 0.999, "p99": 1e-7},
        known_bad=known_bad,
        known_bad_stats=bad,
        error=error,
        non_finite=non_finite,
    )
    return made


def _gate(mean: tuple[float, float], bounds: dict[str, Any] | None = None, **fields: Any) -> Conclusion:
    bounds = bounds if bounds is not None else {"mean": 1e-3}
    numbers = {k: v for k, v in bounds.items() if isinstance(v, (int, float))}
    return Conclusion(mode="gate", checks=kl_checks(_stats(mean), numbers), bounds=bounds, fields=fields)


def _base(status: str = "unproven", **more: Any) -> dict[str, Any]:
    return {"status": status, "model": MODEL, "backend": BACKEND, "file": SHOWN_FILE, **more}


# -- vouch: modes that are not a KL gate --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["aa", "score", "error"])
def test_a_conclusion_with_no_limits_of_its_own_is_returned_as_it_is(mode: str) -> None:
    conclusion = Conclusion(mode=mode, checks=[], bounds={}, verdict="floor", fields={"x": 1})  # type: ignore[arg-type]
    assert _limits().vouch(conclusion) is conclusion


@pytest.mark.parametrize("mode", ["capability", "speed"])
@pytest.mark.parametrize("covered", [False, True])
def test_capability_and_speed_limits_carry_their_note_and_whether_a_file_covers_them(
    mode: str, covered: bool, tmp_path: Path
) -> None:
    proof = _limits(file=tmp_path / "c.json" if covered else None)
    proof._proof = None  # nothing is measured for them
    conclusion = Conclusion(mode=mode, checks=[], bounds={}, verdict="pass", fields={"limits_for": "e4b", "k": 2})  # type: ignore[arg-type]
    vouched = proof.vouch(conclusion)
    expected = _base("calibrated" if covered else "unproven", models_entry="e4b", note=NOTES[mode])
    if not covered:
        expected["why"] = "not calibrated"
    assert vouched.fields == {"limits_for": "e4b", "k": 2, "limits_from": expected}
    assert (vouched.verdict, vouched.mode, vouched.checks) == ("pass", mode, [])
    assert proof._proof is None
    assert NOTES == {
        "capability": "a drop margin in points: the same on every model",
        "speed": "a speed or memory goal: sized on the model and machine it was calibrated on",
    }


# -- vouch: a KL gate -------------------------------------------------------------------------------


def test_a_covered_gate_keeps_its_verdict_and_names_the_file_without_measuring(tmp_path: Path) -> None:
    proof = _limits(file=tmp_path / "c.json")
    proof.calibration = {"aa_floor": {"mean": 1e-6}, "known_bad": {"drift": {"metrics": {"mean": {"lower": 0.1}}}}}
    proof._proof = None
    gate = _gate((2e-3, 3e-3), limits_for=7)  # a models entry that is not text is not named
    vouched = proof.vouch(gate)
    assert vouched.fields == {"limits_for": 7, "limits_from": _base("calibrated")}
    assert (vouched.verdict, vouched.checks) == ("fail", gate.checks)
    assert proof._proof is None


@pytest.mark.parametrize("require", [False, True])
def test_with_proving_off_a_gate_is_unproven_and_an_error_only_when_proof_is_required(require: bool) -> None:
    proof = _limits(prove=False, require=require)
    proof._proof = None
    vouched = proof.vouch(_gate((1e-4, 2e-4)))
    assert vouched.fields["limits_from"] == _base(why="--mlx-prove off")
    assert proof._proof is None
    if not require:
        assert vouched.verdict == "pass" and "error" not in vouched.fields
        return
    assert vouched.verdict == "error"
    assert vouched.fields["error"] == {
        "type": "LimitsNotShown",
        "phase": "call",
        "message": (
            "limits unproven on e4b (metal): --mlx-prove off; --mlx-require-proof makes this an error.\n"
            f"  {HINT}, or declare KNOWN_BAD in the module (a variant with a bug its limits must fail)"
        ),
    }


def test_an_error_stays_the_error_it_is_even_when_proof_is_required() -> None:
    proof = _limits(prove=False, require=True)
    gate = Conclusion(mode="gate", checks=[], bounds={"mean": 1e-3}, verdict="error", fields={"error": {"m": 1}})
    vouched = proof.vouch(gate)
    assert vouched.verdict == "error" and vouched.fields["error"] == {"m": 1}


@pytest.mark.parametrize("require", [False, True])
def test_an_unprovable_gate_reads_its_floor_and_why(require: bool) -> None:
    proof = _limits(unprovable="no known-bad", known_bad=None, require=require, own_entry=False)
    vouched = proof.vouch(_gate((1e-4, 2e-4), bounds={"mean": 1e-3, "top1": 0.5}))
    # the floors of the limits given, as floats; the floor of p99 (no limit) is left out
    assert vouched.fields["limits_from"] == _base(floors={"mean": 1e-8, "top1": 0.999}, why="no known-bad")
    if require:
        assert vouched.verdict == "error"
        assert vouched.fields["error"]["message"] == (
            "limits unproven on e4b (metal): no known-bad; --mlx-require-proof makes this an error.\n"
            f"  {HINT_GATE}, or declare KNOWN_BAD in the module (a variant with a bug its limits must fail)"
        )
    else:
        assert vouched.verdict == "pass" and "error" not in vouched.fields


def test_a_limit_inside_the_floor_reads_inconclusive_and_an_unprovable_gate_keeps_those_checks() -> None:
    proof = _limits(unprovable="no known-bad", floors={"mean": 5e-4, "top1": 0.999})  # 1e-3 < 10 x 5e-4
    gate = _gate((2e-3, 3e-3), bounds={"mean": 1e-3, "top1": 0.5, "note": "x"})
    vouched = proof.vouch(gate)
    assert vouched.fields["limits_from"] == _base(
        floors={"mean": 5e-4, "top1": 0.999}, inside_floor=["mean"], why="no known-bad"
    )
    assert [c["verdict"] for c in vouched.checks] == ["inconclusive", "pass"]
    assert vouched.checks[1] == gate.checks[1]  # a limit outside the floor: its check as it was
    assert vouched.verdict == "inconclusive"


def test_a_known_bad_that_cannot_be_measured_makes_the_gate_an_error_saying_why() -> None:
    vouched = _limits(error="it raised RuntimeError: boom").vouch(_gate((1e-4, 2e-4)))
    why = 'known-bad "kernels:broken" could not be measured: it raised RuntimeError: boom'
    assert vouched.fields["limits_from"] == _base(floors={"mean": 1e-8}, why=why)
    assert vouched.verdict == "error" and [c["verdict"] for c in vouched.checks] == ["pass"]
    message = vouched.fields["error"]["message"]
    assert vouched.fields["error"]["type"] == "LimitsNotShown" and message.splitlines()[0] == (
        f'the limits proof on {MODEL} ({BACKEND}) could not measure KNOWN_BAD = "kernels:broken": it raised '
        "RuntimeError: boom"
    )
    assert f"fix KNOWN_BAD (or the kernel it names), or {HINT}" in message and "re-run: " in message
    assert message.splitlines()[1].endswith(
        "the proof runs the module's known-bad variant to show its limits fail it here; a known-bad must run "
        "and make the model worse (a kernel with a bug), not stop"
    )


def test_a_known_bad_with_non_finite_logits_proves_the_limits() -> None:
    vouched = _limits(non_finite="NaN logits").vouch(_gate((2e-3, 3e-3)))
    assert vouched.fields["limits_from"] == _base(
        "proven",
        floors={"mean": 1e-8},
        known_bad={"value": '"kernels:broken"', "verdict": "fail", "figures": ["non-finite"]},
    )
    assert vouched.verdict == "fail" and "error" not in vouched.fields


def test_a_known_bad_that_fails_proves_the_limits_and_the_verdict_stands() -> None:
    bad = _stats((0.05, 0.08), top1=(0.2, 0.4))
    proven = _limits(known_bad={"bits": 2}, bad=bad).vouch(_gate((1e-4, 2e-4), bounds={"mean": 1e-3, "top1": 0.9}))
    assert proven.fields["limits_from"] == _base(
        "proven",
        floors={"mean": 1e-8, "top1": 0.999},
        known_bad={
            "value": '{"bits": 2}',
            "verdict": "fail",
            "figures": ["mean KL 95% lower bound 0.05 > limit 0.001", "top-1 95% upper bound 0.4 < limit 0.9"],
        },
    )
    assert proven.verdict == "pass" and "error" not in proven.fields


@pytest.mark.parametrize("noisy", [False, True])
def test_a_known_bad_that_passes_refutes_the_limits_with_a_report(noisy: bool) -> None:
    floors = {"mean": 5e-4} if noisy else {"mean": 1e-8}
    proof = _limits(bad=_stats((2e-4, 5e-4)), floors=floors)
    vouched = proof.vouch(_gate((1e-4, 2e-4)))
    figure = "mean KL 95% upper bound 0.0005 ≤ limit 0.001"
    expected = _base(
        "refuted",
        floors=floors,
        known_bad={"value": '"kernels:broken"', "verdict": "pass", "figures": [figure]},
        why=f'known-bad "kernels:broken" passes them ({figure})',
    )
    if noisy:
        expected["inside_floor"] = ["mean"]
    assert vouched.fields["limits_from"] == expected
    assert vouched.verdict == "error" and [c["verdict"] for c in vouched.checks] == ["pass"]
    lines = [
        f"limits do not catch the known-bad on e4b (metal): {NODEID}",
        '  KNOWN_BAD = "kernels:broken" passes every limit here:',
        f"    {figure}",
        "  limits that pass a broken variant on e4b would pass a broken kernel: they were sized on another model "
        "or backend",
        f"  {HINT}",
        *(["  (mean: inside e4b's noise floor as well)"] if noisy else []),
        f"  re-run: {RERUN}",
    ]
    assert vouched.fields["error"] == {"type": "LimitsNotShown", "phase": "call", "message": "\n".join(lines)}


def test_the_refutation_joins_every_figure() -> None:
    bad = _stats((2e-4, 5e-4), top1=(0.95, 0.99))
    vouched = _limits(bad=bad).vouch(_gate((1e-4, 2e-4), bounds={"mean": 1e-3, "top1": 0.9}))
    figures = ["mean KL 95% upper bound 0.0005 ≤ limit 0.001", "top-1 95% lower bound 0.95 ≥ limit 0.9"]
    assert vouched.fields["limits_from"]["why"] == f'known-bad "kernels:broken" passes them ({"; ".join(figures)})'
    assert "    " + figures[0] + "\n    " + figures[1] + "\n" in vouched.fields["error"]["message"]


@pytest.mark.parametrize(
    ("lever", "verdict"), [((1e-4, 2e-4), "inconclusive"), ((2e-3, 3e-3), "fail"), ((5e-4, 2e-3), "inconclusive")]
)
@pytest.mark.parametrize("require", [False, True])
def test_a_known_bad_not_shown_to_fail_leaves_the_gate_at_best_inconclusive(
    lever: tuple[float, float], verdict: str, require: bool
) -> None:
    bad = _stats((5e-4, 2e-3))
    vouched = _limits(bad=bad, require=require).vouch(_gate(lever))
    figure = "mean KL 95% interval [0.0005, 0.002] straddles limit 0.001"
    why = f'known-bad "kernels:broken" not shown to fail them ({figure}): more prompts would tell'
    assert vouched.fields["limits_from"] == _base(
        floors={"mean": 1e-8},
        known_bad={"value": '"kernels:broken"', "verdict": "inconclusive", "figures": [figure]},
        why=why,
    )
    assert vouched.verdict == ("error" if require else verdict)
    if require:
        assert vouched.fields["error"]["message"].startswith(f"limits unproven on e4b (metal): {why}; ")
    else:
        assert "error" not in vouched.fields


def test_the_proof_is_measured_once_and_without_a_known_bad_when_unprovable(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []

    def measured(paired: object, known_bad: object) -> Proof:
        asked.append(known_bad)
        return Proof(floors={"mean": 1.0})

    monkeypatch.setattr(proof_module, "cached_or_measured", measured)
    proof = _limits()
    proof._proof = None
    first = proof.proof()
    assert proof.proof() is first and asked == ["kernels:broken"]
    unprovable = _limits(unprovable="a two-model lever has no known-bad value")
    unprovable._proof = None
    unprovable.proof()
    assert asked == ["kernels:broken", None]


# -- a known-bad's figure, a check at the floor -----------------------------------------------------


def _check(verdict: str, direction: str, **more: Any) -> Check:
    made = {
        "metric": "mean KL",
        "key": "mean",
        "value": 0.0123,
        "lower": 0.01234567,
        "upper": 0.0456789,
        "limit": 0.02,
        "direction": direction,
        "verdict": verdict,
        "n": 16,
        "n_needed": 40,
        "method": "95% interval over prompts",
        **more,
    }
    return made  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("verdict", "direction", "text"),
    [
        ("inconclusive", "max", "mean KL 95% interval [0.0123, 0.0457] straddles limit 0.02"),
        ("inconclusive", "min", "mean KL 95% interval [0.0123, 0.0457] straddles limit 0.02"),
        ("pass", "max", "mean KL 95% upper bound 0.0457 ≤ limit 0.02"),
        ("pass", "min", "mean KL 95% lower bound 0.0123 ≥ limit 0.02"),
        ("fail", "max", "mean KL 95% lower bound 0.0123 > limit 0.02"),
        ("fail", "min", "mean KL 95% upper bound 0.0457 < limit 0.02"),
    ],
)
def test_a_known_bad_s_check_reads_as_the_bound_that_decided_it(verdict: str, direction: str, text: str) -> None:
    assert proof_module._figure(_check(verdict, direction)) == text


def test_a_figure_with_a_missing_end_says_so() -> None:
    check = {k: v for k, v in _check("inconclusive", "max", lower=None, metric="top-1").items() if k != "upper"}
    assert proof_module._figure(check) == "top-1 95% interval [None, None] straddles limit 0.02"  # type: ignore[arg-type]


def test_a_check_at_the_floor_reads_inconclusive_unless_it_passed() -> None:
    passed = _check("pass", "max")
    assert proof_module._at_floor(passed, "e4b", {"mean": 1e-3}) is passed
    for verdict in ("fail", "inconclusive"):
        at = proof_module._at_floor(_check(verdict, "max", p_value=0.5), "e4b", {"mean": 0.00123456, "p99": 9.0})
        assert at == _check(
            "inconclusive",
            "max",
            p_value=0.5,
            n_needed=None,
            method="limit inside e4b's A/A noise floor (0.00123; the rule asks 10x it)",
        )
    unmeasured = proof_module._at_floor(_check("fail", "max"), "m", {})
    assert unmeasured["method"] == "limit inside m's A/A noise floor (None; the rule asks 10x it)"


# -- the known-bad as a verdict names it ------------------------------------------------------------

ROPE = pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken", path="serving")


def _lever_paired(lever: Lever, folder: Path | None = None) -> _Paired:
    return _Paired(run=SimpleNamespace(lever=lever), item=SimpleNamespace(path=(folder or Path("/g")) / "test_g.py"))


def test_a_known_bad_is_named_as_json_a_repr_or_the_whole_lever_it_switches() -> None:
    context = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "serving")
    paired = _lever_paired(context)
    assert proof_measure.named(paired, "m:broken") == '"m:broken"'  # type: ignore[arg-type]
    assert proof_measure.named(paired, {"z": 1, "a": [2]}) == '{"a": [2], "z": 1}'  # type: ignore[arg-type]
    assert proof_measure.named(paired, {1, 2}) == "{1, 2}"  # type: ignore[arg-type]
    assert proof_measure.named(paired, ROPE) == (  # type: ignore[arg-type]
        "mlx_lever 'rope' (patch mlx.core.fast.rope: original → m:broken, path=serving)"
    )
    # a whole lever that cannot be built on this module (another path): by its name, before it is parsed
    prefill = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "prefill")
    assert proof_measure.named(_lever_paired(prefill), ROPE) == "pytest.mark.mlx_lever('rope', ...)"  # type: ignore[arg-type]


# -- which file covers, and the LimitsProof a module gets -------------------------------------------

EMBEDDED = {
    "name": "smollm2-135m",
    "repo_id": "mlxgate/SmolLM2-135M-Instruct-f32",
    "commit": "c0ffee",
    "dtype": "float32",
}
HUB = {"name": None, "repo_id": "org/tiny", "commit": "c0ffee", "pinned": "org/tiny@c0ffee", "dtype": "float32"}
CHIP = {"chip": "Apple M3 Max", "tf32": "on"}
ENV_LEVER = Lever("flag", "env", "MLXGATE_FLAG", "0", "1")
WEIGHTS_LEVER = Lever("w", "weights", None, None, {"bits": 4, "group_size": 64})
MODEL_LEVER = Lever("model", "model", None, None, None)


def _arms(
    tmp_path: Path,
    *,
    described: dict[str, Any],
    lever: Lever = ENV_LEVER,
    reference: dict[str, Any] | None = None,
    module: object = None,
    device: str = "cpu",
) -> _Paired:
    run = SimpleNamespace(
        candidate=SimpleNamespace(describe=lambda: described),
        reference=SimpleNamespace(describe=lambda: reference) if reference is not None else None,
        machine={"device": device, **CHIP},
        lever=lever,
    )
    item = SimpleNamespace(path=tmp_path / "gates" / "test_gate.py", config=SimpleNamespace(rootpath=tmp_path))
    item.module = module
    return _Paired(nodeid="gates/test_gate.py::test_drift", run=run, item=item)


def _write_calibration(
    path: Path, *, device: str = "cpu", commit: str = "c0ffee", ref: str | None = None, dtype: str = "float32"
) -> Path:
    """A calibration file of `gates/test_gate.py` (written too, declaring nothing) as measured on `model`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    module = next(p for p in path.parents if p.name == "calibration").parent / "test_gate.py"
    if not module.exists():
        module.write_text("def test_drift(paired):\n    pass\n")
    model: dict[str, Any] = {"name": "x", "commit": commit, "dtype": dtype}
    if ref is not None:
        model["reference"] = {"commit": ref}
    doc = {"calibration_format": 1, "module": "gates/test_gate.py", "model": model}
    doc |= {"machine": {"device": device, **CHIP}, "gate": GateSource.read(module).digest}
    path.write_text(json.dumps(doc))
    return path


def _expected(paired: _Paired, **fields: Any) -> LimitsProof:
    return LimitsProof(paired=paired, **fields)  # type: ignore[arg-type]


def test_a_file_covers_only_a_model_commit_it_names_and_a_device_it_names(tmp_path: Path) -> None:
    module = tmp_path / "gates" / "test_gate.py"
    path = tmp_path / "gates" / "calibration" / "test_gate.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"calibration_format": 1, "model": {"name": "x"}, "machine": {"device": "cpu"}}))
    assert proof_module.covering_file(module, {**EMBEDDED, "commit": None}, "cpu") is None  # neither names one
    assert proof_module.covering_file(module, EMBEDDED, "cpu") is None
    path.write_text(
        json.dumps({"calibration_format": 1, "model": {"commit": "c0ffee", "dtype": "float32"}, "machine": {}})
    )
    # a file that names no device covers only a run that names none either
    assert proof_module.covering_file(module, EMBEDDED, "") == path
    assert proof_module.covering_file(module, EMBEDDED, "cpu") is None


def test_an_embedded_model_with_no_file_proves_its_known_bad(tmp_path: Path) -> None:
    paired = _arms(tmp_path, described=EMBEDDED, module=SimpleNamespace(KNOWN_BAD="m:bad"))
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made == _expected(
        paired,
        dtype="float32",
        model="smollm2-135m",
        backend="cpu",
        file=None,
        shown_file="gates/calibration/test_gate.json",
        calibrate_command="pytest gates/test_gate.py --mlx-candidate smollm2-135m --mlx-calibrate",
        prove=True,
        require=False,
        known_bad="m:bad",
        unprovable=None,
        own_entry=False,
    )
    off = limits_proof(paired, prove="off", require=True)  # type: ignore[arg-type]
    assert (off.prove, off.require) == (False, True)


def test_a_hub_model_covered_by_its_own_file_runs_no_proof(tmp_path: Path) -> None:
    path = _write_calibration(tmp_path / "gates" / "calibration" / "org--tiny" / "test_gate.json", device="gpu")
    paired = _arms(tmp_path, described=HUB, device="NVIDIA gpu (cuda)")
    assert limits_proof(paired, prove="auto", require=False).file is None  # type: ignore[arg-type]  # another backend
    _write_calibration(path, device="cuda 12")
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made == _expected(
        paired,
        dtype="float32",
        model="org/tiny@c0ffee",
        backend="cuda",
        file=path,
        shown_file="gates/calibration/org--tiny/test_gate.json",
        calibrate_command="pytest gates/test_gate.py --mlx-candidate org/tiny --mlx-calibrate",
        prove=True,  # --mlx-prove auto: a proof runs where the file turns out not to show an assertion's limits
        require=False,
        known_bad=None,
        unprovable="no known-bad",
        own_entry=True,
        calibration=json.loads(path.read_text()),
    )


def test_a_file_outside_the_root_is_named_by_its_whole_path(tmp_path: Path) -> None:
    paired = _arms(tmp_path, described=EMBEDDED)
    paired.item.config.rootpath = tmp_path / "elsewhere"
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made.shown_file == str(tmp_path / "gates" / "calibration" / "test_gate.json")
    assert made.shown_file.startswith("/")


def test_a_machine_with_no_device_is_taken_for_the_cpu_and_an_item_with_no_module_has_no_known_bad(
    tmp_path: Path,
) -> None:
    paired = _arms(tmp_path, described=EMBEDDED)
    paired.run.machine = {}
    del paired.item.module  # a test item that is no Python function
    _write_calibration(tmp_path / "gates" / "calibration" / "test_gate.json", device="cpu")
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made.backend == "cpu" and made.file is not None and made.prove is True
    assert (made.known_bad, made.unprovable) == (None, "no known-bad")


def test_a_two_model_gate_is_covered_only_by_a_file_measured_against_its_reference(tmp_path: Path) -> None:
    path = tmp_path / "gates" / "calibration" / "test_gate.json"
    bad = SimpleNamespace(KNOWN_BAD={"bits": 2, "group_size": 64})
    paired = _arms(tmp_path, described=EMBEDDED, lever=WEIGHTS_LEVER, reference={"commit": "ref1"}, module=bad)
    _write_calibration(path, ref="ref0")
    other = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert (other.file, other.prove, other.unprovable) == (None, True, None)
    assert other.known_bad == {"bits": 2, "group_size": 64}
    _write_calibration(path, ref="ref1")
    same = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert (same.file, same.prove, same.shown_file) == (path, True, "gates/calibration/test_gate.json")
    # no reference arm to compare: the file covers as any other does
    no_ref = _arms(tmp_path, described=EMBEDDED, lever=WEIGHTS_LEVER)
    _write_calibration(path, ref="ref0")
    assert limits_proof(no_ref, prove="auto", require=False).file == path  # type: ignore[arg-type]
    # a one-model lever's file is never asked for a reference
    one = _arms(tmp_path, described=EMBEDDED, reference={"commit": "ref1"})
    assert limits_proof(one, prove="auto", require=False).file == path  # type: ignore[arg-type]


def test_a_file_with_no_reference_covers_no_two_model_gate(tmp_path: Path) -> None:
    _write_calibration(tmp_path / "gates" / "calibration" / "test_gate.json")
    paired = _arms(tmp_path, described=EMBEDDED, lever=MODEL_LEVER, reference={"commit": "ref1"})
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert (made.file, made.prove, made.unprovable) == (None, True, "a two-model lever has no known-bad value")
    # a reference the file does not name and one whose commit it cannot say are not the same
    none_ref = _arms(tmp_path, described=EMBEDDED, lever=MODEL_LEVER, reference={"commit": None})
    assert limits_proof(none_ref, prove="auto", require=False).file is not None  # type: ignore[arg-type]


def test_a_model_lever_is_unprovable_even_with_a_known_bad(tmp_path: Path) -> None:
    paired = _arms(tmp_path, described=EMBEDDED, lever=MODEL_LEVER, module=SimpleNamespace(KNOWN_BAD="x"))
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert (made.known_bad, made.unprovable) == ("x", "a two-model lever has no known-bad value")


def test_a_model_named_by_its_repo_alone_is_calibrated_as_that_repo(tmp_path: Path) -> None:
    described = {"name": "org/tiny", "repo_id": "org/tiny", "commit": "c1"}
    paired = _arms(tmp_path, described=described, module=SimpleNamespace())
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made.calibrate_command == "pytest gates/test_gate.py --mlx-candidate org/tiny --mlx-calibrate"
    assert (made.model, made.known_bad, made.own_entry) == ("org/tiny", None, True)
    assert made.shown_file == "gates/calibration/org--tiny/test_gate.json"


# -- the cache key, and the cache beside the reference ----------------------------------------------


def _keyed_run(lever: Lever = ENV_LEVER, cache: object = None) -> Any:
    return SimpleNamespace(
        reference_model=lambda: "the reference model",
        lever=lever,
        shape="the shape",
        sequences_digest="seqs",
        machine={"device": "cpu"},
        candidate=SimpleNamespace(describe=lambda: {"commit": "cand-commit", "name": "n"}),
        cache=cache,
        said=[],
    )


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proof_measure, "reference_key", lambda **kw: {"reference_key": kw})
    monkeypatch.setattr(proof_measure, "serving_code", lambda: {"digest": "serving", "files": {}})


@pytest.mark.usefixtures("keyed")
def test_a_proof_s_key_holds_the_reference_arm_the_candidate_commit_the_known_bad_and_the_serving_code() -> None:
    run = _keyed_run()
    paired = _Paired(run=run, item=SimpleNamespace(path=Path("/g/test_g.py")))
    reference = {
        "reference_key": {
            "model": "the reference model",
            "lever": ENV_LEVER,
            "shape": "the shape",
            "sequences_digest": "seqs",
            "machine": {"device": "cpu"},
        }
    }
    assert proof_measure._key(paired, None) == {  # type: ignore[arg-type]
        "proof": PROOF_FORMAT,
        "reference": reference,
        "candidate": "cand-commit",
        "known_bad": None,
        "serving_code": "serving",
    }
    bad = Lever("flag", "env", "MLXGATE_FLAG", "0", "7")
    assert proof_measure._key(paired, "7")["known_bad"] == {  # type: ignore[arg-type]
        "reference": bad.key("reference"),
        "candidate": bad.key("candidate"),
    }
    assert PROOF_FORMAT == 2  # 2: the precision floor and the known-bad's oracle checks


@dataclass
class _Files:
    stored: dict[Path, bytes] = field(default_factory=dict)
    loads: int = 0
    writes: list[Path] = field(default_factory=list)

    def load(self, path: Path, decode: Any) -> Any:
        self.loads += 1
        return decode(self.stored[path]) if path in self.stored else None

    def write(self, path: Path, data: bytes) -> None:
        self.writes.append(path)
        self.stored[path] = data


@dataclass
class _Cache:
    directory: Path
    files: _Files = field(default_factory=_Files)
    locked: list[str] = field(default_factory=list)
    on_lock: Any = None  # stored while this worker waited for the lock

    @contextmanager
    def computing(self, digest: str) -> Iterator[None]:
        self.locked.append(digest)
        if self.on_lock is not None:
            self.on_lock()
        yield


def _cached_paired(cache: _Cache | None) -> _Paired:
    run = _keyed_run(cache=cache)
    run.say = run.said.append
    return _Paired(run=run, item=SimpleNamespace(path=Path("/g/test_g.py")))


def _measuring(monkeypatch: pytest.MonkeyPatch, found: Proof) -> list[object]:
    asked: list[object] = []

    def measure(paired: Any, known_bad: object) -> Proof:
        assert isinstance(paired, _Paired) and paired.run.lever is ENV_LEVER  # the module's own arms
        asked.append(known_bad)
        return found

    monkeypatch.setattr(proof_measure, "_measure", measure)
    return asked


#: A known-bad's statistics as `summarize` makes them (a proof entry read back is checked as such).
BAD_STATS = summarize(synthetic_scores(4, 16, scale=0.25)).to_json()
BAD_MEAN = figure(BAD_STATS["mean"])
FOUND = Proof(floors={"mean": 2e-8, "p99": 1e-7}, known_bad=None, known_bad_stats=BAD_STATS)


@pytest.mark.usefixtures("keyed")
def test_with_no_cache_the_proof_is_measured_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _measuring(monkeypatch, FOUND)
    paired = _cached_paired(None)
    assert proof_measure.cached_or_measured(paired, "1") is FOUND  # type: ignore[arg-type]
    assert asked == ["1"] and paired.run.said == [
        f"limits proof: A/A mean KL floor 2e-08; known-bad mean KL {BAD_MEAN}"
    ]


@pytest.mark.usefixtures("keyed")
def test_a_miss_is_measured_under_the_lock_stored_and_then_read_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = _measuring(monkeypatch, FOUND)
    cache = _Cache(tmp_path)
    paired = _cached_paired(cache)
    key = proof_measure._key(paired, "1")  # type: ignore[arg-type]
    assert proof_measure.cached_or_measured(paired, "1") is FOUND  # type: ignore[arg-type]
    assert asked == ["1"] and cache.locked == [key_digest(key)] and cache.files.loads == 2
    path = tmp_path / "proof" / f"{key_digest(key)}.json"
    assert cache.files.writes == [path]
    assert json.loads(cache.files.stored[path]) == {
        "key": json.loads(canonical_json(key)),
        "data": {
            "floors": {"mean": 2e-8, "p99": 1e-7},
            "known_bad_stats": BAD_STATS,
            "non_finite": None,
            "precision": None,
            "known_bad_oracle": None,
            "known_bad_site": None,
        },
    }
    assert paired.run.said == [f"limits proof: A/A mean KL floor 2e-08; known-bad mean KL {BAD_MEAN}"]

    again = _cached_paired(cache)
    hit = proof_measure.cached_or_measured(again, "1")  # type: ignore[arg-type]
    assert hit == Proof(floors={"mean": 2e-8, "p99": 1e-7}, known_bad="1", known_bad_stats=BAD_STATS, source="cache")
    assert asked == ["1"] and cache.locked == [key_digest(key)]  # no lock taken for a hit
    assert again.run.said == [
        f"limits proof: from the reference cache (A/A mean KL floor 2e-08; known-bad mean KL {BAD_MEAN})"
    ]


@pytest.mark.usefixtures("keyed")
def test_a_proof_whose_known_bad_errored_is_never_stored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    errored = Proof(floors={"mean": 1e-8}, known_bad="1", error="cannot build")
    _measuring(monkeypatch, errored)
    cache = _Cache(tmp_path)
    paired = _cached_paired(cache)
    assert proof_measure.cached_or_measured(paired, "1") is errored  # type: ignore[arg-type]
    assert cache.files.writes == [] and paired.run.said == ["limits proof: A/A mean KL floor 1e-08"]


@pytest.mark.usefixtures("keyed")
def test_a_proof_another_worker_stored_while_this_one_waited_is_read_not_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = _measuring(monkeypatch, FOUND)
    cache = _Cache(tmp_path)
    paired = _cached_paired(cache)
    key = proof_measure._key(paired, None)  # type: ignore[arg-type]
    stored = Proof(floors={"mean": 3e-8}, non_finite="NaN")
    cache.on_lock = lambda: proof_measure._store(cache, key, stored)
    hit = proof_measure.cached_or_measured(paired, None)  # type: ignore[arg-type]
    assert hit == Proof(floors={"mean": 3e-8}, non_finite="NaN", source="cache")
    assert asked == [] and cache.files.loads == 2 and len(cache.files.writes) == 1
    assert paired.run.said == [
        "limits proof: from the reference cache (A/A mean KL floor 3e-08; known-bad gives non-finite logits)"
    ]


# -- every branch of a proof keeps the checks the floor turned inconclusive -------------------------

NOISY_FLOORS = {"mean": 5e-4, "top1": 0.999}  # the mean limit 1e-3 sits inside 10 x 5e-4; top-1's does not
BRANCHES: dict[str, tuple[dict[str, Any], bool]] = {
    # branch: (LimitsProof keywords, whether the verdict is an error whatever the checks)
    "unprovable": ({"unprovable": "no known-bad"}, False),
    "error": ({"error": "boom"}, True),
    "non_finite": ({"non_finite": "NaN"}, False),
    "fail": ({"bad": _stats((0.05, 0.08), top1=(0.2, 0.4))}, False),
    "pass": ({"bad": _stats((2e-4, 5e-4), top1=(0.95, 0.99))}, True),
    "inconclusive": ({"bad": _stats((5e-4, 2e-3), top1=(0.85, 0.95))}, False),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
@pytest.mark.parametrize("top1", [None, (0.5, 0.6)], ids=["mean-only", "top1-fails"])
def test_each_branch_returns_the_checks_read_against_the_floor_and_their_verdict(
    branch: str, top1: tuple[float, float] | None
) -> None:
    keywords, errs = BRANCHES[branch]
    bounds = {"mean": 1e-3} if top1 is None else {"mean": 1e-3, "top1": 0.9}
    gate = Conclusion(
        mode="gate", checks=kl_checks(_stats((2e-3, 3e-3), top1=top1 or (0.99, 1.0)), bounds), bounds=bounds
    )
    assert gate.verdict == "fail"
    vouched = _limits(floors=NOISY_FLOORS, **keywords).vouch(gate)
    at_floor = {
        **gate.checks[0],
        "verdict": "inconclusive",
        "n_needed": None,
        "method": "limit inside e4b's A/A noise floor (0.0005; the rule asks 10x it)",
    }
    assert list(vouched.checks) == [at_floor, *gate.checks[1:]]
    assert vouched.fields["limits_from"]["inside_floor"] == ["mean"]
    assert vouched.verdict == ("error" if errs else "inconclusive" if top1 is None else "fail")


def test_two_figures_not_shown_to_fail_are_joined() -> None:
    bad = _stats((5e-4, 2e-3), top1=(0.85, 0.95))
    vouched = _limits(bad=bad).vouch(_gate((1e-4, 2e-4), bounds={"mean": 1e-3, "top1": 0.9}))
    figures = (
        "mean KL 95% interval [0.0005, 0.002] straddles limit 0.001; "
        "top-1 95% interval [0.85, 0.95] straddles limit 0.9"
    )
    assert vouched.fields["limits_from"]["why"] == (
        f'known-bad "kernels:broken" not shown to fail them ({figures}): more prompts would tell'
    )


def test_a_whole_lever_known_bad_is_named_by_what_it_switches_on_the_module_s_lever() -> None:
    proof = _limits(known_bad=ROPE, bad=_stats((0.05, 0.08)))
    context = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "serving")
    proof.paired = _lever_paired(context)  # type: ignore[assignment]
    entry = proof.vouch(_gate((1e-4, 2e-4))).fields["limits_from"]
    assert entry["known_bad"]["value"] == (
        "mlx_lever 'rope' (patch mlx.core.fast.rope: original → m:broken, path=serving)"
    )


def test_limits_inside_the_floor_are_all_named_in_the_refutation() -> None:
    bad = _stats((2e-4, 5e-4), top1=(0.95, 0.99))
    proof = _limits(bad=bad, floors={"mean": 5e-4, "top1": 0.5})
    message = proof.vouch(_gate((1e-4, 2e-4), bounds={"mean": 1e-3, "top1": 0.9})).fields["error"]["message"]
    assert message.splitlines()[-2] == "  (mean, top1: inside e4b's noise floor as well)"


def test_a_known_bad_that_cannot_be_built_is_keyed_by_its_name() -> None:
    paired = _Paired(run=SimpleNamespace(lever=MODEL_LEVER), item=SimpleNamespace(path=Path("/g/test_g.py")))
    assert proof_measure._known_bad_key(paired, "x") == '"x"'  # type: ignore[arg-type]


def test_a_proof_with_a_figure_json_cannot_hold_is_not_stored(tmp_path: Path) -> None:
    cache = _Cache(tmp_path)
    with contextlib.suppress(ValueError):  # json.dumps(allow_nan=False) refuses it (today before the try)
        proof_measure._store(cache, {"k": 1}, Proof(floors={"mean": float("nan")}))
    assert cache.files.writes == []  # never a file with NaN in it
    proof_measure._store(cache, {"k": 1}, Proof(floors={"mean": 1.0}))
    assert len(cache.files.writes) == 1


# -- measuring a proof: the A/A floor, then the known-bad arm ---------------------------------------


class _Counters:
    pass


@dataclass
class _Phases:
    timed: list[str] = field(default_factory=list)
    open: bool = False

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        self.timed.append(phase)
        self.open = True
        yield
        self.open = False


def _measured_paired() -> _Paired:
    said: list[str] = []
    run = SimpleNamespace(
        say=said.append,
        said=said,
        phases=_Phases(),
        reference_model=lambda: "the reference model",
        lever=ENV_LEVER,
        shape="the shape",
        sequences=["s1", "s2"],
        sequences_digest="seqs",
        machine={"device": "cpu"},
        cache="the cache",
        counters=_Counters(),
        watch="the watch",
    )
    return _Paired(run=run, item=SimpleNamespace(path=Path("/g/test_g.py")))


@pytest.fixture
def floor_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def chunked_floor(**kw: Any) -> tuple[int, dict[str, float]]:
        calls.append(kw)
        return 512, {"mean": 1e-8}

    monkeypatch.setattr(proof_measure, "chunked_floor", chunked_floor)
    monkeypatch.setattr(proof_measure, "precision_floor", lambda run: None)  # a float32 run: no precision floor
    return calls


def _bad_arm(monkeypatch: pytest.MonkeyPatch, outcome: object) -> list[Any]:
    made: list[Any] = []

    def known_bad_paired(paired: Any, bad: object) -> Any:
        assert paired.run.phases.open  # measured inside the proof's phase
        if isinstance(outcome, Exception) and bad == "unbuildable":
            raise outcome

        def kl() -> Any:
            assert arm.run.phases is not paired.run.phases and arm.run.phases.spent == {}
            if isinstance(outcome, Exception):
                raise outcome
            return SimpleNamespace(stats=SimpleNamespace(to_json=lambda: outcome), oracle=None, site=None)

        arm = SimpleNamespace(run=SimpleNamespace(phases=paired.run.phases), kl=kl, bad=bad)
        made.append(arm)
        return arm

    monkeypatch.setattr(proof_measure, "known_bad_paired", known_bad_paired)
    return made


def test_a_proof_without_a_known_bad_measures_the_floor_alone(floor_calls: list[dict[str, Any]]) -> None:
    paired = _measured_paired()
    run = paired.run
    assert proof_measure._measure(paired, None) == Proof(floors={"mean": 1e-8})  # type: ignore[arg-type]
    (call,) = floor_calls
    counters = call.pop("counters")
    assert isinstance(counters, _Counters) and counters is not run.counters  # its own counters
    assert call == {
        "reference": "the reference model",
        "lever": ENV_LEVER,
        "shape": "the shape",
        "sequences": ["s1", "s2"],
        "sequences_digest": "seqs",
        "machine": {"device": "cpu"},
        "cache": "the cache",
        "say": run.say,
        "watch": "the watch",
    }
    assert run.phases.timed == ["proof"]
    assert run.said == ["limits proof: no calibration covers this model here; the A/A floor first"]


@pytest.mark.usefixtures("floor_calls")
def test_a_proof_measures_the_known_bad_on_its_own_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _bad_arm(monkeypatch, {"mean": 0.5})
    paired = _measured_paired()
    found = proof_measure._measure(paired, {"bits": 2})  # type: ignore[arg-type]
    assert found == Proof(floors={"mean": 1e-8}, known_bad={"bits": 2}, known_bad_stats={"mean": 0.5})
    assert [arm.bad for arm in made] == [{"bits": 2}]
    assert type(made[0].run.phases).__name__ == "PhaseClock"
    assert paired.run.said == [
        "limits proof: no calibration covers this model here; the A/A floor first",
        'limits proof: the known-bad variant KNOWN_BAD = {"bits": 2}',
    ]


@pytest.mark.usefixtures("floor_calls")
@pytest.mark.parametrize("bad", ["m:bad", "unbuildable"])
def test_a_known_bad_that_errors_is_kept_as_its_message(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    from pytest_mlxgate.errors import LeverError, NonFiniteLogitsError

    _bad_arm(monkeypatch, LeverError("no such kernel"))
    assert proof_measure._measure(_measured_paired(), bad) == Proof(  # type: ignore[arg-type]
        floors={"mean": 1e-8}, known_bad=bad, error="no such kernel"
    )
    _bad_arm(monkeypatch, NonFiniteLogitsError("NaN logits at token 3"))
    assert proof_measure._measure(_measured_paired(), bad) == Proof(  # type: ignore[arg-type]
        floors={"mean": 1e-8}, known_bad=bad, non_finite="NaN logits at token 3"
    )


@pytest.mark.usefixtures("floor_calls")
def test_a_whole_lever_known_bad_is_said_as_the_module_builds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _bad_arm(monkeypatch, {"mean": 0.5})
    paired = _measured_paired()
    paired.run.lever = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "serving")
    proof_measure._measure(paired, ROPE)  # type: ignore[arg-type]
    assert paired.run.said[-1] == (
        "limits proof: the known-bad variant KNOWN_BAD = mlx_lever 'rope' (patch mlx.core.fast.rope: original → "
        "m:broken, path=serving)"
    )


# -- a stored proof read back: checked as a calibration file is ------------------------------------


def _data(**edit: Any) -> dict[str, Any]:
    return {**Proof(floors={"mean": 2e-8, "top1": 0.999}, known_bad_stats=BAD_STATS).to_json(), **edit}


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ({"known_bad_stats": {}}, "known_bad_stats do not read back as KL statistics (KeyError"),
        ({"known_bad_stats": {**BAD_STATS, "mean": -0.1}}, "known_bad_stats.mean -0.1 is no figure in range"),
        ({"known_bad_stats": {**BAD_STATS, "mean_ci": [0.5, 0.6]}}, "outside its own interval [0.5, 0.6]"),
        ({"known_bad_stats": {**BAD_STATS, "top1": 1.5, "top1_ci": [0, 2]}}, "known_bad_stats.top1 1.5 is no figure"),
        ({"known_bad_stats": {**BAD_STATS, "n_prompts": 0}}, "known_bad_stats.n_prompts 0 < 1"),
        ({"floors": {"mean": "x"}}, "floors.mean 'x' is no figure in range"),
        ({"floors": {"top1": 1.2}}, "floors.top1 1.2 is no figure in range"),
        ({"floors": None}, "floors is NoneType, not an object"),
        ({"floors": [0.1]}, "floors is list, not an object"),
        ({"precision": {"mean": -1}}, "precision.mean -1 is no figure in range"),
        ({"non_finite": 3}, "non_finite is not text"),
        ({"known_bad_oracle": {"x": 1}}, "known_bad_oracle does not read back"),
        ({"known_bad_site": [1]}, "known_bad_site does not read back"),
    ],
)
def test_a_stored_proof_whose_figures_are_not_what_a_proof_writes_is_named_and_not_believed(
    edit: dict[str, Any], said: str, tmp_path: Path
) -> None:
    """Its seal vouches only for the bytes: what they say is checked (issue 55: empty statistics under a
    valid seal were a KeyError at the verdict)."""
    assert proof_measure.entry_problems(_data()) == []
    problems = proof_measure.entry_problems(_data(**edit))
    assert any(p.startswith(said) or f" {said}" in p for p in problems), problems  # the words, not inside others
    cache = _Cache(tmp_path)
    key = {"k": 1}
    path = proof_measure._path(cache, key)
    cache.files.stored[path] = json.dumps({"key": key, "data": _data(**edit)}).encode()
    with pytest.raises(ValueError, match="not a proof this code can trust"):  # the store: a miss, said once
        proof_measure._load(cache, key)
    cache.files.stored[path] = json.dumps({"key": key, "data": _data()}).encode()
    assert proof_measure._load(cache, key) is not None


def test_a_stored_proof_with_figures_not_measured_reads_back() -> None:
    """A quantile too few tokens could not give is None in the JSON: nothing to judge, not damage."""
    sparse = {**BAD_STATS, "p999": None, "quantile_ci": {**BAD_STATS["quantile_ci"], "p999": [None, None]}}
    assert proof_measure.entry_problems(_data(known_bad_stats=sparse, precision=None)) == []
    assert proof_measure.entry_problems([]) == ["data is list, not an object"]


def test_a_low_precision_run_names_the_file_its_calibration_would_write(tmp_path: Path) -> None:
    """Uncovered in bfloat16, the record names `<stem>.bfloat16.json` (never the float32 file) and the command
    that writes it."""
    paired = _arms(tmp_path, described={**EMBEDDED, "dtype": "bfloat16"})
    made = limits_proof(paired, prove="auto", require=False)  # type: ignore[arg-type]
    assert made.shown_file == "gates/calibration/test_gate.bfloat16.json"
    assert made.calibrate_command.endswith("--mlx-dtype bfloat16 --mlx-calibrate")


def test_a_stored_proof_reads_back_with_its_precision(tmp_path: Path) -> None:
    """What a low-precision run's proof stores (the plain path's distance from float32) is what it reads."""
    cache = _Cache(tmp_path)
    key = {"k": 2}
    data = _data(precision={"mean": 5.8e-5, "p99": 1e-3})
    cache.files.stored[proof_measure._path(cache, key)] = json.dumps({"key": key, "data": data}).encode()
    loaded = proof_measure._load(cache, key)
    assert loaded is not None and loaded.precision == {"mean": 5.8e-5, "p99": 1e-3}
    assert loaded.to_json() == data


def test_a_stored_proof_reads_back_with_its_known_bad_s_oracle_distances_and_site(tmp_path: Path) -> None:
    """A bfloat16 proof keeps its known-bad's distances from the float32 oracle and its site's calls: read
    back, they are the same."""
    from pytest_mlxgate.kl.oracle import OracleDistances

    sums = {"plain_sums": (1e-4, 2e-4), "candidate_sums": (0.3, 0.5), "counts": (8, 8)}
    oracle = OracleDistances("bfloat16", False, ("a", "b"), **sums, plain_figures={"mean": 1e-5})
    cache = _Cache(tmp_path)
    key = {"k": 3}
    site = {"sequences": 2, "calls": [["attention", 0, 1, [0.5, 0.25], [0.5, 0.5], None, 0.1, 0.2, 1.0]]}
    data = _data(known_bad_oracle=oracle.state(), known_bad_site=site)
    cache.files.stored[proof_measure._path(cache, key)] = json.dumps({"key": key, "data": data}).encode()
    loaded = proof_measure._load(cache, key)
    assert loaded is not None and loaded.known_bad_oracle == oracle.state() and loaded.known_bad_site == site
    assert loaded.to_json() == data
