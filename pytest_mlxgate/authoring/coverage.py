"""Which calibration file covers a run: the judged model's own file, measured on the same model commit, on
the same backend, in the same precision (and on a GPU, on the same chip with the same TF32 setting). Where
none does, the limits proof (`proof`) shows the limits work there first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.dtypes import ORACLE_DTYPE
from ..config.names import BUILT_MODELS
from ..models.device import backend_of
from .calibration_file import calibration_model, calibration_path, read_calibration

__all__ = ["covering_file", "covers_precision", "dtype_option", "model_label", "model_of"]


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
