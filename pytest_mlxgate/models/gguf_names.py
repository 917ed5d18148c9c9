"""A GGUF tensor's name as the mlx_lm model names its parameter, from a converter's two tables: the
per-layer tensors (after `blk.N.`) and the global ones. Both built-in models' converters use it."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["parameter_name"]


def parameter_name(base: str, layer_tensors: Mapping[str, str], global_tensors: Mapping[str, str]) -> str | None:
    """`blk.3.attn_q` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor the tables do not name."""
    if base.startswith("blk."):
        _, layer, kind = base.split(".", 2)
        if kind in layer_tensors:
            return f"model.layers.{int(layer)}.{layer_tensors[kind]}.weight"
    elif base in global_tensors:
        return f"{global_tensors[base]}.weight"
    return None
