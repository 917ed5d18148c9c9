"""Gate: mlx's fused RMSNorm, LayerNorm and RoPE (`mx.fast.rms_norm`, `layer_norm`, `rope`) vs plain ops.

The reference arm swaps all three for `pytest_mlxgate.reference_ops`' float32 versions wherever they
are bound (`fast_ops("plain")`: mlx.nn's RMSNorm and RoPE layers and mlx_lm's model files call them
through `mx.fast`); the candidate runs mlx's kernels. Serving path: RoPE's position offset comes
from the KV cache, so only decoding through the cache exercises it (a teacher-forced prefill rotates
from position 0 alone), and a dropped or wrong offset is the kernel bug that matters most.

Limits: `gates/calibration/test_fused_norms_rope.json` holds what they were set from (`pytest
gates/test_fused_norms_rope.py --mlx-calibrate` measures it again; the calibration files' test checks
the limits against it). On this CPU mx.fast's norms and RoPE are composed float32 ops too, so the two
arms differ only in rounding (mx.fast.rope's inverse frequencies by `exp` in float32) and sit at the
A/A floor; the limits are the rule's. On Metal and CUDA the kernels are fused: re-calibrate there
before trusting a failure as a bug. KNOWN_BAD, RoPE with its base 10% off (`gates/known_bad_ops.py`,
patched over `mlx.core.fast.rope`; its reference arm is mlx's own RoPE, as this lever has no broken
value), must fail them, and does on both calibrated models: it keeps most greedy tokens, so top-1
alone cannot tell it, and the mean and p99 limits are what catch it. It is the known-bad rather than
RoPE with the cache offset dropped (every decoded token rotated as if at position 0), which breaks
the model outright: any limit fails that, so it would prove little about these ones.

Speed (`mlx_speed`: the default contexts, one on a CPU, 600 and 8192 tokens on a GPU): not told apart on
this CPU, as expected where both arms run the same composed ops; no goal asserted. On Metal the fused
kernels are the point: calibrate there for a decode goal.

In the precision it ships (`--mlx-dtype bfloat16`): `relative=2.0` judges the candidate against the float32
oracle (the reference's weights upcast, every activation in float32): its KL from the oracle at most twice
the plain bf16 path's, and, where the lever swaps a function, each call of it on the reference arm's
activations likewise (FlashAttention's rule, `kl/site.py`). The absolute limits above were sized in float32;
in bf16 those below plain bf16's own distance from float32 are set aside for these rules (the record says
which). In float32 the reference arm is the oracle: the rule reads the candidate's KL against 1e-5.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever(
        "fused_norms_rope", context="pytest_mlxgate.reference_ops:fast_ops", ref="plain", cand="fused", path="serving"
    ),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]

# RoPE with its base 10% off (gates/known_bad_ops.py), against mlx's own RoPE
KNOWN_BAD = pytest.mark.mlx_lever(
    "rope_base_off", patch="mlx.core.fast.rope", ref=None, cand="known_bad_ops:rope_base_off", path="serving"
)


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=3e-7, p99=3e-6, top1=0.9, relative=2.0)
