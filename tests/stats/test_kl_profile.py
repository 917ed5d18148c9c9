"""`kl_profile`: the compact plot data a KL record carries — counts that add up, the right bins and
quantiles, the caps that keep a record small whatever the gate's size, strict JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pytest
from report_records import synthetic_scores

from pytest_mlxgate.stats.divergence import TokenScores
from pytest_mlxgate.stats.kl_profile import (
    HISTOGRAM_DECADES,
    HISTOGRAM_PER_DECADE,
    MAX_POSITIONS,
    MAX_PROMPTS,
    kl_profile,
)
from pytest_mlxgate.stats.kl_stats import summarize


def scores(kl: list[float], *, first: int = 0, flips: Sequence[int] = (), ties: Sequence[int] = ()) -> TokenScores:
    n = len(kl)
    ref = np.zeros(n, dtype=np.int32)
    cand = ref.copy()
    cand[list(flips)] = 1
    near = np.zeros(n, dtype=bool)
    near[list(ties)] = True
    return TokenScores(
        kl=np.array(kl, dtype=np.float64),
        ref_top1=ref,
        cand_top1=cand,
        near_tie=near,
        ref_next_logprob=np.zeros(n, dtype=np.float32),
        cand_next_logprob=np.zeros(n, dtype=np.float32),
        next_tokens=np.zeros(n, dtype=np.int32),
        positions=np.arange(first, first + n, dtype=np.int32),
    )


def test_the_histogram_counts_every_token_once_in_its_quarter_decade() -> None:
    p = kl_profile([scores([0.0, 1e-9, 1e-8, 1.5e-8, 1e-3, 0.00178, 1e2, 5e3])])
    h = p["histogram"]
    assert h["decades"] == list(HISTOGRAM_DECADES) and h["per_decade"] == HISTOGRAM_PER_DECADE
    assert len(h["counts"]) == (HISTOGRAM_DECADES[1] - HISTOGRAM_DECADES[0]) * HISTOGRAM_PER_DECADE
    assert (h["zero"], h["under"], h["over"]) == (1, 1, 2)
    assert sum(h["counts"]) + h["zero"] + h["under"] + h["over"] == 8
    assert h["counts"][0] == 2  # 1e-8 and 1.5e-8: [1e-8, 10**-7.75)
    i = (-3 - HISTOGRAM_DECADES[0]) * HISTOGRAM_PER_DECADE
    assert h["counts"][i] == 1 and h["counts"][i + 1] == 1  # 1e-3; 1.78e-3 lies in [10**-2.75, 10**-2.5)


def test_by_position_gives_median_and_p90_over_prompts_and_the_flips_there() -> None:
    p = kl_profile(
        [
            scores([1.0, 2.0, 3.0], flips=[1], ties=[2]),
            scores([3.0, 4.0, 5.0], flips=[2], ties=[1]),
            scores([5.0, 6.0, 7.0], flips=[2]),
        ]
    )
    bp = p["by_position"]
    assert bp["first"] == bp["last"] == [0, 1, 2] and bp["n"] == [3, 3, 3]
    assert bp["median"] == [3.0, 4.0, 5.0]
    assert bp["p90"] == pytest.approx(
        [float(np.quantile([1, 3, 5], 0.9)), float(np.quantile([2, 4, 6], 0.9)), float(np.quantile([3, 5, 7], 0.9))],
        rel=1e-3,
    )
    # position 1: prompt 0 flipped outside a near tie, prompt 1 flipped nothing (a near tie only);
    # position 2: prompts 1 and 2 flipped, prompt 0 had a near tie without a flip
    assert bp["flips"] == [0, 1, 2] and bp["near_tie_flips"] == [0, 0, 0]


def test_flip_counts_match_the_statistics() -> None:
    s = synthetic_scores(5, 40)
    stats, bp = summarize(s), kl_profile(s)["by_position"]
    assert sum(bp["flips"]) == stats.flips and sum(bp["near_tie_flips"]) == stats.near_tie_flips
    assert sum(bp["n"]) == stats.n_tokens


def test_long_sequences_pool_neighbouring_positions_into_at_most_the_cap() -> None:
    bp = kl_profile(synthetic_scores(2, 1000))["by_position"]
    assert len(bp["first"]) == MAX_POSITIONS and sum(bp["n"]) == 2000
    assert bp["first"][0] == 0 and bp["last"][-1] == 999
    assert all(
        b == a + 1 for a, b in zip(bp["last"][:-1], bp["first"][1:], strict=True)
    )  # contiguous, no gaps or overlaps


def test_each_prompt_gets_its_mean_and_a_batch_means_interval() -> None:
    p = kl_profile([scores([0.1] * 3), scores(list(np.linspace(0.0, 2.0, 64)))])["prompts"]
    assert p["index"] == [0, 1] and p["total"] == 2 and p["n_tokens"] == [3, 64]
    assert p["ci"][0] == [None, None]  # 3 tokens: one block, no interval
    lo, hi = p["ci"][1]
    assert lo is not None and hi is not None and 0 <= lo < p["mean"][1] < hi
    assert p["mean"][1] == pytest.approx(1.0, rel=1e-3)


def test_past_the_cap_the_prompts_with_the_largest_means_are_kept_in_prompt_order() -> None:
    n = MAX_PROMPTS + 50
    p = kl_profile([scores([float(i)] * 4) for i in range(n)])["prompts"]
    assert p["total"] == n and len(p["index"]) == MAX_PROMPTS
    assert p["index"] == list(range(50, n))


def test_a_large_gate_s_profile_stays_small_and_strict_json() -> None:
    text = json.dumps(kl_profile(synthetic_scores(1000, 256)), allow_nan=False)
    assert len(text) < 24_000, len(text)
    doc = json.loads(text)
    assert all(v is None or math.isfinite(v) for v in doc["by_position"]["p90"])
