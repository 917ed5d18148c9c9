"""The KL parts of the read model: the statistics, the plots' data (histogram, by position, per prompt,
worst tokens in context), the drift attribution and the A/A floors, each with its tolerant parse.
Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .fields import (
    Flat,
    Interval,
    absent,
    integer,
    interval,
    ints,
    jsonable,
    mapping,
    real,
    reals,
    rest,
    sequence,
    text,
    written,
)

__all__ = [
    "AA",
    "Attribution",
    "Histogram",
    "KLProfile",
    "LayerError",
    "PositionProfile",
    "PromptMeans",
    "STATS_FIGURES",
    "ScopeDrift",
    "Stats",
    "WorstContext",
    "WorstToken",
    "parse_aa",
    "parse_attribution",
    "parse_profile",
    "parse_stats",
]


@dataclass(frozen=True)
class WorstToken(Flat):
    """One of a KL gate's worst tokens (`stats.worst`)."""

    prompt: int | None = None
    position: int | None = None
    kl: float | None = None
    token_id: int | None = None
    ref_top1: int | None = None
    cand_top1: int | None = None
    p_ref: float | None = None
    p_cand: float | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


#: The KL statistics a reader may ask for by key (`Stats.figure`).
STATS_FIGURES = ("mean", "median", "p90", "p95", "p99", "p999", "max", "same_top", "top1", "ln_ppl_ratio")
#: The keys of a record's `stats` the read model types, in the order `Stats.to_json` writes them.
STATS_KEYS = tuple(
    [
        *STATS_FIGURES,
        "n_prompts",
        "n_sequences",
        "n_tokens",
        "confidence",
        "mean_ci",
        "quantile_ci",
        "same_top_ci",
        "top1_ci",
        "flips",
        "near_tie_flips",
        "near_ties",
        "worst",
    ]
)


@dataclass(frozen=True)
class Stats:
    """A KL gate's statistics (`stats/kl_stats.py`); a capability gate's holds only `n_prompts`."""

    present: frozenset[str] = frozenset()  # the keys the record's stats hold (a measured gate's rows)
    n_prompts: int | None = None  # independent texts (KL) or items (capability): the n of every interval
    n_sequences: int | None = None  # token sequences scored: more than n_prompts where windows share a text
    n_tokens: int | None = None
    confidence: float | None = None
    mean: float | None = None
    mean_ci: Interval = Interval()
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    quantile_ci: Mapping[str, Interval] = field(default_factory=dict)
    max: float | None = None
    same_top: float | None = None
    same_top_ci: Interval = Interval()
    top1: float | None = None
    top1_ci: Interval = Interval()
    flips: int | None = None
    near_tie_flips: int | None = None
    near_ties: int | None = None
    ln_ppl_ratio: float | None = None
    worst: tuple[WorstToken, ...] = ()
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys (delta_p, max_at...), as written

    def to_json(self) -> dict[str, Any]:
        """The wire form (`stats/kl_stats.py` writes it): the keys it held, typed or kept as written."""
        typed = {k: jsonable(getattr(self, k)) for k in STATS_KEYS if k != "worst"} | {
            "worst": [w.to_json() for w in self.worst]
        }
        return written(typed, frozenset(STATS_KEYS) - self.present, self.more)

    def has(self, key: str) -> bool:
        return key in self.present

    def figure(self, key: str) -> float | None:
        """`mean`, `p99`, `top1` … by name; None for a name that is not a KL statistic."""
        return cast("float | None", getattr(self, key)) if key in STATS_FIGURES else None

    def quantile_interval(self, q: str) -> Interval:
        return self.quantile_ci[q] if q in self.quantile_ci else Interval()

    @property
    def agreement(self) -> tuple[float | None, float | None]:
        """Top-1 agreement and its lower end: `top1`, or `same_top` in records from before top-1 was kept."""
        if self.has("top1"):
            return self.top1, self.top1_ci.lower
        return self.same_top, self.same_top_ci.lower

    @property
    def identical(self) -> bool:
        """Every distribution equal: nothing to bound (a lever identical on this backend)."""
        return self.max == 0.0 and self.same_top == 1.0


