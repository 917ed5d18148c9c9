"""A KL gate's per-token scores in the compact shapes the HTML report plots, capped so a record stays small.

`kl_profile` is what a KL record carries under `kl_profile` (documented in `results.wire.GateRecord`):
a histogram over fixed log-spaced edges, KL by position (median and p90 over prompts, with top-1 flips),
and each prompt's mean KL with an interval. Every array has a cap, whatever the gate's size, and
floats keep 4 significant digits (a plot needs no more): a 1,000-prompt gate's profile is ~12 KB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .intervals import CONFIDENCE, mean_interval

if TYPE_CHECKING:
    from .divergence import TokenScores

__all__ = ["HISTOGRAM_DECADES", "HISTOGRAM_PER_DECADE", "MAX_POSITIONS", "MAX_PROMPTS", "PROFILE_VERSION", "kl_profile"]

#: Bump when a reader would misread the profile's shape.
PROFILE_VERSION = 1
#: The histogram's fixed edges: 10**lo .. 10**hi, `HISTOGRAM_PER_DECADE` bins per decade (40 bins); KL
#: exactly 0, below 10**lo and at or above 10**hi are counted apart (`zero`, `under`, `over`).
HISTOGRAM_DECADES = (-8, 2)
HISTOGRAM_PER_DECADE = 4
#: At most this many position buckets: longer sequences pool neighbouring positions into one bucket.
MAX_POSITIONS = 128
#: At most this many prompts: beyond it the prompts with the largest means are kept (`total` says of how many).
MAX_PROMPTS = 128
_DIGITS = 4


def _r(x: float) -> float | None:
    """4 significant digits; None for what JSON cannot hold (NaN, inf: an unbounded interval end)."""
    x = float(x)
    return float(f"{x:.{_DIGITS}g}") if math.isfinite(x) else None


def kl_profile(scores: Sequence[TokenScores], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The plots' data from one gate's scores (one TokenScores per prompt, in prompt order)."""
    if not scores:
        raise ValueError("kl_profile needs at least one prompt's scores")
    kl = np.concatenate([np.asarray(s.kl, dtype=np.float64) for s in scores])
    positions = np.concatenate([np.asarray(s.positions, dtype=np.int64) for s in scores])
    same = np.concatenate([np.asarray(s.ref_top1) == np.asarray(s.cand_top1) for s in scores])
    near_tie = np.concatenate([np.asarray(s.near_tie, dtype=bool) for s in scores])
    return {
        "version": PROFILE_VERSION,
        "histogram": _histogram(kl),
        "by_position": _by_position(kl, positions, ~same & ~near_tie, ~same & near_tie),
        "prompts": _prompts(scores, confidence),
    }


def _histogram(kl: np.ndarray) -> dict[str, Any]:
    lo, hi = HISTOGRAM_DECADES
    bins = (hi - lo) * HISTOGRAM_PER_DECADE
    positive = kl[kl > 0]
    index = np.floor((np.log10(positive) - lo) * HISTOGRAM_PER_DECADE).astype(np.int64) if positive.size else positive
    inside = (index >= 0) & (index < bins)
    counts = np.bincount(index[inside], minlength=bins) if positive.size else np.zeros(bins, dtype=np.int64)
    return {
        "decades": [lo, hi],
        "per_decade": HISTOGRAM_PER_DECADE,
        "counts": [int(c) for c in counts],
        "zero": int(np.count_nonzero(kl == 0)),
        "under": int(np.count_nonzero(index < 0)),
        "over": int(np.count_nonzero(index >= bins)),
    }


def _by_position(kl: np.ndarray, positions: np.ndarray, flips: np.ndarray, tie_flips: np.ndarray) -> dict[str, Any]:
    """Per position (or bucket of neighbouring positions), over prompts: median and p90 KL, flips."""
    distinct = np.unique(positions)
    groups = np.array_split(distinct, min(MAX_POSITIONS, distinct.size))
    bucket = np.searchsorted(np.array([g[0] for g in groups]), positions, side="right") - 1
    order = np.argsort(bucket, kind="stable")
    starts = np.searchsorted(bucket[order], np.arange(len(groups)))
    ends = np.append(starts[1:], order.size)
    median, p90 = [], []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        q = np.quantile(kl[order[s:e]], [0.5, 0.9])
        median.append(_r(q[0]))
        p90.append(_r(q[1]))
    return {
        "first": [int(g[0]) for g in groups],
        "last": [int(g[-1]) for g in groups],
        "n": np.bincount(bucket, minlength=len(groups)).tolist(),
        "median": median,
        "p90": p90,
        "flips": np.bincount(bucket, weights=flips, minlength=len(groups)).astype(np.int64).tolist(),
        "near_tie_flips": np.bincount(bucket, weights=tie_flips, minlength=len(groups)).astype(np.int64).tolist(),
    }


def _prompts(scores: Sequence[TokenScores], confidence: float) -> dict[str, Any]:
    """Each prompt's mean KL and an interval from its contiguous blocks of tokens (batch means).

    Within a prompt, per-token KL is autocorrelated, so a t interval over its tokens would be too
    narrow; the t interval over floor(sqrt(T)) block means (each ~sqrt(T) tokens) is the standard
    batch-means remedy. A prompt of fewer than 4 tokens gets no interval (null ends).
    """
    rows: list[tuple[int, float, float, float, int]] = []
    for i, s in enumerate(scores):
        k = np.asarray(s.kl, dtype=np.float64)
        if not k.size:
            continue
        mean = float(k.mean())
        blocks = math.isqrt(k.size)
        lo, hi = -math.inf, math.inf
        if blocks >= 2:
            parts = np.array_split(k, blocks)
            lo, hi = mean_interval(
                np.array([p.mean() for p in parts]),
                confidence,
                weights=np.array([p.size for p in parts], dtype=np.float64),
            )
        rows.append((i, mean, max(0.0, lo) if math.isfinite(lo) else lo, hi, int(k.size)))
    total = len(rows)
    if total > MAX_PROMPTS:  # the largest means: where a regression shows first
        rows = sorted(sorted(rows, key=lambda r: -r[1])[:MAX_PROMPTS])
    return {
        "index": [r[0] for r in rows],
        "mean": [_r(r[1]) for r in rows],
        "ci": [[_r(r[2]), _r(r[3])] for r in rows],
        "n_tokens": [r[4] for r in rows],
        "total": total,
        "confidence": confidence,
        "method": "t over floor(sqrt(T)) contiguous block means",
    }
