"""Statistics of one gate's per-token scores, with intervals that are honest about dependence.

Per-token KL is autocorrelated within a sequence (one bad position drags its neighbours) and
heavy-tailed, so intervals treat SEQUENCES as the independent units: Student-t over per-sequence
means for means, a cluster bootstrap (resampling whole sequences) for quantiles. Token-level
intervals would be several times too narrow. No scipy: the t quantile is computed here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .kl import TokenScores

__all__ = [
    "CONFIDENCE",
    "QUANTILES",
    "KLStats",
    "PromptMean",
    "TokenAt",
    "WorstToken",
    "cluster_bootstrap_quantile",
    "cluster_bootstrap_quantiles",
    "mean_interval",
    "summarize",
    "t_quantile",
    "wilson_bounds",
    "wilson_interval",
]

CONFIDENCE = 0.95
#: The KL quantiles every gate reports (name -> q), in JSON order.
QUANTILES: dict[str, float] = {"median": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
_WORST_TOKENS = 5
_WORST_PROMPTS = 3

Interval = tuple[float, float]


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


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


# --- intervals ---------------------------------------------------------------------------------------


def mean_interval(
    values: np.ndarray, confidence: float = CONFIDENCE, *, weights: np.ndarray | None = None
) -> Interval:
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
    return wilson_bounds(successes, n, _z(confidence))


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


def _proportion_interval(hits: np.ndarray, sizes: np.ndarray, confidence: float) -> Interval:
    """The wider of Wilson on pooled tokens and a t interval over per-sequence rates, in [0, 1]."""
    wl, wh = wilson_interval(int(round(hits.sum())), int(round(sizes.sum())), confidence)
    tl, th = mean_interval(hits / np.maximum(sizes, 1), confidence, weights=sizes)
    return (min(wl, max(0.0, tl)), max(wh, min(1.0, th)))


# --- the summary ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenAt:
    """A scored position: prompt index (in the scores list), position in it, the text's next token."""

    prompt: int
    position: int
    token_id: int


@dataclass(frozen=True)
class WorstToken:
    """One of the largest per-token KLs; p_ref/p_cand are each arm's probability of the next token."""

    prompt: int
    position: int
    kl: float
    token_id: int
    ref_top1: int
    cand_top1: int
    p_ref: float
    p_cand: float


@dataclass(frozen=True)
class PromptMean:
    """A prompt's mean per-token KL (the worst prompts are where a regression shows first)."""

    prompt: int
    mean_kl: float


