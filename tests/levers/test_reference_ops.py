"""The plain-ops references agree with mlx's fused kernels, and a patch lever really swaps them in.

Tolerances: in float32 both sides compute softmax(q·kᵀ·scale)·v with float32 accumulation; they
differ only in summation order (mlx's CPU fallback uses the same ops, the Metal kernel an online
softmax). With |q|,|k|,|v| ~ N(0, 1), D ≤ 128 and T_kv ≤ 64 the rounding is a few float32 ulps of
the O(1) outputs, ~1e-6; atol = rtol = 1e-5 leaves 10× headroom and still catches any semantic
slip (a wrong head mapping, mask offset or scale moves outputs by O(0.1)). In float16 mlx rounds
the scores to float16 (eps ≈ 1e-3) on scores up to ~5, so ~5e-3 in the weights and ≲ 2e-2 in
the outputs: atol = rtol = 2e-2 there.

RoPE (u: the unit roundoff, 2⁻²⁴ float32, 2⁻¹¹ float16, 2⁻⁸ bfloat16; r: the norm of the pair an
element belongs to; θ: the largest angle, max |position · scale · inv_freq|). Turning a pair by an
angle off by δ moves it by r·δ. Both sides form the angle as the same float32 position times a
float32 inverse frequency. With `freqs` that is 1/freqs on both; with `base` mlx takes
exp(-a), a = i·ln(base)/(dims/2), in float32 (relative error ≤ u₃₂·(2a + 1)) where the reference
rounds base^(-i/(dims/2)) once: the angles differ by ≤ u₃₂·θ·(2a + 4)·e^(-a) ≤ 4·u₃₂·θ, and each
is within 3·u₃₂·θ of the float64 formula. The rotation rounds ≤ 3·u·r on mlx's CPU fallback, which
casts cos and sin to the input dtype and rotates in it (two products and a sum, each rounded), and
u·r here (float32, then one cast). So |ours − mx.fast| ≤ r·(4·u + 4·u₃₂·(1 + θ)) to first order;
the tests allow r·(8·u + 8·u₃₂·(1 + θ)) (2× headroom; 3000 cases reach 0.3 of it) plus the dtype's
smallest normal. The reference is within r·(u + 3·u₃₂·(1 + θ)) of the float64 formula: tested at
r·(1.5·u + 8·u₃₂·(1 + θ)) (reached: 0.66), which a rotation in the input dtype exceeds. A semantic
slip (wrong pairing, offset off by one, base and scale mixed up) moves the first pairs by O(r).
With offsets up to 2048 and scale ≤ 2 the angle term dominates in float32 (8·u₃₂·θ ≈ 2e-3 at θ ≈ 4100);
at position 0 it vanishes. The invariants (pair norms, shifts, pairings: the very same angles) are
tested at r·(4·u + 8·u₃₂).

LayerNorm: both sides normalise in float32 with the same ops, so in float32 on the CPU they agree
bit for bit; in float16/bfloat16 mlx's fallback rounds the normalised value, its product with the
weight and the sum with the bias each to the output dtype (3 roundings) where the reference rounds
once: |ours − mx.fast| ≤ u·(4·|y·w| + 2·|b|), y the normalised value; allowed 8·u·(|y·w| + |b|)
(reached: 0.3 of it).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytest_mlxgate.levers.reference_ops as ro
import pytest_mlxgate.reference_ops as compat
from pytest_mlxgate.errors import LeverError
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.levers.reference_ops import fast_ops, layer_norm, rms_norm, rope, scaled_dot_product_attention

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
def test_sdpa_matches_fast_float32(
    b: int, n_q: int, n_kv: int, q_len: int, k_len: int, d: int, mask_kind: str | None
) -> None:
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
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=n_layers,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=256,
        )
    )
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


def counting_reference_sdpa(
    q: Any, k: Any, v: Any, *, scale: float, mask: Any = None, sinks: Any = None, stream: Any = None
) -> Any:
    calls["n"] += 1
    return scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks, stream=stream)


def wrong_scale_sdpa(
    q: Any, k: Any, v: Any, *, scale: float, mask: Any = None, sinks: Any = None, stream: Any = None
) -> Any:
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


# --- RoPE ---------------------------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16"]
#: Unit roundoff: half the distance from 1 to the next number of the dtype.
UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
U32 = UNIT["float32"]


def _f64(a: Any) -> np.ndarray:
    import mlx.core as mx

    return np.array(a.astype(mx.float32), dtype=np.float64)


def _bits(a: Any) -> np.ndarray:
    """The raw bits, for comparisons that must be exact (bfloat16 has no numpy dtype)."""
    import mlx.core as mx

    return np.array(a.view(mx.uint32 if a.dtype == mx.float32 else mx.uint16))


def _tiny(dtype: str) -> float:
    """The smallest normal number: the absolute floor under a relative bound."""
    return {"float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}[dtype]


@st.composite
def rope_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Shapes (B, T, D) and (B, H, T, D), dims < D (odd D too) and == D, both pairings, base or freqs,
    scale ≠ 1, int / scalar-array / size-1 / per-batch offsets, three dtypes; the data from a seed."""
    batch, length, d = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(2, 40))
    shape = (batch, length, d) if draw(st.booleans()) else (batch, draw(st.integers(1, 3)), length, d)
    dims = d - d % 2 if draw(st.booleans()) else 2 * draw(st.integers(1, d // 2))
    kind = draw(st.sampled_from(["int", "scalar", "size1", "vector"]))
    values = draw(st.lists(st.integers(-8, 2048), min_size=batch, max_size=batch))
    return {
        "shape": shape,
        "dims": dims,
        "traditional": draw(st.booleans()),
        "base": draw(st.sampled_from([None, 10000.0, 500000.0, 1e6, 100.0])),
        "scale": draw(st.sampled_from([1.0, 0.5, 0.25, 2.0, 1 / 8, 0.37])),
        "offset_kind": kind,
        "offsets": values if kind == "vector" else values[:1],
        "offset_dtype": draw(st.sampled_from(["int32", "int64", "uint16"])) if kind != "int" else None,
        "dtype": draw(st.sampled_from(DTYPES)),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "amplitude": draw(st.sampled_from([1.0, 0.01, 30.0])),
    }


def _rope_inputs(case: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The input array and rope's keyword arguments (dims included) for one case."""
    import mlx.core as mx

    rng = np.random.default_rng(case["seed"])
    x = mx.array((rng.standard_normal(case["shape"]) * case["amplitude"]).astype(np.float32))
    offsets = case["offsets"] if case["offset_dtype"] != "uint16" else [abs(o) for o in case["offsets"]]
    offset: Any
    if case["offset_kind"] == "int":
        offset = offsets[0]
    else:
        dtype = getattr(mx, case["offset_dtype"])
        offset = mx.array(offsets[0] if case["offset_kind"] == "scalar" else offsets, dtype=dtype)
    freqs = None
    if case["base"] is None:  # positive, from fast (period ~3 positions) to slow, like llama3's scaled ones
        freqs = mx.array(np.exp(rng.uniform(np.log(0.5), np.log(1e5), case["dims"] // 2)).astype(np.float32))
    kwargs = {
        "dims": case["dims"],
        "traditional": case["traditional"],
        "base": case["base"],
        "scale": case["scale"],
        "offset": offset,
        "freqs": freqs,
    }
    return x.astype(getattr(mx, case["dtype"])), kwargs


def _call_rope(op: Callable[..., Any], x: Any, kwargs: dict[str, Any]) -> Any:
    kw = dict(kwargs)
    return op(x, kw.pop("dims"), **kw)


def _exact_rope(x: Any, kwargs: dict[str, Any]) -> np.ndarray:
    """The documented formula in float64 numpy, on the (already rounded) input values."""
    import mlx.core as mx

    xs = _f64(x)
    dims, half, length = kwargs["dims"], kwargs["dims"] // 2, xs.shape[-2]
    if kwargs["freqs"] is None:
        inv = kwargs["base"] ** (-np.arange(half) / half)
    else:
        inv = 1.0 / np.array(kwargs["freqs"], dtype=np.float64)
    offset = kwargs["offset"]
    offsets = np.array(offset, dtype=np.float64) if isinstance(offset, mx.array) else np.float64(offset)
    offsets = offsets.reshape(-1, *([1] * (xs.ndim - 2)))  # (1 or B, 1.., 1): one per batch row
    theta = ((np.arange(length) + offsets) * kwargs["scale"])[..., None] * inv  # (B|1, 1.., T, half)
    cos, sin = np.cos(theta), np.sin(theta)
    first, second = (
        (slice(0, dims, 2), slice(1, dims, 2)) if kwargs["traditional"] else (slice(0, half), slice(half, dims))
    )
    out = xs.copy()
    out[..., first] = xs[..., first] * cos - xs[..., second] * sin
    out[..., second] = xs[..., first] * sin + xs[..., second] * cos
    return out


def _pair_norm(x: Any, kwargs: dict[str, Any]) -> np.ndarray:
    """For each rotated element, the norm r of the pair it rotates with (shape (..., dims))."""
    xs, dims = _f64(x), kwargs["dims"]
    half = dims // 2
    if kwargs["traditional"]:
        r = np.hypot(xs[..., 0:dims:2], xs[..., 1:dims:2])
        return np.repeat(r, 2, axis=-1)
    r = np.hypot(xs[..., :half], xs[..., half:dims])
    return np.concatenate([r, r], axis=-1)


def _max_angle(x: Any, kwargs: dict[str, Any]) -> float:
    import mlx.core as mx

    offset = kwargs["offset"]
    offsets = np.array(offset, dtype=np.float64).ravel() if isinstance(offset, mx.array) else np.array([offset])
    length = x.shape[-2]
    position = max(abs(offsets.min()), abs(offsets.max() + length - 1)) * abs(kwargs["scale"])
    inv = 1.0 if kwargs["freqs"] is None else float(np.max(1.0 / np.array(kwargs["freqs"], dtype=np.float64)))
    return float(position * inv)


def _rope_tolerance(x: Any, kwargs: dict[str, Any], dtype: str, roundings: float = 8) -> np.ndarray:
    """r·(roundings·u + 8·u₃₂·(1 + θ)) + tiny: the module docstring's bounds with headroom."""
    theta = _max_angle(x, kwargs)
    return _pair_norm(x, kwargs) * (roundings * UNIT[dtype] + 8 * U32 * (1 + theta)) + _tiny(dtype)


def _assert_within(got: Any, expected: np.ndarray, tol: np.ndarray, what: str) -> None:
    err = np.abs(_f64(got) - expected)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), f"{what}: |error| {err[worst]:.3g} > tolerance {tol[worst]:.3g} at {worst}"


@settings(max_examples=150, deadline=None)
@given(rope_cases())
def test_rope_matches_fast(case: dict[str, Any]) -> None:
    import mlx.core as mx

    x, kwargs = _rope_inputs(case)
    expected, got = _call_rope(mx.fast.rope, x, kwargs), _call_rope(rope, x, kwargs)
    assert got.shape == expected.shape == x.shape and got.dtype == expected.dtype == x.dtype
    dims = kwargs["dims"]
    tol = _rope_tolerance(x, kwargs, case["dtype"])
    _assert_within(got[..., :dims], _f64(expected[..., :dims]), tol, "reference vs mx.fast.rope")
    # the features past dims come back bit for bit, from both
    for out in (got, expected):
        assert (_bits(out[..., dims:]) == _bits(x[..., dims:])).all()


@settings(max_examples=100, deadline=None)
@given(rope_cases())
def test_rope_matches_the_documented_formula(case: dict[str, Any]) -> None:
    """Both agree with the docstring's maths in float64 numpy; the reference, rotating in float32 and
    rounding once, within r·(1.5·u + 8·u₃₂·(1 + θ)), which a rotation in the input dtype exceeds."""
    import mlx.core as mx

    x, kwargs = _rope_inputs(case)
    exact, dims, dtype = _exact_rope(x, kwargs)[..., : kwargs["dims"]], kwargs["dims"], case["dtype"]
    fast = _call_rope(mx.fast.rope, x, kwargs)[..., :dims]
    _assert_within(fast, exact, _rope_tolerance(x, kwargs, dtype), "mx.fast.rope vs float64 formula")
    got = _call_rope(rope, x, kwargs)[..., :dims]
    _assert_within(got, exact, _rope_tolerance(x, kwargs, dtype, roundings=1.5), "reference vs float64 formula")


@settings(max_examples=80, deadline=None)
@given(rope_cases(), st.data())
def test_rope_invariants(case: dict[str, Any], data: st.DataObject) -> None:
    """A rotation keeps each pair's norm; a later window, one batch row at its own offset, and the
    traditional pairing as a permutation of the halves pairing all give the same numbers (within
    rounding: r·(4·u + 8·u₃₂), no angle term, since these compute the very same angles)."""
    import mlx.core as mx

    x, kwargs = _rope_inputs(case)
    dtype, dims = case["dtype"], kwargs["dims"]
    rounding = _pair_norm(x, kwargs) * (4 * UNIT[dtype] + 8 * U32) + _tiny(dtype)
    out = _call_rope(rope, x, kwargs)

    # each rotated pair keeps its norm, whatever the angle
    norm_error = np.abs(_pair_norm(out, kwargs) - _pair_norm(x, kwargs))
    assert (norm_error <= rounding).all(), f"a pair's norm moved by {norm_error.max():.3g}"

    # rope of rows s.. at offset o + s equals rows s.. of rope at offset o
    start = data.draw(st.integers(0, x.shape[-2] - 1), label="start")
    offset = kwargs["offset"]
    window = _call_rope(rope, x[..., start:, :], {**kwargs, "offset": offset + start})
    _assert_within(window[..., :dims], _f64(out[..., start:, :dims]), rounding[..., start:, :], "later window")

    # with one offset per batch row, row b is rope of that row alone at its own offset
    if isinstance(offset, mx.array) and offset.size > 1:
        b = data.draw(st.integers(0, x.shape[0] - 1), label="row")
        alone = _call_rope(rope, x[b : b + 1], {**kwargs, "offset": int(offset[b].item())})
        _assert_within(alone[..., :dims], _f64(out[b : b + 1, ..., :dims]), rounding[b : b + 1], "one batch row")

    # traditional pairs (2i, 2i + 1) are the halves pairs (i, i + dims/2) of the de-interleaved features
    perm = np.concatenate([np.arange(0, dims, 2), np.arange(1, dims, 2), np.arange(dims, x.shape[-1])])
    halves = _call_rope(rope, x[..., mx.array(perm)], {**kwargs, "traditional": False})
    traditional = _call_rope(rope, x, {**kwargs, "traditional": True})
    traditional_rounding = _pair_norm(x, {**kwargs, "traditional": True}) * (4 * UNIT[dtype] + 8 * U32) + _tiny(dtype)
    _assert_within(
        halves[..., mx.array(np.argsort(perm))][..., :dims],
        _f64(traditional[..., :dims]),
        traditional_rounding,
        "traditional vs de-interleaved halves",
    )


def test_rope_position_zero_is_the_identity() -> None:
    """cos 0 = 1 and sin 0 = 0 exactly: the first position at offset 0 comes back bit for bit."""
    import mlx.core as mx

    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        x = _normal((2, 3, 4, 16), 11, dtype)
        for traditional in (False, True):
            out = rope(x, 16, traditional=traditional, base=10000.0, scale=0.5, offset=0)
            assert (_bits(out[..., 0, :]) == _bits(x[..., 0, :])).all()
            assert not (_bits(out[..., 1, :]) == _bits(x[..., 1, :])).all()


# --- LayerNorm ----------------------------------------------------------------------------------


@st.composite
def layer_norm_cases(draw: st.DrawFn) -> dict[str, Any]:
    """1-D to 3-D inputs, with or without weight and bias (in x's dtype or float32), a mean shift."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=2))) + (draw(st.integers(1, 96)),)
    dtype = draw(st.sampled_from(DTYPES))
    param_dtype = draw(st.sampled_from([dtype, "float32"]))
    return {
        "shape": shape,
        "dtype": dtype,
        "weight": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "param_dtype": param_dtype,
        "eps": draw(st.sampled_from([1e-5, 1e-6, 1e-3, 0.1])),
        "shift": draw(st.sampled_from([0.0, 1.0, -4.0])),
        "scale": draw(st.sampled_from([1.0, 0.01, 30.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _layer_norm_inputs(case: dict[str, Any]) -> tuple[Any, Any, Any]:
    import mlx.core as mx

    rng = np.random.default_rng(case["seed"])
    x = (rng.standard_normal(case["shape"]) + case["shift"]) * case["scale"]
    d = case["shape"][-1]
    pdt = getattr(mx, case["param_dtype"])
    weight = mx.array(rng.uniform(0.5, 2.0, d) * rng.choice([-1, 1], d)).astype(pdt) if case["weight"] else None
    bias = mx.array(rng.standard_normal(d)).astype(pdt) if case["bias"] else None
    return mx.array(x).astype(getattr(mx, case["dtype"])), weight, bias


def _exact_layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In float64: the formula y·w + b; |y·w| + |b|, what rounding the result scales with; and
    |w|·(1 + |y|), what an error in the mean (absolute, in units of std) or the std (relative) scales with."""
    xs = _f64(x)
    centred = xs - xs.mean(axis=-1, keepdims=True)
    y = centred / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    w = np.float64(1.0) if weight is None else _f64(weight)
    b = np.float64(0.0) if bias is None else _f64(bias)
    return y * w + b, np.abs(y * w) + np.abs(b), np.abs(w) * (1 + np.abs(y))


@settings(max_examples=120, deadline=None)
@given(layer_norm_cases())
def test_layer_norm_matches_fast(case: dict[str, Any]) -> None:
    import mlx.core as mx

    x, weight, bias = _layer_norm_inputs(case)
    expected = mx.fast.layer_norm(x, weight, bias, case["eps"])
    got = layer_norm(x, weight, bias, case["eps"])
    assert got.shape == expected.shape == x.shape and got.dtype == expected.dtype
    out_dtype = str(got.dtype).removeprefix("mlx.core.")
    # what the roundings scale with: the float32 normalised values both sides round (not float64's,
    # which are 0 where an x equals its row's mean exactly and float32's mean is off by an ulp)
    y32 = _f64(layer_norm(x.astype(mx.float32), None, None, case["eps"]))
    w = 1.0 if weight is None else _f64(weight)
    magnitude = np.abs(y32 * w) + (0.0 if bias is None else np.abs(_f64(bias)))
    tol = 8 * UNIT[out_dtype] * magnitude + _tiny(out_dtype)
    _assert_within(got, _f64(expected), tol, "reference vs mx.fast.layer_norm")
    if out_dtype == "float32" and mx.default_device() == mx.cpu:  # the fallback: the same float32 ops
        assert (_bits(got) == _bits(expected)).all()


@settings(max_examples=80, deadline=None)
@given(layer_norm_cases())
def test_layer_norm_matches_the_formula(case: dict[str, Any]) -> None:
    """Against float64 numpy: one rounding to the output dtype (allowed 1.5·u·(|y·w| + |b|)), plus
    float32's error in normalising: the mean's rounding (~u₃₂·(|mean| + std)·log₂ D, so in units of
    std ~u₃₂·(1 + |shift|)·log₂ D, shifted by the same for every y) and the std's (relative, ~u₃₂·D
    at worst), both through w: allowed 64·u₃₂·(1 + |shift|)·|w|·(1 + |y|)."""
    x, weight, bias = _layer_norm_inputs(case)
    got = layer_norm(x, weight, bias, case["eps"])
    out_dtype = str(got.dtype).removeprefix("mlx.core.")
    exact, magnitude, spread = _exact_layer_norm(x, weight, bias, case["eps"])
    tol = 1.5 * UNIT[out_dtype] * magnitude + 64 * U32 * (1 + abs(case["shift"])) * spread + _tiny(out_dtype)
    _assert_within(got, exact, tol, "reference vs float64 formula")


def test_layer_norm_scale_invariant_and_dtypes() -> None:
    """With eps = 0 scaling x by a power of two changes nothing, bit for bit; weight and bias promote."""
    import mlx.core as mx

    x = _normal((3, 7, 64), 12)
    base = layer_norm(x, None, None, 0.0)
    assert (_bits(layer_norm(x * 8.0, None, None, 0.0)) == _bits(base)).all()
    np.testing.assert_allclose(np.array(base).mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.array(base).var(-1), 1.0, atol=1e-5)
    half, w = x.astype(mx.float16), mx.ones(64, dtype=mx.bfloat16)
    assert layer_norm(half, w, None, 1e-5).dtype == mx.fast.layer_norm(half, w, None, 1e-5).dtype == mx.float32
    b = mx.zeros(64)
    assert layer_norm(half, None, b, 1e-5).dtype == mx.fast.layer_norm(half, None, b, 1e-5).dtype == mx.float16


# --- bad arguments: rejected like mx.fast rejects them -------------------------------------------


#: Each bad call: the arguments changed, and what the reference's message says.
BAD_ROPE = {
    "both base and freqs": ({"freqs": "ones4"}, "exactly one of base and freqs must be None; both were given"),
    "neither base nor freqs": ({"base": None}, "exactly one of base and freqs must be None; both are None"),
    "odd dims": ({"dims": 7}, "positive and even"),
    "dims > D": ({"dims": 10}, r"dims \(10\) must not exceed the input's last dimension \(8\)"),
    "dims 0": ({"dims": 0}, "positive and even"),
    "2-D input": ({"a": "2d"}, "at least 3 dimensions"),
    "integer input": ({"a": "int"}, "floating type"),
    "float offset": ({"offset": 1.5}, "offset must be an int or an integer array"),
    "bool offset": ({"offset": True}, "offset must be an int or an integer array"),
    "float array offset": ({"offset": "float-array"}, "offset must be an integer; got dtype"),
    "2-D offset": ({"offset": "2d-offset"}, "scalar or a vector of B offsets"),
    "offset of the wrong length": ({"offset": "3-vector"}, "vector of B = 2 offsets"),
    "freqs of the wrong size": ({"base": None, "freqs": "ones3"}, "freqs must be one-dimensional with dims / 2 = 4"),
}


def _bad_rope_args(overrides: dict[str, Any]) -> dict[str, Any]:
    import mlx.core as mx

    values = {
        "ones4": mx.ones(4),
        "ones3": mx.ones(3),
        "2d": mx.zeros((4, 8)),
        "int": mx.zeros((2, 3, 4, 8), mx.int32),
        "float-array": mx.array(1.5),
        "2d-offset": mx.array([[1]]),
        "3-vector": mx.array([1, 2, 3]),
    }
    args: dict[str, Any] = {
        "a": mx.zeros((2, 3, 4, 8)),
        "dims": 8,
        "traditional": False,
        "base": 10000.0,
        "scale": 1.0,
        "offset": 0,
        "freqs": None,
    }
    args.update({k: values[v] if isinstance(v, str) else v for k, v in overrides.items()})
    return args


@pytest.mark.parametrize(("overrides", "message"), list(BAD_ROPE.values()), ids=list(BAD_ROPE))
def test_rope_rejects_what_mlx_rejects(overrides: dict[str, Any], message: str) -> None:
    import mlx.core as mx

    for op, match in ((mx.fast.rope, r"^\[rope\]"), (rope, f"^rope: .*{message}")):
        args = _bad_rope_args(overrides)
        with pytest.raises(ValueError, match=match):
            mx.eval(op(args.pop("a"), args.pop("dims"), **args))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("weight size", r"weight must be one-dimensional with x's last dimension \(8\); got shape \(7,\)"),
        ("2-D bias", r"bias must be one-dimensional .* got shape \(1, 8\)"),
        ("scalar x", "at least 1 dimension"),
        ("integer x", "int32 is not a floating type"),
    ],
    ids=["weight size", "2-D bias", "scalar x", "integer x"],
)
def test_layer_norm_rejects_what_mlx_rejects(case: str, message: str) -> None:
    import mlx.core as mx

    x = mx.zeros((2, 8))
    args = {
        "weight size": (x, mx.ones(7), None),
        "2-D bias": (x, None, mx.ones((1, 8))),
        "scalar x": (mx.array(1.0), None, None),
        "integer x": (mx.zeros((2, 8), mx.int32), None, None),
    }[case]
    for op, match in ((mx.fast.layer_norm, r"^\[layer_norm\]"), (layer_norm, f"^layer_norm: .*{message}")):
        with pytest.raises(ValueError, match=match):
            mx.eval(op(*args, 1e-5))


# --- fast_ops: the lever that swaps mlx's fused norms and RoPE for these -------------------------

FUSED = ("rms_norm", "layer_norm", "rope")
FAST_OPS_LEVER = "pytest_mlxgate.reference_ops:fast_ops"


def _fast_functions() -> dict[str, Any]:
    import mlx.core as mx

    return {name: getattr(mx.fast, name) for name in FUSED}


@pytest.fixture
def plain_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often each reference ran: its worker (`_rope`, ...) wrapped with a counter."""
    counts = dict.fromkeys(FUSED, 0)
    for name in FUSED:
        inner = getattr(ro, f"_{name}")

        def counting(*args: Any, _name: str = name, _inner: Any = inner, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _inner(*args, **kwargs)

        monkeypatch.setattr(ro, f"_{name}", counting)
    return counts


def _serve(model: Any, tokens: Any) -> np.ndarray:
    """Prefill all but the last token through a KV cache, then decode the last: the serving path."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prefill = model(tokens[:, :-1], cache=cache)
    decode = model(tokens[:, -1:], cache=cache)
    mx.eval(prefill, decode)
    return np.concatenate([np.array(prefill[0]), np.array(decode[0])])


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ],
    ids=["base", "llama3-freqs"],
)
def test_fast_ops_plain_runs_a_real_model_through_the_references(
    plain_calls: dict[str, int], rope_scaling: Any
) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama

    mx.random.seed(0)
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=256,
            rope_theta=10000.0,
            rope_scaling=rope_scaling,
        )
    )
    mx.eval(model.parameters())
    assert type(model.model.layers[0].self_attn.rope).__name__ == ("RoPE" if rope_scaling is None else "Llama3RoPE")
    tokens = mx.array(np.random.default_rng(3).integers(0, 256, 12), dtype=mx.int32)[None]
    norm = nn.LayerNorm(64)
    original = _fast_functions()
    lever = Lever("fused_norms_rope", "context", FAST_OPS_LEVER, ref="plain", cand="fused", path="serving")

    with lever.applied("candidate"):
        assert _fast_functions() == original
        fused, fused_norm = _serve(model, tokens), np.array(norm(mx.ones((2, 64)) * mx.arange(64)))
    assert plain_calls == dict.fromkeys(FUSED, 0)
    with lever.applied("reference"):
        assert _fast_functions() == {"rms_norm": ro.rms_norm, "layer_norm": ro.layer_norm, "rope": ro.rope}
        plain, plain_norm = _serve(model, tokens), np.array(norm(mx.ones((2, 64)) * mx.arange(64)))
    assert _fast_functions() == original

    # 2 layers × (q, k) ropes and 2 layers × 2 norms + the final norm, for the prefill and the decode
    assert plain_calls == {"rms_norm": 10, "layer_norm": 1, "rope": 8}
    assert np.isfinite(plain).all()
    np.testing.assert_allclose(plain, fused, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(plain_norm, fused_norm, atol=1e-5, rtol=1e-5)


def test_fast_ops_restores_everything_when_the_body_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Module-level copies (`from mlx.core.fast import rope`) are patched too, and all restored."""
    import mlx.core as mx

    original = _fast_functions()
    copy = types.ModuleType("module_with_a_copy_of_rope")
    copy.rope = mx.fast.rope
    monkeypatch.setitem(sys.modules, copy.__name__, copy)
    with pytest.raises(RuntimeError, match="forward failed"):
        with fast_ops("plain"):
            assert mx.fast.rope is ro.rope and copy.rope is ro.rope
            assert mx.fast.layer_norm is ro.layer_norm and mx.fast.rms_norm is ro.rms_norm
            raise RuntimeError("forward failed")
    assert _fast_functions() == original and copy.rope is original["rope"]
    assert ro.rope is compat.rope and ro.rope.__module__ == "pytest_mlxgate.levers.reference_ops"


@pytest.mark.parametrize(
    ("value", "patched"),
    [
        ("rms_norm,rope", {"rms_norm", "rope"}),
        (" layer_norm ", {"layer_norm"}),
        ("rope,rope", {"rope"}),
        ("fused", set()),
        (None, set()),
    ],
)
def test_fast_ops_patches_only_the_ops_named(value: Any, patched: set[str]) -> None:
    import mlx.core as mx

    original = _fast_functions()
    with fast_ops(value):
        for name in FUSED:
            assert (getattr(mx.fast, name) is getattr(ro, name)) == (name in patched), name
    assert _fast_functions() == original


@pytest.mark.parametrize("value", ["Plain", "fast", "plain,rope", "rope,", "", "sdpa", 1, ["rope"]])
def test_fast_ops_rejects_other_values(value: Any) -> None:
    with pytest.raises(LeverError, match=r"'fused'.*'plain'.*rms_norm, layer_norm, rope"):
        fast_ops(value)
    lever = Lever("fused_norms_rope", "context", FAST_OPS_LEVER, ref=value, cand="fused", path="serving")
    with pytest.raises(LeverError, match="is not one of 'fused'"):
        with lever.applied("reference"):
            pass


def test_compatibility_path_re_exports_the_same_objects() -> None:
    assert compat.__all__ == ro.__all__
    assert {"fast_ops", "layer_norm", "rope", "rms_norm", "scaled_dot_product_attention"} <= set(ro.__all__)
    for name in ro.__all__:
        assert getattr(compat, name) is getattr(ro, name)


def test_stream_argument_runs_there() -> None:
    import mlx.core as mx

    x = _normal((1, 2, 5, 8), 13)
    np.testing.assert_array_equal(
        np.array(rope(x, 8, traditional=True, base=1e4, scale=1.0, offset=3, stream=mx.cpu)),
        np.array(rope(x, 8, traditional=True, base=1e4, scale=1.0, offset=3)),
    )
    np.testing.assert_array_equal(
        np.array(layer_norm(x, None, None, 1e-5, stream=mx.cpu)), np.array(layer_norm(x, None, None, 1e-5))
    )


def test_compiled_off_runs_a_compiled_function_op_by_op_and_on_restores_compilation() -> None:
    """A compiled function's Python body runs once per trace when compiled, on every call when not:
    the count of body runs tells which happened."""
    import mlx.core as mx

    from pytest_mlxgate.reference_ops import compiled

    runs = []

    def body(x: Any) -> Any:
        runs.append(1)
        return mx.exp(x) * 2

    fn = mx.compile(body)
    x = mx.ones((4,))
    with compiled("off"):
        for _ in range(3):
            mx.eval(fn(x))
    assert len(runs) == 3  # no trace cached: the plain ops, every call
    runs.clear()
    for arm in ("on", None):
        with compiled(arm):
            for _ in range(3):
                mx.eval(fn(x))
    assert len(runs) == 1  # traced once, then the compiled graph (compilation came back on after "off")
    with pytest.raises(RuntimeError), compiled("off"):
        raise RuntimeError("a forward that fails")
    runs.clear()
    mx.eval(fn(x))
    assert runs == []  # still compiled after a raise inside "off"


@pytest.mark.parametrize("bad", ["yes", 1, "OFF"])
def test_compiled_refuses_other_values(bad: object) -> None:
    from pytest_mlxgate.errors import LeverError
    from pytest_mlxgate.reference_ops import compiled

    with pytest.raises(LeverError, match="'on'.*'off'"):
        compiled(bad)
