"""Long arms say how far they are, stop past their time limit, and keep out of speed trials' way.

An arm reports to its `ArmWatch` between units of work: KL forwards, speed decode steps, capability
batches. There, and only there, it gets a throttled progress line (done / total, rate, ETA) and its
deadline is checked: an arm past --mlx-arm-timeout raises `ArmTimeoutError`. No thread interrupts
MLX mid-operation; a single call that never returns is beyond what this can end.

Speed trials time alone. Under xdist the controller gives every worker one run folder; a worker's
trial phase holds the exclusive lock file in it (so two workers' trials never overlap) and marks
the folder while it times. Other workers' arms look for the mark between forwards and wait for the
lock's release before their next one (the time waited does not count against their own limit); the
trials first wait, through `settle` (speed/load.py's `wait_for_siblings`), for the forward each
other worker had in flight to end.
Without xdist there is one process: nothing to lock. Standard library and filelock only.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import ArmTimeoutError
from .format import format_clock, format_duration

__all__ = ["TIMING_LOCK", "TIMING_MARK", "ArmWatch", "Watcher", "progress_interval"]

#: In the run folder: the lock speed trials hold, and the mark that says trials are being timed.
TIMING_LOCK = "speed-trials.lock"
TIMING_MARK = "speed-trials.active"
#: Seconds between an arm's progress lines: on a terminal, and in a log (CI keeps every line).
LIVE_INTERVAL, LOG_INTERVAL = 5.0, 30.0


def progress_interval(configured: float | None, live: bool) -> float:
    """--mlx-progress-interval when given, else a line every 5 s on a terminal and every 30 s in a log."""
    if configured is not None:
        return configured
    return LIVE_INTERVAL if live else LOG_INTERVAL


class Watcher:
    """One gate module's settings for its arms' watches: where lines go, how often, the time limit,
    and the run folder whose lock keeps speed trials alone (None: not under xdist)."""

    def __init__(
        self,
        *,
        say: Callable[[str], None] | None,
        interval: float,
        limit_s: float | None,
        run_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        settle: Callable[[], float] | None = None,
    ) -> None:
        self.say = say
        self.interval = interval
        self.limit_s = limit_s
        self.run_dir = run_dir
        self.clock = clock
        self.settle = settle  # under xdist, with the mark up: waits out other workers' forwards in flight
        self._timing = False  # this process holds the trial lock: its own arms never wait for it

    def arm(
        self, label: str, total: int, *, unit: str, action: str = "running", verb: str = "ran", closing: bool = False
    ) -> ArmWatch:
        """A watch for one arm; `closing`: always end with a summary line (else only after an interim line)."""
        return ArmWatch(self, label, total, unit=unit, action=action, verb=verb, closing=closing)

    @contextlib.contextmanager
    def timing_alone(self, what: str) -> Iterator[float]:
        """Hold the run's trial lock for the block; yields the seconds spent waiting for it."""
        if self.run_dir is None or self._timing:
            yield 0.0
            return
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.run_dir / TIMING_LOCK))
        waited = 0.0
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another process's trials: wait for their end
            self._say(f"{what}: waiting for {self._holder()} to finish its speed trials (speed is timed alone)")
            started = self.clock()
            lock.acquire()
            waited = self.clock() - started
        mark = self.run_dir / TIMING_MARK
        try:
            mark.write_text(f"{_worker_name()} ({what}), pid {os.getpid()}\n", encoding="utf-8")
            self._timing = True
            if self.settle is not None:
                settled = self.settle()
                waited += settled
                if settled >= 1.0:
                    self._say(f"{what}: waited {settled:.1f} s for other workers' forwards in flight to end")
            yield waited
        finally:
            self._timing = False
            with contextlib.suppress(OSError):
                mark.unlink()
            lock.release()

    def pause_for_timing(self, label: str) -> float:
        """Between two forwards: while another process times speed trials, wait for them to end.
        Returns the seconds waited (0.0 at once when nobody is timing: one stat of the mark)."""
        if self.run_dir is None or self._timing:
            return 0.0
        mark = self.run_dir / TIMING_MARK
        if not mark.exists():
            return 0.0
        holder = self._holder()
        if holder.endswith(f"pid {os.getpid()}"):
            return 0.0  # our own mark (another module's watcher in this process): never wait on ourselves
        from filelock import FileLock

        self._say(f"{label}: paused while {holder} times its speed trials")
        started = self.clock()
        with FileLock(str(self.run_dir / TIMING_LOCK)):
            if mark.exists():  # the lock was free, so its holder died before removing the mark
                with contextlib.suppress(OSError):
                    mark.unlink()
        return self.clock() - started

    def _holder(self) -> str:
        assert self.run_dir is not None
        try:
            return (self.run_dir / TIMING_MARK).read_text(encoding="utf-8").strip() or "another worker"
        except OSError:
            return "another worker"

    def _say(self, text: str) -> None:
        if self.say is not None:
            self.say(text)


