"""A model loaded through `mlx_lm.load`, with the verified snapshot it came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..results.records import ModelRef
    from .materialize import ResolvedSnapshot

__all__ = ["LoadedModel"]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model with the snapshot it came from."""

    model: Any
    tokenizer: Any
    snapshot: ResolvedSnapshot

    def describe(self) -> ModelRef:
        s = self.snapshot
        return {"name": s.name, "repo_id": s.repo_id, "commit": s.commit, "pinned": s.pinned}
