"""Plain-ops references for mlx's fused kernels, to patch in as a lever's reference arm.

A fused kernel (Metal SDPA, fast RMSNorm, LayerNorm, RoPE) is the thing a perf lever changes, so
the gate needs the same maths written in ordinary, obviously-correct mlx ops, computed in float32
and cast once to the dtype the fused kernel returns. Use one with a patch lever, or swap the norms
and RoPE together with the `fast_ops` context factory (and `compiled` turns `mx.compile` off)::

    pytest.mark.mlx_lever("attention", patch="mlx.core.fast.scaled_dot_product_attention",
                          ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention", cand=None)
    pytest.mark.mlx_lever("fused_norms_rope", context="pytest_mlxgate.reference_ops:fast_ops",
                          ref="plain", cand="fused", path="serving")

mlx is imported inside each function: importing this module stays free.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from ..errors import LeverError
from .patching import patched

__all__ = ["FAST_OPS", "compiled", "fast_ops", "layer_norm", "rms_norm", "rope", "scaled_dot_product_attention"]


def scaled_dot_product_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    scale: float,
    mask: Any = None,
    sinks: Any = None,
    force_fused: bool = False,
    stream: Any = None,
) -> Any:
    """`mx.fast.scaled_dot_product_attention`, in plain ops, with the same arguments and semantics.

    q: [B, N_q, T_q, D]; k: [B, N_kv, T_kv, D]; v: [B, N_kv, T_kv, D_v], N_q a multiple of N_kv
    (GQA: query head h reads kv head h // (N_q // N_kv)). `mask` is None, "causal" (aligned to the
    end: query i sees keys <= i + T_kv - T_q), a boolean array (True = attend) or an additive
    array, broadcastable to [B, N_q, T_q, T_kv]. `sinks` [N_q] adds one logit per head as an extra
    softmax column with no value. `force_fused` is accepted and ignored: nothing here is fused.
    """
    import mlx.core as mx

    del force_fused
    if stream is not None:
        with mx.stream(stream):
            return _sdpa(mx, q, k, v, scale, mask, sinks)
    return _sdpa(mx, q, k, v, scale, mask, sinks)


def _sdpa(mx: Any, q: Any, k: Any, v: Any, scale: float, mask: Any, sinks: Any, *, low: bool = False) -> Any:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, N, T, D]; got shapes {q.shape}, {k.shape}, {v.shape}")
    n_q, n_kv = q.shape[1], k.shape[1]
    if n_kv == 0 or n_q % n_kv or v.shape[1] != n_kv:
        raise ValueError(f"query heads ({n_q}) must be a multiple of key/value heads ({n_kv}, {v.shape[1]})")
    out_dtype = mx.result_type(q, k, v)  # what mx.fast returns
    f32 = out_dtype if low else mx.float32  # `low`: every step in the inputs' precision (`low_precision`)
    if n_q != n_kv:
        k = mx.repeat(k, n_q // n_kv, axis=1)
        v = mx.repeat(v, n_q // n_kv, axis=1)
    scores = (q.astype(f32) * scale) @ k.astype(f32).swapaxes(-1, -2)  # [B, N_q, T_q, T_kv]
    q_len, k_len = scores.shape[-2], scores.shape[-1]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask {mask!r} is not supported; the only string mask is 'causal'")
        # aligned to the end; with T_q > T_kv the first rows see no key at all (uniform weights)
        mask = (mx.arange(q_len)[:, None] + (k_len - q_len)) >= mx.arange(k_len)[None, :]
    if mask is not None:
        if mask.ndim > 4:
            raise ValueError(f"mask has {mask.ndim} dimensions; at most 4 ([B, N, T_q, T_kv]) are allowed")
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(mx.finfo(f32).min, dtype=f32))
        else:
            scores = scores + mask.astype(f32)
    if sinks is not None:
        column = mx.broadcast_to(sinks.astype(f32).reshape(1, n_q, 1, 1), (*scores.shape[:-1], 1))
        weights = mx.softmax(mx.concatenate([column, scores], axis=-1), axis=-1)[..., 1:]
    else:
        weights = mx.softmax(scores, axis=-1)
    return (weights @ v.astype(f32)).astype(out_dtype)


def rms_norm(x: Any, weight: Any, eps: float, *, stream: Any = None) -> Any:
    """`mx.fast.rms_norm` in plain ops: x / sqrt(mean(x², last axis) + eps) * weight, in float32.

    `weight` may be None (no scaling), as in mlx; the result has x's and weight's promoted dtype.
    """
    import mlx.core as mx

    if stream is not None:
        with mx.stream(stream):
            return _rms_norm(mx, x, weight, eps)
    return _rms_norm(mx, x, weight, eps)


def _rms_norm(mx: Any, x: Any, weight: Any, eps: float, *, low: bool = False) -> Any:
    out_dtype = x.dtype if weight is None else mx.result_type(x, weight)
    compute = out_dtype if low else mx.float32
    x32 = x.astype(compute)
    y = x32 * mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(compute)
    return y.astype(out_dtype)


def layer_norm(x: Any, weight: Any, bias: Any, eps: float, *, stream: Any = None) -> Any:
    """`mx.fast.layer_norm` in plain ops: (x - mean) / sqrt(var + eps) * weight + bias, last axis, float32.

    `weight` and `bias` may be None (no scaling, no shift). The result's dtype is mlx's: x's and the
    weight's (and the bias's) promoted dtype; with no weight it is x's, even if a bias is given.
    """
    import mlx.core as mx

    if stream is not None:
        with mx.stream(stream):
            return _layer_norm(mx, x, weight, bias, eps)
    return _layer_norm(mx, x, weight, bias, eps)


def _layer_norm(mx: Any, x: Any, weight: Any, bias: Any, eps: float, *, low: bool = False) -> Any:
    if x.ndim == 0:
        raise ValueError("layer_norm: x must have at least 1 dimension (the normalized last axis); got a scalar")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and (param.ndim != 1 or param.shape[0] != x.shape[-1]):
            raise ValueError(
                f"layer_norm: {name} must be one-dimensional with x's last dimension ({x.shape[-1]}); "
                f"got shape {param.shape}"
            )
    if weight is None:
        out_dtype = x.dtype
    else:
        out_dtype = mx.result_type(x, weight) if bias is None else mx.result_type(x, weight, bias)
    if not mx.issubdtype(out_dtype, mx.floating):
        raise ValueError(f"layer_norm: the result dtype {out_dtype} is not a floating type; pass floating arrays")
    f32 = out_dtype if low else mx.float32
    x32 = x.astype(f32)
    centred = x32 - mx.mean(x32, axis=-1, keepdims=True)
    y = centred * mx.rsqrt(mx.mean(mx.square(centred), axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(f32)
    if bias is not None:
        y = y + bias.astype(f32)
    return y.astype(out_dtype)


def rope(
    a: Any,
    dims: int,
    *,
    traditional: bool,
    base: float | None,
    scale: float,
    offset: Any,
    freqs: Any = None,
    stream: Any = None,
) -> Any:
    """`mx.fast.rope` in plain ops, with the same arguments and semantics.

    `a` is (B, *, T, D); the first `dims` features of each position are rotated, the rest returned
    untouched. Position t of row b is p = (offset_b + t) * scale; pair i turns by p * inv_freq[i],
    inv_freq[i] = base ** (-i / (dims / 2)), or 1 / freqs[i] when `freqs` is given (exactly one of
    `base` and `freqs` is None). `traditional` pairs features (2i, 2i + 1); otherwise (i, i + dims/2).
    `offset` is an int, an integer scalar array, or an integer vector of B offsets, one per batch row.
    Angles and rotation in float32; the result has the input's dtype.
    """
    import mlx.core as mx

    how = dict(traditional=traditional, base=base, scale=scale, freqs=freqs)
    if stream is not None:
        with mx.stream(stream):
            return _rope(mx, a, dims, offset, **how)
    return _rope(mx, a, dims, offset, **how)


def _rope(
    mx: Any,
    a: Any,
    dims: int,
    offset: Any,
    *,
    traditional: bool,
    base: float | None,
    scale: float,
    freqs: Any,
    low: bool = False,
) -> Any:
    if (base is None) == (freqs is None):
        given = "both were given" if base is not None else "both are None"
        raise ValueError(f"rope: exactly one of base and freqs must be None; {given}")
    if a.ndim < 3:
        raise ValueError(f"rope: the input must be (B, *, T, D), at least 3 dimensions; got shape {a.shape}")
    if not mx.issubdtype(a.dtype, mx.floating):
        raise ValueError(f"rope: the input must be a floating type; got {a.dtype}")
    if dims <= 0 or dims % 2:
        raise ValueError(f"rope: dims must be positive and even (features are rotated in pairs); got {dims}")
    if dims > a.shape[-1]:
        raise ValueError(f"rope: dims ({dims}) must not exceed the input's last dimension ({a.shape[-1]})")
    f32 = mx.float32
    half = dims // 2
    if freqs is not None:
        if freqs.ndim != 1 or freqs.shape[0] != half:
            raise ValueError(
                f"rope: freqs must be one-dimensional with dims / 2 = {half} entries; got shape {freqs.shape}"
            )
        inv_freqs = 1.0 / freqs.astype(f32)
    else:
        assert base is not None
        inv_freqs = mx.array([base ** (-i / half) for i in range(half)], dtype=f32)
    batch, length = a.shape[0], a.shape[-2]
    offsets = _rope_offsets(mx, offset, batch)
    positions = (mx.arange(length, dtype=f32) + offsets[..., None]) * scale  # (T,) or (B, T)
    if positions.ndim == 2:  # one row of positions per batch row, broadcast over the middle axes
        positions = positions.reshape(batch, *([1] * (a.ndim - 3)), length)
    theta = positions[..., None] * inv_freqs  # (..., T, dims / 2)
    cos, sin = mx.cos(theta), mx.sin(theta)
    if low:  # the angles in float32 (a table, as composed RoPE keeps it), the rotation in the input's precision
        cos, sin = cos.astype(a.dtype), sin.astype(a.dtype)
    x = a if low else a.astype(f32)
    if traditional:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
    else:
        x1, x2 = x[..., :half], x[..., half:dims]
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if traditional:
        rotated = mx.stack([r1, r2], axis=-1).reshape(*r1.shape[:-1], dims)
    else:
        rotated = mx.concatenate([r1, r2], axis=-1)
    rotated = rotated.astype(a.dtype)
    if dims == a.shape[-1]:
        return rotated
    return mx.concatenate([rotated, a[..., dims:]], axis=-1)


def _rope_offsets(mx: Any, offset: Any, batch: int) -> Any:
    """The offset as float32: a scalar, or a (B,) vector with one offset per batch row."""
    if not isinstance(offset, mx.array):
        if isinstance(offset, bool) or not hasattr(type(offset), "__index__"):  # an int, numpy's included
            raise ValueError(f"rope: offset must be an int or an integer array; got {type(offset).__name__} {offset!r}")
        return mx.array(operator.index(offset), dtype=mx.float32)
    if offset.ndim > 1:
        raise ValueError(f"rope: offset must be a scalar or a vector of B offsets; got shape {offset.shape}")
    if offset.size not in (1, batch):
        raise ValueError(f"rope: offset must be a scalar or a vector of B = {batch} offsets; got shape {offset.shape}")
    if not mx.issubdtype(offset.dtype, mx.integer):
        raise ValueError(f"rope: offset must be an integer; got dtype {offset.dtype}")
    offsets = offset.astype(mx.float32)
    return offsets.reshape(()) if offset.size == 1 else offsets


# --- the plain low-precision path: the same ops in the inputs' own precision ---------------------------


def low_precision(fn: Any) -> Any:
    """The plain low-precision twin of one of these references: the same composed ops with every step in the
    inputs' precision (a bf16 composed norm, attention with bf16 scores and softmax; RoPE's angle table kept in
    float32), what plain low-precision code costs, which the site check (`kl.site`) holds a kernel to. The
    references themselves compute in float32 inside: near the oracle, no fair yardstick. Anything else: itself."""
    return _LOW_PRECISION.get(fn, fn)


def _sdpa_low(q: Any, k: Any, v: Any, *, scale: float, mask: Any = None, sinks: Any = None, **_: Any) -> Any:
    import mlx.core as mx

    return _sdpa(mx, q, k, v, scale, mask, sinks, low=True)


def _rms_norm_low(x: Any, weight: Any, eps: float, **_: Any) -> Any:
    import mlx.core as mx

    return _rms_norm(mx, x, weight, eps, low=True)


def _layer_norm_low(x: Any, weight: Any, bias: Any, eps: float, **_: Any) -> Any:
    import mlx.core as mx

    return _layer_norm(mx, x, weight, bias, eps, low=True)


def _rope_low(
    a: Any, dims: int, *, traditional: bool, base: float | None, scale: float, offset: Any, freqs: Any = None, **_: Any
) -> Any:
    import mlx.core as mx

    return _rope(mx, a, dims, offset, traditional=traditional, base=base, scale=scale, freqs=freqs, low=True)


_LOW_PRECISION: dict[Any, Any] = {
    scaled_dot_product_attention: _sdpa_low,
    rms_norm: _rms_norm_low,
    layer_norm: _layer_norm_low,
    rope: _rope_low,
}


# --- the fast_ops lever: mlx's fused norms and RoPE, or these references --------------------------

#: The fused ops `fast_ops` can swap, each at `mlx.core.fast.<name>`.
FAST_OPS = ("rms_norm", "layer_norm", "rope")


def fast_ops(value: object) -> AbstractContextManager[None]:
    """A lever context factory: "fused" (or None) runs mlx's fused kernels, "plain" patches
    `mx.fast.rms_norm`, `layer_norm` and `rope` with the references here, and a comma-separated
    subset ("rms_norm,rope") patches only those. Everything is restored on exit, raise or not::

        pytest.mark.mlx_lever("fused_norms_rope", context="pytest_mlxgate.reference_ops:fast_ops",
                              ref="plain", cand="fused", path="serving")
    """
    names = _fast_op_names(value)
    return _plain_fast_ops(names) if names else nullcontext()


def _fast_ops_sites(reference: object, candidate: object) -> list[tuple[str, Any, Any]]:
    """The functions `fast_ops` swaps, each as (target, the reference arm's, the candidate arm's): what the
    site check (`kl.site`) judges against their float32 oracle."""
    import mlx.core as mx

    plain = {"rms_norm": rms_norm, "layer_norm": layer_norm, "rope": rope}
    ref_names, cand_names = set(_fast_op_names(reference)), set(_fast_op_names(candidate))
    return [
        (
            f"mlx.core.fast.{name}",
            plain[name] if name in ref_names else getattr(mx.fast, name),
            plain[name] if name in cand_names else getattr(mx.fast, name),
        )
        for name in FAST_OPS
    ]


fast_ops.sites = _fast_ops_sites  # type: ignore[attr-defined]  # read by kl.site.lever_sites


def _fast_op_names(value: object) -> tuple[str, ...]:
    """The ops to patch: () for mlx's kernels, all of FAST_OPS for "plain", or the subset named."""
    if value is None:
        return ()
    if isinstance(value, str):
        if value in ("fused", "plain"):
            return () if value == "fused" else FAST_OPS
        names = [part.strip() for part in value.split(",")]
        if all(name in FAST_OPS for name in names):
            return tuple(dict.fromkeys(names))
    raise LeverError(
        f"fast_ops value {value!r} is not one of 'fused' (or None: mlx's kernels), 'plain' (all of "
        f"{', '.join(FAST_OPS)} as plain ops) or a comma-separated subset of {', '.join(FAST_OPS)} "
        "(e.g. 'rms_norm,rope')"
    )


