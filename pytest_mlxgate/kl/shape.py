"""A KL gate's shape (which path, how many tokens, how they are fed) and its forward counters.

Plain data, no numpy: the session builds these before any arm runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import LeverError

if TYPE_CHECKING:
    from ..levers.lever import Arm

__all__ = ["ArmCounters", "RunShape", "SERVING_PREFILL_STEP"]

Path_ = Literal["prefill", "serving"]

#: mlx_lm.generate's default prefill step: the serving path's prefix is processed in chunks this big.
SERVING_PREFILL_STEP = 2048


@dataclass(frozen=True)
class RunShape:
    """How much of each sequence is scored, and how it is fed to the model."""

    path: Path_
    tokens: int  # sequence length T: ids hold T + 1 tokens, the last one only ever predicted
    decode: int  # serving: the last `decode` positions are fed one token at a time
    chunk: int | None = None  # prefill chunk size; None: one forward (prefill) / 2048 (serving)
    batched: bool = True  # serving: the sequences (one length) run as batches, not one at a time

    def __post_init__(self) -> None:
        if self.tokens < 2:
            raise LeverError(f"a gate needs at least 2 tokens per sequence, got {self.tokens}")
        if self.path == "serving" and not 1 <= self.decode < self.tokens:
            raise LeverError(
                f"the serving path feeds the last `decode` of {self.tokens} tokens one at a time, "
                f"so decode must be between 1 and {self.tokens - 1}, got {self.decode}; "
                "change --mlx-kl-decode (or mlx_kl(decode=...))"
            )
        if self.chunk is not None and self.chunk < 1:
            raise LeverError(f"the prefill chunk size must be positive, got {self.chunk}")

    @property
    def scored(self) -> int:
        """Scored positions per sequence."""
        return self.decode if self.path == "serving" else self.tokens

    def to_json(self) -> dict[str, Any]:
        serving = self.path == "serving"
        return {
            "path": self.path,
            "tokens": self.tokens,
            "decode": self.decode if serving else None,
            "chunk": self.chunk,
            **({"batched": self.batched} if serving else {}),
        }


@dataclass
class ArmCounters:
    """Forward calls per arm (how tests prove a cached reference arm really did not run), and calls
    of a patch lever's site per arm (how a gate proves its lever was exercised at all)."""

    reference_forwards: int = 0
    candidate_forwards: int = 0
    lever_calls: dict[str, int] = field(default_factory=dict)  # arm -> calls of the patched site

    def add(self, arm: Arm, n: int) -> None:
        if arm == "reference":
            self.reference_forwards += n
        else:
            self.candidate_forwards += n

    def call_counter(self, arm: Arm) -> Callable[[], None]:
        """What `Lever.applied(on_call=...)` calls each time the arm's patched site runs."""
        self.lever_calls.setdefault(arm, 0)

        def count() -> None:
            self.lever_calls[arm] += 1

        return count
