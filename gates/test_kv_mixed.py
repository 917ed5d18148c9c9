"""Gate: the production KV plan — 8-bit on layers 3, 4, 9, 10, 11, 14, 4-bit elsewhere, group 64.

The plan this project descends from runs on gemma-4 e4b (`kv_config_production.json` beside this
file; layer indices are e4b's, all among its 24 cached layers). A candidate snapshot that ships its
own `kv_config.json` is gated on that plan instead (`snapshot_plan=`), as its serving stack would
run it. It runs here on the embedded model's 30 layers through the serving path like the uniform
8-bit gate (`test_kv_cache.py`, whose reference arm this gate shares: same plain cache, same sizes),
so the two read side by side.

Limits: `gates/calibration/test_kv_mixed.json` holds what they were set from, the A/A floor (the
reference arm is the 8-bit gate's), this plan's drift and KNOWN_BAD's (`pytest gates/test_kv_mixed.py
--mlx-calibrate` measures them again; the calibration files' test checks the limits against them).
24 of 30 layers at 4 bits cost a 135M model much more than uniform 8-bit, so the limits hold the plan
near where it is, with the check's room; what they catch is a kernel or plan that makes it worse: a
2-bit cache (KNOWN_BAD) fails them. What they cannot tell on this model: uniform 4-bit from this plan.

KV memory is counted, not sampled: 8-bit is 72 bytes per 64 float32 values (packed words, a scale and
a bias per group), 4-bit 40, so with 6 of 30 layers at 8 bits the cache is the same share of the plain
one at every context (e4b, 6 of 24: 0.188 by the same count; the e2b-shaped tiny gemma-4 of the tests,
6 of 15 with sliding windows: 0.235). The gate asks for at most 0.25 on any of them: below uniform
8-bit (0.281), so a plan that quietly stopped using 4 bits fails. Speed: on this CPU quantized
attention is composed ops, so the plan costs decode speed: reported, not asserted; on Metal the
quantized kernels are fused and the long-context ratio is the figure to watch.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever(
        "kv_cache",
        kv=True,
        ref="plain",
        cand="kv_config_production.json",
        snapshot_plan="kv_config.json",  # a snapshot's own plan, when it ships one, is what its serving stack runs
        path="serving",
    ),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]

KNOWN_BAD = {"bits": 2, "group_size": 64, "start": 0}  # a 2-bit cache: a plan that makes it worse


def test_drift(paired: Paired) -> None:
    # gemma3-270m's p99 under this plan is ~3x the embedded model's, with a wide interval at 16 prompts
    # (gates/calibration/gemma3-270m/test_kv_mixed.json): its limits have the rule's room there
    assert_kl_below(paired, mean=0.3, p99=2.0, top1=0.5, models={"gemma3-270m": {"mean": 0.5, "p99": 7.0}})


def test_memory(paired: Paired) -> None:
    assert_smaller(paired, kv=0.25, at="all")
