"""One run's mlxgate session: who this process is, and the concern plugins it wires together.

Like pytest-xdist's DSession and its TerminalDistReporter, each concern is its own object, registered
as a plugin for the hooks it alone answers: the models and the header (`provision.py`), the shard plan
(`sharding.py`), the reports (`reports.py`), the closing summary (`summary.py`); mid-run lines go
through `progress.py`. The hooks whose steps span concerns, in an order that matters, stay here.
Only the controller prints and writes; workers never download.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ..config.names import Role
from ..config.settings import Settings
from ..errors import MlxgateError
from ..results.records import records_in
from .cachedir import ReferenceCacheDir
from .outcome import RunOutcome
from .process import Process
from .progress import Progress
from .provision import WORKERINPUT_KEYS, ModelProvider
from .reports import ReportWriter
from .sharding import SHARD_DURATIONS_KEY, SHARD_PLAN_KEY, ShardPlanner
from .summary import TerminalSummary
from .transport import attach, carried_by, stage_error

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel
    from ..models.materialize import ResolvedSnapshot
    from .builder import RunContext
    from .paired import Paired
    from .paired_run import PairedRun

__all__ = ["MlxgateSession", "Role", "SHARD_DURATIONS_KEY", "SHARD_PLAN_KEY", "WORKERINPUT_KEYS"]


class MlxgateSession:
    """Per-run state and the hooks that need more than one concern (no module globals, no `config._x`)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        from ..capability.distributed import launch_rank

        self.config = config
        self.settings = settings
        self.process = Process(getattr(config, "workerinput", None), launch_rank())
        if (
            self.process.rank is not None
            and settings.in_use
            and (self.process.is_worker or getattr(config.option, "dist", "no") != "no")
        ):
            raise pytest.UsageError(
                "mlxgate: this pytest is one rank of an mlx.launch job (MLX_RANK is set) and also distributes "
                "over xdist workers; the ranks already split the capability items. Fix: -p no:xdist (or -n 0) "
                "in the command mlx.launch runs"
            )
        gate = settings.gate
        self.progress = Progress(config, self.process, in_use=settings.in_use)
        self.reference_cache = ReferenceCacheDir(config, gate) if gate is not None else None
        self.models = ModelProvider(config, settings, self.process, self.progress, self.reference_cache)
        self.shards = ShardPlanner(config, gate, self.process)
        self.outcome = RunOutcome()  # the controller's view of which tests ran: interrupted runs, merge
        self.reports = ReportWriter(
            config,
            settings,
            self.process,
            self.outcome,
            machine=self.models.machine,
            shard_plan=lambda: self.shards.plan,
        )
        self.summary = TerminalSummary(self.process, self.reports)
        self._runs: dict[str, PairedRun] = {}

    def plugins(self) -> dict[str, object]:
        """Each object with hooks, by the name it is registered under (plugin.py registers them)."""
        return {
            "mlxgate-session": self,
            "mlxgate-models": self.models,
            "mlxgate-shards": self.shards,
            "mlxgate-reports": self.reports,
            "mlxgate-summary": self.summary,
        }

    @property
    def is_worker(self) -> bool:
        return self.process.is_worker

    @property
    def is_quiet_rank(self) -> bool:
        return self.process.is_quiet_rank

    # -- hooks that span concerns --------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """An earlier run's reports are moved aside first; then, under xdist, the models are resolved on the
        controller before xdist starts the workers that need them."""
        self.reports.move_stale_reports()
        self.models.resolve_for_workers()

    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """A `--mlx-lever` override is checked against every collected module, then --mlx-shard keeps its own."""
        from .gate_request import check_lever_override

        check_lever_override(self.settings.gate, items)
        self.shards.select(config, items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.is_worker:  # under xdist the controller collects nothing: each worker's ids come instead
            self.outcome.collected(item.nodeid for item in session.items)

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        message = str(excinfo.value).strip()
        self.outcome.interrupted_by(f"{excinfo.typename}: {message}" if message else excinfo.typename)

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

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The controller notes which tests ran (the records themselves: reports.py)."""
        if not self.is_worker:
            self.outcome.saw(report, recorded=bool(records_in(carried_by(report))))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.progress.close()  # the workers' last progress lines, before the summary

    # -- what fixtures and the xdist hooks call ------------------------------------------------

    def snapshot(self, role: Role = "candidate") -> ResolvedSnapshot | None:
        return self.models.snapshot(role)

    def model(self, role: Role = "candidate") -> tuple[Any, Any]:
        return self.models.model(role)

    def loaded_model(self, role: Role) -> LoadedModel | None:
        return self.models.loaded_model(role)

    def machine(self) -> tuple[str, str]:
        return self.models.machine()

    def warn_if_reference_blas(self) -> None:
        self.models.warn_if_reference_blas()

    def paired(self, item: pytest.Item) -> Paired:
        """The `paired` fixture's value: the item's module run (built once per module and lever)."""
        from ..config.rerun import rerun_command
        from .builder import build_paired_run
        from .paired import Paired

        run = build_paired_run(self._run_context(), item, self._runs)
        return Paired(run, item, rerun_command(self.config, item.nodeid))

    def _run_context(self) -> RunContext:
        from ..models.device import run_machine
        from .builder import RunContext
        from .workers import run_dir_of

        gate = self.settings.gate
        assert gate is not None and self.reference_cache is not None
        device, blas = self.machine()
        return RunContext(
            gate=gate,
            load_model=self.loaded_model,
            cache_dir=self.reference_cache.usable(),
            machine=run_machine(device, blas),
            progress=self.progress.sink(),
            live=self.progress.live(),
            distributed=self.process.rank is not None,
            run_dir=run_dir_of(self.process.workerinput),
        )

    def worker_payload(self) -> dict[str, Any]:
        """What `pytest_configure_node` puts into each worker's `workerinput`: pinned snapshots, the shard
        durations, and where to send progress lines (the relay starts with the first worker)."""
        self.progress.start_relay()
        return {**self.models.payload(), **self.shards.payload(), **self.progress.payload()}

    def worker_done(self, output: dict[str, Any]) -> None:
        """A worker's workeroutput (xdist's testnodedown): the shard plan it applied, for the report."""
        self.shards.worker_done(output)