@dataclass(frozen=True)
class Histogram(Flat):
    """Per-token KL in bins of 1/per_decade decade from 10**decades[0]; zero, under and over counted aside."""

    counts: tuple[int, ...] = ()
    decades: tuple[int, int] | None = None
    per_decade: int = 0
    zero: int = 0
    under: int = 0
    over: int = 0
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class PositionProfile(Flat):
    """Per bucket of neighbouring positions: first, last, tokens, median and p90 of KL over prompts, flips."""

    first: tuple[int | None, ...] = ()
    last: tuple[int | None, ...] = ()
    n: tuple[int | None, ...] = ()
    median: tuple[float | None, ...] = ()
    p90: tuple[float | None, ...] = ()
    flips: tuple[int | None, ...] = ()
    near_tie_flips: tuple[int | None, ...] = ()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class PromptMeans(Flat):
    """Per prompt (at most 128 recorded): its index, mean KL with its interval, its tokens."""

    index: tuple[int | None, ...] = ()
    mean: tuple[float | None, ...] = ()
    ci: tuple[Interval, ...] = ()
    n_tokens: tuple[int | None, ...] = ()
    total: int | None = None
    method: str | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class WorstContext(Flat):
    """A worst token in its text: before it, the token, after it."""

    prompt: int | None = None
    position: int | None = None
    before: str | None = None
    token: str | None = None
    after: str | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class KLProfile:
    """What the HTML report plots (`stats/kl_profile.py`); an older record holds none of it (None, empty)."""

    histogram: Histogram = Histogram()
    by_position: PositionProfile = PositionProfile()
    prompts: PromptMeans = PromptMeans()
    worst_context: tuple[WorstContext, ...] = ()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        typed = {
            "histogram": self.histogram.to_json(),
            "by_position": self.by_position.to_json(),
            "prompts": self.prompts.to_json(),
            "worst_context": [c.to_json() for c in self.worst_context],
        }
        return written(typed, self.left_out, self.more)


@dataclass(frozen=True)
class ScopeDrift:
    """One scope of attribution: the candidate on these layers only, its KL against the reference."""

    name: str | None = None
    kind: str | None = None  # layer | block | type | rest
    layers: tuple[int, ...] = ()
    level: int | None = None  # 1: the first round; 2: the worst block's layers
    ranked: bool = True  # False: a block whose layers were measured in its place
    n: int | None = None
    mean: float | None = None
    mean_ci: Interval = Interval()
    p99: float | None = None
    top1: float | None = None
    by_position: PositionProfile | None = None  # attention-type scopes: KL by position
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        typed = {
            "name": self.name,
            "kind": self.kind,
            "layers": list(self.layers),
            "level": self.level,
            "ranked": self.ranked,
            "n": self.n,
            "mean": self.mean,
            "mean_ci": list(self.mean_ci),
            "p99": self.p99,
            "top1": self.top1,
            "by_position": self.by_position.to_json() if self.by_position is not None else None,
        }
        return written(typed, self.left_out, self.more)


@dataclass(frozen=True)
class LayerError(Flat):
    """With the lever everywhere: one layer's output error relative to the reference arm's."""

    layer: int | None = None
    type: str | None = None
    rel_error: float | None = None
    ci: Interval = Interval()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class Attribution:
    """Where a KL gate's drift comes from (`explain.attribute`): scopes, the output-error curve, the cost."""

    sequences: int | None = None
    budget: float | None = None
    whole_mean: float | None = None  # the lever everywhere, on the same sequences
    whole_ci: Interval = Interval()
    whole_n: int | None = None
    scopes: tuple[ScopeDrift, ...] = ()
    residual: tuple[LayerError, ...] = ()
    residual_sequences: int | None = None
    notes: tuple[str, ...] = ()
    sequence_arms: int | None = None
    gate_sequence_arms: int | None = None
    seconds: float | None = None
    gate_seconds: float | None = None
    source: str | None = None  # computed | cache
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`explain/attribute.py` writes it): the whole, the residual and the cost nested."""
        typed = {
            "sequences": self.sequences,
            "budget": self.budget,
            "whole": {"mean": self.whole_mean, "mean_ci": list(self.whole_ci), "n": self.whole_n},
            "scopes": [s.to_json() for s in self.scopes],
            "residual": {"layers": [e.to_json() for e in self.residual], "sequences": self.residual_sequences},
            "notes": list(self.notes),
            "cost": {
                "sequence_arms": self.sequence_arms,
                "gate_sequence_arms": self.gate_sequence_arms,
                "seconds": self.seconds,
                "gate_seconds": self.gate_seconds,
            },
            "source": self.source,
        }
        return written(typed, self.left_out, self.more)

    def top(self, k: int = 3) -> tuple[ScopeDrift, ...]:
        """The ranked layer, block and outside-the-layers scopes with the most drift, worst first."""
        rows = [s for s in self.scopes if s.kind != "type" and s.ranked and s.mean is not None]
        return tuple(sorted(rows, key=lambda s: -(s.mean or 0.0))[:k])


@dataclass(frozen=True)
class AA:
    """--mlx-aa: the noise floors a gate's limits must sit above, by metric."""

    floors: Mapping[str, float | None] = field(default_factory=dict)
    more: Mapping[str, Any] = field(default_factory=dict)  # the A/A runs' own statistics, as written

    def to_json(self) -> dict[str, Any]:
        return {**self.more, "floors": dict(self.floors)}


