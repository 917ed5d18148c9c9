"""Gate: 4-bit weights (group 64, as `mlx_lm.convert -q` writes them) vs the float32 weights as loaded.

The weights lever loads a second copy of the verified snapshot and quantizes it with mlx_lm's own
converter (`mlx_lm.utils.quantize_model`), so the gate compares what a 4-bit repo would hold
without needing one; the reference arm keeps the weights as loaded. Prefill path: weights change
every matmul, prefill and decode alike.

Limits: `gates/calibration/test_weights.json` holds what they were set from (`pytest
gates/test_weights.py --mlx-calibrate` measures it again; the calibration files' test checks the limits
against it). The A/A floor is exact (each arm runs one model object). A 135M model loses much at 4 bits
(larger models far less), the loosest lever this project gates: the limits hold it near where it is,
inside the quality bounds; 2-bit weights (KNOWN_BAD), where the model is gone, fail them. Memory: a
4-bit word plus a float32 scale and bias per 64 weights, over float32, which `test_memory` bounds.

Speed, and what MLX's CPU quantized matmul costs: on this CPU it does not use BLAS, so both prefill and
decode drop far below the float32 arm. The gate's sizes are small for that reason (most of its time is
the 4-bit arm's prefill): one context of 16 tokens (16 and 32 told the same ratios, and a 4-bit trial's
prefill costs ~0.13 s a token here);
on Metal quantized matmuls are the fast path, and this is the ratio to assert there.

On gemma3-270m this lever breaks the model: beyond the quality bounds, so no limit can pass it
(`gates/calibration/gemma3-270m/test_weights.json`), and the gate fails there: a true finding, not a
limit to loosen (the calibration files' test holds the gate to failing it on that model).
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 4, "group_size": 64}),
    pytest.mark.mlx_kl(prompts=8, tokens=32),
    pytest.mark.mlx_speed(contexts=(16,), decode=4),
]

KNOWN_BAD = {"bits": 2, "group_size": 64}  # 2-bit weights: the model is gone


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=2.0, p99=6.0, top1=0.3)


def test_memory(paired: Paired) -> None:
    assert_smaller(paired, weights=0.2)
