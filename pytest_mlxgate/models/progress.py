"""Download progress: a bar for `mlxgate get` on a terminal, throttled lines for pytest's reporter.

The hub calls `progress(bytes_done, bytes_total)` from its worker threads, so both sinks take a
lock, keep `done` monotonic and redraw at most every `interval` seconds. No dependency: the bar
is a few lines, and a library bar would fight pytest's own terminal writer.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TextIO

from ..common.format import format_bytes, format_clock

__all__ = ["LineProgress", "TerminalBar"]


def _amount(n: float, unit: str) -> str:
    return format_bytes(n) if unit == "B" else f"{n:.0f} {unit}"


class _Meter:
    """Shared bookkeeping: monotonic done, total, rate since the first report, throttling."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.lock = threading.Lock()
        self.interval = interval
        self.clock = clock
        self.done = 0
        self.total = 0
        self.first: tuple[float, int] | None = None  # (time, done) at the first report
        self.last_emit = float("-inf")

    def update(self, done: int, total: int) -> bool:
        """Record a report (caller holds the lock); True when it is time to redraw."""
        now = self.clock()
        if self.first is None:
            self.first = (now, done)  # a resume starts past 0: rate counts only this run's bytes
        self.done = max(self.done, done)
        self.total = max(self.total, total)
        finished = self.total > 0 and self.done >= self.total
        if not finished and now - self.last_emit < self.interval:
            return False
        self.last_emit = now
        return True

    def rate(self) -> float:
        if self.first is None:
            return 0.0
        elapsed = self.clock() - self.first[0]
        return (self.done - self.first[1]) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> str:
        rate = self.rate()
        if rate <= 0 or self.total <= 0:
            return "--:--"
        return format_clock((self.total - self.done) / rate)


class TerminalBar:
    """`label [#####-----]  42%  1.2 GB / 2.9 GB  48.1 MB/s  ETA 0:35`, redrawn in place on a TTY.

    `unit` is "B" for downloads; the embedded model's builder counts "files".
    """

    def __init__(
        self,
        stream: TextIO,
        label: str,
        *,
        unit: str = "B",
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._label = label
        self._unit = unit
        self._meter = _Meter(interval, clock)
        self._width = shutil.get_terminal_size((80, 24)).columns
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        with self._meter.lock:
            if self._meter.update(done, total):
                self._draw()

    def close(self) -> None:
        """End the bar's line (only if one was drawn, so a cached snapshot prints nothing)."""
        with self._meter.lock:
            if self._drawn:
                self._draw()
                self._stream.write("\n")
                self._stream.flush()
                self._drawn = False

    def _draw(self) -> None:
        m = self._meter
        frac = m.done / m.total if m.total else 0.0
        rate = f"  {format_bytes(m.rate())}/s" if self._unit == "B" else ""
        tail = f" {frac:4.0%}  {_amount(m.done, self._unit)} / {_amount(m.total, self._unit)}{rate}  ETA {m.eta()}"
        room = max(10, self._width - len(self._label) - len(tail) - 4)
        filled = int(room * min(frac, 1.0))
        line = f"{self._label} [{'#' * filled}{'-' * (room - filled)}]{tail}"
        self._stream.write("\r" + line[: self._width - 1])
        self._stream.flush()
        self._drawn = True


class LineProgress:
    """Whole lines for pytest's terminal reporter: a line every `interval` s and a closing summary."""

    def __init__(
        self,
        write_line: Callable[[str], None],
        label: str,
        *,
        unit: str = "B",
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        action: str = "fetching",
        count_rate: bool = False,
    ) -> None:
        self._write_line = write_line
        self._label = label
        self._unit = unit
        self._action = action
        self._count_rate = count_rate  # units other than bytes: say their rate too ("0.8 items/s")
        self._meter = _Meter(interval, clock)
        self._started = self._meter.last_emit = clock()  # no line for downloads under one interval
        self._moved = False

    def __call__(self, done: int, total: int) -> None:
        with self._meter.lock:
            self._moved |= done > 0
            if self._meter.update(done, total) and self._meter.done < self._meter.total:
                m, unit = self._meter, self._unit
                rate = f" at {self._rate()}" if unit == "B" or self._count_rate else ""
                self._write_line(
                    f"mlxgate: {self._action} {self._label}: {_amount(m.done, unit)} / "
                    f"{_amount(m.total, unit)}{rate}, ETA {m.eta()}"
                )

    def finish(self, verb: str = "fetched") -> None:
        """One summary line, if anything moved."""
        with self._meter.lock:
            if not self._moved:
                return
            m, unit = self._meter, self._unit
            rate = f" ({self._rate()})" if unit == "B" or self._count_rate else ""
            self._write_line(
                f"mlxgate: {verb} {self._label}: {_amount(m.done, unit)} in "
                f"{m.clock() - self._started:.1f} s{rate}"  # listing/converting included
            )

    def _rate(self) -> str:
        rate = self._meter.rate()
        return f"{format_bytes(rate)}/s" if self._unit == "B" else f"{rate:.2g} {self._unit}/s"
