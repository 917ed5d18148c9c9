"""How a gate's speed is measured: at which contexts, how many decoded tokens, how many pairs.

Plain data, no mlx: the session builds it from the `mlx_speed` marker and the options before any
arm runs. Pairs are added one at a time (`speed.measure`) until each context is decided: the goals
the module's assertions declare that apply there are cleared or shown missed, or, where none
applies, the prefill and decode estimates' standard errors are within `precision`; `repetitions` is
the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LeverError

__all__ = [
    "DEFAULT_PRECISION",
    "DEFAULT_REPETITIONS",
    "SAMPLED_GOALS",
    "SpeedGoal",
    "SpeedShape",
    "default_contexts",
    "default_decode",
    "past_the_window",
]

#: Pairs per context at most (the budget): fewer gives an interval too wide to show a few percent (and
#: is refused under 3).
DEFAULT_REPETITIONS = 9
#: Where no goal applies, a context stops once its prefill and decode estimates' standard errors are within
#: this share (of the log ratio): a figure only reported is then as repeatable as it needs to be (the goal:
#: estimates across runs within sd 0.05, tests/stats/test_ratios.py simulates it). Its interval, shown, is
#: the look's. The rule before, intervals within 10%, asked for standard errors of 2-3% and on this CPU's
#: spread (5-14% per pair) ran every context to the budget.
DEFAULT_PRECISION = 0.04
#: The goals a sampled ratio decides (bytes are counted, exact from the first trial): key -> direction.
SAMPLED_GOALS = {"decode": "min", "prefill": "min", "memory": "max"}
_MIN_REPETITIONS = 3
#: The method this project descends from decides at 600 and 8k tokens of context.
_ACCELERATOR_CONTEXTS = (600, 8192)
_ACCELERATOR_DECODE = 64
#: On a CPU (the embedded model in CI) one context a run can afford: a CPU's figure says whether a lever
#: runs and is grossly slower or faster, where an accelerator's two say how it scales with context. Two
#: CPU contexts (64 and 256) told ratios within ~10% of each other in every gate here, about their
#: intervals' width (gates/calibration/), and were 41% of `./dev gates` (`./dev bench gates`); at 128 a
#: trial is ~0.6 s of prefill and ~0.7 s of decoding (the embedded model decodes ~11 tokens/s on 2
#: cores), so a context's 10-20 trials take 15-30 s.
_CPU_CONTEXTS = (128,)
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
class SpeedGoal:
    """A goal a module's assertion declares (`assert_faster(paired, decode=1.05, at=...)`): the trials
    at the contexts it applies to stop once it is decided."""

    key: str  # "decode", "prefill" (the least ratio) or "memory" (the most peak ratio)
    limit: float
    at: int | str | None = None  # a context, "all", or None: the longest

    def applies_at(self, context: int, contexts: tuple[int, ...]) -> bool:
        return self.at == "all" or self.at == context or (self.at is None and context == max(contexts))

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "limit": self.limit, "at": self.at}


@dataclass(frozen=True)
class SpeedShape:
    """Each context is prefilled, then `decode` tokens are decoded one at a time; pairs of trials
    (after `warmup` untimed ones per arm) are added until the context is decided by `goals` (or,
    with none there, `precision`), at most `repetitions` of them."""

    contexts: tuple[int, ...]
    decode: int
    repetitions: int = DEFAULT_REPETITIONS
    warmup: int = 1
    goals: tuple[SpeedGoal, ...] = ()
    precision: float = DEFAULT_PRECISION

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
        if not self.precision > 0:
            raise LeverError(
                f"speed precision must be a positive share (0.04: standard errors within 4%), got {self.precision}"
            )

    def goals_at(self, context: int) -> list[SpeedGoal]:
        """The sampled goals that decide `context` (bytes goals never need another pair)."""
        return [g for g in self.goals if g.key in SAMPLED_GOALS and g.applies_at(context, self.contexts)]

    def to_json(self) -> dict[str, Any]:
        return {
            "contexts": list(self.contexts),
            "decode": self.decode,
            "repetitions": self.repetitions,
            "warmup": self.warmup,
            "goals": [g.to_json() for g in self.goals],
            "precision": self.precision,
        }
