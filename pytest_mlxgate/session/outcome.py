"""What became of the run's tests, for its reports: which ran, which never did (an interrupted run), and
which modules ran without leaving a gate record (so `mlxgate merge` can tell a skip from a vanished gate).

The controller sees every collected node id (its own collection, or each xdist worker's) and every
report (xdist forwards them), so it alone keeps this. Also here: moving a previous run's report aside
before this run writes its own, so CI never uploads it as this run's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from ..config.shards import module_of

__all__ = ["STALE_SUFFIX", "RunOutcome", "move_aside"]

#: A report from an earlier run found at the report's path at session start is renamed to PATH + this.
STALE_SUFFIX = ".stale"


class RunOutcome:
    """The run's tests as the controller saw them: collected, reported, skipped, recorded."""

    def __init__(self) -> None:
        self._collected: dict[str, None] = {}  # node ids in collection order
        self._reported: set[str] = set()  # teardown reports seen: the test ran to its end
        self._skipped: set[str] = set()
        self._recorded: set[str] = set()  # carried a gate record
        self._interrupt: str | None = None

    def collected(self, nodeids: Iterable[str]) -> None:
        """Node ids collected: the controller's own, or an xdist worker's (each collects the same)."""
        for nodeid in nodeids:
            self._collected.setdefault(nodeid, None)

    def saw(self, report: pytest.TestReport, *, recorded: bool) -> None:
        """A test report (any phase) reached the controller; `recorded`: it carried a gate record."""
        if report.skipped:
            self._skipped.add(report.nodeid)
        if report.when == "teardown":
            self._reported.add(report.nodeid)
            if recorded:
                self._recorded.add(report.nodeid)

    def interrupted_by(self, reason: str) -> None:
        """pytest's keyboard-interrupt hook: Ctrl-C, pytest.exit(), `Interrupted` (collection errors, -x under
        xdist)."""
        self._interrupt = reason

    def not_run(self) -> list[str]:
        """Modules with a collected test that never reported its end, in collection order."""
        return list(dict.fromkeys(module_of(n) for n in self._collected if n not in self._reported))

    def interruption(self, session: pytest.Session) -> dict[str, Any] | None:
        """`{reason, not_run}` when the run stopped before its end (Ctrl-C, pytest.exit, -x / --maxfail
        with tests left); None for a run that ran everything it collected."""
        not_run = self.not_run()
        stopped = session.shouldstop or session.shouldfail
        if session.exitstatus != pytest.ExitCode.INTERRUPTED and not (stopped and not_run):
            return None
        reason = self._interrupt or (str(stopped) if stopped else "interrupted")
        return {"reason": reason, "not_run": not_run}

    def without_records(self) -> dict[str, str]:
        """Modules whose every test ran but none left a gate record, and why ("2 skipped", "1 without a gate
        record"): what a shard's report says so that merge tells them from modules whose records vanished."""
        by_module: dict[str, list[str]] = {}
        for nodeid in self._reported:
            by_module.setdefault(module_of(nodeid), []).append(nodeid)
        unfinished = set(self.not_run())  # part of it never ran: not_run says so
        out: dict[str, str] = {}
        for module, nodeids in sorted(by_module.items()):
            if module in unfinished or any(n in self._recorded for n in nodeids):
                continue
            skipped = sum(n in self._skipped for n in nodeids)
            parts = [f"{skipped} skipped"] if skipped else []
            if len(nodeids) > skipped:
                parts.append(f"{len(nodeids) - skipped} without a gate record")
            out[module] = ", ".join(parts)
        return out


def move_aside(path: Path) -> Path | None:
    """Rename an earlier run's report at `path` to `path.stale` (replacing an older one); None when there is
    none. OSError when it cannot be moved (the caller stops the run: its report could not replace it)."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return None
    if path.is_dir():
        raise IsADirectoryError(21, "it is a directory", str(path))
    stale = path.with_name(path.name + STALE_SUFFIX)
    path.replace(stale)
    return stale
