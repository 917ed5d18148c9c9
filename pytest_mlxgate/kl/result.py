"""What one KL gate measured (`KLResult`), and the A/A noise floors its limits are checked against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..results.wire import Check, ModelRef
from ..verdicts.conclude import Conclusion

if TYPE_CHECKING:
    from ..levers.lever import Lever
    from ..stats.divergence import TokenScores
    from ..stats.kl_stats import KLStats
    from .oracle import OracleDistances
    from .shape import ArmCounters, RunShape
    from .site import SiteCheck

__all__ = ["KLResult", "aa_floors"]


@dataclass
class KLResult:
    """Everything one gate measured: statistics, where they came from, and what to show on failure."""

    stats: KLStats
    lever: Lever
    shape: RunShape
    candidate: ModelRef
    reference_model: ModelRef | None
    reference_source: str  # "computed" | "cache"
    durations: dict[str, float]
    counters: ArmCounters
    previews: list[str]  # per sequence, for failure reports
    token_text: dict[int, str]  # ids named in the report -> their text
    scores: list[TokenScores] = field(repr=False)
    aa: dict[str, Any] | None = None  # --mlx-aa: {"chunk": c, "repeat": stats, "chunked": stats, "floors": {...}}
    profile: dict[str, Any] | None = None  # the record's kl_profile: what the HTML report plots (stats.kl_profile)
    oracle: OracleDistances | None = None  # both arms' distances from the float32 oracle, when the gate asks
    site: SiteCheck | None = None  # the kernel at the lever's site against its float32 oracle (`kl.site`)
    site_note: str | None = None  # why no site check ran where the oracle did (a lever with no function to judge)
    server: dict[str, Any] | None = None  # a candidate served over HTTP: where, and what its lower-bound KL rests on

    @property
    def mode(self) -> str:
        return "aa" if self.aa is not None else "gate"

    def token(self, token_id: int) -> str:
        return self.token_text.get(token_id, f"<{token_id}>")

    def conclusion(self, *, bounds: Mapping[str, float], checks: Sequence[Check], verdict: str = "") -> Conclusion:
        """What a KL gate decided, with everything its record carries (`verdict` "": the checks' worst)."""
        return Conclusion(
            mode="aa" if self.aa is not None else "gate",
            checks=checks,
            bounds=bounds,
            verdict=verdict,
            fields=self.record_fields(),
        )

    def record_fields(self) -> dict[str, Any]:
        """The record's fields this measurement fills (`results.records.gate_record`'s keywords)."""
        extra: dict[str, Any] = {"kl_profile": self.profile} if self.profile is not None else {}
        if self.oracle is not None:
            extra["oracle"] = self.oracle.to_json()
            if self.site is not None:
                extra["oracle"]["site"] = self.site.to_json()
            if self.site_note is not None:
                extra["oracle"]["site_note"] = self.site_note
        if self.counters.lever_calls:
            extra["lever_calls"] = dict(self.counters.lever_calls)
        lever = self.lever.to_json()
        if self.server is not None:  # an arm was a server, not the module's value for it
            extra["server"] = dict(self.server)
            if self.server.get("url"):
                lever["cand"] = f"served at {self.server['url']}"
            if self.server.get("ref_url"):
                lever["ref"] = f"served at {self.server['ref_url']}"
        return dict(
            candidate=self.candidate,
            reference_model=self.reference_model,
            lever=lever,
            path=self.shape.path,
            sizes={
                "prompts": self.stats.n_prompts,
                "tokens": self.shape.tokens,
                "decode": self.shape.decode if self.shape.path == "serving" else None,
                "chunk": self.shape.chunk,
            },
            stats=self.stats.to_json(),
            reference_source=self.reference_source,
            durations=dict(self.durations),
            forwards={"reference": self.counters.reference_forwards, "candidate": self.counters.candidate_forwards},
            aa=self.aa,
            tokens={str(k): v for k, v in self.token_text.items()},
            **extra,
        )


def aa_floors(runs: Sequence[KLStats]) -> dict[str, float]:
    """The worst of the A/A runs, at the confidence bound a gate compares against."""
    floors: dict[str, float] = {}
    for stats in runs:
        j = stats.to_json()
        candidates = {"mean": j["mean_ci"][1], "max": j["max"], "ln_ppl": j["ln_ppl_ratio_ci"][1]}
        for q in ("median", "p90", "p95", "p99", "p999"):
            candidates[q] = j["quantile_ci"][q][1]
        for name, value in candidates.items():
            if value is not None:
                floors[name] = max(floors.get(name, float("-inf")), float(value))
        for name in ("top1", "same_top"):
            lo = j[f"{name}_ci"][0]
            if lo is not None:
                floors[name] = min(floors.get(name, float("inf")), float(lo))
    return floors
