"""Gate: an 8-bit quantized KV cache vs the plain cache, on the serving path.

The serving path is what `mlx_lm.generate` runs: the prefix is prefilled into the cache, the cache
is quantized where the plan says (here every layer, 8 bits, group 64, from token 0), and the last
tokens are decoded one at a time through `quantized_scaled_dot_product_attention`. A plain-cache
compatibility path would never exercise that kernel, so it would miss the drift that ships.

How the limits were set (re-measure: `./dev gates --mlx-aa` checks every limit against the floor;
`./dev gates` shows the drift; both measured on the embedded model, 16 prompts x 128 tokens):
- A/A floor (the reference arm against itself: 0; with its prefix prefilled in chunks of a third):
  mean KL 1.8e-8, p99 1.6e-7, top-1 99.3% (95% bounds). Every limit sits >= 10^4 x above it, so a verdict is
  never decided by noise.
- This lever (8-bit, group 64, from token 0): mean KL 3.9e-4 (95% upper 5.3e-4), p99 4.3e-3,
  top-1 99.0% (lower 97.7%). The limits leave it ~4x of room: mean 2e-3, p99 2e-2, top-1 95%.
- A known-bad change must fail: a 4-bit cache (`--mlx-lever kv_cache --mlx-ref-value plain
  --mlx-cand-value bits=4,group_size=64,start=0`) measures mean KL 0.12, p99 0.93, top-1 82.6%.

Speed and memory (`mlx_speed`: both arms on the serving path at 64 and 256 tokens of context, 8
decoded, 9 interleaved pairs): the 8-bit cache holds 72 bytes per 64 float32 values (packed words,
a scale and a bias per group): 0.281 x the plain cache at every context, which `test_memory` asks
for (at most 0.3). On this CPU, quantized attention is composed ops (dequantize, then matmul), so
8-bit costs decode speed (measured x0.86 [0.80, 0.92] at 256 tokens, 11.4 -> 9.6 tok/s, on an
otherwise idle machine; prefill x0.96 [0.90, 1.04]); reported, not asserted. On Metal the quantized attention is one fused kernel
and long contexts are where it should pay: there, assert it (`assert_faster(paired, decode=...)`).

Long context: HashHop is where KV-cache approximations fail first; both arms generate in batches
through the arm's own caches (`serving.batch`: plain `BatchKVCache` vs a left-padded batch of
8-bit quantized caches); alone, that loop is `mlx_lm.stream_generate(kv_bits=8)` token for token. The smoke tier (~384-token
contexts, 1-2 hops, the chain form) is one the embedded model solves a third of (33.3% of 24
items); an 8-bit cache answered every one of those 24 exactly as the plain cache did, a 2-bit cache
none (0%). Items cost ~5.6 s per arm here (16 in ~90 s), so the gate asks for 16 and a 15-point margin, which 16
agreeing items show (bound 0.145); a real regression needs ~40+ items to be *shown* against that
margin (a 33-point loss on 24 items is not yet: p = 0.065), so this is a coarse check beside the
KL gate's fine one; `--mlx-tier full` (~12k-token contexts, 1-4 hops) is the real test.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_capability_at_least, assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=2e-3, p99=2e-2, top1=0.95)


def test_memory(paired: Paired) -> None:
    assert_faster(paired, kv=0.3, at="all")


def test_long_context(paired: Paired) -> None:
    assert_capability_at_least(paired, "hashhop", max_drop=0.15, n=16)
