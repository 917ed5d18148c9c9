"""The known-bad kernels gates/test_compile.py and gates/test_fused_norms_rope.py name (gates/known_bad_ops.py):
each differs from what it replaces by its one bug, keeps its signature, and the hard-sigmoid context
refuses to stand for a known-bad on a model that calls none of its activations."""

from __future__ import annotations

import inspect
import math

import pytest
from gate_modules import load_gate_module

from pytest_mlxgate.errors import VacuousLeverError

ops = load_gate_module("known_bad_ops")


def test_rope_base_off_is_rope_with_the_base_10_percent_larger_and_given_frequencies_alike() -> None:
    import mlx.core as mx

    from pytest_mlxgate.levers import reference_ops

    assert inspect.signature(ops.rope_base_off) == inspect.signature(reference_ops.rope)
    a = mx.random.normal((1, 2, 5, 8), key=mx.random.key(0))
    args = {"traditional": False, "scale": 1.0, "offset": 3}
    bad = ops.rope_base_off(a, 8, base=10_000.0, **args)
    assert mx.allclose(bad, mx.fast.rope(a, 8, base=11_000.0, **args), atol=1e-5)
    assert not mx.allclose(bad, mx.fast.rope(a, 8, base=10_000.0, **args), atol=1e-3)
    freqs = mx.array([10_000.0 ** (i / 4) for i in range(4)])
    assert mx.allclose(ops.rope_base_off(a, 8, base=None, freqs=freqs, **args), bad, atol=1e-5)


def test_the_hard_sigmoid_activations_differ_from_the_shipped_ones_by_the_sigmoid_alone() -> None:
    import mlx.core as mx
    import mlx.nn as nn

    g = mx.array([-8.0, -1.0, 0.0, 1.0, 8.0])
    x = mx.ones_like(g)
    hard = mx.clip(g / 6 + 0.5, 0, 1)
    assert mx.allclose(ops.swiglu_hard_sigmoid(g, x), g * hard * x)
    assert not mx.allclose(ops.swiglu_hard_sigmoid(g, x), nn.silu(g) * x, atol=1e-2)
    z = 2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)
    assert mx.allclose(ops.gelu_approx_hard_sigmoid(g), g * mx.clip(z / 6 + 0.5, 0, 1))
    assert mx.allclose(g * mx.sigmoid(z), nn.gelu_approx(g), atol=1e-5)  # the sigmoid it replaces


def test_the_hard_sigmoid_context_patches_both_activations_and_refuses_a_model_that_calls_neither() -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm.models.activations as activations

    shipped = (activations.swiglu, nn.gelu_approx)
    g = mx.array([1.0, 2.0])
    with ops.hard_sigmoid_activations("on"):
        assert mx.allclose(activations.swiglu(g, g), ops.swiglu_hard_sigmoid(g, g))
        assert mx.allclose(nn.gelu_approx(g), ops.gelu_approx_hard_sigmoid(g))
    assert (activations.swiglu, nn.gelu_approx) == shipped
    with ops.hard_sigmoid_activations("off"):
        assert activations.swiglu is shipped[0]
    with pytest.raises(VacuousLeverError, match="the model called none of mlx_lm.models.activations.swiglu"):
        with ops.hard_sigmoid_activations("on"):
            pass
    assert (activations.swiglu, nn.gelu_approx) == shipped
