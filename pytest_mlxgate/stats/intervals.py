"""Intervals and the distributions behind them: the one statistics core of both gates.

Student-t (no scipy: its quantile is computed here), the normal (the standard library's
`statistics.NormalDist`), Wilson score bounds for proportions, and the cluster bootstrap that
resamples whole sequences.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

__all__ = [
    "CONFIDENCE",
    "Interval",
    "cluster_bootstrap_quantile",
    "cluster_bootstrap_quantiles",
    "mean_interval",
    "normal_cdf",
    "normal_quantile",
    "proportion_interval",
    "t_quantile",
    "wilson_bounds",
    "wilson_interval",
    "wilson_lower",
    "z_two_sided",
]

#: The confidence of every interval a gate reports unless a caller asks for another.
CONFIDENCE = 0.95

Interval = tuple[float, float]
_NORMAL = NormalDist()


# --- distributions ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: the t with P(T <= t) = p for `df` degrees of freedom (inf: the normal).

    Inverts the regularized incomplete beta, P(|T| > t) = I_x(df/2, 1/2) with x = df / (df + t^2),
    by bisection on log x: slow-ish (~ms) but accurate to ~1e-12, and cached.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    alpha = 2.0 * (1.0 - p)  # two-sided tail mass = I_x(df/2, 1/2)
    a, b = df / 2.0, 0.5
    lo, hi = -745.0, 0.0  # log x; I_x rises with x
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _betainc(a, b, math.exp(mid)) < alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    x = math.exp(0.5 * (lo + hi))
    return math.sqrt(df * (1.0 - x) / x)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def normal_quantile(p: float) -> float:
    """The standard normal quantile (the standard library's; -inf and +inf at 0 and 1)."""
    if p == 0.0:
        return -math.inf
    if p == 1.0:
        return math.inf
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return _NORMAL.inv_cdf(p)


def normal_cdf(x: float) -> float:
    """Standard normal CDF via erfc, so the far tails keep their relative accuracy."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def z_two_sided(confidence: float) -> float:
    """z_{1-a/2}: the normal quantile of a two-sided interval at `confidence`."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return normal_quantile(0.5 + confidence / 2.0)


# --- intervals ---------------------------------------------------------------------------------------


def mean_interval(values: np.ndarray, confidence: float = CONFIDENCE, *, weights: np.ndarray | None = None) -> Interval:
    """Student-t interval for a mean over independent units (per-sequence means), df = n - 1.

    With `weights` (e.g. each sequence's token count) it is the interval of the weighted mean
    sum(w * v) / sum(w) (the pooled per-token mean), from the cluster-robust (ratio) standard
    error; equal weights give the plain t interval. One unit says nothing about spread:
    (-inf, +inf).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"need a non-empty 1-D array of values, got shape {v.shape}")
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != v.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError("weights must be non-negative, one per value, and not all zero")
    keep = w > 0
    v, w = v[keep], w[keep]
    n = v.size
    mean = float(np.sum(w * v) / np.sum(w))
    if not math.isfinite(mean):
        return (mean, mean) if math.isnan(mean) else (-math.inf, math.inf)
    if n == 1:
        return (-math.inf, math.inf)
    se = math.sqrt(n / (n - 1) * float(np.sum((w * (v - mean)) ** 2))) / float(np.sum(w))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * se
    return (mean - half, mean + half)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval for a proportion; (0, 1) when there is nothing to go on."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return (0.0, 1.0)
    return wilson_bounds(successes, n, z_two_sided(confidence))


def wilson_lower(successes: int, n: int, confidence: float = CONFIDENCE) -> float:
    """ONE-sided Wilson lower bound: P(p < bound) <= 1 - confidence, so it uses z_confidence (1.645 at 95%).

    It equals the lower end of the two-sided interval at 2*confidence - 1 (the 90% interval at 0.95).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return 0.0
    return wilson_bounds(successes, n, normal_quantile(confidence))[0]


def wilson_bounds(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score bounds at the normal quantile `z` (z_{1-a/2}: a two-sided interval; z_{1-a}: a
    one-sided bound); shared by the KL gate's agreement rates and the capability scores."""
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, center - half)
    hi = 1.0 if successes == n else min(1.0, center + half)
    return (lo, hi)


def cluster_bootstrap_quantiles(
    per_seq: Sequence[np.ndarray],
    qs: Sequence[float],
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> list[Interval]:
    """Percentile-bootstrap intervals for pooled-token quantiles, resampling whole sequences.

    Each resample draws len(per_seq) sequences with replacement and takes np.quantile (linear) of
    their pooled tokens. Deterministic for a seed. Under two non-empty sequences: (-inf, +inf).
    """
    seqs = [np.asarray(s, dtype=np.float64).ravel() for s in per_seq]
    seqs = [s for s in seqs if s.size]
    if len(seqs) < 2:
        return [(-math.inf, math.inf) for _ in qs]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(seqs), size=(resamples, len(seqs)))
    stats = _resampled_quantiles(seqs, qs, draws)
    tail = (1.0 - confidence) / 2.0
    bounds = np.quantile(stats, [tail, 1.0 - tail], axis=0)
    return [(float(bounds[0, i]), float(bounds[1, i])) for i in range(len(qs))]


def cluster_bootstrap_quantile(
    per_seq: Sequence[np.ndarray],
    q: float,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """`cluster_bootstrap_quantiles` for one quantile."""
    return cluster_bootstrap_quantiles(per_seq, [q], resamples=resamples, seed=seed, confidence=confidence)[0]


def _resampled_quantiles(seqs: Sequence[np.ndarray], qs: Sequence[float], draws: np.ndarray) -> np.ndarray:
    """(resamples, len(qs)): np.quantile (linear) of each resample's pooled tokens.

    Without concatenating: the pooled tokens are sorted once; a resample is a count per sequence,
    i.e. a weight per sorted token, and a rank is found by searching the cumulative weights.
    """
    n_seq = len(seqs)
    lengths = np.array([s.size for s in seqs], dtype=np.int64)
    pooled = np.concatenate(seqs)
    order = np.argsort(pooled, kind="stable")
    values = pooled[order]
    owner = np.repeat(np.arange(n_seq), lengths)[order]
    r = draws.shape[0]
    counts = np.bincount((draws + (np.arange(r) * n_seq)[:, None]).ravel(), minlength=r * n_seq)
    counts = counts.reshape(r, n_seq)
    sizes = counts @ lengths  # tokens in each resample
    q = np.asarray(qs, dtype=np.float64)[None, :]
    n = sizes[:, None].astype(np.float64)
    h = n * q + (1.0 + q * (1.0 - 1.0 - 1.0)) - 1.0  # numpy's 'linear' virtual index, as numpy writes it
    below = np.floor(h).astype(np.int64)
    frac = h - below
    above = np.minimum(below + 1, sizes[:, None] - 1)
    out = np.empty((r, q.shape[1]), dtype=np.float64)
    span = int(sizes.max()) + 1
    counts32 = counts.astype(np.int32)
    chunk = max(1, (1 << 21) // max(1, values.size))
    for c0 in range(0, r, chunk):
        c1 = min(r, c0 + chunk)
        cum = np.cumsum(counts32[c0:c1][:, owner], axis=1, dtype=np.int64)  # tokens up to each sorted one
        shift = (np.arange(c1 - c0, dtype=np.int64) * span)[:, None]
        cum += shift  # rows stacked into one ascending array, searched once
        flat = cum.ravel()
        base = (np.arange(c1 - c0, dtype=np.int64) * values.size)[:, None]
        lo_idx = np.searchsorted(flat, below[c0:c1] + shift, side="right") - base
        hi_idx = np.searchsorted(flat, above[c0:c1] + shift, side="right") - base
        a, b, t = values[lo_idx], values[hi_idx], frac[c0:c1]
        out[c0:c1] = np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)  # numpy's _lerp
    return out


def proportion_interval(hits: np.ndarray, sizes: np.ndarray, confidence: float) -> Interval:
    """The wider of Wilson on pooled tokens and a t interval over per-sequence rates, in [0, 1]."""
    wl, wh = wilson_interval(int(round(hits.sum())), int(round(sizes.sum())), confidence)
    tl, th = mean_interval(hits / np.maximum(sizes, 1), confidence, weights=sizes)
    return (min(wl, max(0.0, tl)), max(wh, min(1.0, th)))
