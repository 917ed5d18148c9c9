"""The float32 oracle: what a low-precision arm is judged against, relative to what plain low precision costs.

In bfloat16 a correct fused kernel and the plain composed ops both sit at some distance from the truth,
and an absolute KL limit sized in float32 cannot tell that rounding from a bug. So the reference arm's
own weights, upcast (losslessly) and computed in float32 with the reference's lever value, are the oracle,
and a gate may ask (`assert_kl_below(paired, relative=2.0)`) that the candidate's KL from the oracle be
at most `relative` times the plain path's, FlashAttention's rule lifted from tensors to next-token
distributions. Both distances are measured per sequence on the same token ids, and the rule is decided on
a paired 95% bound over texts (`relative_check`).

The oracle's distributions are cached like a reference arm (their key names the float32 model), and the
plain path's distance from them in an entry beside it; where the run already computes in float32 the
reference arm *is* the oracle and nothing more runs (`OracleDistances.same`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..common.keys import canonical_json, key_digest
from ..common.refstore import store_or_warn
from ..config.dtypes import ORACLE_DTYPE
from ..results.wire import Check
from ..stats.intervals import mean_interval
from ..stats.kl_stats import summarize
from ..verdicts.conclude import check

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel
    from ..stats.divergence import RefDistributions, TokenScores
    from .prompts import TokenSequence
    from .refcache import ReferenceCache

__all__ = [
    "DEFAULT_RELATIVE_ATOL",
    "ORACLE_FORMAT",
    "PRECISION_FIGURES",
    "RELATIVE",
    "OracleArm",
    "OracleDistances",
    "PlainDistance",
    "inside_precision",
    "relative_check",
    "unit_sums",
]

#: Bump when what a cached distance entry holds changes meaning: an older entry is then a miss.
ORACLE_FORMAT = 2
#: The limit's key in a gate's bounds and the checks: `assert_kl_below(paired, relative=2.0)`.
RELATIVE = "relative"
#: The absolute term of the relative rule (mean KL, nats): where both distances are ~0 (a float32 run, or a
#: model that rounds alike in both precisions) a kernel may add this much and still pass.
DEFAULT_RELATIVE_ATOL = 1e-5


#: The plain path's figures an absolute limit is read against (point values: what plain rounding costs).
PRECISION_FIGURES = ("mean", "median", "p90", "p95", "p99", "p999", "max", "top1", "same_top")
#: Agreement rates among them: a limit there reads rounding when it asks for *more* agreement than plain has.
_AGREEMENT = ("top1", "same_top")


@dataclass(frozen=True)
class PlainDistance:
    """The plain reference arm's KL from the oracle: per sequence token sums and counts, and its statistics'
    point values (`PRECISION_FIGURES`): what is kept beside the oracle's distributions."""

    sums: tuple[float, ...]
    counts: tuple[int, ...]
    figures: Mapping[str, float]

    @classmethod
    def of(cls, scores: Sequence[TokenScores], texts: Sequence[str]) -> PlainDistance:
        sums, counts = unit_sums(scores)
        stats = summarize(scores, texts=list(texts)).to_json()
        figures = {k: float(stats[k]) for k in PRECISION_FIGURES if isinstance(stats.get(k), (int, float))}
        return cls(sums, counts, figures)


def inside_precision(bounds: Mapping[str, float], figures: Mapping[str, float]) -> list[str]:
    """The absolute limits below the plain low-precision path's own distance from float32 (for agreement
    rates: above its agreement): a limit there reads the precision's rounding, which a correct kernel adds as
    much as a plain one, so its check can neither fail on it nor prove anything."""
    out = []
    for key, limit in bounds.items():
        plain = figures.get(key)
        if plain is None or not math.isfinite(plain):
            continue
        if (limit > plain) if key in _AGREEMENT else (limit < plain):
            out.append(key)
    return out


