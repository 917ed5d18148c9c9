"""Known-bad kernels the gates name as `KNOWN_BAD`: each has one real bug that a gate's limits must fail.

`--mlx-calibrate` measures them beside the lever (the result is in `calibration/<gate>.json`), and the
calibration files' test checks that the gate's limits, as written, fail them. Importing this module
imports mlx (the compiled activations are compiled as mlx_lm's are, at import).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import partial
from typing import Any

import mlx.core as mx

from pytest_mlxgate.errors import LeverError, VacuousLeverError
from pytest_mlxgate.levers.patching import counted, patched
from pytest_mlxgate.reference_ops import rope as _plain_rope
from pytest_mlxgate.reference_ops import scaled_dot_product_attention as _plain_attention

__all__ = [
    "attention_scale_off",
    "gelu_approx_hard_sigmoid",
    "hard_sigmoid_activations",
    "rope_base_off",
    "swiglu_hard_sigmoid",
]


def attention_scale_off(
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
    """Attention with its softmax scale 10% too large: what a kernel that rounds or caches 1/sqrt(d)
    wrongly computes. Every row still sums to 1, so nothing but the distribution shows it."""
    return _plain_attention(q, k, v, scale=scale * 1.1, mask=mask, sinks=sinks, force_fused=force_fused, stream=stream)


def rope_base_off(
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
    """RoPE with its base 10% too large (given frequencies, the same error): every pair turns at a slightly
    wrong rate, so positions drift apart more the farther they are, while nearby tokens still agree."""
    if base is not None:
        base = base * 1.1
    else:  # freqs[i] = base ** (i / half): a base 10% off multiplies each by 1.1 ** (i / half)
        half = dims // 2
        freqs = freqs * mx.power(mx.array(1.1, dtype=mx.float32), mx.arange(half, dtype=mx.float32) / half)
    return _plain_rope(
        a, dims, traditional=traditional, base=base, scale=scale, offset=offset, freqs=freqs, stream=stream
    )


def _hard_sigmoid(x: Any) -> Any:
    return mx.clip(x / 6 + 0.5, 0.0, 1.0)


@partial(mx.compile, shapeless=True)
def swiglu_hard_sigmoid(gate: Any, x: Any) -> Any:
    """mlx_lm's compiled SwiGLU with the hard sigmoid, clip(g / 6 + 1/2, 0, 1), in place of the sigmoid."""
    return gate * _hard_sigmoid(gate) * x


@partial(mx.compile, shapeless=True)
def gelu_approx_hard_sigmoid(x: Any) -> Any:
    """mlx.nn's compiled tanh-approximate GELU, x * sigmoid(2z), with the hard sigmoid in place of the sigmoid."""
    return x * _hard_sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))


#: The compiled activations the gates' models call, by where their layers look them up: the hard-sigmoid
#: version of each (llama-style models call SwiGLU, gemma's the tanh-approximate GELU).
_HARD_SIGMOID = {
    "mlx_lm.models.activations.swiglu": swiglu_hard_sigmoid,
    "mlx.nn.gelu_approx": gelu_approx_hard_sigmoid,
}


def hard_sigmoid_activations(value: object) -> AbstractContextManager[None]:
    """A context lever factory: "on" runs the compiled activations (`_HARD_SIGMOID`) with the hard sigmoid
    in place of the sigmoid, "off" (or None) as they ship. LeverError on exit when "on" changed nothing:
    the model called none of them, so the known-bad arm would be the reference."""
    if value is None or value == "off":
        return nullcontext()
    if value == "on":
        return _hard_sigmoid_patched()
    raise LeverError(f"hard_sigmoid_activations value {value!r} is not 'on' (the hard sigmoid) or 'off' (or None)")


@contextmanager
def _hard_sigmoid_patched() -> Iterator[None]:
    calls = 0

    def seen() -> None:
        nonlocal calls
        calls += 1

    with ExitStack() as stack:
        for target, broken in _HARD_SIGMOID.items():
            stack.enter_context(patched("hard_sigmoid_activations", target, counted(broken, seen, "hard_sigmoid")))
        yield
    if not calls:
        raise VacuousLeverError(
            f"hard_sigmoid_activations: the model called none of {', '.join(_HARD_SIGMOID)}, so the hard sigmoid "
            "changed nothing; this known-bad variant does not apply to it (add its compiled activation here)"
        )
