"""Gate: the production KV plan — 8-bit on layers 3, 4, 9, 10, 11, 14, 4-bit elsewhere, group 64.

The plan this project descends from runs on gemma-4 e4b (`kv_config_production.json` beside this
file; layer indices are e4b's, all among its 24 cached layers). It runs here on the embedded
model's 30 layers through the serving path like the uniform 8-bit gate (`test_kv_cache.py`, whose
reference arm this gate shares: same plain cache, same sizes), so the two read side by side.

How the limits were set (embedded model, 16 prompts x 128 tokens, the last 32 decoded):
- A/A floor: the reference arm is the 8-bit gate's, floor mean KL 1.8e-8, p99 1.6e-7.
- This plan: mean KL 8.9e-2 (95% upper 1.1e-1), p99 0.64 (upper 0.83), top-1 85.7% (lower 81.6%):
  24 of 30 layers at 4 bits cost a 135M model much more than uniform 8-bit (mean 4.2e-4). The limits
  hold it where it is, ~2x of room: mean 0.2, p99 1.5, top-1 75%; what they catch is a kernel or
  plan that makes it worse: a 2-bit cache (`--mlx-lever kv_cache --mlx-ref-value plain
  --mlx-cand-value bits=2,group_size=64,start=0`) measures mean KL 3.1, p99 8.8, top-1 20.7%. What
  they cannot tell on this model: uniform 4-bit (mean 0.12) from this plan.
- KV memory is counted, not sampled: 8-bit is 72 bytes per 64 float32 values (packed words, a scale
  and a bias per group), 4-bit 40; with 6 of 30 layers at 8 bits the cache is 0.181 x the plain one
  at every context (e4b, 6 of 24: 0.188 by the same count; the e2b-shaped tiny gemma-4 of the tests,
  6 of 15 with sliding windows: 0.235). The gate asks for at most 0.25 on any of them: below uniform
  8-bit (0.281), so a plan that quietly stopped using 4 bits fails.
- Speed (CPU, 2 cores: quantized attention is composed ops here, so the plan costs decode speed:
  decode x0.92 [0.86, 0.99] at 256 tokens of context, 9.2 -> 8.8 tok/s): reported, not asserted; on
  Metal the quantized kernels are fused and the long-context ratio is the figure to watch.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand="kv_config_production.json", path="serving"),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=0.2, p99=1.5, top1=0.75)


def test_memory(paired: Paired) -> None:
    assert_faster(paired, kv=0.25, at="all")
