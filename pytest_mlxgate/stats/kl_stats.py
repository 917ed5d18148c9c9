"""Statistics of one gate's per-token scores, with intervals that are honest about dependence.

Per-token KL is autocorrelated within a sequence (one bad position drags its neighbours) and
heavy-tailed, so intervals treat TEXTS as the independent units: Student-t over per-text means for
means, a cluster bootstrap (resampling whole texts) for quantiles. A text is a sequence, or all the
sequences cut from one prompt (windows of one text share it, so they are not independent samples).
Token-level intervals would be several times too narrow. No scipy: the t quantile is computed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .intervals import CONFIDENCE, Interval, cluster_bootstrap_quantiles, mean_interval, proportion_interval

if TYPE_CHECKING:
    from .divergence import TokenScores

__all__ = [
    "QUANTILES",
    "KLStats",
    "PromptMean",
    "TokenAt",
    "WorstToken",
    "summarize",
]

#: The KL quantiles every gate reports (name -> q), in JSON order.
QUANTILES: dict[str, float] = {"median": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
_WORST_TOKENS = 5
_WORST_PROMPTS = 3

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
    #: Token sequences scored; `n_prompts` counts the independent texts they come from (windows of one
    #: text are one unit of every interval), so the two differ only where texts were reused.
    n_sequences: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (int, float, None, lists, dicts), keys in the documented order."""
        return {
            "n_prompts": self.n_prompts,
            "n_sequences": self.n_prompts if self.n_sequences is None else self.n_sequences,
            "n_tokens": self.n_tokens,
            "confidence": self.confidence,
            "mean": _num(self.mean),
            "mean_ci": _pair(self.mean_ci),
            **{name: _num(getattr(self, name)) for name in QUANTILES},
            "quantile_ci": {name: _pair(self.quantile_ci[name]) for name in QUANTILES},
            "max": _num(self.max),
            "max_at": {
                "prompt": self.max_at.prompt,
                "position": self.max_at.position,
                "token_id": self.max_at.token_id,
            },
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
                {
                    "prompt": w.prompt,
                    "position": w.position,
                    "kl": _num(w.kl),
                    "token_id": w.token_id,
                    "ref_top1": w.ref_top1,
                    "cand_top1": w.cand_top1,
                    "p_ref": _num(w.p_ref),
                    "p_cand": _num(w.p_cand),
                }
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
                WorstToken(
                    int(w["prompt"]),
                    int(w["position"]),
                    _float(w["kl"]),
                    int(w["token_id"]),
                    int(w["ref_top1"]),
                    int(w["cand_top1"]),
                    _float(w["p_ref"]),
                    _float(w["p_cand"]),
                )
                for w in d["worst"]
            ),
            worst_prompts=tuple(PromptMean(int(p["prompt"]), _float(p["mean_kl"])) for p in d["worst_prompts"]),
            n_sequences=int(d.get("n_sequences", d["n_prompts"])),
        )


def summarize(
    scores: Sequence[TokenScores], confidence: float = CONFIDENCE, *, texts: Sequence[str] | None = None
) -> KLStats:
    """The statistics of one gate's scores (one TokenScores per sequence, in order). `texts[i]` names
    the text sequence i was cut from: sequences of one text are one unit of every interval and of n
    (16 windows of one prompt are n = 1, not 16 independent samples); None: each its own text."""
    if not scores:
        raise ValueError("summarize needs at least one prompt's scores")
    if texts is not None and len(texts) != len(scores):
        raise ValueError(f"texts names {len(texts)} sequences, the scores hold {len(scores)}")
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
    # the independent units: texts in order of first use (each sequence its own where texts is None)
    names = list(range(len(scores))) if texts is None else list(texts)
    first: dict[object, int] = {}
    unit_of_seq = np.array([first.setdefault(t, len(first)) for t in names], dtype=np.int64)
    n_units = len(first)
    unit_of = unit_of_seq[prompt_of]
    unit_sizes = np.bincount(unit_of_seq, weights=sizes, minlength=n_units)
    unit_live = unit_sizes > 0

    def per_seq(a: np.ndarray) -> np.ndarray:
        """Per-sequence sums of a per-token array (sequences with tokens only)."""
        return np.bincount(prompt_of, weights=a, minlength=len(scores))[live]

    def per_unit(a: np.ndarray) -> np.ndarray:
        """Per-text sums of a per-token array (texts with tokens only): what the intervals resample."""
        return np.bincount(unit_of, weights=a, minlength=n_units)[unit_live]

    seq_mean_kl = per_seq(kl) / sizes[live].astype(np.float64)
    w = unit_sizes[unit_live].astype(np.float64)
    mean_lo, mean_hi = mean_interval(per_unit(kl) / w, confidence, weights=w)
    qvals = np.quantile(kl, list(QUANTILES.values()))
    units = [np.concatenate([kl_seqs[i] for i in np.flatnonzero(unit_of_seq == u)]) for u in range(n_units)]
    qcis = cluster_bootstrap_quantiles([k for k in units if k.size], list(QUANTILES.values()), confidence=confidence)
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
        n_prompts=n_units,
        n_sequences=len(scores),
        n_tokens=n_tokens,
        confidence=float(confidence),
        mean=float(kl.mean()),
        mean_ci=(max(0.0, mean_lo), mean_hi),  # KL >= 0: a t interval's negative end says nothing
        **{name: float(v) for name, v in zip(QUANTILES, qvals, strict=True)},
        quantile_ci=dict(zip(QUANTILES, qcis, strict=True)),
        max=float(kl[top]),
        max_at=TokenAt(int(prompt_of[top]), int(positions[top]), int(next_tokens[top])),
        same_top=float(same.mean()),
        same_top_ci=proportion_interval(per_unit(same.astype(np.float64)), w, confidence),
        top1=float(agree.mean()),
        top1_ci=proportion_interval(per_unit(agree.astype(np.float64)), w, confidence),
        flips=int(np.count_nonzero(~same & ~near_tie)),
        near_tie_flips=int(np.count_nonzero(~same & near_tie)),
        near_ties=int(np.count_nonzero(near_tie)),
        ln_ppl_ratio=float(ln_ratio.mean()),
        ln_ppl_ratio_ci=mean_interval(per_unit(ln_ratio) / w, confidence, weights=w),
        delta_p=_delta_p(dp),
        worst=tuple(
            WorstToken(
                prompt=int(prompt_of[j]),
                position=int(positions[j]),
                kl=float(kl[j]),
                token_id=int(next_tokens[j]),
                ref_top1=int(ref_top1[j]),
                cand_top1=int(cand_top1[j]),
                p_ref=float(np.exp(ref_lp[j])),
                p_cand=float(np.exp(cand_lp[j])),
            )
            for j in worst.tolist()
        ),
        worst_prompts=tuple(PromptMean(int(live_ids[i]), float(seq_mean_kl[i])) for i in prompt_order.tolist()),
    )


def _delta_p(dp: np.ndarray) -> dict[str, float]:
    """p_cand(next) - p_ref(next): mean, rms and quantiles."""
    q = np.quantile(dp, [0.01, 0.05, 0.5, 0.95, 0.99])
    return {
        "mean": float(dp.mean()),
        "rms": float(np.sqrt(np.mean(dp * dp))),
        "p1": float(q[0]),
        "p5": float(q[1]),
        "median": float(q[2]),
        "p95": float(q[3]),
        "p99": float(q[4]),
    }


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _pair(ci: Interval) -> list[float | None]:
    return [_num(ci[0]), _num(ci[1])]


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def _interval(pair: Sequence[Any]) -> Interval:
    lo, hi = pair
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))
