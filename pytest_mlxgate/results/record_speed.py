"""The speed and memory part of the read model: per context both arms' figures and the paired ratios,
with their tolerant parse; derived facts (the longest context, a context's KV ratio) computed here once.
Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import Flat, Interval, absent, integer, interval, mapping, real, rest, text, written

__all__ = ["LoadSeen", "Ratio", "ServedSpeed", "Speed", "SpeedArm", "SpeedContext", "parse_context", "parse_speed"]


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
class LoadSeen(Flat):
    """Other processes' CPU use while the trials were timed (`speed.load.load_seen`); `high` from a quarter
    of the cores (None: not measured)."""

    cores: int | None = None
    other_cores: float | None = None
    share: float | None = None
    high: bool | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class ServedSpeed:
    """Both arms served over HTTP (`speed.served`): the servers, and the shortest context timed again with
    `requests` at once (None: not measured)."""

    reference: str | None = None
    candidate: str | None = None
    concurrent: SpeedContext | None = None
    requests: int | None = None
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        concurrent = None if self.concurrent is None else {"requests": self.requests, **self.concurrent.to_json()}
        return {"reference": self.reference, "candidate": self.candidate, "concurrent": concurrent, **self.more}


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
    load_seen: LoadSeen | None = None  # other processes' load while the trials were timed
    served: ServedSpeed | None = None  # both arms served: the servers and their concurrent context
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
            "load_seen": None if self.load_seen is None else self.load_seen.to_json(),
            "served": None if self.served is None else self.served.to_json(),
        }
        return written(typed, self.left_out, self.more)

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
SPEED_KEYS = ("id", "shape", "contexts", "weights_bytes", "memory_method", "duration_s", "load_seen", "served")
LOAD_KEYS = ("cores", "other_cores", "share", "high")
SERVED_KEYS = ("reference", "candidate", "concurrent")


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


def parse_context(c: Mapping[str, Any]) -> SpeedContext:
    """One context's JSON (`ContextSpeed.to_json()`), its length read from its own `context`."""
    return _context(integer(c.get("context")) or 0, c)


def _load(value: Any) -> LoadSeen | None:
    seen = mapping(value)
    if not seen:
        return None
    high = seen.get("high")
    return LoadSeen(
        cores=integer(seen.get("cores")),
        other_cores=real(seen.get("other_cores")),
        share=real(seen.get("share")),
        high=high if isinstance(high, bool) else None,
        left_out=absent(seen, LOAD_KEYS),
        more=rest(seen, LOAD_KEYS),
    )


def _served(value: Any) -> ServedSpeed | None:
    served = mapping(value)
    if not served:
        return None
    concurrent = mapping(served.get("concurrent"))  # its context's figures, and how many requests at once
    context = {k: v for k, v in concurrent.items() if k != "requests"}
    return ServedSpeed(
        reference=text(served.get("reference")) or None,
        candidate=text(served.get("candidate")) or None,
        concurrent=parse_context(context) if concurrent else None,
        requests=integer(concurrent.get("requests")),
        more=rest(served, SERVED_KEYS),
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
        load_seen=_load(s.get("load_seen")),
        served=_served(s.get("served")),
        shape_more=rest(shape, ("repetitions", "decode")),
        left_out=absent(s, SPEED_KEYS),
        more=rest(s, SPEED_KEYS),
    )
