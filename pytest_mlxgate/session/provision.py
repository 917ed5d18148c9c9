"""The run's models: each role's snapshot resolved once per run, its weights loaded once per process.

Resolution happens on the controller: eagerly at session start when xdist distributes (the pinned
result rides down in `workerinput`), lazily on first fixture use otherwise. Workers never download.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ..common.format import format_bytes
from ..config.names import Aliases, CandidateSpec, Role, load_aliases, parse_name
from ..config.settings import Settings
from ..errors import MlxgateError, MlxgateUsageError, MlxgateWarning, ModelUnavailableError
from ..models.progress import LineProgress
from .process import Process
from .progress import Progress

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel
    from ..models.materialize import ResolvedSnapshot
    from .cachedir import ReferenceCacheDir

__all__ = ["WORKERINPUT_KEYS", "ModelProvider"]

#: workerinput keys carrying each role's ResolvedSnapshot as JSON, controller -> workers.
WORKERINPUT_KEYS: dict[Role, str] = {
    "candidate": "mlxgate_snapshot",
    "reference": "mlxgate_reference_snapshot",
}


class ModelProvider:
    """Which models, their snapshots and loaded weights, and the header line that names them (a plugin)."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        process: Process,
        progress: Progress,
        reference_cache: ReferenceCacheDir | None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.process = process
        self.progress = progress
        self.reference_cache = reference_cache  # None without gate settings: the header says nothing of it
        try:
            self.aliases: Aliases = load_aliases(settings.pyproject, settings.tool_table)
            names: dict[Role, str | None] = {"candidate": settings.candidate, "reference": settings.reference}
            self.specs: dict[Role, CandidateSpec | None] = {
                role: parse_name(name, aliases=self.aliases, base_dir=settings.names_dir[role], role=role)
                if name
                else None
                for role, name in names.items()
            }
        except MlxgateUsageError as e:
            raise pytest.UsageError(str(e)) from None
        self._resolved: dict[Role, ResolvedSnapshot] = {}
        self._failed: dict[Role, str] = {}
        self._models: dict[Role, tuple[Any, Any]] = {}
        self._machine: tuple[str, str] | None = None
        self._header_shown = False

    def resolve_for_workers(self) -> None:
        """Under xdist, resolve on the controller before xdist starts the workers that need it."""
        if self.process.is_worker or not self.settings.in_use:
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
        if self.process.is_worker or self.process.is_quiet_rank or not self.settings.in_use:
            return []
        device, blas = self.machine()
        lines = []
        for role, spec in self.specs.items():
            if spec is not None:
                lines.append(_describe(role, spec, self._resolved.get(role)))
        lines[0] += f" · {device} · {blas}"
        if self.reference_cache is not None:
            _, off = self.reference_cache.plan()
            if off is not None:
                lines.append(f"mlxgate: reference cache off ({off})")
        if self.process.rank is not None:
            lines.append(
                "mlxgate: rank 0 of an mlx.launch job: capability items are split over its ranks; "
                "this rank prints the summary and writes the reports"
            )
        self._header_shown = True
        return lines

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
        if self.process.is_worker:
            return False
        return self.config.pluginmanager.hasplugin("dsession") or getattr(self.config.option, "dist", "no") != "no"

    def warn_if_reference_blas(self) -> None:
        """Warn once per run, from the controller, with the fix."""
        if self.process.is_worker or not self.settings.in_use:
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
        shipped = (self.process.workerinput or {}).get(WORKERINPUT_KEYS[role])
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

    def payload(self) -> dict[str, Any]:
        """The workers' part of `workerinput`: every snapshot resolved so far, pinned, as JSON."""
        return {WORKERINPUT_KEYS[r]: s.to_json() for r, s in self._resolved.items()}

    def model(self, role: Role = "candidate") -> tuple[Any, Any]:
        """(model, tokenizer) of the role through `mlx_lm.load`, once per process, in `--mlx-dtype`'s precision;
        weights that cannot be read raise `ModelUnavailableError` naming the file and the fix (`loaded.load_mlx`)."""
        if role not in self._models:
            snap = self.snapshot(role)
            if snap is None:
                raise ModelUnavailableError(f"mlxgate: no {role} model configured (--mlx-{role} NAME)")
            from ..models.loaded import load_mlx
            from ..models.precision import cast_model

            model, tokenizer = load_mlx(snap, role)
            self._models[role] = cast_model(model, self.settings.dtype), tokenizer
        return self._models[role]

    def loaded_model(self, role: Role) -> LoadedModel | None:
        """The role's model with its snapshot; None when no model is configured for the role."""
        from ..models.loaded import LoadedModel

        snap = self.snapshot(role)
        if snap is None:
            return None
        model, tokenizer = self.model(role)
        return LoadedModel(model, tokenizer, snap)

    def _materialize(self, role: Role, spec: CandidateSpec) -> ResolvedSnapshot:
        from ..models.materialize import materialize

        expected: tuple[type[Exception], ...] = (MlxgateError, OSError)
        if spec.kind != "local":  # a local directory never needs the downloader (nor httpx)
            from ..hub import HubError

            expected += (HubError,)

        with self.progress.lines() as write_line:
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
                write_line(_describe(role, spec, snap))
        return snap


def _describe(role: Role, spec: CandidateSpec, snap: ResolvedSnapshot | None) -> str:
    """The header's line for one role: what the name resolved to, and how it was had."""
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
