"""One run's mlxgate state, registered as a pytest plugin: which models, their snapshots, the loaded model.

Resolution happens once per run, on the controller: eagerly at session start when xdist
distributes (the pinned result rides down in `workerinput`), lazily on first fixture use otherwise.
Only the controller prints; workers never download and never write to the terminal.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import pytest

from .errors import MlxgateError, MlxgateUsageError, MlxgateWarning, ModelUnavailableError
from .names import Aliases, CandidateSpec, load_aliases, parse_name
from .progress import LineProgress, format_bytes
from .settings import Settings

if TYPE_CHECKING:
    from .paired import Paired, PairedRun
    from .reporting import RunInfo
    from .snapshots import ResolvedSnapshot

__all__ = ["MlxgateSession", "Role", "WORKERINPUT_KEYS"]

Role = Literal["candidate", "reference"]
#: workerinput keys carrying each role's ResolvedSnapshot as JSON, controller -> workers.
WORKERINPUT_KEYS: dict[Role, str] = {
    "candidate": "mlxgate_snapshot",
    "reference": "mlxgate_reference_snapshot",
}


class MlxgateSession:
    """Per-run state and the hooks that need it (no module globals, no `config._x`)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
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
        self._written: list[str] = []
        self._started = time.time()
        self._models: dict[Role, tuple[Any, Any]] = {}
        self._runs: dict[str, PairedRun] = {}
        self.records: list[dict[str, Any]] = []  # gate records seen by this process's reports

    @property
    def is_worker(self) -> bool:
        return self.workerinput is not None

    # -- hooks ---------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under xdist, resolve on the controller before xdist starts the workers that need it."""
        if self.is_worker or not self.settings.in_use:
            return
        if not self.config.pluginmanager.hasplugin("dsession"):
            return  # not distributing: fixtures resolve lazily, only if a test needs a model
        for role in WORKERINPUT_KEYS:
            try:
                self.snapshot(role)
            except ModelUnavailableError as e:
                raise pytest.UsageError(str(e)) from None

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """`mlxgate: name → repo@commit (verified, cached) · device · BLAS`, only when in use."""
        if self.is_worker or not self.settings.in_use:
            return []
        device, blas = self.machine()
        lines = []
        for role, spec in self.specs.items():
            if spec is not None:
                lines.append(self._describe(role, spec, self._resolved.get(role)))
        lines[0] += f" · {device} · {blas}"
        self._header_shown = True
        return lines

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Gate records ride the teardown report's user_properties (so they cross xdist too)."""
        if self.is_worker or report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == "mlxgate" and isinstance(value, dict):
                self.records.append(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One table for the whole run, printed by the controller only."""
        if self.is_worker or not self.records:
            return
        from .reporting import summary_lines

        terminalreporter.section("mlxgate")
        for line in summary_lines(self.records, width=terminalreporter._tw.fullwidth):
            terminalreporter.write_line(line)
        for line in self._written:
            terminalreporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The controller writes the JSON report and appends to the results DB, once per run."""
        self._written = []
        if self.is_worker or not self.records or self.settings.gate is None:
            return
        from .reporting import ResultsDB, write_json_report

        score = self._capability_score()
        if score is not None:
            self.records.append(score)
        run = self._run_info()
        gate = self.settings.gate
        if gate.report is not None:
            write_json_report(gate.report, run, self.records)
            self._written.append(f"mlxgate: JSON report → {gate.report}")
        if gate.db is not None:
            try:
                rows = ResultsDB(gate.db).append(run, self.records)
            except (OSError, MlxgateError, ValueError) as e:  # history is a by-product: warn, keep the verdict
                self.config.issue_config_time_warning(MlxgateWarning(f"results DB {gate.db} not written: {e}"), 2)
            else:
                self._written.append(f"mlxgate: {rows} row(s) → {gate.db} (quality_runs)")

    def _capability_score(self) -> dict[str, Any] | None:
        """The Capability Score: the unweighted mean of the six tasks, flagged partial when one did not run."""
        latest: dict[str, dict[str, Any]] = {}
        for record in self.records:
            if record.get("mode") == "capability":
                latest.update(record.get("tasks") or {})
        if not latest:
            return None
        from .capability.runner import TASK_NAMES
        from .capability.stats import capability_score

        field_of = {"reference": "ref_score", "candidate": "cand_score"}
        arms = {arm: capability_score({t: latest[t][key] if t in latest else None for t in TASK_NAMES}, TASK_NAMES)
                for arm, key in field_of.items()}
        tasks = {t: {"reference": v["ref_score"], "candidate": v["cand_score"], "n": v["n"]} for t, v in latest.items()}
        partial = arms["candidate"][1]
        return {
            "nodeid": "mlxgate::capability_score", "gate": "Capability Score", "mode": "score",
            "stats": {}, "checks": [], "verdict": "partial" if partial else "complete",
            "capability_score": {"reference": arms["reference"][0], "candidate": arms["candidate"][0],
                                 "partial": partial, "tasks": tasks,
                                 "missing": [t for t in TASK_NAMES if t not in latest]},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def _run_info(self) -> RunInfo:
        import platform
        import sys
        import time
        import uuid
        from importlib.metadata import PackageNotFoundError, version

        from .reporting import RunInfo, git_state

        def v(dist: str) -> str:
            try:
                return version(dist)
            except PackageNotFoundError:
                return "absent"

        commit, dirty = git_state(self.config.rootpath)
        device, blas = self.machine()
        gate = self.settings.gate
        config = {
            "candidate": self.settings.candidate,
            "reference": self.settings.reference,
            "offline": self.settings.offline,
            "gate": {k: (str(v_) if v_ is not None else None) for k, v_ in vars(gate).items()} if gate else None,
        }
        return RunInfo(
            run_id=uuid.uuid4().hex,
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._started)),
            code_commit=commit,
            code_dirty=dirty,
            argv=[str(a) for a in self.config.invocation_params.args],
            config=config,
            machine={"device": device, "blas": blas, "mlx": v("mlx"), "mlx_lm": v("mlx-lm"),
                     "python": sys.version.split()[0], "platform": platform.platform()},
        )

    # -- what fixtures call --------------------------------------------------------------------

    def machine(self) -> tuple[str, str]:
        """(device, BLAS), computed once; this is where mlx.core gets imported on the controller."""
        if self._machine is None:
            from .device import REFERENCE_BLAS, blas_in_use, mlx_device

            blas = blas_in_use()
            label = f"{blas} (slow, see warning)" if blas == REFERENCE_BLAS else blas
            self._machine = (mlx_device(), label)
        return self._machine

    def warn_if_reference_blas(self) -> None:
        """Warn once per run, from the controller, with the fix."""
        if self.is_worker or not self.settings.in_use:
            return
        from .device import reference_blas_warning

        message = reference_blas_warning()
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
            from .snapshots import ResolvedSnapshot

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
        """(model, tokenizer) of the role through `mlx_lm.load`, once per process."""
        if role not in self._models:
            snap = self.snapshot(role)
            if snap is None:
                raise ModelUnavailableError(f"mlxgate: no {role} model configured (--mlx-{role} NAME)")
            import mlx_lm

            try:
                loaded = mlx_lm.load(snap.path)
            except (OSError, ValueError) as e:
                raise ModelUnavailableError(
                    f"mlxgate: mlx_lm.load could not load {snap.pinned} ({snap.name}): {e}"
                ) from e
            self._models[role] = (loaded[0], loaded[1])
        return self._models[role]

    def paired(self, item: pytest.Item) -> Paired:
        """The `paired` fixture's value: the item's module run (built once per module and lever)."""
        from .gate_config import build_paired_run, rerun_command
        from .paired import Paired

        run = build_paired_run(self, item, self._runs)
        return Paired(run, item, rerun_command(self.config, item.nodeid))

    def terminal_line_writer(self) -> contextlib.AbstractContextManager[Callable[[str], None] | None]:
        return self._terminal()

    def worker_payload(self) -> dict[str, str]:
        """What `pytest_configure_node` puts into each worker's `workerinput`: pinned snapshots."""
        return {WORKERINPUT_KEYS[r]: s.to_json() for r, s in self._resolved.items()}

    # -- internals -----------------------------------------------------------------------------

    def _materialize(self, role: Role, spec: CandidateSpec) -> ResolvedSnapshot:
        from .snapshots import materialize

        expected: tuple[type[Exception], ...] = (MlxgateError, OSError)
        if spec.kind != "local":  # a local directory never needs the downloader (nor httpx)
            from .hub import HubError

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
                self._failed[role] = f"mlxgate: cannot get the {role} '{spec.name}': {e}"
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
        if self.is_worker or reporter is None:
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
