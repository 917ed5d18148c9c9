"""How numbers read on the terminal and in failure messages: one function per unit."""

from __future__ import annotations

__all__ = [
    "DASH",
    "clip",
    "figure",
    "format_bytes",
    "format_clock",
    "format_duration",
    "percent",
    "percent_distinct",
    "points",
]

#: What a missing value prints as in tables.
DASH = "—"


def clip(text: str, width: int, *, keep: str = "start") -> str:
    """`text` in at most `width` characters, an ellipsis where it was cut: its start kept (an output, a
    table cell), or its end (`keep="end"`: the context just before a token)."""
    if len(text) <= width:
        return text
    room = max(0, width - 1)
    return text[:room] + "…" if keep == "start" else "…" + (text[-room:] if room else "")


def figure(x: object, *, other: str | None = None) -> str:
    """A measured number to three significant figures (`0.0118`, `3e-07`); anything else as itself,
    or as `other` where the caller has a word for "no number" (DASH in tables)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.3g}"
    return str(x) if other is None else other


def format_bytes(n: float) -> str:
    """Decimal units, like the hub's own pages: 999 B, 1.2 kB, 3.4 MB, 5.6 GB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_clock(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` past an hour: an ETA that ticks."""
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_duration(seconds: float) -> str:
    """How long something took: `4.2 s`, `3 m 07 s`, `1 h 02 m`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def percent(x: float | None, *, missing: str = "n/a") -> str:
    """A fraction as a percentage with one decimal."""
    return missing if x is None else f"{100 * x:.1f}%"


def percent_distinct(v: float) -> str:
    """One decimal, more where rounding would say 100% (or 0%) of something that is not."""
    pct = v * 100
    digits = 1
    while digits < 4 and 0 < v < 1 and round(pct, digits) in (0.0, 100.0):
        digits += 1
    return f"{pct:.{digits}f}%"


def points(x: float) -> str:
    """A difference of two fractions in percentage points."""
    return f"{100 * x:.1f} points"
