"""mlxgate's lines mid-run: written to the controller's terminal (even mid-test), a worker's relayed to it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .process import Process
from .relay import LIVE_KEY, RELAY_KEY, ProgressRelay, worker_progress

__all__ = ["Progress"]


class Progress:
    """Where a progress line goes in this process: the terminal on the controller, the relay folder on a
    worker, nowhere on a quiet rank. The relay starts with the first worker and ends with the session."""

    def __init__(self, config: pytest.Config, process: Process, *, in_use: bool) -> None:
        self.config = config
        self.process = process
        self._in_use = in_use
        self._relay: ProgressRelay | None = None  # controller under xdist: the workers' progress lines

    @contextlib.contextmanager
    def lines(self) -> Iterator[Callable[[str], None] | None]:
        """A line writer to the real terminal even mid-test (capture suspended); None on workers."""
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if self.process.is_worker or self.process.is_quiet_rank or reporter is None:
            yield None
            return
        capman = self.config.pluginmanager.getplugin("capturemanager")
        ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with ctx:
            yield reporter.write_line

    def say(self, text: str) -> None:
        """A progress line on the controller's terminal."""
        with self.lines() as write:
            if write is not None:
                write(f"mlxgate: {text}")

    def sink(self) -> Callable[[str], None] | None:
        """Where a gate's progress lines go: the terminal on the controller, the relay folder on a worker."""
        if self.process.is_quiet_rank:
            return None
        workerinput = self.process.workerinput
        if workerinput is None:
            return self.say
        directory = workerinput.get(RELAY_KEY)
        if not directory:
            return None
        return worker_progress(str(directory), str(workerinput.get("workerid", "worker")))

    def live(self) -> bool:
        """Interim progress (items done, rate, ETA) only on a terminal; otherwise a closing line per task."""
        if self.process.workerinput is not None:
            return bool(self.process.workerinput.get(LIVE_KEY))
        writer = self.config.get_terminal_writer()
        stream = getattr(writer, "_file", None)  # the real stdout, saved before output capture
        try:
            return bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):
            return False

    def start_relay(self) -> None:
        """The relay for the workers' lines, once per run (a worker's `workerinput` is being made)."""
        if self._relay is None and self._in_use:
            self._relay = ProgressRelay(self._say_from_thread)

    def payload(self) -> dict[str, Any]:
        """The workers' part of `workerinput`: the relay folder and whether the lines are live."""
        if self._relay is None:
            return {}
        return {RELAY_KEY: str(self._relay.directory), LIVE_KEY: self.live()}

    def close(self) -> None:
        """At the session's end: print the workers' last lines, remove the relay folder."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    def _say_from_thread(self, text: str) -> None:
        """The relay's writer: the reporter directly (capture belongs to the main thread)."""
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"mlxgate: {text.removeprefix('mlxgate: ')}")