@dataclass(frozen=True)
class KLStats:
    """One gate's statistics; `to_json` is the stable, plain-JSON form the reports and checks read.

    Point values are pooled over tokens; intervals treat prompts as the independent units (mean_ci
    stops at 0: KL is never negative). In JSON, None marks a value or bound that is undefined or
    unbounded (an interval from one prompt, an infinite log-prob), so `json.dumps(...,
    allow_nan=False)` always works. `flips` counts top-1 changes outside near ties and
    `near_tie_flips` those at near ties, so same_top = 1 - (flips + near_tie_flips) / n_tokens
    and top1 = 1 - flips / n_tokens.
    """

    n_prompts: int
    n_tokens: int
    confidence: float
    mean: float
    mean_ci: Interval
    median: float
    p90: float
    p95: float
    p99: float
    p999: float
    quantile_ci: Mapping[str, Interval]
    max: float
    max_at: TokenAt
    same_top: float
    same_top_ci: Interval
    top1: float
    top1_ci: Interval
    flips: int
    near_tie_flips: int
    near_ties: int
    ln_ppl_ratio: float
    ln_ppl_ratio_ci: Interval
    delta_p: Mapping[str, float]
    worst: tuple[WorstToken, ...] = field(default=())
    worst_prompts: tuple[PromptMean, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (int, float, None, lists, dicts), keys in the documented order."""
        return {
            "n_prompts": self.n_prompts,
            "n_tokens": self.n_tokens,
            "confidence": self.confidence,
            "mean": _num(self.mean),
            "mean_ci": _pair(self.mean_ci),
            **{name: _num(getattr(self, name)) for name in QUANTILES},
            "quantile_ci": {name: _pair(self.quantile_ci[name]) for name in QUANTILES},
            "max": _num(self.max),
            "max_at": {"prompt": self.max_at.prompt, "position": self.max_at.position,
                       "token_id": self.max_at.token_id},
            "same_top": _num(self.same_top),
            "same_top_ci": _pair(self.same_top_ci),
            "top1": _num(self.top1),
            "top1_ci": _pair(self.top1_ci),
            "flips": self.flips,
            "near_tie_flips": self.near_tie_flips,
            "near_ties": self.near_ties,
            "ln_ppl_ratio": _num(self.ln_ppl_ratio),
            "ln_ppl_ratio_ci": _pair(self.ln_ppl_ratio_ci),
            "delta_p": {k: _num(v) for k, v in self.delta_p.items()},
            "worst": [
                {"prompt": w.prompt, "position": w.position, "kl": _num(w.kl), "token_id": w.token_id,
                 "ref_top1": w.ref_top1, "cand_top1": w.cand_top1, "p_ref": _num(w.p_ref),
                 "p_cand": _num(w.p_cand)}
                for w in self.worst
            ],
            "worst_prompts": [{"prompt": p.prompt, "mean_kl": _num(p.mean_kl)} for p in self.worst_prompts],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KLStats:
        """Inverse of `to_json` (None becomes NaN, or -inf/+inf at an interval's low/high end)."""
        at = d["max_at"]
        return cls(
            n_prompts=int(d["n_prompts"]),
            n_tokens=int(d["n_tokens"]),
            confidence=float(d["confidence"]),
            mean=_float(d["mean"]),
            mean_ci=_interval(d["mean_ci"]),
            median=_float(d["median"]),
            p90=_float(d["p90"]),
            p95=_float(d["p95"]),
            p99=_float(d["p99"]),
            p999=_float(d["p999"]),
            quantile_ci={name: _interval(d["quantile_ci"][name]) for name in QUANTILES},
            max=_float(d["max"]),
            max_at=TokenAt(int(at["prompt"]), int(at["position"]), int(at["token_id"])),
            same_top=_float(d["same_top"]),
            same_top_ci=_interval(d["same_top_ci"]),
            top1=_float(d["top1"]),
            top1_ci=_interval(d["top1_ci"]),
            flips=int(d["flips"]),
            near_tie_flips=int(d["near_tie_flips"]),
            near_ties=int(d["near_ties"]),
            ln_ppl_ratio=_float(d["ln_ppl_ratio"]),
            ln_ppl_ratio_ci=_interval(d["ln_ppl_ratio_ci"]),
            delta_p={str(k): _float(v) for k, v in d["delta_p"].items()},
            worst=tuple(
                WorstToken(int(w["prompt"]), int(w["position"]), _float(w["kl"]), int(w["token_id"]),
                           int(w["ref_top1"]), int(w["cand_top1"]), _float(w["p_ref"]), _float(w["p_cand"]))
                for w in d["worst"]
            ),
            worst_prompts=tuple(PromptMean(int(p["prompt"]), _float(p["mean_kl"])) for p in d["worst_prompts"]),
        )


def summarize(scores: Sequence[TokenScores], confidence: float = CONFIDENCE) -> KLStats:
    """The statistics of one gate's scores (one TokenScores per prompt, in prompt order)."""
    if not scores:
        raise ValueError("summarize needs at least one prompt's scores")
    sizes = np.array([len(s) for s in scores], dtype=np.int64)
    n_tokens = int(sizes.sum())
    if n_tokens == 0:
        raise ValueError("summarize needs at least one scored token")
    live = sizes > 0
    kl_seqs = [np.asarray(s.kl, dtype=np.float64) for s in scores]
    kl = np.concatenate(kl_seqs)
    prompt_of = np.repeat(np.arange(len(scores)), sizes)
    positions = np.concatenate([s.positions for s in scores])
    next_tokens = np.concatenate([s.next_tokens for s in scores])
    ref_top1 = np.concatenate([s.ref_top1 for s in scores])
    cand_top1 = np.concatenate([s.cand_top1 for s in scores])
    near_tie = np.concatenate([s.near_tie for s in scores]).astype(bool)
    ref_lp = np.concatenate([s.ref_next_logprob for s in scores]).astype(np.float64)
    cand_lp = np.concatenate([s.cand_next_logprob for s in scores]).astype(np.float64)

    def per_seq(a: np.ndarray) -> np.ndarray:
        """Per-prompt sums of a per-token array (prompts with tokens only)."""
        return np.bincount(prompt_of, weights=a, minlength=len(scores))[live]

    w = sizes[live].astype(np.float64)
    seq_mean_kl = per_seq(kl) / w
    mean_lo, mean_hi = mean_interval(seq_mean_kl, confidence, weights=w)
    qvals = np.quantile(kl, list(QUANTILES.values()))
    qcis = cluster_bootstrap_quantiles([k for k in kl_seqs if k.size], list(QUANTILES.values()),
                                       confidence=confidence)
    same = ref_top1 == cand_top1
    agree = same | near_tie
    with np.errstate(invalid="ignore"):
        ln_ratio = ref_lp - cand_lp
        dp = np.exp(cand_lp) - np.exp(ref_lp)
    top = int(np.argmax(kl))
    worst = np.argsort(-kl, kind="stable")[:_WORST_TOKENS]
    prompt_order = np.argsort(-seq_mean_kl, kind="stable")[:_WORST_PROMPTS]
    live_ids = np.flatnonzero(live)
    return KLStats(
        n_prompts=len(scores),
        n_tokens=n_tokens,
        confidence=float(confidence),
        mean=float(kl.mean()),
        mean_ci=(max(0.0, mean_lo), mean_hi),  # KL >= 0: a t interval's negative end says nothing
        **{name: float(v) for name, v in zip(QUANTILES, qvals)},
        quantile_ci=dict(zip(QUANTILES, qcis)),
        max=float(kl[top]),
        max_at=TokenAt(int(prompt_of[top]), int(positions[top]), int(next_tokens[top])),
        same_top=float(same.mean()),
        same_top_ci=_proportion_interval(per_seq(same.astype(np.float64)), w, confidence),
        top1=float(agree.mean()),
        top1_ci=_proportion_interval(per_seq(agree.astype(np.float64)), w, confidence),
        flips=int(np.count_nonzero(~same & ~near_tie)),
        near_tie_flips=int(np.count_nonzero(~same & near_tie)),
        near_ties=int(np.count_nonzero(near_tie)),
        ln_ppl_ratio=float(ln_ratio.mean()),
        ln_ppl_ratio_ci=mean_interval(per_seq(ln_ratio) / w, confidence, weights=w),
        delta_p=_delta_p(dp),
        worst=tuple(
            WorstToken(prompt=int(prompt_of[j]), position=int(positions[j]), kl=float(kl[j]),
                       token_id=int(next_tokens[j]), ref_top1=int(ref_top1[j]), cand_top1=int(cand_top1[j]),
                       p_ref=float(np.exp(ref_lp[j])), p_cand=float(np.exp(cand_lp[j])))
            for j in worst.tolist()
        ),
        worst_prompts=tuple(PromptMean(int(live_ids[i]), float(seq_mean_kl[i])) for i in prompt_order.tolist()),
    )


def _delta_p(dp: np.ndarray) -> dict[str, float]:
    """p_cand(next) - p_ref(next): mean, rms and quantiles."""
    q = np.quantile(dp, [0.01, 0.05, 0.5, 0.95, 0.99])
    return {"mean": float(dp.mean()), "rms": float(np.sqrt(np.mean(dp * dp))), "p1": float(q[0]),
            "p5": float(q[1]), "median": float(q[2]), "p95": float(q[3]), "p99": float(q[4])}


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _pair(ci: Interval) -> list[float | None]:
    return [_num(ci[0]), _num(ci[1])]


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def _interval(pair: Sequence[Any]) -> Interval:
    lo, hi = pair
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