WORST_KEYS = ("prompt", "position", "kl", "token_id", "ref_top1", "cand_top1", "p_ref", "p_cand")
ATTRIBUTION_KEYS = ("sequences", "budget", "whole", "scopes", "residual", "notes", "cost", "source")
SCOPE_KEYS = ("name", "kind", "layers", "level", "ranked", "n", "mean", "mean_ci", "p99", "top1", "by_position")
HISTOGRAM_KEYS = ("counts", "decades", "per_decade", "zero", "under", "over")
POSITION_KEYS = ("first", "last", "n", "median", "p90", "flips", "near_tie_flips")
PROMPTS_KEYS = ("index", "mean", "ci", "n_tokens", "total", "method")
CONTEXT_KEYS = ("prompt", "position", "before", "token", "after")
PROFILE_KEYS = ("histogram", "by_position", "prompts", "worst_context")


def parse_aa(a: Mapping[str, Any]) -> AA:
    """A record's `aa` (--mlx-aa): the floors typed, the A/A runs' statistics kept as written."""
    return AA(floors={str(k): real(v) for k, v in mapping(a.get("floors")).items()}, more=rest(a, ("floors",)))


def parse_stats(s: Mapping[str, Any]) -> Stats:
    figures = {key: real(s.get(key)) for key in STATS_FIGURES}
    return Stats(
        present=frozenset(str(k) for k in s),
        n_prompts=integer(s.get("n_prompts")),
        n_sequences=integer(s.get("n_sequences")),
        n_tokens=integer(s.get("n_tokens")),
        confidence=real(s.get("confidence")),
        mean_ci=interval(s.get("mean_ci")),
        same_top_ci=interval(s.get("same_top_ci")),
        top1_ci=interval(s.get("top1_ci")),
        quantile_ci={str(q): interval(ci) for q, ci in mapping(s.get("quantile_ci")).items()},
        flips=integer(s.get("flips")),
        near_tie_flips=integer(s.get("near_tie_flips")),
        near_ties=integer(s.get("near_ties")),
        worst=tuple(
            WorstToken(
                prompt=integer(w.get("prompt")),
                position=integer(w.get("position")),
                kl=real(w.get("kl")),
                token_id=integer(w.get("token_id")),
                ref_top1=integer(w.get("ref_top1")),
                cand_top1=integer(w.get("cand_top1")),
                p_ref=real(w.get("p_ref")),
                p_cand=real(w.get("p_cand")),
                left_out=absent(w, WORST_KEYS),
                more=rest(w, WORST_KEYS),
            )
            for w in sequence(s.get("worst"))
            if isinstance(w, Mapping)
        ),
        more=rest(s, STATS_KEYS),
        **figures,  # the float fields named in STATS_FIGURES
    )


