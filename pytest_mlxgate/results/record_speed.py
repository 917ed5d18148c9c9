"""The speed and memory part of the read model: per context both arms' figures and the paired ratios,
with their tolerant parse; derived facts (the longest context, a context's KV ratio) computed here once.
Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import Flat, Interval, absent, integer, interval, jsonable, mapping, real, rest, text, written

__all__ = ["Ratio", "Speed", "SpeedArm", "SpeedContext", "parse_speed"]


@dataclass(frozen=True)
class Ratio:
    """Candidate / reference: the geometric mean of the paired ratios with its interval (bytes: exact)."""

    ratio: float | None = None
    ci: Interval = Interval()
    n: int | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        return written({"ratio": self.ratio, "ratio_ci": list(self.ci), "n": self.n}, self.left_out, self.more)


@dataclass(frozen=True)
class SpeedArm(Flat):
    prefill_tps: float | None = None
    decode_tps: float | None = None
    peak_bytes: int | None = None
    kv_bytes: int | None = None  # allocated
    kv_held_bytes: int | None = None  # the positions holding a token (a wrapped window: at most its window)
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class SpeedContext:
    """Both arms at one context length, and their ratios (None: not measured)."""

    length: int
    reference: SpeedArm = SpeedArm()
    candidate: SpeedArm = SpeedArm()
    prefill: Ratio | None = None
    decode: Ratio | None = None
    peak: Ratio | None = None
    kv: Ratio | None = None
    stopped: str | None = None  # why the trials stopped here: "decided", "precise", "budget" (None: a fixed count)
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        def ratio(r: Ratio | None) -> dict[str, Any] | None:
            return r.to_json() if r is not None else None

        typed = {
            "context": self.length,
            "reference": self.reference.to_json(),
            "candidate": self.candidate.to_json(),
            "prefill": ratio(self.prefill),
            "decode": ratio(self.decode),
            "peak": ratio(self.peak),
            "kv": ratio(self.kv),
            "stopped": self.stopped,
        }
        return written(typed, self.left_out, self.more)

    @property
    def kv_ratio(self) -> float | None:
        """The KV cache bytes ratio: recorded, else from both arms' bytes."""
        if self.kv is not None and self.kv.ratio is not None:
            return self.kv.ratio
        ref, cand = self.reference.kv_bytes, self.candidate.kv_bytes
        return cand / ref if ref and cand is not None else None


