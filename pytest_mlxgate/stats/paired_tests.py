"""Paired statistics for the capability gate: did the candidate lose more than `max_drop`?

Both arms answer the SAME items, so every test here is paired: an item that both arms get right (or
both wrong) says nothing about a difference, and pairing removes the item-difficulty variance that an
unpaired test would have to pay for with several times more items.

The gate's question, and the burden of proof
--------------------------------------------
`drop = score(ref) - score(cand)` (positive = the candidate is worse). The gate uses
`drop_exceeds`, which tests

    H0: drop <= max_drop   against   H1: drop > max_drop

and FAILS only when H0 is rejected at level `alpha`, i.e. when the drop is significantly larger than
`max_drop`. This protects against false alarms: a candidate that truly lost no more than `max_drop`
fails with probability <= alpha (checked by exact enumeration and simulation in the tests). The price
is that a small evaluation passes almost anything: power is what sample size buys, so it must be
planned. With exact McNemar (`max_drop = 0`), one-sided alpha = 0.05, and a true regression of
3 points where 5% of items are discordant (ref-right/cand-wrong 4%, ref-wrong/cand-right 1%), the
normal-approximation sample-size formula (Connor 1987) gives n = 342 paired items for 80% power.
The exact test is discrete and so a little conservative: computed exactly (`power_binary_exact`),
n = 342 has 76.5% power and the gate needs n = 371 (`n_for_power(0.05, 0.03, max_drop=0.0)`; from
there on power stays >= 80%). Plan on 371 items for that scenario, ~400 with any slack.

`drop_within` is the other direction, proper non-inferiority (H0: drop >= max_drop; rejecting it
DEMONSTRATES that the candidate lost less than `max_drop`). It needs much more data to pass and is
offered for reports that must prove equivalence rather than merely fail to find a regression.

Methods
-------
* binary, `max_drop == 0`: exact McNemar, the conditional binomial test on the discordant pairs
  (b losses, c wins): under drop = 0, b | b + c ~ Bin(b + c, 1/2).
* binary, `max_drop != 0`: the exact conditional test does not extend to a margin (the discordant
  split then depends on a nuisance parameter), so we use the restricted-MLE score test for a
  difference of paired proportions (Tango 1998, Stat Med 17:891; Nam 1997, Biometrics 53:1422):
  Z = (b - c - n*delta) / sqrt(n * (2*q~ + delta - delta^2)) with q~ the MLE of P(wins) under
  drop = delta, WITH a McNemar-style continuity correction of 1 on b - c - n*delta. Uncorrected,
  its exact size at the boundary reaches 8.9% at alpha = 0.05 when discordant pairs are few and
  mostly losses (n = 300, max_drop = 0.01, 1.5% discordant); corrected, the exact worst case over
  n in 20..2000, max_drop in 0.005..0.2, discordance up to 90% is 4.7% (`power_binary_exact`).
* graded scores: a paired bootstrap of mean(ref - cand) that rejects only when BOTH the shift
  (null-imposed, basic) bootstrap and the studentized (percentile-t) bootstrap reject, i.e.
  p = max of the two. Each fails alone on realistic eval data: the shift test reaches ~8-10% size
  when differences are skewed toward rare big candidate wins, the percentile-t test ~7-9% when only
  a few items differ at all (identical greedy outputs); requiring both keeps the size at or below
  the better of the two (measured 4-5% in those regimes) at little cost in power.
* intervals: Tango's published score interval for a binary paired difference (inverting the
  statistic WITHOUT the test's continuity correction),
  the hull of the percentile-t and basic bootstrap intervals for graded ones (matching the
  conservative test); both two-sided at `ci_confidence` (95% by default).
  Note the one-sided test at alpha agrees with a two-sided (1 - 2*alpha) interval, so at alpha = 0.05
  the reported 95% interval can include `max_drop` while the test (barely) rejects.

No scipy: normal quantiles and binomial tails are computed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

import numpy as np

from .intervals import normal_cdf, z_two_sided

__all__ = [
    "DropOptions",
    "DropTest",
    "PairedBinary",
    "Scores",
    "drop_exceeds",
    "drop_test_binary",
    "drop_test_graded",
    "drop_within",
    "holm",
    "mcnemar_exact_p",
    "mcnemar_exact_p_two_sided",
    "mean_interval_bootstrap",
    "paired_binary",
    "score_array",
    "score_z",
    "tango_interval",
]

Alternative = Literal["exceeds", "within"]
Kind = Literal["auto", "binary", "graded"]
#: Per-item scores, one per item in the shared item order: a list (bools or floats) or a 1-D array.
Scores = Sequence[bool | float] | np.ndarray
_CONTINUITY = 1.0  # on b - c - n*delta: keeps the score test's exact size <= alpha (module docs)
_HYPOTHESIS = {
    "exceeds": "H0: drop <= max_drop (reject: drop significantly larger)",
    "within": "H0: drop >= max_drop (reject: drop significantly smaller)",
}


def check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


# --- binomial tails -------------------------------------------------------------------------------------


def _log_comb(m: int) -> np.ndarray:
    """log C(m, k) for k = 0..m (lgamma per term: no cumulative rounding drift)."""
    lg = np.array([math.lgamma(k + 1.0) for k in range(m + 1)])
    return np.asarray(lg[m] - lg - lg[::-1], dtype=np.float64)


def binom_pmf(m: int, p: float) -> np.ndarray:
    """Bin(m, p) probabilities for k = 0..m, in log space so large m neither overflows nor underflows."""
    k = np.arange(m + 1, dtype=np.float64)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(m + 1)
        out[0 if p <= 0.0 else m] = 1.0
        return out
    return np.asarray(np.exp(_log_comb(m) + k * math.log(p) + (m - k) * math.log1p(-p)))


def upper_tail_half(m: int) -> np.ndarray:
    """P(X >= k | X ~ Bin(m, 1/2)) for k = 0..m (summed from the small end: small tails stay exact)."""
    pmf = binom_pmf(m, 0.5)
    return np.asarray(np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0), dtype=np.float64)


def mcnemar_exact_p(b: int, c: int) -> float:
    """One-sided exact McNemar p for "losses exceed wins": P(X >= b | X ~ Bin(b + c, 1/2)).

    Conditional on the b + c discordant pairs, each is a loss with probability 1/2 under drop = 0;
    concordant pairs carry no information about the difference. No discordant pairs: p = 1.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    if b == 0:
        return 1.0
    return float(upper_tail_half(b + c)[b])