@contextmanager
def _plain_fast_ops(names: tuple[str, ...]) -> Iterator[None]:
    references = {"rms_norm": rms_norm, "layer_norm": layer_norm, "rope": rope}
    with ExitStack() as stack:
        for name in names:
            stack.enter_context(patched("fast_ops", f"mlx.core.fast.{name}", references[name]))
        yield


def compiled(value: object) -> AbstractContextManager[None]:
    """A lever context factory for `mx.compile`: "on" (or None) runs compiled functions as they
    ship (mlx_lm wraps its activations, gemma's softcaps, ... in `mx.compile`; mlx.nn some of its
    own); "off" runs every one of them op by op, through `mx.disable_compile()` for the arm::

        pytest.mark.mlx_lever("mx_compile", context="pytest_mlxgate.reference_ops:compiled",
                              ref="off", cand="on", path="serving")

    On exit compilation is on again unless MLX_DISABLE_COMPILE turned it off for the process
    (mlx has no getter for the switch: the environment variable is the only other setter).
    """
    if value is None or value == "on":
        return nullcontext()
    if value == "off":
        return _compile_disabled()
    raise LeverError(
        f"compiled value {value!r} is not 'on' (or None: mx.compile as it ships) or 'off' "
        "(every compiled function run op by op)"
    )


@contextmanager
def _compile_disabled() -> Iterator[None]:
    import mlx.core as mx

    mx.disable_compile()
    try:
        yield
    finally:
        if not os.environ.get("MLX_DISABLE_COMPILE"):
            mx.enable_compile()