@dataclass(frozen=True)
class Speed:
    """Speed and memory of both arms (`speed/result.py`), contexts shortest first."""

    id: str | None = None
    repetitions: int | None = None
    decode_tokens: int | None = None
    contexts: tuple[SpeedContext, ...] = ()
    weights_reference: int | None = None
    weights_candidate: int | None = None
    memory_method: str | None = None
    duration_s: float | None = None
    load_seen: Mapping[str, Any] | None = None  # other processes' load while the trials were timed
    shape_more: Mapping[str, Any] = field(default_factory=dict)  # the shape's untyped keys, as written
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`speed/result.py` writes it): contexts keyed by their length as text."""
        typed = {
            "id": self.id,
            "shape": {**self.shape_more, "repetitions": self.repetitions, "decode": self.decode_tokens},
            "contexts": {str(c.length): c.to_json() for c in self.contexts},
            "weights_bytes": {"reference": self.weights_reference, "candidate": self.weights_candidate},
            "memory_method": self.memory_method,
            "duration_s": self.duration_s,
            "load_seen": jsonable(self.load_seen),
        }
        return written(typed, self.left_out, self.more)

    @property
    def as_json(self) -> dict[str, Any]:
        """The measurement in its JSON shape, from what was read (well-formed whatever the record held): for
        `results.speed_text`, the one wording of speed figures, which the assertion messages share."""

        def arm(a: SpeedArm) -> dict[str, Any]:
            return {
                "prefill_tps": a.prefill_tps,
                "decode_tps": a.decode_tps,
                "peak_bytes": a.peak_bytes,
                "kv_bytes": a.kv_bytes,
                "kv_held_bytes": a.kv_held_bytes,
            }

        def ratio(r: Ratio | None) -> dict[str, Any] | None:
            return None if r is None else {"ratio": r.ratio, "ratio_ci": list(r.ci), "n": r.n}

        return {
            "contexts": {
                str(c.length): {
                    "context": c.length,
                    "reference": arm(c.reference),
                    "candidate": arm(c.candidate),
                    "prefill": ratio(c.prefill),
                    "decode": ratio(c.decode),
                    "peak": ratio(c.peak),
                    "kv": ratio(c.kv),
                    "stopped": c.stopped,
                }
                for c in self.contexts
            },
            "weights_bytes": {"reference": self.weights_reference, "candidate": self.weights_candidate},
            "load_seen": self.load_seen,
        }

    @property
    def longest(self) -> SpeedContext | None:
        """The longest measured context: the one the DB columns, history and unqualified names show."""
        return self.contexts[-1] if self.contexts else None

    @property
    def weights_ratio(self) -> float | None:
        ref, cand = self.weights_reference, self.weights_candidate
        return cand / ref if ref and cand is not None else None


def _ratio(value: Any) -> Ratio | None:
    e = mapping(value)
    keys = ("ratio", "ratio_ci", "n")
    return (
        Ratio(
            ratio=real(e.get("ratio")),
            ci=interval(e.get("ratio_ci")),
            n=integer(e.get("n")),
            left_out=absent(e, keys),
            more=rest(e, keys),
        )
        if e
        else None
    )


def _arm(a: Mapping[str, Any]) -> SpeedArm:
    return SpeedArm(
        prefill_tps=real(a.get("prefill_tps")),
        decode_tps=real(a.get("decode_tps")),
        peak_bytes=integer(a.get("peak_bytes")),
        kv_bytes=integer(a.get("kv_bytes")),
        kv_held_bytes=integer(a.get("kv_held_bytes")),
        left_out=absent(a, ARM_KEYS),
        more=rest(a, ARM_KEYS),
    )


ARM_KEYS = ("prefill_tps", "decode_tps", "peak_bytes", "kv_bytes", "kv_held_bytes")
CONTEXT_KEYS = ("context", "reference", "candidate", "prefill", "decode", "peak", "kv", "stopped")
SPEED_KEYS = ("id", "shape", "contexts", "weights_bytes", "memory_method", "duration_s", "load_seen")


def _context(length: int, c: Mapping[str, Any]) -> SpeedContext:
    return SpeedContext(
        length=length,
        reference=_arm(mapping(c.get("reference"))),
        candidate=_arm(mapping(c.get("candidate"))),
        prefill=_ratio(c.get("prefill")),
        decode=_ratio(c.get("decode")),
        peak=_ratio(c.get("peak")),
        kv=_ratio(c.get("kv")),
        stopped=text(c.get("stopped")) or None,
        left_out=absent(c, CONTEXT_KEYS),
        more=rest(c, CONTEXT_KEYS),
    )


def parse_speed(s: Mapping[str, Any]) -> Speed:
    contexts = mapping(s.get("contexts"))
    lengths = sorted((str(c) for c in contexts if str(c).isdigit()), key=int)  # JSON keys: the length as text
    shape, weights = mapping(s.get("shape")), mapping(s.get("weights_bytes"))
    return Speed(
        id=text(s.get("id")) or None,
        repetitions=integer(shape.get("repetitions")),
        decode_tokens=integer(shape.get("decode")),
        contexts=tuple(_context(int(c), mapping(contexts[c])) for c in lengths),
        weights_reference=integer(weights.get("reference")),
        weights_candidate=integer(weights.get("candidate")),
        memory_method=text(s.get("memory_method")) or None,
        duration_s=real(s.get("duration_s")),
        load_seen=s.get("load_seen") if isinstance(s.get("load_seen"), Mapping) else None,
        shape_more=rest(shape, ("repetitions", "decode")),
        left_out=absent(s, SPEED_KEYS),
        more=rest(s, SPEED_KEYS),
    )
