"""Values in and out of JSON: strict-JSON copies, and tolerant converters that never raise.

A record from another process (or an older run in the DB) may lack a field or hold a string
where a number was expected; the read model (`model.parse_record`) gets None instead, and a table
shows a dash.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "Flat",
    "Interval",
    "absent",
    "dumps",
    "integer",
    "interval",
    "ints",
    "jsonable",
    "mapping",
    "number",
    "real",
    "reals",
    "rest",
    "sequence",
    "text",
    "written",
]


def real(value: Any) -> float | None:
    """A finite number or None: a string or NaN in a stats field must not poison a numeric column."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    f = real(value)
    return int(f) if f is not None and f == int(f) else None


def text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else dumps(value)


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def jsonable(value: Any) -> Any:
    """A strict-JSON copy: non-finite floats become null, tuples lists, numpy-like scalars numbers."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)  # a Path or an enum: keep what it says rather than lose the whole report


def dumps(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(jsonable(value), allow_nan=False, ensure_ascii=False, indent=indent)


class Interval(NamedTuple):
    """The two ends of an interval, in the figure's own units; None where there is no such end."""

    lower: float | None = None
    upper: float | None = None


def rest(wire: Mapping[str, Any], typed: Collection[str]) -> dict[str, Any]:
    """The keys of a record's part that the read model does not type (a speed trial's seconds, an A/A run's
    whole statistics, a capability item's answers), as written: kept, so that a record read and written
    again (merge, the results DB) loses nothing, and a newer record's fields survive an older reader."""
    return {str(k): v for k, v in wire.items() if k not in typed}


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


def interval(value: Any) -> Interval:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return Interval(real(value[0]), real(value[1]))
    return Interval()


def ints(value: Any) -> tuple[int | None, ...]:
    return tuple(integer(v) for v in sequence(value))


def reals(value: Any) -> tuple[float | None, ...]:
    return tuple(real(v) for v in sequence(value))


def absent(wire: Mapping[str, Any], typed: Collection[str]) -> frozenset[str]:
    """The typed keys a record's part did not hold: its `to_json` leaves them out again (absent and null
    read the same, but a record read and written again keeps its shape)."""
    return frozenset(k for k in typed if k not in wire)


def written(typed: Mapping[str, Any], left_out: Collection[str], kept: Mapping[str, Any]) -> dict[str, Any]:
    """A part's wire form: its typed keys but those it did not hold, then the keys kept as written (`rest`).
    In a fixed order, so that the same record writes the same bytes in any process."""
    out = {k: v for k, v in typed.items() if k not in left_out}
    out.update(kept)
    return out


class Flat:
    """A part of the read model whose fields are its wire keys (values: numbers, text, intervals, tuples),
    then `left_out` and `more`: its `to_json` is its fields as JSON, but those it did not hold, then its
    untyped keys. A dataclass mixin: the subclass declares the fields."""

    left_out: frozenset[str]
    more: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        import dataclasses

        typed = {
            f.name: jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]  # always a dataclass
            if f.name not in ("left_out", "more")
        }
        return written(typed, self.left_out, self.more)
