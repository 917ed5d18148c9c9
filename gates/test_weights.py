"""Gate: 4-bit weights (group 64, as `mlx_lm.convert -q` writes them) vs the float32 weights as loaded.

The weights lever loads a second copy of the verified snapshot and quantizes it with mlx_lm's own
converter (`mlx_lm.utils.quantize_model`), so the gate compares what a 4-bit repo would hold
without needing one; the reference arm keeps the weights as loaded. Prefill path: weights change
every matmul, prefill and decode alike.

How the limits were set (embedded model, 8 prompts x 32 tokens: small, because of the cost below):
- A/A floor: each arm runs one model object; the reference against itself is exact (0).
- This lever: mean KL 0.66 (95% upper 0.78), p99 2.8 (upper 3.0), top-1 55.9% (lower 46.2%). A
  135M model loses much at 4 bits (larger models far less). The limits hold it where it is, ~2x of
  room: mean 1.5, p99 6, top-1 35%.
- A known-bad change must fail: 2-bit weights (`--mlx-lever weights --mlx-ref-value none
  --mlx-cand-value 2`) measure mean KL 15.1, top-1 0.0%.
- Memory: 513.1 -> 80.3 MiB of weights (x0.156: a 4-bit word plus a float32 scale and bias per 64
  weights, over float32), which `test_memory` asks for (at most 0.2).
- Speed, and what MLX's CPU quantized matmul costs: on this CPU it does not use BLAS, so prefill
  drops to x0.06 [0.05, 0.06] (148 -> 8.6 tok/s at 32 tokens) and decode to x0.49 [0.44, 0.55]
  (10.2 -> 5.3 tok/s; measured on an otherwise idle machine). The gate's sizes are small for that
  reason (~1.5 min here, most of it the 4-bit arm's prefill); on Metal quantized matmuls are the
  fast path, and this is the ratio to assert there.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 4, "group_size": 64}),
    pytest.mark.mlx_kl(prompts=8, tokens=32),
    pytest.mark.mlx_speed(contexts=(16, 32), decode=4),
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=1.5, p99=6.0, top1=0.35)


def test_memory(paired: Paired) -> None:
    assert_faster(paired, weights=0.2)
