"""Gate: `mx.compile` on vs off: the fused graphs mlx_lm's models run vs the same functions op by op.

mlx_lm wraps its hot elementwise functions in `mx.compile` (the SwiGLU and GELU activations,
gemma's logit softcap and its other helpers; mlx.nn some activations of its own). The reference arm
runs with compilation off for the arm (`pytest_mlxgate.reference_ops:compiled`, through
`mx.disable_compile()`), so every one of them runs op by op; the candidate runs them compiled, as
mlx_lm ships them. Serving path: compiled functions are traced per input shape (or shapeless), and
decode's one-token shapes are where a stale or wrongly shapeless trace would show.

How the limits were set (`pytest gates/test_compile.py --mlx-calibrate`; embedded model, 16 prompts
x 128 tokens, 32 decoded; rule: each KL limit >= 4x the lever's 95% upper bound and >= 10x the A/A floor):
- A/A floor (the reference against itself, and with the prefix prefilled in chunks of a third):
  mean KL 1.7e-8, p99 1.5e-7, top-1 99.3% (95% bounds).
- This lever: exactly 0 on this CPU (compiled and uncompiled graphs give bit-identical logits;
  "identical on this backend" in the summary), so the limits come from the floor alone: mean 2e-7,
  p99 2e-6, top-1 90%. Metal's compiled kernels may round differently: re-calibrate there.
- A known-bad fused kernel must fail: a compiled SwiGLU with the hard sigmoid in place of the
  sigmoid (a fast-math shortcut a fused kernel might take; planted with a patch lever on
  `mlx_lm.models.activations.swiglu`, same sizes): mean KL 8.8e-2, p99 0.38, top-1 83.2%.

Speed (`mlx_speed`, 256 tokens of context, 8 decoded, 9 interleaved pairs; measured beside other
work): decode x1.03 [1.00, 1.07], prefill x0.94 [0.92, 0.96]: on this CPU compiling the activations
buys nothing for decode and costs prefill ~6% (compiled CPU kernels are generated C++, not the
vectorized fallbacks); no goal asserted here. On Metal fusion saves kernel launches: calibrate there.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("mx_compile", context="pytest_mlxgate.reference_ops:compiled", ref="off", cand="on",
                          path="serving"),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(contexts=(256,)),
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=2e-7, p99=2e-6, top1=0.9)