def mcnemar_exact_p_two_sided(b: int, c: int) -> float:
    """Two-sided exact McNemar p: twice the smaller one-sided tail, capped at 1."""
    return min(1.0, 2.0 * min(mcnemar_exact_p(b, c), mcnemar_exact_p(c, b)))


# --- the paired binary table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedBinary:
    """The paired 2x2 table: what a binary drop test needs from two arms' per-item outcomes."""

    n: int
    ref_correct: int
    cand_correct: int
    b: int  # ref right, cand wrong (discordant: losses)
    c: int  # ref wrong, cand right (discordant: wins)


def score_array(values: Scores, name: str) -> np.ndarray:
    """Per-item scores as a flat float64 array: no nesting, nothing non-finite."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of per-item scores, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite scores")
    return arr


def _pair(ref: Scores, cand: Scores) -> tuple[np.ndarray, np.ndarray]:
    r, c = score_array(ref, "ref"), score_array(cand, "cand")
    if r.shape != c.shape:
        raise ValueError(f"the arms must score the same items: {r.size} ref vs {c.size} cand scores")
    if r.size == 0:
        raise ValueError("no items to compare")
    return r, c


def _is_binary(arr: np.ndarray) -> bool:
    return bool(np.all((arr == 0.0) | (arr == 1.0)))


def paired_binary(ref: Scores, cand: Scores) -> PairedBinary:
    """Join two arms' 0/1 outcomes item by item into the paired table (same order, same length)."""
    r, c = _pair(ref, cand)
    if not (_is_binary(r) and _is_binary(c)):
        raise ValueError("binary outcomes must be 0/1 (or bools); use drop_test_graded for graded scores")
    rb, cb = r.astype(bool), c.astype(bool)
    return PairedBinary(
        n=int(r.size),
        ref_correct=int(rb.sum()),
        cand_correct=int(cb.sum()),
        b=int(np.sum(rb & ~cb)),
        c=int(np.sum(~rb & cb)),
    )


