"""Gate: 8-bit weights (group 64, as `mlx_lm.convert -q --q-bits 8` writes them) vs the float32 weights as loaded.

The same lever as gates/test_weights.py (4-bit): a second copy of the verified snapshot quantized
by mlx_lm's own converter, the reference arm the weights as loaded. Prefill path.

How the limits were set (`pytest gates/test_weights_8bit.py --mlx-calibrate`; embedded model, 8
prompts x 32 tokens; rule: each KL limit >= 4x the lever's 95% upper bound and >= 10x the A/A floor):
- A/A floor: mean KL 2.2e-8, p99 1.6e-7, top-1 98.5% (95% bounds).
- This lever: mean KL 2.7e-3 (upper 3.3e-3), p99 0.015 (upper 0.021), top-1 96.5% (lower 93.5%):
  ~250x less drift than 4 bits (mean 0.66). Limits, the rule's: mean 0.015, p99 0.1, top-1 70%.
- A known-bad change must fail: 4-bit weights (gates/test_weights.py's lever) measure mean KL 0.66,
  p99 2.8, top-1 55.9%: over every limit here.
- Memory: weights x0.281 (8-bit words plus a float32 scale and bias per 64 weights), which
  `test_memory` asks for (at most 0.31, the rule's bytes + 10%).
- Speed, and what MLX's CPU quantized matmul costs: prefill x0.04 [0.04, 0.04] (141 -> 6.9 tok/s at
  16 tokens), decode x0.47 [0.43, 0.52] at 32: no BLAS for quantized matmuls on this CPU, slower
  than 4 bits even (more bytes to unpack). On Metal quantized matmuls are the fast path.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 8, "group_size": 64}),
    pytest.mark.mlx_kl(prompts=8, tokens=32),
    pytest.mark.mlx_speed(contexts=(16, 32), decode=4),
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=0.015, p99=0.1, top1=0.7)


def test_memory(paired: Paired) -> None:
    assert_faster(paired, weights=0.31)