def parse_attribution(a: Mapping[str, Any]) -> Attribution:
    """A record's `attribution` (also the assertion's own, before it is a record) in the read model."""
    whole, cost, residual = mapping(a.get("whole")), mapping(a.get("cost")), mapping(a.get("residual"))
    return Attribution(
        left_out=absent(a, ATTRIBUTION_KEYS),
        more=rest(a, ATTRIBUTION_KEYS),
        sequences=integer(a.get("sequences")),
        budget=real(a.get("budget")),
        whole_mean=real(whole.get("mean")),
        whole_ci=interval(whole.get("mean_ci")),
        whole_n=integer(whole.get("n")),
        scopes=tuple(_scope(mapping(s)) for s in sequence(a.get("scopes")) if isinstance(s, Mapping)),
        residual=tuple(
            LayerError(
                layer=integer(e.get("layer")),
                type=text(e.get("type")),
                rel_error=real(e.get("rel_error")),
                ci=interval(e.get("ci")),
                left_out=absent(e, ("layer", "type", "rel_error", "ci")),
                more=rest(e, ("layer", "type", "rel_error", "ci")),
            )
            for e in (mapping(x) for x in sequence(residual.get("layers")))
        ),
        residual_sequences=integer(residual.get("sequences")),
        notes=tuple(str(n) for n in sequence(a.get("notes"))),
        sequence_arms=integer(cost.get("sequence_arms")),
        gate_sequence_arms=integer(cost.get("gate_sequence_arms")),
        seconds=real(cost.get("seconds")),
        gate_seconds=real(cost.get("gate_seconds")),
        source=text(a.get("source")),
    )


def _scope(s: Mapping[str, Any]) -> ScopeDrift:
    bp = s.get("by_position")
    return ScopeDrift(
        name=text(s.get("name")),
        kind=text(s.get("kind")),
        layers=tuple(i for i in ints(s.get("layers")) if i is not None),
        level=integer(s.get("level")),
        ranked=s.get("ranked") is not False,
        n=integer(s.get("n")),
        mean=real(s.get("mean")),
        mean_ci=interval(s.get("mean_ci")),
        p99=real(s.get("p99")),
        top1=real(s.get("top1")),
        by_position=parse_profile({"by_position": bp}).by_position if isinstance(bp, Mapping) else None,
        left_out=absent(s, SCOPE_KEYS),
        more=rest(s, SCOPE_KEYS),
    )


def parse_profile(p: Mapping[str, Any]) -> KLProfile:
    hist, bp, prompts = mapping(p.get("histogram")), mapping(p.get("by_position")), mapping(p.get("prompts"))
    decades = sequence(hist.get("decades"))
    return KLProfile(
        histogram=Histogram(
            counts=tuple(integer(c) or 0 for c in sequence(hist.get("counts"))),
            decades=(integer(decades[0]) or 0, integer(decades[1]) or 0) if len(decades) == 2 else None,
            per_decade=integer(hist.get("per_decade")) or 0,
            zero=integer(hist.get("zero")) or 0,
            under=integer(hist.get("under")) or 0,
            over=integer(hist.get("over")) or 0,
            left_out=absent(hist, HISTOGRAM_KEYS),
            more=rest(hist, HISTOGRAM_KEYS),
        ),
        by_position=PositionProfile(
            first=ints(bp.get("first")),
            last=ints(bp.get("last")),
            n=ints(bp.get("n")),
            median=reals(bp.get("median")),
            p90=reals(bp.get("p90")),
            flips=ints(bp.get("flips")),
            near_tie_flips=ints(bp.get("near_tie_flips")),
            left_out=absent(bp, POSITION_KEYS),
            more=rest(bp, POSITION_KEYS),
        ),
        prompts=PromptMeans(
            index=ints(prompts.get("index")),
            mean=reals(prompts.get("mean")),
            ci=tuple(interval(c) for c in sequence(prompts.get("ci"))),
            n_tokens=ints(prompts.get("n_tokens")),
            total=integer(prompts.get("total")),
            method=text(prompts.get("method")),
            left_out=absent(prompts, PROMPTS_KEYS),
            more=rest(prompts, PROMPTS_KEYS),
        ),
        worst_context=tuple(
            WorstContext(
                prompt=integer(c.get("prompt")),
                position=integer(c.get("position")),
                before=text(c.get("before")),
                token=text(c.get("token")),
                after=text(c.get("after")),
                left_out=absent(c, CONTEXT_KEYS),
                more=rest(c, CONTEXT_KEYS),
            )
            for c in (mapping(c) for c in sequence(p.get("worst_context")))
        ),
        left_out=absent(p, PROFILE_KEYS),
        more=rest(p, PROFILE_KEYS),
    )
