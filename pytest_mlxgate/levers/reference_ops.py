"""Plain-ops references for mlx's fused kernels, to patch in as a lever's reference arm.

A fused kernel (Metal SDPA, fast RMSNorm) is the thing a perf lever changes, so the gate needs
the same maths written in ordinary, obviously-correct mlx ops: matmul and softmax in float32,
the result cast to the dtype the fused kernel returns (the inputs' promoted dtype). Use them with
a patch lever, e.g.::

    pytest.mark.mlx_lever("attention", patch="mlx.core.fast.scaled_dot_product_attention",
                          ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention", cand=None)

mlx is imported inside each function: importing this module stays free.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rms_norm", "scaled_dot_product_attention"]


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


def _sdpa(mx: Any, q: Any, k: Any, v: Any, scale: float, mask: Any, sinks: Any) -> Any:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, N, T, D]; got shapes {q.shape}, {k.shape}, {v.shape}")
    n_q, n_kv = q.shape[1], k.shape[1]
    if n_kv == 0 or n_q % n_kv or v.shape[1] != n_kv:
        raise ValueError(f"query heads ({n_q}) must be a multiple of key/value heads ({n_kv}, {v.shape[1]})")
    out_dtype = mx.result_type(q, k, v)  # what mx.fast returns
    f32 = mx.float32
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


def _rms_norm(mx: Any, x: Any, weight: Any, eps: float) -> Any:
    out_dtype = x.dtype if weight is None else mx.result_type(x, weight)
    x32 = x.astype(mx.float32)
    y = x32 * mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(mx.float32)
    return y.astype(out_dtype)
