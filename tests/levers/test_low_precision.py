"""`reference_ops.low_precision`: the plain low-precision path the site check holds a kernel to: the same ops
in the inputs' precision, close to the float32 result within that precision's rounding, and farther from it
than the float32-inside references are (which is why they are no fair yardstick)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pytest

from pytest_mlxgate.levers import reference_ops as ro


def _up(a: Any) -> Any:
    return a.astype(mx.float32)


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    mx.random.seed(3)
    q = mx.random.normal((1, 4, 48, 32)).astype(mx.bfloat16)
    k, v = (mx.random.normal((1, 2, 48, 32)).astype(mx.bfloat16) for _ in range(2))
    x = (mx.random.normal((3, 7, 256)) * 3).astype(mx.bfloat16)
    w = (mx.random.normal((256,)) * 0.1 + 1).astype(mx.bfloat16)
    b = (mx.random.normal((256,)) * 0.1).astype(mx.bfloat16)
    a = mx.random.normal((2, 4, 40, 64)).astype(mx.bfloat16)
    return [
        ("sdpa", ro.scaled_dot_product_attention, (q, k, v), {"scale": 32**-0.5, "mask": "causal"}),
        ("rms_norm", ro.rms_norm, (x, w, 1e-5), {}),
        ("layer_norm", ro.layer_norm, (x, w, b, 1e-5), {}),
        ("rope", ro.rope, (a, 64), {"traditional": False, "base": 10000.0, "scale": 1.0, "offset": 300}),
    ]


@pytest.mark.parametrize("case", range(4), ids=["sdpa", "rms_norm", "layer_norm", "rope"])
def test_the_twin_computes_in_the_inputs_precision_near_float32_and_less_exactly_than_the_reference(case: int) -> None:
    _, fn, args, kwargs = _cases()[case]
    twin = ro.low_precision(fn)
    assert twin is not fn
    oracle = fn(*(_up(x) if isinstance(x, mx.array) else x for x in args), **kwargs)
    low, ref = twin(*args, **kwargs), fn(*args, **kwargs)
    assert low.dtype == ref.dtype == mx.bfloat16 and low.shape == ref.shape == oracle.shape
    scale = float(mx.abs(oracle).max())
    low_err = float(mx.abs(_up(low) - oracle).max()) / scale
    ref_err = float(mx.abs(_up(ref) - oracle).max()) / scale
    assert low_err < 0.05  # within a few bf16 units of the float32 result: the same op
    assert low_err > ref_err  # the float32-inside reference rounds once, at its output only


def test_a_function_with_no_twin_is_its_own_plain_path() -> None:
    assert ro.low_precision(mx.fast.rms_norm) is mx.fast.rms_norm
    assert ro.low_precision(print) is print


def test_in_float32_the_twin_is_the_reference() -> None:
    _, fn, args, kwargs = _cases()[1]
    up = tuple(_up(x) if isinstance(x, mx.array) else x for x in args)
    assert mx.array_equal(ro.low_precision(fn)(*up, **kwargs), fn(*up, **kwargs)).item()
