"""Which calibration file covers a run: the judged model's own file, measured on the same model commit, on
the same backend, in the same precision (and on a GPU, on the same chip with the same TF32 setting). Where
none does, the limits proof (`proof`) shows the limits work there first.

A file covers only what it measured, checked at every run without measuring anything: it must be this
module's (its name, its lever, its gate digest: the lever, KNOWN_BAD and the local modules they import),
and today's limits must still fail the known-bad figures it recorded and sit above its A/A floor. A file
copied from another gate, or limits loosened after calibrating, would otherwise lend a pass to limits
nothing ever showed catch a broken kernel (issue 55)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..common.gate_calls import DeclaredLimit
from ..config.dtypes import ORACLE_DTYPE
from ..config.names import BUILT_MODELS
from ..models.device import backend_of
from ..verdicts.calibration import AGREEMENT_METRICS, FLOOR_FACTOR
from .calibration_check import known_bad_verdict
from .calibration_file import KL_ASSERTION, GateSource, calibration_model, calibration_path, read_calibration

__all__ = [
    "covering_file",
    "covers_precision",
    "dtype_option",
    "inside_floor",
    "limits_not_shown",
    "model_label",
    "model_of",
    "not_this_modules",
]


def model_of(described: Mapping[str, Any]) -> str | None:
    name, repo = described.get("name"), described.get("repo_id")
    return calibration_model(name if isinstance(name, str) else None, repo if isinstance(repo, str) else None)


def covering_file(
    module: Path, described: Mapping[str, Any], backend: str, machine: Mapping[str, str] | None = None
) -> Path | None:
    """The calibration file that covers this module on this model and backend, or None: the model's own
    file (`calibration_path`) measured on the same backend, on the same model commit, in the same precision
    (`covers_precision`). A file that cannot be read covers nothing (the calibration files' check names it)."""
    path = calibration_path(module, model_of(described), _text(described.get("dtype")))
    try:
        doc = read_calibration(path)
    except ValueError:
        return None
    if doc is None:
        return None
    held, model = doc.get("machine"), doc.get("model")
    if not isinstance(held, Mapping) or backend_of(str(held.get("device", ""))) != backend:
        return None
    if not isinstance(model, Mapping):
        return None
    commit = described.get("commit")
    if not commit or model.get("commit") != commit:
        return None
    if covers_precision(model, held, described, backend, machine or {}) is not None:
        return None
    return path


def covers_precision(
    model: Mapping[str, Any],
    held: Mapping[str, Any],
    described: Mapping[str, Any],
    backend: str,
    machine: Mapping[str, str],
) -> str | None:
    """Why a calibration file (its `model` and `machine` parts) does not cover a run in this precision on this
    chip, or None when it does. Limits sized in float32 say nothing of bfloat16, whose own rounding is larger
    than most kernels' error. A file that names no dtype was written before precision was recorded, when the
    built-in models ran in float32 alone: it covers a float32 run of a built-in model, nothing else. On a GPU,
    rounding also differs by chip and by MLX_ENABLE_TF32 (float32 matmuls at reduced precision): a file covers
    only the chip and the TF32 setting it was measured with."""
    run_dtype = described.get("dtype")
    file_dtype = model.get("dtype")
    if file_dtype is None and model.get("name") in BUILT_MODELS:
        file_dtype = ORACLE_DTYPE
    if not run_dtype or file_dtype != run_dtype:
        then, now = file_dtype or "an unrecorded precision", run_dtype or "an unknown one"
        return f"measured in {then}, this run computes in {now}"
    if backend in ("cpu", ""):
        return None  # one CPU's float32 and bfloat16 ops round alike: no chip or TF32 switch reaches them
    for fact in ("chip", "tf32"):
        if held.get(fact) is None or held.get(fact) != machine.get(fact):
            return (
                f"measured with {fact} {held.get(fact) or 'unrecorded'}, this run has {machine.get(fact) or 'unknown'}"
            )
    return None


def not_this_modules(doc: Mapping[str, Any], module: Path, lever: str | None) -> str | None:
    """Why the calibration `doc` beside `module` was not measured on it (None: it was): another module's
    file (copied or renamed), another lever, or the gate's lever, KNOWN_BAD or their local modules changed
    since (its gate digest, `GateSource`)."""
    named = doc.get("module")
    if isinstance(named, str) and Path(named).name != module.name:
        return f"it is the calibration of {named}, not of {module.name}"
    held = doc.get("lever")
    if lever is not None and isinstance(held, Mapping) and held.get("name") not in (None, lever):
        return f"it measured lever {held.get('name')!r}, this module's is {lever!r}"
    then = doc.get("gate")
    then_parts = then.get("parts") if isinstance(then, Mapping) else None
    now = GateSource.read(module).digest
    if not isinstance(then, Mapping) or then.get("digest") != now["digest"]:
        parts = then_parts if isinstance(then_parts, Mapping) else {}
        changed = sorted(n for n in set(parts) | set(now["parts"]) if parts.get(n) != now["parts"].get(n))
        what = ", ".join(changed) or "its gate digest"
        return f"the module's lever, KNOWN_BAD or their modules changed since it was measured ({what})"
    return None


def limits_not_shown(doc: Mapping[str, Any], bounds: Mapping[str, float], known_bad: bool) -> str | None:
    """Why the calibration `doc` does not show these KL limits (None: it does): one inside its A/A floor
    (`inside_floor`), or, where the module declares a known-bad (`known_bad`), the known-bad figures it
    recorded not shown to fail them (`known_bad_verdict`: the limits were loosened since, or the file holds
    no measurement of it)."""
    floors = doc.get("aa_floor")
    held = {str(k): float(v) for k, v in (floors.items() if isinstance(floors, Mapping) else ()) if _real(v)}
    noisy = inside_floor(bounds, held)
    if noisy:
        return f"{', '.join(noisy)} within {FLOOR_FACTOR:g}x its A/A floor"
    if not known_bad or not bounds:
        return None
    bad = doc.get("known_bad")
    if isinstance(bad, Mapping) and bad.get("non_finite"):
        return None  # NaN or inf logits: red whatever the limits
    drift = bad.get("drift") if isinstance(bad, Mapping) else None
    if not isinstance(drift, Mapping):
        return "it holds no measurement of the module's KNOWN_BAD"
    limits = [DeclaredLimit("", KL_ASSERTION, key, value) for key, value in bounds.items()]
    verdict, figures = known_bad_verdict(drift, limits)
    if verdict == "fail":
        return None
    return f"the known-bad it measured is not shown to fail these limits ({verdict}: {'; '.join(figures)})"


def inside_floor(bounds: Mapping[str, float], floors: Mapping[str, float]) -> list[str]:
    """The limits that sit within `FLOOR_FACTOR` x the floor (for agreement rates: whose disagreement
    does): a check against them would tell noise, not the lever."""
    out = []
    for key, limit in bounds.items():
        floor = floors.get(key)
        if floor is None or not math.isfinite(floor):
            continue
        if key in AGREEMENT_METRICS:
            if 1.0 - limit < FLOOR_FACTOR * (1.0 - floor):
                out.append(key)
        elif limit < FLOOR_FACTOR * floor:
            out.append(key)
    return out


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def model_label(described: Mapping[str, Any]) -> str:
    """How a verdict names the judged model: its built-in alias, else repo@commit as pinned."""
    name = described.get("name")
    if isinstance(name, str) and name in BUILT_MODELS:
        return name
    return str(described.get("pinned") or described.get("repo_id") or name or "the model")


def dtype_option(described: Mapping[str, Any]) -> str:
    """` --mlx-dtype D` for a run in another precision than the built-in models' float32 (calibrate in it)."""
    dtype = described.get("dtype")
    return f" --mlx-dtype {dtype}" if dtype and dtype != ORACLE_DTYPE else ""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
