"""The run's closing lines on the controller's terminal: calibrations, the gates' table, reports, errors."""

from __future__ import annotations

import os
from typing import Any

from .process import Process
from .reports import ReportWriter

__all__ = ["TerminalSummary"]


class TerminalSummary:
    """Prints what the reports hold, once, from the controller (a plugin; only rank 0 of an mlx.launch job)."""

    def __init__(self, process: Process, reports: ReportWriter) -> None:
        self.process = process
        self.reports = reports

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One table for the whole run, printed by the controller only; then why the run failed after its
        tests (a report not written), in red."""
        done = self.reports
        if self.process.is_worker or not (done.records or done.calibrations or done.errors or done.interrupted):
            return
        if self.process.is_quiet_rank:
            terminalreporter.write_line(f"mlxgate: rank {self.process.rank}: the summary and reports are rank 0's")
            return
        if done.calibrations:
            from ..verdicts.calibration_text import calibration_lines

            terminalreporter.section("mlxgate calibration")
            for calibration in done.calibrations:
                for line in calibration_lines(calibration):
                    terminalreporter.write_line(line)
        if not (done.records or done.errors or done.interrupted):
            return
        from ..results.summary import summary_lines

        terminalreporter.section("mlxgate")
        if done.records:
            for line in summary_lines(done.records, width=terminalreporter._tw.fullwidth):
                terminalreporter.write_line(line)
        if done.interrupted is not None:
            from ..results.summary import interrupted_line

            terminalreporter.write_line(
                f"mlxgate: {interrupted_line(done.interrupted)}; the reports say so (interrupted: true, verdict error)",
                red=True,
                bold=True,
            )
        for line in done.written:
            terminalreporter.write_line(line)
        if os.environ.get("GITHUB_ACTIONS") == "true" and done.records:  # workflow commands: annotations
            from ..results.github import annotation_lines

            for line in annotation_lines(done.records, done.locations):
                terminalreporter.write_line(line)
        for line in done.errors:
            terminalreporter.write_line(line, red=True, bold=True)