class ArmWatch:
    """One arm: `advance(n)` / `(done, total)` between units of work, `check()` inside a timed span
    (deadline only: a clock read), `finish()` at the end."""

    def __init__(
        self, watcher: Watcher, label: str, total: int, *, unit: str, action: str, verb: str, closing: bool
    ) -> None:
        self._w = watcher
        self.label = label
        self.total = total
        self.unit = unit
        self._action, self._verb, self._closing = action, verb, closing
        self.started = watcher.clock()
        self._last_line = self.started  # the first line comes one interval in: short arms print nothing
        self.paused = 0.0  # waited for another worker's speed trials: not this arm's time
        self.done = 0
        self.lines = 0

    @property
    def elapsed(self) -> float:
        """Seconds this arm has worked (waits for other workers' speed trials left out)."""
        return self._w.clock() - self.started - self.paused

    def advance(self, n: int = 1) -> None:
        """`n` more units done."""
        self(self.done + n, self.total)

    def __call__(self, done: int, total: int) -> None:
        """`done` of `total` units (capability's `ArmProgress` protocol)."""
        self.done, self.total = max(self.done, done), max(total, 1)
        self.paused += self._w.pause_for_timing(self.label)
        self.check()
        now = self._w.clock()
        if self._w.say is not None and self.done < self.total and now - self._last_line >= self._w.interval:
            self._last_line = now
            self.lines += 1
            self._w.say(
                f"{self._action} {self.label}: {self.done} / {self.total} {self.unit} at "
                f"{_rate(self.done / self.elapsed if self.elapsed > 0 else 0.0)} {self.unit}/s, "
                f"ETA {self._eta()}"
            )

    def check(self) -> None:
        """Raise `ArmTimeoutError` when the arm has run past the limit."""
        limit = self._w.limit_s
        if limit is None:
            return
        elapsed = self.elapsed
        if elapsed <= limit:
            return
        raise ArmTimeoutError(
            f"the {self.label} ran past the arm time limit: {self.done} of {self.total} {self.unit} done in "
            f"{format_duration(elapsed)} (limit {limit:g} s, --mlx-arm-timeout), so it was stopped and the gate "
            "has no verdict. A lever that stalls (a sleep, a lock, a slow fallback kernel) or sizes too big for "
            "this machine do this: find which, lower the sizes, or raise the limit with --mlx-arm-timeout "
            "SECONDS (ini mlx_arm_timeout; 0 or none: no limit)"
        )

    def finish(self, verb: str | None = None) -> None:
        """The closing line: always for a `closing` watch, else only when an interim line was printed."""
        if self._w.say is None or not (self._closing and self.done > 0 or self.lines):
            return
        elapsed = self.elapsed
        rate = f" ({_rate(self.done / elapsed)} {self.unit}/s)" if elapsed > 0 else ""
        self._w.say(f"{verb or self._verb} {self.label}: {self.done} {self.unit} in {elapsed:.1f} s{rate}")

    def _eta(self) -> str:
        if self.done <= 0:
            return "--:--"
        return format_clock(self.elapsed / self.done * (self.total - self.done))


def _rate(rate: float) -> str:
    """3 figures at most, never an exponent: 1234, 56.7, 0.82."""
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2g}"


def _worker_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "a pytest process")
