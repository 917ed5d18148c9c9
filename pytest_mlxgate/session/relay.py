"""Progress lines from xdist workers to the controller's terminal.

A worker's stdout and stderr go nowhere a user sees, and xdist carries nothing from a worker to the
controller until a test's report. A capability run is minutes per task, so workers append their
progress lines to one file each in a folder the controller made (whole lines under PIPE_BUF are
written atomically), and a daemon thread on the controller prints new lines as they arrive, tagged
with the worker's id. Standard library only: the controller imports this.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["LIVE_KEY", "RELAY_KEY", "ProgressRelay", "worker_progress"]

#: workerinput key of the relay folder (absent: no relay, e.g. not distributing).
RELAY_KEY = "mlxgate_progress_dir"
#: workerinput key: whether the controller's output is a terminal (interim lines) or not (a line per task).
LIVE_KEY = "mlxgate_live_progress"


def worker_progress(directory: str, worker_id: str) -> Callable[[str], None]:
    """A worker's `progress(text)`: one line appended to its file in the relay folder."""
    path = Path(directory) / f"{worker_id}.log"

    def say(text: str) -> None:
        line = " ".join(text.splitlines()) + "\n"
        try:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError:
            pass  # progress is a courtesy: a vanished folder must not fail a gate

    return say


class ProgressRelay:
    """The controller's side: a folder for the workers and a thread that prints their new lines."""

    def __init__(self, write: Callable[[str], None], *, interval: float = 0.5) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="mlxgate-progress-"))
        self._write = write
        self._interval = interval
        self._offsets: dict[Path, int] = {}
        self._pending: dict[Path, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="mlxgate-progress-relay", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.drain()

    def drain(self) -> None:
        """Print every complete line the workers wrote since the last look."""
        with self._lock:
            for path in sorted(self.directory.glob("*.log")):
                try:
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        handle.seek(self._offsets.get(path, 0))
                        chunk = handle.read()
                        self._offsets[path] = handle.tell()
                except OSError:
                    continue
                text = self._pending.pop(path, "") + chunk
                *lines, rest = text.split("\n")
                if rest:
                    self._pending[path] = rest  # a line still being written
                for line in lines:
                    if line:
                        self._write(f"[{path.stem}] {line}")

    def close(self) -> None:
        """Stop the thread, print what is left, remove the folder."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.drain()
        shutil.rmtree(self.directory, ignore_errors=True)
