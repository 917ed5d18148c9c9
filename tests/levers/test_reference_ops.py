"""The plain-ops references agree with mlx's fused kernels, and a patch lever really swaps them in.

Tolerances: in float32 both sides compute softmax(q·kᵀ·scale)·v with float32 accumulation; they
differ only in summation order (mlx's CPU fallback uses the same ops, the Metal kernel an online
softmax). With |q|,|k|,|v| ~ N(0, 1), D ≤ 128 and T_kv ≤ 64 the rounding is a few float32 ulps of
the O(1) outputs, ~1e-6; atol = rtol = 1e-5 leaves 10× headroom and still catches any semantic
slip (a wrong head mapping, mask offset or scale moves outputs by O(0.1)). In float16 mlx rounds
the scores to float16 (eps ≈ 1e-3) on scores up to ~5, so ~5e-3 in the weights and ≲ 2e-2 in
the outputs: atol = rtol = 2e-2 there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.levers.reference_ops import rms_norm, scaled_dot_product_attention

SDPA = "mlx.core.fast.scaled_dot_product_attention"
REF_SDPA = "pytest_mlxgate.reference_ops:scaled_dot_product_attention"


def _normal(shape: tuple[int, ...], key: int, dtype: Any = None) -> Any:
    import mlx.core as mx

    x = mx.random.normal(shape, key=mx.random.key(key))
    return x if dtype is None else x.astype(dtype)


def _close(a: Any, b: Any, tol: float) -> None:
    import mlx.core as mx

    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), atol=tol, rtol=tol)


CASES = [
    # B, N_q, N_kv, T_q, T_kv, D, mask
    (2, 4, 4, 7, 7, 32, None),
    (1, 8, 2, 9, 9, 64, "causal"),  # GQA, prefill
    (1, 8, 2, 1, 17, 64, None),  # decode: one query, many keys
    (1, 8, 1, 1, 17, 128, "causal"),  # MQA decode: causal must not hide any key
    (2, 4, 2, 5, 12, 32, "causal"),  # chunked prefill: causal aligned to the end
    (1, 4, 2, 6, 3, 16, "causal"),  # T_q > T_kv: the first rows see no key
    (2, 4, 2, 5, 12, 32, "bool"),
    (2, 4, 2, 5, 12, 32, "bool-per-head"),
    (2, 4, 2, 5, 12, 32, "additive"),
    (1, 6, 3, 4, 10, 32, "sinks"),
    (2, 4, 2, 1, 64, 128, "sinks-causal"),
]


def _mask(kind: str | None, b: int, n_q: int, q_len: int, k_len: int) -> tuple[Any, Any]:
    import mlx.core as mx

    if kind in (None, "causal"):
        return kind, None
    if kind == "bool":
        return mx.random.uniform(shape=(b, 1, q_len, k_len), key=mx.random.key(7)) > 0.3, None
    if kind == "bool-per-head":
        return mx.random.uniform(shape=(n_q, q_len, k_len), key=mx.random.key(8)) > 0.5, None
    if kind == "additive":
        return _normal((q_len, k_len), 9), None
    sinks = _normal((n_q,), 10)
    return ("causal" if kind == "sinks-causal" else None), sinks


@pytest.mark.parametrize(("b", "n_q", "n_kv", "q_len", "k_len", "d", "mask_kind"), CASES)
def test_sdpa_matches_fast_float32(b: int, n_q: int, n_kv: int, q_len: int, k_len: int, d: int,
                                   mask_kind: str | None) -> None:
    import mlx.core as mx

    q, k, v = _normal((b, n_q, q_len, d), 1), _normal((b, n_kv, k_len, d), 2), _normal((b, n_kv, k_len, d), 3)
    mask, sinks = _mask(mask_kind, b, n_q, q_len, k_len)
    scale = d**-0.5
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    got = scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    _close(got, expected, 1e-5)


def test_sdpa_semantics_differ_where_they_should() -> None:
    """The comparison above can fail: the causal mask and the GQA mapping both matter."""
    import mlx.core as mx

    q, k, v = _normal((1, 4, 5, 16), 1), _normal((1, 2, 8, 16), 2), _normal((1, 2, 8, 16), 3)
    causal = scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    assert not np.allclose(np.array(causal), np.array(scaled_dot_product_attention(q, k, v, scale=0.25)), atol=1e-3)
    # query head h reads kv head h // 2: swapping the kv heads changes the answer
    swapped = scaled_dot_product_attention(q, k[:, ::-1], v[:, ::-1], scale=0.25, mask="causal")
    assert not np.allclose(np.array(causal), np.array(swapped), atol=1e-3)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    _close(causal, expected, 1e-5)


def test_sdpa_float16() -> None:
    import mlx.core as mx

    q = _normal((1, 8, 6, 64), 1, mx.float16)
    k, v = _normal((1, 2, 20, 64), 2, mx.float16), _normal((1, 2, 20, 64), 3, mx.float16)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    got = scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert got.dtype == mx.float16
    _close(got, expected, 2e-2)


def test_sdpa_rejects_what_mlx_rejects() -> None:
    q, k = _normal((1, 3, 2, 8), 1), _normal((1, 2, 2, 8), 2)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        scaled_dot_product_attention(q, k, k, scale=1.0)
    with pytest.raises(ValueError, match="only string mask is 'causal'"):
        scaled_dot_product_attention(k, k, k, scale=1.0, mask="upper")


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_matches_fast(with_weight: bool) -> None:
    import mlx.core as mx

    x, w = _normal((3, 5, 96), 4), (_normal((96,), 5) if with_weight else None)
    _close(rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5), 1e-5)
    half = x.astype(mx.float16)
    _close(rms_norm(half, None, 1e-5), mx.fast.rms_norm(half, None, 1e-5), 2e-3)


# --- patched into a real mlx_lm model -----------------------------------------------------------


def tiny_llama(n_layers: int = 2, seed: int = 0) -> Any:
    """A random mlx_lm llama: 64 hidden, 4 query heads over 2 kv heads, vocab 256."""
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=n_layers, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
    ))
    mx.eval(model.parameters())
    return model


def _logits(model: Any, lever: Lever, arm: Any) -> np.ndarray:
    import mlx.core as mx

    x = mx.array(np.random.default_rng(3).integers(0, 256, 12), dtype=mx.int32)[None]
    with lever.applied(arm):
        out = model(x)
        mx.eval(out)
    return np.array(out[0])


calls = {"n": 0}


def counting_reference_sdpa(q: Any, k: Any, v: Any, *, scale: float, mask: Any = None, sinks: Any = None,
                            stream: Any = None) -> Any:
    calls["n"] += 1
    return scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks, stream=stream)


def wrong_scale_sdpa(q: Any, k: Any, v: Any, *, scale: float, mask: Any = None, sinks: Any = None,
                     stream: Any = None) -> Any:
    return scaled_dot_product_attention(q, k, v, scale=scale * 1.1, mask=mask, sinks=sinks, stream=stream)


def test_patch_lever_swaps_in_reference_sdpa() -> None:
    import mlx.core as mx

    model = tiny_llama()
    original = mx.fast.scaled_dot_product_attention
    lever = Lever("attention", "patch", SDPA, ref=REF_SDPA, cand=None, path="prefill")
    ref, cand = _logits(model, lever, "reference"), _logits(model, lever, "candidate")
    assert mx.fast.scaled_dot_product_attention is original
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(ref, cand, atol=1e-4, rtol=1e-4)

    counting = Lever("attention", "patch", SDPA, ref=counting_reference_sdpa, cand=None, path="prefill")
    calls["n"] = 0
    np.testing.assert_allclose(_logits(model, counting, "reference"), cand, atol=1e-4, rtol=1e-4)
    assert calls["n"] == 2  # once per layer: the model really went through the patched function
    assert mx.fast.scaled_dot_product_attention is original


def test_wrong_patch_changes_logits() -> None:
    model = tiny_llama()
    lever = Lever("attention", "patch", SDPA, ref=wrong_scale_sdpa, cand=None, path="prefill")
    ref, cand = _logits(model, lever, "reference"), _logits(model, lever, "candidate")
    assert np.abs(ref - cand).max() > 1e-3
