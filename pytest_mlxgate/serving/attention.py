"""Attention over a quantized KV cache whose keys and values have widths of their own (a K8/V4 plan).

mlx_lm's `scaled_dot_product_attention` sends every cache with a `bits` attribute to
`quantized_scaled_dot_product_attention(..., group_size=cache.group_size, bits=cache.bits)`: one width
for the keys' matmul and the values'. A cache that stores them apart calls `read_widths_in_attention()`
when it is made: from then on, in this process, mlx_lm's function is `width_reading_attention`, which
reads each operand's width from its packed parts and hands a pair of equal widths to mlx_lm's own
function, unchanged (so every plan with one width computes exactly what it did), and does the two
quantized matmuls at their own widths otherwise. Every model mlx_lm has goes through that one function,
so every architecture and every loop (one prompt, the batch, mlx_lm's own) gets it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import base

from ..errors import LeverError

__all__ = ["is_mlx_lms_own", "packed_width", "read_widths_in_attention", "width_reading_attention"]

#: The name of mlx_lm's own quantized attention (one width for keys and values) in `mlx_lm.models.base`.
_NAME = "quantized_scaled_dot_product_attention"


def is_mlx_lms_own(function: object) -> bool:
    """`function` is mlx_lm's own quantized attention: the function defined under that name in
    `mlx_lm.models.base`'s own source file, not whatever that name was bound to when this module was
    imported (a conftest's kernel installed before then would otherwise pass for mlx_lm's)."""
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and getattr(function, "__module__", None) == base.__name__
        and getattr(function, "__qualname__", None) == _NAME
        and code.co_filename == base.__file__
    )


#: mlx_lm's own quantized attention, where it is bound at import (else found when first replaced).
_ONE_WIDTH: Any = getattr(base, _NAME) if is_mlx_lms_own(getattr(base, _NAME)) else None


def packed_width(parts: tuple[Any, Any, Any], group_size: int) -> int:
    """The bits per value of `mx.quantize`'s output `(packed, scales, biases)`: D values in groups of
    `group_size` leave D / group_size scales, and pack into D * bits / 32 words."""
    packed, scales = parts[0], parts[1]
    words, values = int(packed.shape[-1]) * 32, int(scales.shape[-1]) * group_size
    if words % values or not 2 <= words // values <= 8:
        raise LeverError(
            f"quantized parts of {packed.shape[-1]} words and {scales.shape[-1]} scales at group size {group_size} "
            f"hold {words / values:g} bits a value, which mx.quantize never makes (2 to 8): the "
            "cache's keys or values were not made by mx.quantize at this group size"
        )
    return words // values


def width_reading_attention(
    queries: Any,
    q_keys: tuple[Any, Any, Any],
    q_values: tuple[Any, Any, Any],
    scale: float,
    mask: Any,
    group_size: int = 64,
    bits: int = 8,
) -> Any:
    """mlx_lm's quantized attention, with the keys and the values each at the width they are stored at
    (`bits`, the one width mlx_lm passes, is not read: the parts say)."""
    k_bits, v_bits = packed_width(q_keys, group_size), packed_width(q_values, group_size)
    if k_bits == v_bits:
        return _ONE_WIDTH(queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=k_bits)
    return _attention_apart(queries, q_keys, q_values, scale, mask, group_size, k_bits, v_bits)


def _attention_apart(
    queries: Any,
    q_keys: tuple[Any, Any, Any],
    q_values: tuple[Any, Any, Any],
    scale: float,
    mask: Any,
    group_size: int,
    k_bits: int,
    v_bits: int,
) -> Any:
    """mlx_lm's quantized attention step by step (scores and softmax in its precision), each half read at
    its own width: at one width, exactly what mlx_lm computes."""
    batch, q_heads, length, dim = queries.shape
    kv_heads = q_keys[0].shape[-3]
    repeats = q_heads // kv_heads
    queries = queries * scale
    if repeats > 1:  # grouped-query attention: each K/V head serves `repeats` query heads
        queries = mx.reshape(queries, (batch, kv_heads, repeats, length, dim))
        q_keys = tuple(mx.expand_dims(p, -3) for p in q_keys)  # type: ignore[assignment]
        q_values = tuple(mx.expand_dims(p, -3) for p in q_values)  # type: ignore[assignment]
    scores = mx.quantized_matmul(queries, *q_keys, transpose=True, group_size=group_size, bits=k_bits)
    scores = _masked(scores, mask, grouped=repeats > 1)
    weights = mx.softmax(scores, axis=-1, precise=True)
    out = mx.quantized_matmul(weights, *q_values, transpose=False, group_size=group_size, bits=v_bits)
    if repeats > 1:
        out = mx.reshape(out, (batch, q_heads, length, out.shape[-1]))
    return out


def _masked(scores: Any, mask: Any, *, grouped: bool) -> Any:
    """`scores` under mlx_lm's attention masks: None, "causal" (the last queries against every key),
    a boolean array (False: hidden) or an additive one."""
    if mask is None:
        return scores
    if isinstance(mask, str):
        queries, keys = scores.shape[-2:]
        mask = mx.arange(keys - queries, keys)[:, None] >= mx.arange(keys)[None]
    if grouped and mask.ndim > 3:
        mask = mx.expand_dims(mask, -3)
    if mask.dtype == mx.bool_:
        return mx.where(mask, scores, mx.finfo(scores.dtype).min)
    return scores + mask


def read_widths_in_attention() -> None:
    """Put `width_reading_attention` in mlx_lm's place (once; a no-op after). Called by each cache that
        stores keys and values at different widths, before any attention can read it. LeverError where
        something else (a lever's own kernel) holds the place, however early it was put there (`is_mlx_lms_own`):
    it would read both at one width, or be displaced by this one unseen."""
    global _ONE_WIDTH
    now = base.quantized_scaled_dot_product_attention
    if now is width_reading_attention:
        return
    if not is_mlx_lms_own(now):
        where = f"{getattr(now, '__module__', '?')}.{getattr(now, '__qualname__', now)}"
        raise LeverError(
            f"mlx_lm.models.base.quantized_scaled_dot_product_attention is {where!r}, not mlx_lm's own: a KV "
            "plan with keys and values at different widths (k_bits != v_bits) needs mlxgate's width-reading "
            "attention there, which would displace that kernel unseen. Run that lever with a plan of one width "
            "per layer, or gate that kernel in a run of its own"
        )
    _ONE_WIDTH = now
    base.quantized_scaled_dot_product_attention = width_reading_attention
