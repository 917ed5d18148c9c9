"""What one capability task measured: both arms' results on the same items, joined by item id."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .base import Item, ItemResult, Tier

if TYPE_CHECKING:
    from ..levers.lever import Arm

__all__ = ["CapabilityRun"]


@dataclass
class CapabilityRun:
    """One task, both arms, joined by item id."""

    task: str
    tier: Tier
    graded: bool
    items: list[Item]
    reference: list[ItemResult]
    candidate: list[ItemResult]
    durations: dict[str, float] = field(default_factory=dict)
    rendered: dict[str, str] = field(default_factory=dict)  # item id -> exact model input (for reports)
    reference_source: str = "computed"  # "cache": the reference arm's results came from the capability cache
    sequential: dict[str, Any] | None = None  # n=Budget(...): the sequential procedure's verdict, bounds and budget
    ranks: int = 1  # > 1: the items were split over this many `mx.distributed` ranks (capability/distributed.py)

    @property
    def n(self) -> int:
        return len(self.items)

    def scores(self, arm: Arm) -> list[float]:
        return [r.score for r in (self.reference if arm == "reference" else self.candidate)]

    def paired_items(self) -> list[dict[str, Any]]:
        """Per item, both arms' outputs and verdicts: enough to rescore a run or join it to another."""
        return [
            {
                "id": it.id,
                "prompt_hash": r.prompt_hash,
                "reference": {"output": r.output, "score": r.score, "verdict": r.verdict},
                "candidate": {"output": c.output, "score": c.score, "verdict": c.verdict},
            }
            for it, r, c in zip(self.items, self.reference, self.candidate, strict=True)
        ]

    def flipped(self) -> list[tuple[Item, ItemResult, ItemResult]]:
        """Items whose outcome changed between the arms, losses (ref right, cand wrong) first."""
        pairs = [
            (it, r, c)
            for it, r, c in zip(self.items, self.reference, self.candidate, strict=True)
            if r.score != c.score
        ]
        return sorted(pairs, key=lambda p: p[2].score - p[1].score)
