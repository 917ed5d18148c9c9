"""What a speed measurement found: every trial, and per context the paired ratios.

`to_json` is what records carry (every repetition is kept, as llama-bench's JSON does); the text
of a result is `results.speed_text`'s, which reads that JSON's parse (`results.record_speed`), so the
controller's summary and a failure message word it the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..results.record_speed import parse_context, parse_speed
from ..results.speed_text import context_text, speed_lines
from ..stats.ratios import RatioEstimate, look_confidence, paired_ratio
from .shape import SpeedShape

__all__ = ["ContextSpeed", "SpeedResult", "Trial"]


@dataclass(frozen=True)
class Trial:
    """One arm's timed run at one context."""

    prefill_s: float
    decode_s: float
    peak_bytes: int | None  # above what was in use at the trial's start; None: not measurable here
    kv_bytes: int | None  # allocated: every array of every layer's cache (`cache_bytes`); None: not seen (a server)
    kv_held_bytes: int | None = None  # the positions holding a token (`cache_held_bytes`)

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "peak_bytes": self.peak_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_held_bytes": self.kv_held_bytes,
        }


@dataclass(frozen=True)
class ContextSpeed:
    """Both arms at one context: tokens/s (medians), ratios with intervals, memory."""

    context: int
    decode_tokens: int
    reference: list[Trial]
    candidate: list[Trial]
    prefill: RatioEstimate
    decode: RatioEstimate
    peak: RatioEstimate | None  # None where peak memory is not measured, or an arm allocated nothing
    stopped: str | None = None  # why no more pairs were timed: "decided", "precise" or "budget"

    @classmethod
    def from_trials(
        cls,
        context: int,
        decode: int,
        reference: Sequence[Trial],
        candidate: Sequence[Trial],
        *,
        budget: int | None = None,
        stopped: str | None = None,
    ) -> ContextSpeed:
        """The ratios of the pairs so far. `budget`: the pairs were added sequentially, at most that
        many, so the intervals are the looks' (`stats.ratios.look_confidence`); None: a fixed count."""
        if len(reference) != len(candidate) or not reference:
            raise ValueError("speed pairs need as many candidate as reference trials")
        level = {} if budget is None else {"confidence": look_confidence(len(reference), budget)}
        prefill = paired_ratio(
            [context / t.prefill_s for t in candidate], [context / t.prefill_s for t in reference], **level
        )
        dec = paired_ratio([decode / t.decode_s for t in candidate], [decode / t.decode_s for t in reference], **level)
        peaks = [(c.peak_bytes, r.peak_bytes) for c, r in zip(candidate, reference, strict=True)]
        peak = None
        if all(c is not None and r is not None and c > 0 and r > 0 for c, r in peaks):
            peak = paired_ratio([float(c) for c, _ in peaks], [float(r) for _, r in peaks], **level)  # type: ignore[arg-type]
        return cls(context, decode, list(reference), list(candidate), prefill, dec, peak, stopped)

    def to_json(self) -> dict[str, Any]:
        def arm(trials: Sequence[Trial]) -> dict[str, Any]:
            peaks = [t.peak_bytes for t in trials if t.peak_bytes is not None]
            return {
                "prefill_tps": statistics.median(self.context / t.prefill_s for t in trials),
                "decode_tps": statistics.median(self.decode_tokens / t.decode_s for t in trials),
                "peak_bytes": int(statistics.median(peaks)) if peaks else None,
                "kv_bytes": int(statistics.median(kv))
                if (kv := [t.kv_bytes for t in trials if t.kv_bytes is not None])
                else None,
                "kv_held_bytes": int(statistics.median(held))
                if (held := [t.kv_held_bytes for t in trials if t.kv_held_bytes is not None])
                else None,
                "trials": [t.to_json() for t in trials],
            }

        ref, cand = arm(self.reference), arm(self.candidate)
        kv_ratio = cand["kv_bytes"] / ref["kv_bytes"] if ref["kv_bytes"] and cand["kv_bytes"] is not None else None
        return {
            "context": self.context,
            "decode_tokens": self.decode_tokens,
            "reference": ref,
            "candidate": cand,
            "prefill": self.prefill.to_json(),
            "decode": self.decode.to_json(),
            "peak": self.peak.to_json() if self.peak is not None else None,
            "kv": {"ratio": kv_ratio},
            "stopped": self.stopped,
        }

    def short_text(self) -> str:
        return context_text(parse_context(self.to_json()))


@dataclass(frozen=True)
class SpeedResult:
    """A gate module's speed: its shape, each context's pairs, and how memory was read."""

    shape: SpeedShape
    contexts: Mapping[int, ContextSpeed]
    memory_method: str
    weights: Mapping[str, int]
    arms: Mapping[str, str]  # side -> the lever arm it ran ("reference" twice under A/A)
    duration_s: float
    load_seen: Mapping[str, Any] | None = None  # other processes' CPU use during the trials (`speed.load`)

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": self.shape.to_json(),
            "memory_method": self.memory_method,
            "weights_bytes": dict(self.weights),
            "arms": dict(self.arms),
            "duration_s": round(self.duration_s, 3),
            "contexts": {str(c): s.to_json() for c, s in self.contexts.items()},
            "load_seen": dict(self.load_seen) if self.load_seen is not None else None,
        }

    def lines(self) -> list[str]:
        return speed_lines(parse_speed(self.to_json()))
