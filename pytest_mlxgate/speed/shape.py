"""How a gate's speed is measured: at which contexts, how many decoded tokens, how many pairs.

Plain data, no mlx: the session builds it from the `mlx_speed` marker and the options before any
arm runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LeverError

__all__ = ["DEFAULT_REPETITIONS", "SpeedShape", "default_contexts", "default_decode", "past_the_window"]

#: Pairs per context: fewer gives an interval too wide to show a few percent (and is refused under 3).
DEFAULT_REPETITIONS = 9
_MIN_REPETITIONS = 3
#: The method this project descends from decides at 600 and 8k tokens of context.
_ACCELERATOR_CONTEXTS = (600, 8192)
_ACCELERATOR_DECODE = 64
#: On a CPU (the embedded model in CI) the same measurement at sizes a run can afford: the embedded
#: model decodes ~12 tokens/s on 2 cores, so a module's 40 trials at 64 and 256 take ~1 min.
_CPU_CONTEXTS = (64, 256)
_CPU_DECODE = 8


def default_contexts(device: str) -> tuple[int, ...]:
    """The contexts speed is measured at when nothing says otherwise, by MLX's device."""
    return _CPU_CONTEXTS if device.startswith("cpu") else _ACCELERATOR_CONTEXTS


def default_decode(device: str) -> int:
    return _CPU_DECODE if device.startswith("cpu") else _ACCELERATOR_DECODE


def past_the_window(contexts: tuple[int, ...], window: int | None) -> tuple[int, ...]:
    """The default contexts, with one at 1.5x a sliding-window model's window when none reaches past
    it: a window that has not wrapped times (and holds) what a plain cache would, so without it the
    speed and KV bytes of the path a long prompt takes are never measured."""
    if window is None or max(contexts) > window:
        return contexts
    return (*contexts, window * 3 // 2)


@dataclass(frozen=True)
class SpeedShape:
    """Each context is prefilled, then `decode` tokens are decoded one at a time; `repetitions`
    pairs of trials (after `warmup` untimed ones per arm) give the ratios."""

    contexts: tuple[int, ...]
    decode: int
    repetitions: int = DEFAULT_REPETITIONS
    warmup: int = 1

    def __post_init__(self) -> None:
        if not self.contexts or any(not isinstance(c, int) or c < 1 for c in self.contexts):
            raise LeverError(f"speed contexts must be positive token counts, got {self.contexts!r}")
        if len(set(self.contexts)) != len(self.contexts):
            raise LeverError(f"speed contexts repeat a length: {self.contexts!r}")
        if self.decode < 1:
            raise LeverError(f"speed decode must time at least 1 token, got {self.decode}")
        if self.repetitions < _MIN_REPETITIONS:
            raise LeverError(
                f"speed needs at least {_MIN_REPETITIONS} pairs of trials per context for an interval "
                f"(got {self.repetitions}); {DEFAULT_REPETITIONS} is the default"
            )
        if self.warmup < 0:
            raise LeverError(f"speed warm-up trials cannot be negative, got {self.warmup}")

    def to_json(self) -> dict[str, Any]:
        return {
            "contexts": list(self.contexts),
            "decode": self.decode,
            "repetitions": self.repetitions,
            "warmup": self.warmup,
        }
