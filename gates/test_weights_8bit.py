"""Gate: 8-bit weights (group 64, as `mlx_lm.convert -q --q-bits 8` writes them) vs the float32 weights as loaded.

The same lever as gates/test_weights.py (4-bit): a second copy of the verified snapshot quantized
by mlx_lm's own converter, the reference arm the weights as loaded. Prefill path.

Limits: `gates/calibration/test_weights_8bit.json` holds what they were set from (`pytest
gates/test_weights_8bit.py --mlx-calibrate` measures it again; the calibration files' test checks the
limits against it): 8 bits drift orders of magnitude less than 4, and the limits are the rule's, so
4-bit weights (KNOWN_BAD, gates/test_weights.py's lever) fail every one of them. Memory: 8-bit words
plus a float32 scale and bias per 64 weights, which `test_memory` bounds (the rule's bytes + 10%).
Speed: no BLAS for quantized matmuls on this CPU, slower than 4 bits even (more bytes to unpack), so the
sizes are gates/test_weights.py's (16 tokens of context, 4 decoded); on Metal quantized matmuls are the
fast path.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 8, "group_size": 64}),
    pytest.mark.mlx_kl(prompts=8, tokens=32),
    pytest.mark.mlx_speed(contexts=(16,), decode=4),
]

KNOWN_BAD = {"bits": 4, "group_size": 64}  # 4-bit weights (gates/test_weights.py's lever): far more drift


def test_drift(paired: Paired) -> None:
    # gemma3-270m's p99 under 8-bit weights is ~8x the embedded model's
    # (gates/calibration/gemma3-270m/test_weights_8bit.json): its limits have the rule's room there
    assert_kl_below(paired, mean=0.015, p99=0.1, top1=0.7, models={"gemma3-270m": {"mean": 0.02, "p99": 0.5}})


def test_memory(paired: Paired) -> None:
    assert_smaller(paired, weights=0.31)