# --- the margin score test (Tango 1998 / Nam 1997) ----------------------------------------------------------


def _restricted_q(b: float, c: float, n: float, delta: float) -> float:
    """MLE of P(win) = P(ref wrong, cand right) under P(loss) - P(win) = delta.

    Profile likelihood b*log(q + delta) + c*log(q) + (n - b - c)*log(1 - 2q - delta); its stationary
    point solves 2n q^2 + B q + C = 0 with B = -(b + c) + delta*(2n - b + c), C = -c*delta*(1 - delta);
    the larger root is the one in [max(0, -delta), (1 - delta)/2].
    """
    bb = -(b + c) + delta * (2.0 * n - b + c)
    cc = -c * delta * (1.0 - delta)
    disc = max(bb * bb - 8.0 * n * cc, 0.0)
    return max((math.sqrt(disc) - bb) / (4.0 * n), max(0.0, -delta))


def score_z(b: int, c: int, n: int, delta: float, *, correction: float = 0.0) -> float:
    """Tango's score statistic for H0: drop = delta; large values mean the drop exceeds delta.

    Z = (b - c - n*delta) / sqrt(n*(2q~ + delta - delta^2)); at delta = 0 it is the uncorrected McNemar
    statistic (b - c)/sqrt(b + c). `correction` shrinks the numerator toward 0 by that much (the gate
    uses 1, McNemar's continuity correction). Zero null variance (delta = 0, b = c = 0): 0.
    """
    if not -1.0 < delta < 1.0:
        raise ValueError(f"delta must be in (-1, 1), got {delta}")
    if b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need 0 <= b, c and b + c <= n, got b={b}, c={c}, n={n}")
    q = _restricted_q(b, c, n, delta)
    var = n * (2.0 * q + delta - delta * delta)
    num = b - c - n * delta
    num = math.copysign(max(abs(num) - correction, 0.0), num)
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def tango_interval(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Tango's score interval for drop = p_ref - p_cand: the deltas the two-sided score test keeps."""
    z = z_two_sided(confidence)
    if n <= 0:
        raise ValueError("no items to compare")
    est = (b - c) / n

    def solve(target: float, lo: float, hi: float) -> float:
        # score_z decreases in delta; find where it crosses `target` (bisection, 1e-12).
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if score_z(b, c, n, mid) > target:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-12:
                break
        return 0.5 * (lo + hi)

    eps = 1e-12
    lower = -1.0 if score_z(b, c, n, -1.0 + eps) <= z else solve(z, -1.0 + eps, est)
    upper = 1.0 if score_z(b, c, n, 1.0 - eps) >= -z else solve(-z, est, 1.0 - eps)
    return (max(-1.0, lower), min(1.0, upper))


def binary_drop_p(b: int, c: int, n: int, max_drop: float, alternative: Alternative) -> tuple[str, float]:
    if max_drop == 0.0:
        p = mcnemar_exact_p(b, c) if alternative == "exceeds" else mcnemar_exact_p(c, b)
        return "exact-mcnemar", p
    z = score_z(b, c, n, max_drop, correction=_CONTINUITY)
    return "score-margin", normal_cdf(-z) if alternative == "exceeds" else normal_cdf(z)


# --- the result -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DropTest:
    """One paired drop test: estimate, interval, p-value and the verdict, JSON-ready for the report."""

    method: str  # "exact-mcnemar" | "score-margin" | "paired-bootstrap"
    n: int
    ref_score: float
    cand_score: float
    drop: float  # ref - cand (positive = the candidate is worse)
    drop_ci: tuple[float, float]  # two-sided, at ci_confidence
    max_drop: float
    p_value: float  # one-sided, for the null named by `alternative`
    rejected: bool  # p_value < alpha; for "exceeds" that means the gate fails
    b: int | None  # losses (binary only)
    c: int | None  # wins (binary only)
    alpha: float = 0.05
    alternative: str = "exceeds"
    ci_confidence: float = 0.95

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (no NaN/inf: undefined numbers become None)."""
        return {
            "method": self.method,
            "n": self.n,
            "ref_score": _num(self.ref_score),
            "cand_score": _num(self.cand_score),
            "drop": _num(self.drop),
            "drop_ci": [_num(self.drop_ci[0]), _num(self.drop_ci[1])],
            "ci_confidence": _num(self.ci_confidence),
            "max_drop": _num(self.max_drop),
            "alternative": self.alternative,
            "hypothesis": _HYPOTHESIS.get(self.alternative, self.alternative),
            "alpha": _num(self.alpha),
            "p_value": _num(self.p_value),
            "rejected": bool(self.rejected),
            "b": self.b,
            "c": self.c,
        }


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def check_margin(max_drop: float) -> None:
    if not -1.0 < max_drop < 1.0:
        raise ValueError(f"max_drop must be in (-1, 1) (a difference of proportions), got {max_drop}")


# --- the tests --------------------------------------------------------------------------------------------


def drop_test_binary(
    ref: Scores,
    cand: Scores,
    *,
    max_drop: float,
    alpha: float = 0.05,
    alternative: Alternative = "exceeds",
    ci_confidence: float = 0.95,
) -> DropTest:
    """Paired test on 0/1 outcomes: exact McNemar at max_drop = 0, Tango's score test otherwise."""
    check_alpha(alpha)
    check_margin(max_drop)
    t = paired_binary(ref, cand)
    method, p = binary_drop_p(t.b, t.c, t.n, max_drop, alternative)
    return DropTest(
        method=method,
        n=t.n,
        ref_score=t.ref_correct / t.n,
        cand_score=t.cand_correct / t.n,
        drop=(t.b - t.c) / t.n,
        drop_ci=tango_interval(t.b, t.c, t.n, ci_confidence),
        max_drop=float(max_drop),
        p_value=p,
        rejected=p < alpha,
        b=t.b,
        c=t.c,
        alpha=alpha,
        alternative=alternative,
        ci_confidence=ci_confidence,
    )


def _bootstrap_means_sds(d: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Means and sample SDs of `resamples` with-replacement resamples of d (chunked: bounded memory)."""
    rng = np.random.default_rng(seed)
    n = d.size
    means = np.empty(resamples)
    sds = np.empty(resamples)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        x = d[rng.integers(0, n, size=(stop - start, n))]
        means[start:stop] = x.mean(axis=1)
        sds[start:stop] = x.std(axis=1, ddof=1) if n > 1 else 0.0
    return means, sds


def drop_test_graded(
    ref: Scores,
    cand: Scores,
    *,
    max_drop: float,
    alpha: float = 0.05,
    resamples: int = 10000,
    seed: int = 0,
    alternative: Alternative = "exceeds",
    ci_confidence: float = 0.95,
) -> DropTest:
    """Paired bootstrap on graded scores: rejects only when the shift AND the percentile-t tests do.

    With d = ref - cand resampled by item (the same resamples feed both):
    * shift (null-imposed): p1 = (1 + #{mean(d*) - mean(d) >= mean(d) - max_drop}) / (B + 1);
    * percentile-t: t_obs = (mean(d) - max_drop)/se, t* = (mean(d*) - mean(d))/se*,
      p2 = (1 + #{t* >= t_obs}) / (B + 1); a resample with se* = 0 gets t* = +-inf by its shift.
    p = max(p1, p2) (the module docs say why). Both are valid Monte Carlo p-values, never 0. The
    interval is the hull of the basic and percentile-t intervals, clipped to the observed range of d.
    """
    check_alpha(alpha)
    check_margin(max_drop)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < ci_confidence < 1.0:
        raise ValueError(f"ci_confidence must be in (0, 1), got {ci_confidence}")
    r, c = _pair(ref, cand)
    d = r - c
    n = d.size
    mean = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    means, sds = _bootstrap_means_sds(d, resamples, seed)
    shift = means - mean
    ses = sds / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        tstar = np.where(ses > 0, shift / np.where(ses > 0, ses, 1.0), np.sign(shift) * np.inf)
    excess = mean - max_drop
    sign = 1.0 if alternative == "exceeds" else -1.0
    if se > 0:
        p_shift = (1.0 + float(np.sum(sign * shift >= sign * excess))) / (resamples + 1.0)
        p_t = (1.0 + float(np.sum(sign * tstar >= sign * excess / se))) / (resamples + 1.0)
        p = max(p_shift, p_t)
    else:  # every item moved by exactly `mean`: the sign of the excess is certain
        p = 1.0 / (resamples + 1.0) if sign * excess > 0 else 1.0
    tail = (1.0 - ci_confidence) / 2.0
    if se > 0:
        big = np.finfo(np.float64).max / 4.0  # quantile() of +-inf neighbours is nan; clip, then clip CI
        s_lo, s_hi = np.quantile(shift, [tail, 1.0 - tail])
        t_lo, t_hi = np.quantile(np.clip(tstar, -big, big), [tail, 1.0 - tail])
        lo = min(mean - float(s_hi), mean - float(t_hi) * se)
        hi = max(mean - float(s_lo), mean - float(t_lo) * se)
        ci = (max(lo, float(d.min())), min(hi, float(d.max())))
    else:
        ci = (mean, mean)
    return DropTest(
        method="paired-bootstrap",
        n=n,
        ref_score=float(r.mean()),
        cand_score=float(c.mean()),
        drop=mean,
        drop_ci=ci,
        max_drop=float(max_drop),
        p_value=p,
        rejected=p < alpha,
        b=None,
        c=None,
        alpha=alpha,
        alternative=alternative,
        ci_confidence=ci_confidence,
    )


class DropOptions(TypedDict, total=False):
    """`drop_exceeds`/`drop_within`'s options: `alpha` (0.05); `kind` ("auto", the default: the binary
    tests when every score is 0/1, the graded bootstrap otherwise); the bootstrap's `resamples`
    (10000) and `seed` (0)."""

    alpha: float
    kind: Kind
    resamples: int
    seed: int


def _dispatch(ref: Scores, cand: Scores, max_drop: float, alternative: Alternative, options: DropOptions) -> DropTest:
    unknown = sorted(set(options) - set(DropOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    alpha, kind = options.get("alpha", 0.05), options.get("kind", "auto")
    if kind == "auto":
        r, c = _pair(ref, cand)
        kind = "binary" if _is_binary(r) and _is_binary(c) else "graded"
    if kind == "binary":
        return drop_test_binary(ref, cand, max_drop=max_drop, alpha=alpha, alternative=alternative)
    return drop_test_graded(
        ref,
        cand,
        max_drop=max_drop,
        alpha=alpha,
        resamples=options.get("resamples", 10000),
        seed=options.get("seed", 0),
        alternative=alternative,
    )


def drop_exceeds(ref: Scores, cand: Scores, *, max_drop: float, **options: Unpack[DropOptions]) -> DropTest:
    """The gate's test, H0: drop <= max_drop; `rejected` (the gate fails) = the drop is significantly larger."""
    return _dispatch(ref, cand, max_drop, "exceeds", options)


def drop_within(ref: Scores, cand: Scores, *, max_drop: float, **options: Unpack[DropOptions]) -> DropTest:
    """Non-inferiority proper, H0: drop >= max_drop; `rejected` = the drop is shown smaller than max_drop."""
    return _dispatch(ref, cand, max_drop, "within", options)


# --- power -----------------------------------------------------------------------------------------------


# --- intervals of graded means, and multiplicity ---------------------------------------------------------------


def mean_interval_bootstrap(
    scores: Scores, confidence: float = 0.95, resamples: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval for a mean of graded scores (stays inside the scores' range)."""
    s = score_array(scores, "scores")
    if s.size == 0:
        raise ValueError("no scores")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    means, _ = _bootstrap_means_sds(s, resamples, seed)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return (float(lo), float(hi))


def holm(p_values: Mapping[str, float], alpha: float = 0.05) -> dict[str, bool]:
    """Holm-Bonferroni step-down: task -> rejected, family-wise error <= alpha under any dependence.

    Sorted ascending, the k-th p (k = 0..m-1) is rejected while p < alpha/(m - k); the first that is
    not stops the procedure. Strict `<`, as in DropTest.rejected.
    """
    check_alpha(alpha)
    for name, p in p_values.items():
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-value of {name!r} must be in [0, 1], got {p}")
    order = sorted(p_values, key=lambda k: p_values[k])
    m = len(order)
    out = {name: False for name in p_values}
    for k, name in enumerate(order):
        if not p_values[name] < alpha / (m - k):
            break
        out[name] = True
    return out