@dataclass(frozen=True)
class OracleDistances:
    """Each text's KL from the float32 oracle, for the plain reference arm and for the candidate arm:
    token sums and token counts per sequence, so that any grouping into units reads them."""

    dtype: str  # the precision the arms computed in
    same: bool  # the reference arm computes in float32: it is the oracle (its distance is 0 by definition)
    texts: tuple[str, ...]  # per sequence, the text it was cut from (sequences of one text are one unit)
    plain_sums: tuple[float, ...]
    candidate_sums: tuple[float, ...]
    counts: tuple[int, ...]
    source: str = "computed"  # the oracle's distributions: "computed" | "cache" | "reference" (same)
    plain_figures: Mapping[str, float] = field(default_factory=dict)  # `PlainDistance.figures` ({}: same)

    def units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(plain mean, candidate mean, tokens) per text."""
        order: dict[str, int] = {}
        for t in self.texts:
            order.setdefault(t, len(order))
        at = np.array([order[t] for t in self.texts], dtype=np.int64)
        n = len(order)
        counts = np.bincount(at, weights=np.asarray(self.counts, dtype=np.float64), minlength=n)
        plain = np.bincount(at, weights=np.asarray(self.plain_sums, dtype=np.float64), minlength=n)
        cand = np.bincount(at, weights=np.asarray(self.candidate_sums, dtype=np.float64), minlength=n)
        live = counts > 0
        return plain[live] / counts[live], cand[live] / counts[live], counts[live]

    def state(self) -> dict[str, Any]:
        """Everything it holds, as JSON (a proof keeps its known-bad's); `from_state` reads it back."""
        return {
            "dtype": self.dtype,
            "same": self.same,
            "texts": list(self.texts),
            "plain_sums": list(self.plain_sums),
            "candidate_sums": list(self.candidate_sums),
            "counts": list(self.counts),
            "plain_figures": dict(self.plain_figures),
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> OracleDistances:
        """`state`'s JSON back; ValueError where it is not one (a damaged cache entry)."""
        try:
            made = cls(
                dtype=str(data["dtype"]),
                same=bool(data["same"]),
                texts=tuple(str(t) for t in data["texts"]),
                plain_sums=tuple(float(x) for x in data["plain_sums"]),
                candidate_sums=tuple(float(x) for x in data["candidate_sums"]),
                counts=tuple(int(x) for x in data["counts"]),
                source="cache",
                plain_figures={str(k): float(v) for k, v in dict(data.get("plain_figures") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an oracle distances state: {e}") from None
        sizes = {len(made.texts), len(made.plain_sums), len(made.candidate_sums), len(made.counts)}
        if len(sizes) != 1 or not made.counts or sum(made.counts) <= 0:
            raise ValueError("an oracle distances state whose parts differ in length, or holds no token")
        return made

    def to_json(self) -> dict[str, Any]:
        """The record's `oracle`: both distances with their 95% intervals over texts, and what the oracle is."""
        plain, cand, tokens = self.units()

        def distance(values: np.ndarray) -> dict[str, Any]:
            lower, upper = mean_interval(values, weights=tokens)
            mean = float(np.sum(values * tokens) / np.sum(tokens))
            return {"mean": mean, "ci": [_finite(lower), _finite(upper)]}

        return {
            "dtype": self.dtype,
            "oracle": ORACLE_DTYPE,
            "same": self.same,
            "source": self.source,
            "n": int(plain.size),
            "plain": distance(plain),
            "candidate": distance(cand),
            "plain_figures": dict(self.plain_figures),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def unit_sums(scores: Sequence[TokenScores]) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Per sequence: the sum of its per-token KL and its token count."""
    return tuple(float(np.sum(s.kl, dtype=np.float64)) for s in scores), tuple(len(s) for s in scores)


def relative_check(distances: OracleDistances, relative: float, atol: float = DEFAULT_RELATIVE_ATOL) -> Check:
    """The relative rule as one check: per text d = KL(oracle, candidate) - relative * KL(oracle, plain), and
    the 95% upper bound of its token-weighted mean must be at most `atol` (fail: the lower bound above it).
    `value` is that mean; `ratio` the candidate's distance over the plain path's."""
    plain, cand, tokens = distances.units()
    excess = cand - relative * plain
    mean = float(np.sum(excess * tokens) / np.sum(tokens))
    lower, upper = mean_interval(excess, weights=tokens)
    plain_mean = float(np.sum(plain * tokens) / np.sum(tokens))
    cand_mean = float(np.sum(cand * tokens) / np.sum(tokens))
    if distances.same and cand_mean == 0.0:
        method = "identical to the float32 oracle: both arms compute its very distributions"
    elif not distances.same and distances.candidate_sums == distances.plain_sums:
        # the candidate computed the reference arm's very distributions: as far from the oracle, text by text
        lower = upper = mean
        method = "identical to the plain path: the candidate's distributions are the reference arm's, as far from f32"
    elif distances.same:
        method = "the reference arm is the float32 oracle (a float32 run): the candidate's KL from it, at most atol"
    else:
        method = (
            f"95% interval over texts of KL(oracle, candidate) - {relative:g} x KL(oracle, plain {distances.dtype})"
        )
    made = check(
        metric=f"KL to f32 oracle - {relative:g}x plain's",
        key=RELATIVE,
        value=mean,
        lower=lower,
        upper=upper,
        limit=atol,
        direction="max",
        n=int(plain.size),
        method=method,
    )
    made["ratio"] = cand_mean / plain_mean if plain_mean > 0 else (None if cand_mean > 0 else 1.0)
    made["oracle"] = {"plain": plain_mean, "candidate": cand_mean, "relative": relative}
    if made["verdict"] == "inconclusive" and plain.size >= 2 and upper > mean and mean < atol:
        made["n_needed"] = max(int(plain.size) + 1, math.ceil(plain.size * ((upper - mean) / (atol - mean)) ** 2))
    return made


# -- the oracle's distributions, and the plain path's distance from them ------------------------------------


class OracleArm:
    """One measurement's oracle: its distributions (cached like a reference arm, under the float32 model's
    key), the plain reference arm's KL from them (cached beside them; else scored in the reference arm's own
    pass when that runs, or in a pass of its own), and both arms' distances once the candidate has run."""

    def __init__(
        self,
        *,
        oracle: LoadedModel,
        reference: LoadedModel,
        oracle_key: Mapping[str, Any],
        reference_key: Mapping[str, Any],
        cache: ReferenceCache | None,
    ) -> None:
        self.oracle = oracle
        self.reference = reference
        #: the reference arm computes in float32: it is the oracle, at distance 0 by definition
        self.same = oracle is reference or reference.dtype == ORACLE_DTYPE
        self.oracle_key = dict(oracle_key)
        self.entry_key = {"oracle_distance": ORACLE_FORMAT, "oracle": dict(oracle_key), "plain": dict(reference_key)}
        self.cache = cache
        self.refs: list[RefDistributions] | None = None
        self.source = "reference" if self.same else "cache"
        self.plain: PlainDistance | None = None

    def prepare(
        self,
        sequences: Sequence[TokenSequence],
        computed: Callable[[LoadedModel, str], list[RefDistributions]],
        say: Callable[[str], None],
    ) -> None:
        """The oracle's distributions (`computed(model, label)` runs an arm) and the cached plain distance."""
        if self.same:
            return
        cache = self.cache
        self.refs = cache.load(self.oracle_key, len(sequences)) if cache is not None else None
        if self.refs is None:
            self.refs = computed(self.oracle, "float32 oracle arm")
            if cache is not None:
                store_or_warn(cache, self.oracle_key, self.refs)
            self.source = "computed"
        self.plain = _load(cache, self.entry_key) if cache is not None else None

    @property
    def wants_plain(self) -> bool:
        """The plain arm's distance is still to be scored (the reference arm's pass may do it)."""
        return not self.same and self.plain is None

    def keep_plain(self, scores: Sequence[TokenScores], texts: Sequence[str]) -> PlainDistance:
        self.plain = PlainDistance.of(scores, texts)
        if self.cache is not None:
            _store(self.cache, self.entry_key, self.plain)
        return self.plain

    def distances(self, texts: Sequence[str], candidate_scores: Sequence[TokenScores]) -> OracleDistances:
        cand_sums, counts = unit_sums(candidate_scores)
        plain_sums = self.plain.sums if self.plain is not None else tuple(0.0 for _ in counts)
        return OracleDistances(
            dtype=self.reference.dtype,
            same=self.same,
            texts=tuple(texts),
            plain_sums=plain_sums,
            candidate_sums=cand_sums,
            counts=counts,
            source=self.source,
            plain_figures=dict(self.plain.figures) if self.plain is not None else {},
        )


def _path(cache: Any, key: Mapping[str, Any]) -> Path:
    return Path(cache.directory) / "oracle" / f"{key_digest(key)}.json"


def _load(cache: Any, key: Mapping[str, Any]) -> PlainDistance | None:
    def decode(payload: bytes) -> PlainDistance | None:
        entry = json.loads(payload)
        if entry.get("key") != json.loads(canonical_json(key)):
            return None
        data = entry["data"]
        sums = tuple(float(x) for x in data["sums"])
        counts = tuple(int(x) for x in data["counts"])
        figures = {str(k): float(v) for k, v in data["figures"].items()}
        if len(sums) != len(counts) or not all(math.isfinite(x) and x >= 0 for x in (*sums, *figures.values())):
            return None
        return PlainDistance(sums, counts, figures)

    loaded: PlainDistance | None = cache.files.load(_path(cache, key), decode)
    return loaded


def _store(cache: Any, key: Mapping[str, Any], plain: PlainDistance) -> None:
    data = {"sums": list(plain.sums), "counts": list(plain.counts), "figures": dict(plain.figures)}
    payload = json.dumps({"key": json.loads(canonical_json(key)), "data": data}, allow_nan=False)
    try:
        cache.files.write(_path(cache, key), payload.encode())
    except (OSError, ValueError):
        pass  # a by-product: the next run measures it again
