"""Gate: MLX's fused attention (`mx.fast.scaled_dot_product_attention`) vs plain-ops attention.

Prefill path: one teacher-forced forward per prompt, so every attention call sees a full causal
block. The reference arm swaps the fused kernel for `pytest_mlxgate.reference_ops`' matmul +
float32 softmax version everywhere it is bound (mlx_lm's model files import it by name); the
candidate arm runs the original kernel.

Limits: `gates/calibration/test_attention.json` holds what they were set from (`pytest
gates/test_attention.py --mlx-calibrate` measures it again; the calibration files' test checks the
limits against it). On Linux CPU mx.fast's attention *is* composed ops, so the lever measures exactly 0
and the limits come from the A/A floor alone (the reference against itself, and with the prompt fed
in chunks through a KV cache); on Metal and CUDA the fused kernels sum in another order, so expect
small non-zero values there and calibrate on that machine before trusting a failure as a bug. The
limits accept rounding-order noise and nothing a real bug produces: KNOWN_BAD, a softmax scale 10%
off (`gates/known_bad_ops.py`), must fail them.

Capability (smoke tier, both arms on the same items): ARC-Easy and SciQ scored by the log-probability
of each whole answer (the cloze form), where the embedded 135M model sits well off the floor (on
MMLU's lettered form it is at chance, and IFEval is near it, where no lever can show a drop). The
gate passes only when the drop is shown to be at most 10 points: `Budget` adds 16 items at a time
until the anytime-valid bound clears the margin either way; an exact lever stops early, as no pair
differs. A lost softmax scale (uniform attention) is a regression this shows
(tests/capability/test_planted_regression.py). `--mlx-tier full` runs the full sets.

Speed (`mlx_speed`: the default contexts, and 1.5x the window on a sliding-window model): reported
beside the drift, so a slower attention kernel shows its figure; no goal is asserted, as on this CPU
both arms are composed ops.

In the precision it ships (`--mlx-dtype bfloat16`): `relative=2.0` judges the candidate against the float32
oracle (the reference's weights upcast, every activation in float32): its KL from the oracle at most twice
the plain bf16 path's, and, where the lever swaps a function, each call of it on the reference arm's
activations likewise (FlashAttention's rule, `kl/site.py`). The absolute limits above were sized in float32;
in bf16 those below plain bf16's own distance from float32 are set aside for these rules (the record says
which). In float32 the reference arm is the oracle: the rule reads the candidate's KL against 1e-5.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Budget, Paired, assert_capability_at_least, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever(
        "attention",
        patch="mlx.core.fast.scaled_dot_product_attention",
        ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention",
        cand=None,
        path="prefill",
    ),
    pytest.mark.mlx_kl(prompts=16, tokens=128),
    pytest.mark.mlx_speed(),
]

KNOWN_BAD = "known_bad_ops:attention_scale_off"  # the softmax scale 10% off (gates/known_bad_ops.py)


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=1e-4, p99=1e-3, top1=0.98, relative=2.0)


def test_capability(paired: Paired) -> None:
    assert_capability_at_least(paired, ["arc_easy", "sciq"], max_drop=0.10, n=Budget(items=64, batch=16))
