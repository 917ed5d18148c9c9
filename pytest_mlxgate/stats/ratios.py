"""A paired ratio (candidate / reference) with its interval: how speed and memory are decided.

Each repetition times both arms back to back, so slow moments of the machine hit both; the unit is
the pair's ratio. Ratios multiply, so the estimate is the geometric mean of the per-pair ratios
and the interval a Student-t interval on their logarithms, turned back into ratios (a lognormal
model: timing noise is multiplicative).

Speed trials are sequential (`speed.measure`): pairs are added until the verdict is decided, looking
at a few pair counts fixed in advance (`look_points`), so the interval shown after n pairs is
`look_confidence(n, budget)`'s, not the fixed-n one. Looking with fixed-n intervals and stopping on
the first that clears a goal would pass a lever at its goal far more often than 2.5% of the time
(tests/stats/test_ratios.py simulates both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .intervals import CONFIDENCE, t_quantile

__all__ = ["FIRST_LOOK", "RatioEstimate", "look_confidence", "look_points", "paired_ratio", "ratio_pairs_needed"]


@dataclass(frozen=True)
class RatioEstimate:
    """The geometric mean of n pair ratios and its interval (both ends nan below 2 pairs)."""

    ratio: float
    lower: float
    upper: float
    n: int
    log_sd: float  # spread of the log ratios: what sizes a repeat

    def to_json(self) -> dict[str, float | int | list[float | None] | None]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        return {
            "ratio": num(self.ratio),
            "ratio_ci": [num(self.lower), num(self.upper)],
            "n": self.n,
            "log_sd": num(self.log_sd),
        }


def paired_ratio(
    candidate: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> RatioEstimate:
    """The candidate/reference ratio from paired, positive measurements (tokens/s, bytes).

    Pairs where either side is not a positive finite number are refused: a zero time or a zero
    peak is a measurement that failed, and no ratio can be taken from it.
    """
    cand = np.asarray(candidate, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if cand.shape != ref.shape or cand.ndim != 1 or cand.size == 0:
        raise ValueError(f"need as many candidate as reference values, at least one (got {cand.shape}, {ref.shape})")
    if not (np.all(np.isfinite(cand)) and np.all(np.isfinite(ref)) and np.all(cand > 0) and np.all(ref > 0)):
        raise ValueError("ratios need positive, finite measurements on both arms")
    logs = np.log(cand) - np.log(ref)
    n = int(logs.size)
    center = float(np.mean(logs))
    if n < 2:
        return RatioEstimate(math.exp(center), math.nan, math.nan, n, math.nan)
    sd = float(np.std(logs, ddof=1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return RatioEstimate(math.exp(center), math.exp(center - half), math.exp(center + half), n, sd)


#: The fewest pairs a sequential speed trial looks at (an interval needs a spread: 3 pairs at least).
FIRST_LOOK = 3
#: Looks after 4 pairs and then every time the count has grown by half (4, 6, 9, 13, ...), and at the
#: budget: few looks, so each keeps most of the error rate, and the counts where a decision is likely.
_FIRST_SCHEDULED, _GROWTH = 4, 1.5


def look_points(budget: int) -> tuple[int, ...]:
    """The pair counts a sequential trial of at most `budget` pairs looks at: 4, 6, 9, 13, ... below
    the budget, then the budget itself. Fixed before any pair is timed."""
    if budget < FIRST_LOOK:
        raise ValueError(f"a sequential ratio looks from {FIRST_LOOK} pairs (got a budget of {budget})")
    points: list[int] = []
    n = _FIRST_SCHEDULED
    while n < budget:
        points.append(n)
        n = math.ceil(n * _GROWTH)
    return (*points, budget)


def look_confidence(n: int, budget: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided level of the interval shown at look `n` (one of `look_points(budget)`), such that
    the intervals of every look hold the true ratio all at once with `confidence` (Bonferroni over the
    looks: whatever the stopping rule, a verdict read at a look is wrong with probability at most
    1 - confidence, half of it per side). Half the error goes to the last look, so a trial that runs
    its whole budget reads nearly as a fixed-n one would; the other half is spread evenly over the
    looks before it."""
    points = look_points(budget)
    if n not in points:
        raise ValueError(f"{n} pairs is not a look of a trial of at most {budget} (it looks at {list(points)})")
    alpha = 1.0 - confidence
    if len(points) == 1:
        return confidence
    if n == budget:
        return 1.0 - alpha / 2.0
    return 1.0 - alpha / 2.0 / (len(points) - 1)


def ratio_pairs_needed(estimate: RatioEstimate, limit: float, confidence: float = CONFIDENCE) -> int | None:
    """About how many pairs would put the interval on one side of `limit` at the observed spread;
    None when the point estimate sits on the limit (no number of pairs would tell) or no spread is known."""
    if estimate.n < 2 or not math.isfinite(estimate.log_sd) or limit <= 0:
        return None
    gap = abs(math.log(estimate.ratio) - math.log(limit))
    if gap == 0:
        return None
    z = t_quantile(0.5 + confidence / 2.0, max(1, estimate.n - 1))
    return max(estimate.n + 1, math.ceil((z * estimate.log_sd / gap) ** 2))
