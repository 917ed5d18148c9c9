"""The run's reports: gate records gathered by the controller, then JSON, results DB, HTML, job summary.

Each record's JUnit properties and GitHub annotation location are taken as its report arrives; the
files are written once, at the session's end, by the controller alone (rank 0 of an mlx.launch job).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config.settings import Settings
from ..errors import MlxgateError, MlxgateWarning
from ..results.records import calibrations_in, records_in
from .outcome import RunOutcome
from .process import Process
from .transport import carried_by

if TYPE_CHECKING:
    from ..results.history import ResultsDBLocked
    from ..results.model import Record
    from ..results.records import RunInfo

__all__ = ["ReportWriter", "junit_xml"]


class ReportWriter:
    """The controller's records of the run and every report made of them (a plugin). A report the run owes
    that cannot be written fails the run (`errors`); the history is a by-product: it only warns."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        process: Process,
        outcome: RunOutcome,
        *,
        machine: Callable[[], tuple[str, str]],
        shard_plan: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.config = config
        self.settings = settings
        self.process = process
        self.outcome = outcome
        self._machine = machine
        self._shard_plan = shard_plan
        self._started = time.time()
        self.records: list[Record] = []  # gate records seen by this process's reports
        self.calibrations: list[dict[str, Any]] = []  # --mlx-calibrate measurements, one per gate module
        self.locations: dict[str, tuple[str, int]] = {}  # nodeid -> its test function's (path, line): annotations
        self.written: list[str] = []  # a line per report written, for the terminal summary
        self.errors: list[str] = []  # what made the run fail after its tests (a report not written)
        self.interrupted: dict[str, Any] | None = None  # {reason, not_run}: the run stopped before its end
        self._json_report: Path | None = None  # where this run's JSON report was written
        self._html_report: Path | None = None  # ...and its HTML report
        self._stale: dict[str, Path] = {}  # report path -> where an earlier run's report there was moved
        self._db_locked = False  # the results DB was locked at the end: the rest of the run leaves it alone

    def move_stale_reports(self) -> None:
        """On the controller, before any test: an earlier run's report at --mlx-report's (or --mlx-html's)
        path becomes PATH.stale, so a run that then cannot write its own leaves none to mistake for it."""
        gate = self.settings.gate
        if self.process.is_worker or self.process.is_quiet_rank or gate is None:
            return
        from .outcome import move_aside

        for flag, path in (("--mlx-report", gate.report), ("--mlx-html", gate.html)):
            if path is None:
                continue
            try:
                stale = move_aside(path)
            except OSError as e:
                raise pytest.UsageError(
                    f"mlxgate: {flag} {path}: a report from an earlier run is there and cannot be moved aside "
                    f"({e.strerror or e}), so this run could not replace it either, and CI would upload it as this "
                    f"run's. Fix: {flag} PATH in a writable directory, or remove {path}"
                ) from None
            if stale is not None:
                self._stale[str(path)] = stale

    @pytest.hookimpl(tryfirst=True)  # before junitxml reads the report's user_properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The controller collects the records of each teardown report and hands JUnit its properties."""
        if self.process.is_worker or report.when != "teardown":
            return
        entries = carried_by(report)
        if not entries:
            return
        records = records_in(entries)
        self.records.extend(records)
        self.calibrations.extend(calibrations_in(entries))
        if records and os.environ.get("GITHUB_ACTIONS") == "true":
            from ..results.github import gate_location

            workspace = os.environ.get("GITHUB_WORKSPACE")
            self.locations[report.nodeid] = gate_location(
                self.config.rootpath, report.location, Path(workspace) if workspace else None
            )
        xml = junit_xml(self.config)
        if xml is None or not records:
            return
        from ..results.junit import junit_properties, suite_properties

        for record in records:
            if getattr(xml, "family", "xunit1") == "xunit1":  # "legacy" is xunit1 by now
                report.user_properties.extend(junit_properties(record))  # in its own <testcase>
            else:  # xunit2: a <testcase> has no <properties>; the <testsuite> does
                for name, value in suite_properties(record):
                    xml.add_global_property(name, value)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The controller writes the JSON report and appends to the results DB, once per run."""
        self.written = []
        gate = self.settings.gate
        sharded = gate is not None and gate.shard is not None  # a shard writes its report even when empty:
        if self.process.is_worker or gate is None:  # merge counts it
            return
        wanted = self.records or gate.report is not None or gate.html is not None or sharded
        interrupted = self.outcome.interruption(session) if wanted else None
        if not (self.records or self.calibrations or sharded or interrupted):
            return
        if self.process.is_quiet_rank:  # rank 0 of the mlx.launch job holds the same records and writes them
            return
        from ..results.history import ResultsDB, ResultsDBError, ResultsDBLocked
        from ..results.json_report import write_json_report
        from ..results.score import score_record
        from ..results.tasks import TASK_NAMES

        score = score_record(self.records, TASK_NAMES)
        if score is not None:
            self.records.append(score)
        self.interrupted = interrupted
        facts: dict[str, Any] = {"interrupted": interrupted} if interrupted else {}
        if sharded:  # which planned modules ran without a record (skipped): merge tells them from vanished ones
            facts["without_records"] = self.outcome.without_records()
        run = self._run_info(**facts)
        if gate.report is not None:
            try:
                write_json_report(gate.report, run, self.records, self.calibrations)
            except OSError as e:  # CI would find no report (or take an old one): the run fails, saying why
                self._fail_run(
                    session, f"JSON report {gate.report} not written: {e.strerror or e}", "--mlx-report", gate.report
                )
            else:
                self.written.append(f"mlxgate: JSON report → {gate.report}")
                self._json_report = gate.report
        if gate.db is not None and self.records:  # a calibration alone has no verdict to keep in the history
            try:
                results = ResultsDB(gate.db)
                rows = results.append(run, self.records)
            except ResultsDBLocked as e:  # held by another process past the busy timeout: queue, never lose
                self._db_locked = True
                self._queue_rows(gate.db, run, e)
            except (OSError, MlxgateError, ValueError, ResultsDBError) as e:  # history is a by-product: warn
                self.config.issue_config_time_warning(
                    MlxgateWarning(
                        f"results DB {gate.db} not written: {e}; fix: --mlx-db PATH in a writable directory, or "
                        "--mlx-db off"
                    ),
                    2,
                )
            else:
                earlier = (
                    f", and {results.pending_merged} row(s) queued by earlier runs that found it locked"
                    if results.pending_merged
                    else ""
                )
                self.written.append(f"mlxgate: {rows} row(s) → {gate.db} (quality_runs){earlier}")
        if gate.html is not None and (self.records or interrupted):
            self._write_html(session, gate.html, run, gate.db)
        summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path and self.records:
            self._write_step_summary(Path(summary_path))

    def _fail_run(self, session: pytest.Session, what: str, flag: str, path: Path) -> None:
        """A report this run owes cannot be written: an error at exit (the exit status says it), not a warning."""
        stale = self._stale.get(str(path))
        moved = f" The earlier run's report there was moved to {stale} at the start." if stale else ""
        self.errors.append(
            f"mlxgate: ERROR: {what}.{moved} CI must not find an earlier run's report (or none) "
            f"and take it for this run's, so the run fails. Fix: {flag} PATH in a writable directory "
            "with free space"
        )
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _queue_rows(self, db: Path, run: RunInfo, locked: ResultsDBLocked) -> None:
        """The DB is locked: the run's rows go to `<db>.pending.jsonl`, added by the next run that opens it."""
        from ..results.history import pending_path, queue_pending

        who = f"another process (PID {locked.holder})" if locked.holder is not None else "another run"
        try:
            pending = queue_pending(db, run, self.records)
        except OSError as e:
            self.config.issue_config_time_warning(
                MlxgateWarning(
                    f"results DB {db} not written: it is locked by {who} (waited {locked.timeout:g} s), and its rows "
                    f"could not be queued to {pending_path(db)} either ({e.strerror or e}); fix: --mlx-db PATH in a "
                    "writable directory, or --mlx-db off"
                ),
                2,
            )
            return
        self.written.append(
            f"mlxgate: results not recorded in the DB yet: {db} is locked by {who} (waited "
            f"{locked.timeout:g} s); {len(self.records)} row(s) queued to {pending}, merged on the "
            "next run"
        )

    def _write_html(self, session: pytest.Session, path: Path, run: RunInfo, db: Path | None) -> None:
        """The HTML report, with each gate's history from the results DB (this run's rows included)."""
        from ..results.history import ResultsDBError
        from ..results.html_report import history_rows, write_html_report

        history = None
        if db is not None and self._db_locked:
            history = {}  # locked: no second wait for the sparklines
        elif db is not None:
            try:
                history = history_rows(db, (r.nodeid for r in self.records))
            except (OSError, ResultsDBError, ValueError):
                history = {}  # the DB already warned, or is unreadable: the report shows no sparklines
        try:
            write_html_report(path, self.records, history=history, run=run)
        except OSError as e:
            self._fail_run(session, f"HTML report {path} not written: {e.strerror or e}", "--mlx-html", path)
        else:
            self.written.append(f"mlxgate: HTML report → {path}")
            self._html_report = path

    def _write_step_summary(self, path: Path) -> None:
        """Append the run's job summary to GitHub's file, within what is left of its 1 MiB."""
        from ..results.github import STEP_SUMMARY_LIMIT, step_summary

        reports = [("JSON report", str(self._json_report))] if self._json_report is not None else []
        if self._html_report is not None:
            reports.append(("HTML report", str(self._html_report)))
        xml = junit_xml(self.config)
        if xml is not None and getattr(xml, "logfile", None):
            reports.append(("JUnit XML", str(xml.logfile)))
        try:
            used = path.stat().st_size if path.exists() else 0  # earlier writers in this step count too
            text = step_summary(self.records, reports=reports, limit=STEP_SUMMARY_LIMIT - used - 1)
            if text:
                with path.open("a", encoding="utf-8") as f:
                    f.write(("\n" if used else "") + text)
        except OSError as e:
            self.config.issue_config_time_warning(
                MlxgateWarning(f"job summary not written to $GITHUB_STEP_SUMMARY ({path}): {e.strerror or e}"), 2
            )
        else:
            if text:
                self.written.append("mlxgate: job summary → $GITHUB_STEP_SUMMARY")

    def _run_info(self, **facts: Any) -> RunInfo:
        import platform
        import sys

        from ..models.device import installed_versions
        from ..results.records import RunInfo

        device, blas = self._machine()
        gate = self.settings.gate
        config = {
            "candidate": self.settings.candidate,
            "reference": self.settings.reference,
            "offline": self.settings.offline,
            "gate": {k: (str(v) if v is not None else None) for k, v in vars(gate).items()} if gate else None,
        }
        shard_plan = self._shard_plan()
        if shard_plan is not None:
            config["shard"] = shard_plan
        config.update(facts)  # what became of the run's tests: interrupted, without_records
        versions = installed_versions(("mlx", "mlx-lm"))
        machine = {
            "device": device,
            "blas": blas,
            "mlx": versions["mlx"],
            "mlx_lm": versions["mlx-lm"],
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        }
        return RunInfo.new(
            self.config.rootpath,
            argv=[str(a) for a in self.config.invocation_params.args],
            config=config,
            machine=machine,
            started=self._started,
        )


def junit_xml(config: pytest.Config) -> Any:
    """pytest's JUnit writer when --junit-xml is on in this process (never on an xdist worker), else None."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it: JUnit gets no mlxgate properties
        return None
    return config.stash.get(xml_key, None)
