"""One run's mlxgate state, registered as a pytest plugin: which models, their snapshots, the loaded model.

Resolution happens once per run, on the controller: eagerly at session start when xdist
distributes (the pinned result rides down in `workerinput`), lazily on first fixture use otherwise.
Only the controller prints; workers never download and never write to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..common.format import format_bytes
from ..config.names import Aliases, CandidateSpec, Role, load_aliases, parse_name
from ..config.settings import Settings
from ..errors import MlxgateError, MlxgateUsageError, MlxgateWarning, ModelUnavailableError
from ..models.progress import LineProgress
from ..results.records import calibrations_in, records_in
from .relay import LIVE_KEY, RELAY_KEY, ProgressRelay, worker_progress
from .outcome import RunOutcome
from .transport import attach, carried_by, stage_error

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel
    from ..models.materialize import ResolvedSnapshot
    from ..results.history import ResultsDBLocked
    from ..results.records import GateRecord, RunInfo
    from .builder import RunContext
    from .paired import Paired, PairedRun

__all__ = ["MlxgateSession", "Role", "SHARD_DURATIONS_KEY", "SHARD_PLAN_KEY", "WORKERINPUT_KEYS"]

#: workerinput keys carrying each role's ResolvedSnapshot as JSON, controller -> workers.
WORKERINPUT_KEYS: dict[Role, str] = {
    "candidate": "mlxgate_snapshot",
    "reference": "mlxgate_reference_snapshot",
}
#: workerinput: the modules' recorded durations, read once by the controller (--mlx-shard), so every
#: worker plans from the same history even when a run appends to it meanwhile.
SHARD_DURATIONS_KEY = "mlxgate_shard_durations"
#: workeroutput: the shard plan a worker applied, for the controller's report and summary.
SHARD_PLAN_KEY = "mlxgate_shard_plan"


class MlxgateSession:
    """Per-run state and the hooks that need it (no module globals, no `config._x`)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        from ..capability.distributed import launch_rank

        self.rank: int | None = launch_rank()  # one rank of an mlx.launch job (None: a plain run)
        if self.rank is not None and settings.in_use and (
                self.workerinput is not None or getattr(config.option, "dist", "no") != "no"):
            raise pytest.UsageError(
                "mlxgate: this pytest is one rank of an mlx.launch job (MLX_RANK is set) and also distributes "
                "over xdist workers; the ranks already split the capability items. Fix: -p no:xdist (or -n 0) "
                "in the command mlx.launch runs")
        try:
            self.aliases: Aliases = load_aliases(settings.pyproject, settings.tool_table)
            names: dict[Role, str | None] = {
                "candidate": settings.candidate,
                "reference": settings.reference,
            }
            self.specs: dict[Role, CandidateSpec | None] = {
                role: parse_name(
                    name, aliases=self.aliases, base_dir=settings.names_dir[role], role=role
                )
                if name
                else None
                for role, name in names.items()
            }
        except MlxgateUsageError as e:
            raise pytest.UsageError(str(e)) from None
        self._resolved: dict[Role, ResolvedSnapshot] = {}
        self._failed: dict[Role, str] = {}
        self._machine: tuple[str, str] | None = None
        self._header_shown = False
        self._ref_cache_failed = False
        self._written: list[str] = []
        self._started = time.time()
        self._models: dict[Role, tuple[Any, Any]] = {}
        self._runs: dict[str, PairedRun] = {}
        self.records: list[GateRecord] = []  # gate records seen by this process's reports
        self.calibrations: list[dict[str, Any]] = []  # --mlx-calibrate measurements, one per gate module
        self._locations: dict[str, tuple[str, int]] = {}  # nodeid -> its test function's (path, line): annotations
        self._json_report: Path | None = None  # where this run's JSON report was written
        self._html_report: Path | None = None  # ...and its HTML report
        self._relay: ProgressRelay | None = None  # controller under xdist: the workers' progress lines
        self._shard_durations: dict[str, float] | None = None  # --mlx-shard: read from the history once
        self.shard_plan: dict[str, Any] | None = None  # --mlx-shard: the plan applied (from a worker under xdist)
        self._shard_text: str | None = None
        self.outcome = RunOutcome()  # the controller's view of which tests ran: interrupted runs, merge
        self._interrupted: dict[str, Any] | None = None  # {reason, not_run}: the run stopped before its end
        self._errors: list[str] = []  # what made the run fail after its tests (a report not written)
        self._stale: dict[str, Path] = {}  # report path -> where an earlier run's report there was moved
        self._db_locked = False  # the results DB was locked at the end: the rest of the run leaves it alone

    @property
    def is_worker(self) -> bool:
        return self.workerinput is not None

    @property
    def is_quiet_rank(self) -> bool:
        """A rank other than 0 of an mlx.launch job: it runs its share of the items, prints and writes nothing."""
        return self.rank is not None and self.rank != 0

    # -- hooks ---------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under xdist, resolve on the controller before xdist starts the workers that need it."""
        self._move_stale_reports()
        if self.is_worker or not self.settings.in_use:
            return
        if not self.config.pluginmanager.hasplugin("dsession"):
            return  # not distributing: fixtures resolve lazily, only if a test needs a model
        for role in WORKERINPUT_KEYS:
            try:
                self.snapshot(role)
            except ModelUnavailableError as e:
                raise pytest.UsageError(str(e)) from None

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """--mlx-shard I/N: keep the whole modules of shard I; the others are reported deselected."""
        self._check_lever_override(items)
        gate = self.settings.gate
        if gate is None or gate.shard is None:
            return
        from .shards import module_of, plan_shards

        plan = plan_shards({module_of(item.nodeid) for item in items}, self.shard_durations(), gate.shard.count)
        keep = set(plan.modules(gate.shard))
        selected = [item for item in items if module_of(item.nodeid) in keep]
        deselected = [item for item in items if module_of(item.nodeid) not in keep]
        self.shard_plan = plan.to_json(gate.shard)
        self._shard_text = plan.describe(gate.shard)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = selected
        if self.workerinput is not None:
            output = getattr(config, "workeroutput", None)
            if isinstance(output, dict):
                output[SHARD_PLAN_KEY] = self.shard_plan

    def _check_lever_override(self, items: list[pytest.Item]) -> None:
        """A bare `--mlx-lever NAME` that no collected gate module declares is a usage error: it would
        override nothing (and, before, turned every module's lever into an environment variable)."""
        gate = self.settings.gate
        if gate is None or gate.lever is None:
            return
        from ..levers.parsing import check_override_targets

        declared: dict[str, str | None] = {}
        for item in items:
            if "paired" not in getattr(item, "fixturenames", ()):
                continue
            mark = item.get_closest_marker("mlx_lever")
            name = mark.args[0] if mark is not None and mark.args and isinstance(mark.args[0], str) else None
            declared[item.nodeid.split("::")[0]] = name
        try:
            check_override_targets(gate.lever, declared)
        except MlxgateUsageError as e:
            raise pytest.UsageError(str(e)) from None

    def _move_stale_reports(self) -> None:
        """On the controller, before any test: an earlier run's report at --mlx-report's (or --mlx-html's)
        path becomes PATH.stale, so a run that then cannot write its own leaves none to mistake for it."""
        gate = self.settings.gate
        if self.is_worker or self.is_quiet_rank or gate is None:
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
                    f"run's. Fix: {flag} PATH in a writable directory, or remove {path}") from None
            if stale is not None:
                self._stale[str(path)] = stale

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.is_worker:  # under xdist the controller collects nothing: each worker's ids come instead
            self.outcome.collected(item.nodeid for item in session.items)

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        message = str(excinfo.value).strip()
        self.outcome.interrupted_by(f"{excinfo.typename}: {message}" if message else excinfo.typename)

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        return [f"mlxgate: {self._shard_text}"] if self._shard_text and not self.is_worker else []

    def shard_durations(self) -> dict[str, float]:
        """Each module's recorded seconds (--mlx-shard balancing): shipped by the controller under xdist,
        else read from the results DB once; none without a DB (the plan then splits by node id)."""
        if self._shard_durations is None:
            shipped = (self.workerinput or {}).get(SHARD_DURATIONS_KEY)
            if isinstance(shipped, dict):
                self._shard_durations = {str(k): float(v) for k, v in shipped.items()}
            else:
                self._shard_durations = self._read_shard_durations()
        return self._shard_durations

    def _read_shard_durations(self) -> dict[str, float]:
        gate = self.settings.gate
        if gate is None or gate.db is None or not gate.db.is_file():
            return {}  # never create a DB just to find it empty
        from ..results.history import ResultsDB, ResultsDBError
        from .shards import module_durations

        try:
            rows = ResultsDB(gate.db).rows(columns=("run_id", "started", "nodeid", "total_s", "config_json"))
        except (OSError, ResultsDBError) as e:
            self.config.issue_config_time_warning(MlxgateWarning(
                f"--mlx-shard: the results DB {gate.db} cannot be read ({e}); the shards split by node id, "
                "unbalanced. Fix: --mlx-db PATH to a readable history (every shard the same file)"), 2)
            return {}
        return module_durations(rows)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """`mlxgate: name → repo@commit (verified, cached) · device · BLAS`, only when in use."""
        if self.is_worker or self.is_quiet_rank or not self.settings.in_use:
            return []
        device, blas = self.machine()
        lines = []
        for role, spec in self.specs.items():
            if spec is not None:
                lines.append(self._describe(role, spec, self._resolved.get(role)))
        lines[0] += f" · {device} · {blas}"
        if self.settings.gate is not None:
            _, off = self.reference_cache_plan()
            if off is not None:
                lines.append(f"mlxgate: reference cache off ({off})")
        if self.rank is not None:
            lines.append("mlxgate: rank 0 of an mlx.launch job: capability items are split over its ranks; "
                         "this rank prints the summary and writes the reports")
        self._header_shown = True
        return lines

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """What the item's gates published rides its teardown report (so it crosses xdist too); an
        error mlxgate raised on purpose is reported by its message alone (it says what, why and the
        fix: a traceback through the plugin's frames adds nothing)."""
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, MlxgateError) and report.failed:
            report.longrepr = f"{type(call.excinfo.value).__name__}: {call.excinfo.value}"
        stage_error(item, report, call)  # a gate that raised: an error record, never absent
        attach(item, report)
        return report

    @pytest.hookimpl(tryfirst=True)  # before junitxml reads the report's user_properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The controller collects the records of each teardown report and hands JUnit its properties."""
        if not self.is_worker:
            self.outcome.saw(report, recorded=bool(records_in(carried_by(report))))
        if self.is_worker or report.when != "teardown":
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
            self._locations[report.nodeid] = gate_location(self.config.rootpath, report.location,
                                                           Path(workspace) if workspace else None)
        xml = _junit_xml(self.config)
        if xml is None or not records:
            return
        from ..results.junit import junit_properties, suite_properties

        for record in records:
            if getattr(xml, "family", "xunit1") == "xunit1":  # "legacy" is xunit1 by now
                report.user_properties.extend(junit_properties(record))  # in its own <testcase>
            else:  # xunit2: a <testcase> has no <properties>; the <testsuite> does
                for name, value in suite_properties(record):
                    xml.add_global_property(name, value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One table for the whole run, printed by the controller only; then why the run failed after its
        tests (a report not written), in red."""
        if self.is_worker or not (self.records or self.calibrations or self._errors or self._interrupted):
            return
        if self.is_quiet_rank:
            terminalreporter.write_line(f"mlxgate: rank {self.rank}: the summary and reports are rank 0's")
            return
        if self.calibrations:
            from ..authoring.calibrate import calibration_lines

            terminalreporter.section("mlxgate calibration")
            for calibration in self.calibrations:
                for line in calibration_lines(calibration):
                    terminalreporter.write_line(line)
        if not (self.records or self._errors or self._interrupted):
            return
        from ..results.summary import summary_lines

        terminalreporter.section("mlxgate")
        if self.records:
            for line in summary_lines(self.records, width=terminalreporter._tw.fullwidth):
                terminalreporter.write_line(line)
        if self._interrupted is not None:
            from ..results.summary import interrupted_line

            terminalreporter.write_line(f"mlxgate: {interrupted_line(self._interrupted)}; the reports say so "
                                        "(interrupted: true, verdict error)", red=True, bold=True)
        for line in self._written:
            terminalreporter.write_line(line)
        if os.environ.get("GITHUB_ACTIONS") == "true" and self.records:  # workflow commands: annotations
            from ..results.github import annotation_lines

            for line in annotation_lines(self.records, self._locations):
                terminalreporter.write_line(line)
        for line in self._errors:
            terminalreporter.write_line(line, red=True, bold=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The controller writes the JSON report and appends to the results DB, once per run."""
        self._written = []
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if (self.shard_plan is not None and not self.shard_plan.get("modules") and not self.is_worker
                and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.OK  # more shards than modules: an empty shard is the plan, no error
        gate = self.settings.gate
        sharded = gate is not None and gate.shard is not None  # a shard writes its report even when empty:
        if self.is_worker or gate is None:  # merge counts it
            return
        wanted = self.records or gate.report is not None or gate.html is not None or sharded
        interrupted = self.outcome.interruption(session) if wanted else None
        if not (self.records or self.calibrations or sharded or interrupted):
            return
        if self.is_quiet_rank:  # rank 0 of the mlx.launch job holds the same records and writes them
            return
        from ..capability.base import TASK_NAMES
        from ..results.history import ResultsDB, ResultsDBError, ResultsDBLocked
        from ..results.json_report import write_json_report
        from ..results.score import score_record

        score = score_record(self.records, TASK_NAMES)
        if score is not None:
            self.records.append(score)
        self._interrupted = interrupted
        facts: dict[str, Any] = {"interrupted": interrupted} if interrupted else {}
        if sharded:  # which planned modules ran without a record (skipped): merge tells them from vanished ones
            facts["without_records"] = self.outcome.without_records()
        run = self._run_info(**facts)
        if gate.report is not None:
            try:
                write_json_report(gate.report, run, self.records, self.calibrations)
            except OSError as e:  # CI would find no report (or take an old one): the run fails, saying why
                self._fail_run(session, f"JSON report {gate.report} not written: {e.strerror or e}", "--mlx-report",
                               gate.report)
            else:
                self._written.append(f"mlxgate: JSON report → {gate.report}")
                self._json_report = gate.report
        if gate.db is not None and self.records:  # a calibration alone has no verdict to keep in the history
            try:
                results = ResultsDB(gate.db)
                rows = results.append(run, self.records)
            except ResultsDBLocked as e:  # held by another process past the busy timeout: queue, never lose
                self._db_locked = True
                self._queue_rows(gate.db, run, e)
            except (OSError, MlxgateError, ValueError, ResultsDBError) as e:  # history is a by-product: warn
                self.config.issue_config_time_warning(MlxgateWarning(
                    f"results DB {gate.db} not written: {e}; fix: --mlx-db PATH in a writable directory, or "
                    "--mlx-db off"), 2)
            else:
                earlier = (f", and {results.pending_merged} row(s) queued by earlier runs that found it locked"
                           if results.pending_merged else "")
                self._written.append(f"mlxgate: {rows} row(s) → {gate.db} (quality_runs){earlier}")
        if gate.html is not None and (self.records or interrupted):
            self._write_html(session, gate.html, run, gate.db)
        summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path and self.records:
            self._write_step_summary(Path(summary_path))

    def _fail_run(self, session: pytest.Session, what: str, flag: str, path: Path) -> None:
        """A report this run owes cannot be written: an error at exit (the exit status says it), not a warning."""
        stale = self._stale.get(str(path))
        moved = f" The earlier run's report there was moved to {stale} at the start." if stale else ""
        self._errors.append(f"mlxgate: ERROR: {what}.{moved} CI must not find an earlier run's report (or none) "
                            f"and take it for this run's, so the run fails. Fix: {flag} PATH in a writable directory "
                            "with free space")
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _queue_rows(self, db: Path, run: RunInfo, locked: ResultsDBLocked) -> None:
        """The DB is locked: the run's rows go to `<db>.pending.jsonl`, added by the next run that opens it."""
        from ..results.history import pending_path, queue_pending

        who = f"another process (PID {locked.holder})" if locked.holder is not None else "another run"
        try:
            pending = queue_pending(db, run, self.records)
        except OSError as e:
            self.config.issue_config_time_warning(MlxgateWarning(
                f"results DB {db} not written: it is locked by {who} (waited {locked.timeout:g} s), and its rows "
                f"could not be queued to {pending_path(db)} either ({e.strerror or e}); fix: --mlx-db PATH in a "
                "writable directory, or --mlx-db off"), 2)
            return
        self._written.append(f"mlxgate: results not recorded in the DB yet: {db} is locked by {who} (waited "
                             f"{locked.timeout:g} s); {len(self.records)} row(s) queued to {pending}, merged on the "
                             "next run")

    def _write_html(self, session: pytest.Session, path: Path, run: RunInfo, db: Path | None) -> None:
        """The HTML report, with each gate's history from the results DB (this run's rows included)."""
        from ..results.fields import nodeid_of
        from ..results.history import ResultsDBError
        from ..results.html_report import history_rows, write_html_report

        history = None
        if db is not None and self._db_locked:
            history = {}  # locked: no second wait for the sparklines
        elif db is not None:
            try:
                history = history_rows(db, (nodeid_of(r) for r in self.records))
            except (OSError, ResultsDBError, ValueError):
                history = {}  # the DB already warned, or is unreadable: the report shows no sparklines
        try:
            write_html_report(path, self.records, history=history, run=run)
        except OSError as e:
            self._fail_run(session, f"HTML report {path} not written: {e.strerror or e}", "--mlx-html", path)
        else:
            self._written.append(f"mlxgate: HTML report → {path}")
            self._html_report = path

    def _write_step_summary(self, path: Path) -> None:
        """Append the run's job summary to GitHub's file, within what is left of its 1 MiB."""
        from ..results.github import STEP_SUMMARY_LIMIT, step_summary

        reports = [("JSON report", str(self._json_report))] if self._json_report is not None else []
        if self._html_report is not None:
            reports.append(("HTML report", str(self._html_report)))
        xml = _junit_xml(self.config)
        if xml is not None and getattr(xml, "logfile", None):
            reports.append(("JUnit XML", str(xml.logfile)))
        try:
            used = path.stat().st_size if path.exists() else 0  # earlier writers in this step count too
            text = step_summary(self.records, reports=reports, limit=STEP_SUMMARY_LIMIT - used - 1)
            if text:
                with path.open("a", encoding="utf-8") as f:
                    f.write(("\n" if used else "") + text)
        except OSError as e:
            self.config.issue_config_time_warning(MlxgateWarning(
                f"job summary not written to $GITHUB_STEP_SUMMARY ({path}): {e.strerror or e}"), 2)
        else:
            if text:
                self._written.append("mlxgate: job summary → $GITHUB_STEP_SUMMARY")

    def _run_info(self, **facts: Any) -> RunInfo:
        import platform
        import sys

        from ..models.device import installed_versions
        from ..results.records import RunInfo

        device, blas = self.machine()
        gate = self.settings.gate
        config = {
            "candidate": self.settings.candidate,
            "reference": self.settings.reference,
            "offline": self.settings.offline,
            "gate": {k: (str(v) if v is not None else None) for k, v in vars(gate).items()} if gate else None,
        }
        if self.shard_plan is not None:
            config["shard"] = self.shard_plan
        config.update(facts)  # what became of the run's tests: interrupted, without_records
        versions = installed_versions(("mlx", "mlx-lm"))
        machine = {"device": device, "blas": blas, "mlx": versions["mlx"], "mlx_lm": versions["mlx-lm"],
                   "python": sys.version.split()[0], "platform": platform.platform()}
        return RunInfo.new(self.config.rootpath, argv=[str(a) for a in self.config.invocation_params.args],
                           config=config, machine=machine, started=self._started)

    # -- what fixtures call --------------------------------------------------------------------

    def machine(self) -> tuple[str, str]:
        """(device, BLAS), computed once. The xdist controller asks a subprocess: it only prints the
        header, and must not load mlx (nor numpy) for that; elsewhere the gates load mlx anyway."""
        from ..models.device import REFERENCE_BLAS

        device, blas = self._machine_facts()
        return device, f"{blas} (slow, see warning)" if blas == REFERENCE_BLAS else blas

    def _machine_facts(self) -> tuple[str, str]:
        if self._machine is None:
            from ..models.device import machine_facts

            self._machine = machine_facts(in_subprocess=self._distributes())
        return self._machine

    def _distributes(self) -> bool:
        """This process is an xdist controller: its workers run the tests."""
        if self.is_worker:
            return False
        return self.config.pluginmanager.hasplugin("dsession") or getattr(self.config.option, "dist", "no") != "no"

    def warn_if_reference_blas(self) -> None:
        """Warn once per run, from the controller, with the fix."""
        if self.is_worker or not self.settings.in_use:
            return
        from ..models.device import reference_blas_warning

        message = reference_blas_warning(self._machine_facts()[1])
        if message:
            self.config.issue_config_time_warning(MlxgateWarning(message), stacklevel=2)

    def snapshot(self, role: Role = "candidate") -> ResolvedSnapshot | None:
        """The role's snapshot (None: no such model configured); resolves at most once per process.

        Raises `ModelUnavailableError` with the user-facing message when it cannot be had.
        """
        if role in self._resolved:
            return self._resolved[role]
        if role in self._failed:
            raise ModelUnavailableError(self._failed[role])
        spec = self.specs[role]
        if spec is None:
            return None
        shipped = (self.workerinput or {}).get(WORKERINPUT_KEYS[role])
        if shipped is not None:
            from ..models.materialize import ResolvedSnapshot

            snap = ResolvedSnapshot.from_json(shipped)
            if not snap.dir.is_dir():
                self._failed[role] = (
                    f"mlxgate: the controller's {role} snapshot {snap.path} is not on this worker's "
                    "machine; remote xdist workers need the hub cache on a shared path "
                    "(--mlx-cache-dir)"
                )
                raise ModelUnavailableError(self._failed[role])
        else:
            # Not shipped: no xdist, or mlxgate not in use on the controller. Not in use means
            # no option, ini or [tool.mlxgate]: the default embedded model, which each worker
            # builds or finds quietly (its builder is locked across processes); never a download.
            snap = self._materialize(role, spec)
        self._resolved[role] = snap
        return snap

    def model(self, role: Role = "candidate") -> tuple[Any, Any]:
        """(model, tokenizer) of the role through `mlx_lm.load`, once per process; weights that cannot be
        read raise `ModelUnavailableError` naming the file and the fix (`models.loaded.load_mlx`)."""
        if role not in self._models:
            snap = self.snapshot(role)
            if snap is None:
                raise ModelUnavailableError(f"mlxgate: no {role} model configured (--mlx-{role} NAME)")
            from ..models.loaded import load_mlx

            self._models[role] = load_mlx(snap, role)
        return self._models[role]

    def paired(self, item: pytest.Item) -> Paired:
        """The `paired` fixture's value: the item's module run (built once per module and lever)."""
        from ..config.rerun import rerun_command
        from .builder import build_paired_run
        from .paired import Paired

        run = build_paired_run(self._run_context(), item, self._runs)
        return Paired(run, item, rerun_command(self.config, item.nodeid))

    def _run_context(self) -> RunContext:
        from ..models.device import installed_versions
        from .builder import RunContext
        from .workers import run_dir_of

        gate = self.settings.gate
        assert gate is not None
        device, blas = self.machine()
        return RunContext(
            gate=gate,
            load_model=self.loaded_model,
            cache_dir=self._reference_cache_dir(),
            machine={"device": device, "blas": blas, **installed_versions(("mlx", "mlx-lm"))},
            progress=self._progress_sink(),
            live=self._live(),
            distributed=self.rank is not None,
            run_dir=run_dir_of(self.workerinput),
        )

    def reference_cache_plan(self) -> tuple[Path | None, str | None]:
        """(directory, why it is off): --mlx-reference-cache, else pytest's cache, else off."""
        gate = self.settings.gate
        assert gate is not None
        if gate.reference_cache_off:
            return None, "--mlx-reference-cache off"
        if gate.reference_cache is not None:
            return gate.reference_cache, None
        cache = getattr(self.config, "cache", None)  # None under -p no:cacheprovider
        if cache is None:
            return None, "pytest's cacheprovider is disabled; --mlx-reference-cache DIR keeps one"
        return Path(cache._cachedir) / "d" / "mlxgate-reference", None

    def _reference_cache_dir(self) -> Path | None:
        """The usable reference cache directory, or None: off, or not writable (warned once, with
        the fix; reference arms are then computed every run, the verdicts are the same)."""
        directory, _ = self.reference_cache_plan()
        if directory is None or self._ref_cache_failed:
            return None
        try:
            cache = getattr(self.config, "cache", None)
            if self.settings.gate is not None and self.settings.gate.reference_cache is None and cache is not None:
                directory = Path(cache.mkdir("mlxgate-reference"))  # pytest's own: its .gitignore comes too
            else:
                directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._ref_cache_failed = True
            readable = directory.is_dir()
            warnings.warn(MlxgateWarning(
                f"reference cache {directory} is not writable ({e.strerror or e}): "
                + ("its entries are still read, new ones are not stored. " if readable else
                   "reference arms are computed every run. ")
                + "Fix: --mlx-reference-cache DIR (a writable directory), or --mlx-reference-cache off"),
                stacklevel=2)
            return directory if readable else None
        return directory

    def _progress_sink(self) -> Callable[[str], None] | None:
        """Where progress lines go: the terminal on the controller, the relay folder on a worker."""
        if self.is_quiet_rank:
            return None
        if not self.is_worker:
            return self._say
        assert self.workerinput is not None
        directory = self.workerinput.get(RELAY_KEY)
        if not directory:
            return None
        return worker_progress(str(directory), str(self.workerinput.get("workerid", "worker")))

    def _live(self) -> bool:
        """Interim progress (items done, rate, ETA) only on a terminal; otherwise a closing line per task."""
        if self.is_worker:
            assert self.workerinput is not None
            return bool(self.workerinput.get(LIVE_KEY))
        writer = self.config.get_terminal_writer()
        stream = getattr(writer, "_file", None)  # the real stdout, saved before output capture
        try:
            return bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):
            return False

    def loaded_model(self, role: Role) -> LoadedModel | None:
        """The role's model with its snapshot; None when no model is configured for the role."""
        from ..models.loaded import LoadedModel

        snap = self.snapshot(role)
        if snap is None:
            return None
        model, tokenizer = self.model(role)
        return LoadedModel(model, tokenizer, snap)

    def _say(self, text: str) -> None:
        """A progress line on the controller's terminal."""
        with self._terminal() as write:
            if write is not None:
                write(f"mlxgate: {text}")

    def worker_payload(self) -> dict[str, Any]:
        """What `pytest_configure_node` puts into each worker's `workerinput`: pinned snapshots, and
        where to send progress lines (the relay starts with the first worker)."""
        if self._relay is None and self.settings.in_use:
            self._relay = ProgressRelay(self._say_from_thread)
        payload: dict[str, Any] = {WORKERINPUT_KEYS[r]: s.to_json() for r, s in self._resolved.items()}
        if self.settings.gate is not None and self.settings.gate.shard is not None:
            payload[SHARD_DURATIONS_KEY] = self.shard_durations()
        if self._relay is not None:
            payload[RELAY_KEY] = str(self._relay.directory)
            payload[LIVE_KEY] = self._live()
        return payload

    def worker_done(self, output: dict[str, Any]) -> None:
        """A worker's workeroutput (xdist's testnodedown): the shard plan it applied, for the report."""
        plan = output.get(SHARD_PLAN_KEY)
        if self.shard_plan is None and isinstance(plan, dict):
            self.shard_plan = plan

    def _say_from_thread(self, text: str) -> None:
        """The relay's writer: the reporter directly (capture belongs to the main thread)."""
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"mlxgate: {text.removeprefix('mlxgate: ')}")

    # -- internals -----------------------------------------------------------------------------

    def _materialize(self, role: Role, spec: CandidateSpec) -> ResolvedSnapshot:
        from ..models.materialize import materialize

        expected: tuple[type[Exception], ...] = (MlxgateError, OSError)
        if spec.kind != "local":  # a local directory never needs the downloader (nor httpx)
            from ..hub import HubError

            expected += (HubError,)

        with self._terminal() as write_line:
            label = spec.repo_id or spec.name
            unit = "files" if spec.kind == "embedded" else "B"  # the builder counts files
            progress = LineProgress(write_line, label, unit=unit) if write_line else None
            try:
                snap = materialize(
                    spec,
                    cache_dir=self.settings.cache_dir,
                    endpoint=self.settings.endpoint,
                    offline=self.settings.offline,
                    progress=progress,
                )
            except expected as e:
                from ..common.redact import redact  # every way of failing to get a model ends here

                self._failed[role] = redact(f"mlxgate: cannot get the {role} '{spec.name}': {e}")
                raise ModelUnavailableError(self._failed[role]) from e
            if progress is not None:
                progress.finish("built" if spec.kind == "embedded" else "fetched")
            if write_line and self._header_shown:
                write_line(self._describe(role, spec, snap))
        return snap

    @contextlib.contextmanager
    def _terminal(self) -> Iterator[Callable[[str], None] | None]:
        """A line writer to the real terminal even mid-test (capture suspended); None on workers."""
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if self.is_worker or self.is_quiet_rank or reporter is None:
            yield None
            return
        capman = self.config.pluginmanager.getplugin("capturemanager")
        ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with ctx:
            yield reporter.write_line

    @staticmethod
    def _describe(role: Role, spec: CandidateSpec, snap: ResolvedSnapshot | None) -> str:
        prefix = "mlxgate:" if role == "candidate" else "mlxgate reference:"
        if snap is None:
            return f"{prefix} {spec.name} (resolved on first use)"
        if snap.kind == "local":
            return f"{prefix} {spec.name} → {snap.path} (local directory, not verified)"
        status = {
            "cached": "verified, cached",
            "downloaded": f"verified, downloaded {format_bytes(snap.fetched_bytes)} in {snap.seconds:.1f} s",
            "built": "verified, built",
        }.get(snap.source, snap.source)
        same = spec.kind == "hub" and spec.name.split("@")[0] == snap.repo_id
        named = snap.pinned if same else f"{spec.name} → {snap.pinned}"
        return f"{prefix} {named} ({status})"


def _junit_xml(config: pytest.Config) -> Any:
    """pytest's JUnit writer when --junit-xml is on in this process (never on an xdist worker), else None."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it: JUnit gets no mlxgate properties
        return None
    return config.stash.get(xml_key, None)
