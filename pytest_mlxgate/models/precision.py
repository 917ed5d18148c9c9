"""The precision the arms compute in: a model as shipped, or cast to the dtype a run names (`--mlx-dtype`).

A kernel shipped in bfloat16 must be judged in bfloat16: in float32 most kernels here differ from their
plain-ops reference by nothing at all. The cast is the one `mlx_lm.convert --dtype` applies (floating
parameters only, by the model's own `cast_predicate`), done at load, so every model, built-in or from the
hub, can be run in any precision without a converted copy on disk. Quantized weights stay quantized:
only their scales, biases and the float parameters change. The names a run may ask for: `config.dtypes`.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

from ..config.dtypes import AUTO, ORACLE_DTYPE

__all__ = ["ORACLE_DTYPE", "cast_model", "float32_copy", "model_dtype"]


def model_dtype(model: Any) -> str:
    """The precision a model computes in: its first floating parameter's dtype (quantized weights are
    uint32; their scales say), or "unknown"."""
    leaves: Any = tree_flatten(model.parameters())
    for _, value in leaves:
        if mx.issubdtype(value.dtype, mx.floating):
            return str(value.dtype).rsplit(".", 1)[-1]
    return "unknown"


def cast_model(model: Any, dtype: str) -> Any:
    """`model` with its floating parameters in `dtype` (in place, as `mlx_lm.convert --dtype` casts them);
    `auto` leaves it as loaded. Returns the model."""
    if dtype == AUTO:
        return model
    target = getattr(mx, dtype)
    keep = getattr(model, "cast_predicate", lambda _path: True)

    def cast(path: str, value: Any) -> Any:
        if keep(path) and mx.issubdtype(value.dtype, mx.floating) and value.dtype != target:
            return value.astype(target)
        return value

    model.update(tree_map_with_path(cast, model.parameters()))
    mx.eval(model.parameters())
    return model


def float32_copy(model: Any) -> Any:
    """A second instance of `model` computing in float32: its float parameters upcast (lossless from bf16 and
    fp16), its quantized weights kept. The float32 oracle of a low-precision run; `model` is left as it is."""
    twin = copy.deepcopy(model)
    return cast_model(twin, ORACLE_DTYPE)
