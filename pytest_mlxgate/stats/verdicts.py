"""Three verdicts at a fixed n: what a paired drop or a score was *shown* to be, and the n that would tell.

A gate's limit is a margin: *pass* means the one-sided (1 - alpha) bound clears it (the drop's upper
bound <= max_drop, the score's lower bound >= floor); *fail* means the other side was shown (the drop's
lower bound above the margin, the score's upper bound under the floor); everything else is
*inconclusive*, which never passes: it says how far the bound is and about how many items at the
observed rates would clear the margin. "No significant drop" is not evidence of no drop, so a wide
interval around zero is inconclusive here, where a classical test would have called it a pass.

Bounds (fixed n, one look):
* pass/fail items: Tango's score interval for the paired difference of proportions (Tango 1998), whose
  two-sided (1 - 2 alpha) ends are the one-sided (1 - alpha) bounds; with no discordant pair at all it
  reduces to z^2 / (n + z^2), i.e. 25 agreeing items bound a drop at 0.10;
* graded items: the paired bootstrap's interval (hull of basic and percentile-t) at 1 - 2 alpha;
* a score's floor: one-sided Wilson bounds.
The words and the three-way rule are the one vocabulary's (`results/verdicts.py`), re-exported here.
`n_needed` projects the observed rates to a larger n (same discordance, same mean and spread) and
returns the first n whose bound would clear the margin: a planning figure, not a promise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..results.verdicts import Verdict, three_way
from .intervals import normal_quantile, wilson_bounds
from .paired_tests import tango_interval

__all__ = [
    "N_NEEDED_CAP",
    "Verdict",
    "VerdictOutcome",
    "binary_drop_bounds",
    "drop_n_needed_binary",
    "drop_n_needed_graded",
    "floor_n_needed",
    "score_bounds",
    "three_way",
]

#: Projections stop here; beyond it the message says "more than N_NEEDED_CAP".
N_NEEDED_CAP = 100_000


@dataclass(frozen=True)
class VerdictOutcome:
    """One limit's verdict with the numbers that decided it (JSON-ready)."""

    verdict: Verdict
    n: int
    value: float
    lower: float  # one-sided (1 - fail level) lower bound (drop) or (1 - alpha) lower bound (score)
    upper: float
    limit: float
    n_needed: int | None  # inconclusive: about how many items would clear the limit (None: not at these rates)
    method: str

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "n": self.n,
            "value": self.value,
            "lower": self.lower,
            "upper": self.upper,
            "limit": self.limit,
            "n_needed": self.n_needed,
            "method": self.method,
        }


def binary_drop_bounds(
    b: float, c: float, n: float, *, alpha: float, fail_alpha: float | None = None
) -> tuple[float, float]:
    """(lower at 1 - fail_alpha, upper at 1 - alpha), one-sided Tango score bounds of P(loss) - P(win)."""
    upper = tango_interval(b, c, n, 1.0 - 2.0 * alpha)[1]  # type: ignore[arg-type]
    lower = tango_interval(b, c, n, 1.0 - 2.0 * (fail_alpha or alpha))[0]  # type: ignore[arg-type]
    return lower, upper


def score_bounds(successes: float, n: float, *, alpha: float) -> tuple[float, float]:
    """One-sided (1 - alpha) Wilson bounds of a pass rate (each side at alpha)."""
    z = normal_quantile(1.0 - alpha)
    return wilson_bounds(successes, n, z)  # type: ignore[arg-type]


def _first_n(clears: Callable[[int], bool], n: int) -> int | None:
    """The smallest m > n with clears(m), assuming it stays true once true (doubling, then bisection)."""
    lo, hi = n, max(2 * n, n + 1)
    while not clears(hi):
        if hi >= N_NEEDED_CAP:
            return None
        lo, hi = hi, min(2 * hi, N_NEEDED_CAP)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if clears(mid):
            hi = mid
        else:
            lo = mid
    return hi


def drop_n_needed_binary(
    b: int, c: int, n: int, *, max_drop: float, alpha: float, fail_alpha: float | None = None
) -> int | None:
    """About how many items at the observed loss and win rates would decide the drop against max_drop."""
    drop = (b - c) / n
    if drop == max_drop:
        return None
    rb, rc = b / n, c / n

    def clears(m: int) -> bool:
        lo, hi = binary_drop_bounds(rb * m, rc * m, m, alpha=alpha, fail_alpha=fail_alpha)
        return hi <= max_drop if drop < max_drop else lo > max_drop

    return _first_n(clears, n)


def drop_n_needed_graded(
    drop: float, sd: float, n: int, *, max_drop: float, alpha: float, fail_alpha: float | None = None
) -> int | None:
    """The normal-approximation n at which mean +- z sd/sqrt(n) clears the margin (graded scores)."""
    gap = abs(max_drop - drop)
    if gap == 0:
        return None
    z = normal_quantile(1.0 - (alpha if drop < max_drop else (fail_alpha or alpha)))
    if sd == 0:
        return n + 1
    m = math.ceil((z * sd / gap) ** 2)
    return min(max(m, n + 1), N_NEEDED_CAP) if m <= N_NEEDED_CAP else None


def floor_n_needed(successes: int, n: int, *, floor: float, alpha: float) -> int | None:
    """About how many items at the observed pass rate would put the score's bound clear of `floor`."""
    rate = successes / n
    if rate == floor:
        return None

    def clears(m: int) -> bool:
        lo, hi = score_bounds(rate * m, m, alpha=alpha)
        return lo >= floor if rate > floor else hi < floor

    return _first_n(clears, n)
