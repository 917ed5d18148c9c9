"""Gate: MLX's fused attention (`mx.fast.scaled_dot_product_attention`) vs plain-ops attention.

Prefill path: one teacher-forced forward per prompt, so every attention call sees a full causal
block. The reference arm swaps the fused kernel for `pytest_mlxgate.reference_ops`' matmul +
float32 softmax version everywhere it is bound (mlx_lm's model files import it by name); the
candidate arm runs the original kernel.

How the limits were set (re-measure: `./dev gates --mlx-aa` checks every limit against the floor;
`./dev gates` shows the drift; both measured on the embedded model, 16 prompts x 128 tokens):
- A/A floor (the reference arm against itself: 0; with the prompt fed in chunks of a third through a
  KV cache): mean KL 3.3e-10, p99 1.6e-10, top-1 99.8% (95% bounds). The limits sit >= 10^5 x above it.
- On Linux CPU, mx.fast's attention *is* composed ops, so this lever measures exactly 0 here; on
  Metal and CUDA the fused kernels sum in another order, so expect small non-zero values (not
  measured here: no GPU). The limits (mean 1e-4, p99 1e-3, top-1 99%) accept rounding-order
  noise and nothing a real bug produces.
- A known-bad kernel must fail: a softmax scale off by 10% (patch the candidate with such a
  function via `--mlx-lever attention --mlx-ref-value ... --mlx-cand-value mymod:sdpa`) measures
  mean KL 1.5e-2, p99 0.12, top-1 93.1%.

Capability (smoke tier, both arms on the same items): ARC-Easy and SciQ scored by the log-probability
of each whole answer (the cloze form), where the embedded 135M model sits well off the floor
(ARC-Easy 50.0%, SciQ 42.2% on the 64 smoke items; on MMLU's lettered form it is at chance and
on IFEval at 12.5%, where no lever can show a drop). The gate passes only when the drop is shown to
be at most 10 points: `Budget` adds 16 items at a time until the anytime-valid bound clears the
margin either way. Here the lever is exact, so no pair differs and each task stops after 48 items
(a drop bounded at 0.079). A lost softmax scale (uniform attention) is a regression this shows:
ARC-Easy 50.0% -> 26.6% (tests/capability/test_planted_regression.py). `--mlx-tier full` runs the
full sets.
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
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=1e-4, p99=1e-3, top1=0.99)


def test_capability(paired: Paired) -> None:
    assert_capability_at_least(paired, ["arc_easy", "sciq"], max_drop=0.10, n=Budget(items=64, batch=16))
