"""xdist glue beyond snapshots and progress: a folder per run, and one worker per gate module.

The run folder (made by the controller, shipped down in `workerinput`) holds the lock that keeps
speed trials alone (`common.watch`) and each worker's list of gate modules.

Scheduling. Plain `-n N` (`--dist load`) hands tests to workers one by one, so two tests of one
gate module can run on two workers: each then builds the module's run (loads the model, runs both
arms, times speed), twice the work, and the two speed measurements contend for the same cores.
xdist keeps tests together only per module/file (`loadscope`, `loadfile`) or per `xdist_group`
marker under `--dist loadgroup` (which also appends `@group` to the test ids). So mlxgate gives
xdist a scheduler that makes every gate module one work unit under `load`, `loadscope` and
`loadgroup` (a test's own `xdist_group` still wins there) and leaves every other test where xdist
would put it; `loadfile` already keeps modules whole, `each` runs everything everywhere. Only the
workers know which modules are gates (they collect): each writes them to the run folder before it
reports its collection, and the scheduler reads them when the first collection arrives. A run that
collects no gate gets xdist's own scheduler, unchanged. Standard library (xdist inside functions):
the controller imports this.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "GATE_MARKERS",
    "RUN_DIR_KEY",
    "GateModuleScheduling",
    "gate_modules",
    "make_run_dir",
    "make_scheduler",
    "read_gate_modules",
    "remove_run_dir",
    "run_dir_of",
    "write_gate_modules",
]

#: workerinput key of the run folder.
RUN_DIR_KEY = "mlxgate_run_dir"
#: An item is a gate when it uses `paired` or carries one of these markers.
GATE_MARKERS = ("mlx_lever", "mlx_kl", "mlx_speed", "mlx_tier", "mlx_server")
#: The dist modes whose scheduler keeps gate modules whole (others are left as xdist makes them).
GROUPED_DISTS = ("load", "loadscope", "loadgroup")


def make_run_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="mlxgate-run-"))


def remove_run_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def run_dir_of(workerinput: Mapping[str, Any] | None) -> Path | None:
    """The run folder a worker was given (None: not an xdist worker, or a remote one that cannot see
    the controller's folder: its speed trials then take no lock, its gate modules go unannounced)."""
    value = (workerinput or {}).get(RUN_DIR_KEY)
    return Path(str(value)) if value and Path(str(value)).is_dir() else None


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def gate_modules(items: Iterable[Any]) -> list[str]:
    """The modules (node id paths) of the items that are gates."""
    found: dict[str, None] = {}
    for item in items:
        uses_paired = "paired" in getattr(item, "fixturenames", ())
        if uses_paired or any(item.get_closest_marker(name) is not None for name in GATE_MARKERS):
            found[module_of(item.nodeid)] = None
    return list(found)


def write_gate_modules(run_dir: Path, worker_id: str, modules: Sequence[str]) -> None:
    """A worker's gate modules, published whole (temp file, then rename) before it reports its collection."""
    tmp = run_dir / f".gates-{worker_id}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(list(modules)), encoding="utf-8")
    os.replace(tmp, run_dir / f"gates-{worker_id}.json")


def read_gate_modules(run_dir: Path | None) -> set[str]:
    """Every worker's gate modules so far (they collect the same tests, so one is enough)."""
    found: set[str] = set()
    if run_dir is None:
        return found
    for path in run_dir.glob("gates-*.json"):
        try:
            found.update(str(m) for m in json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return found


def _grouped_class(dist: str) -> Any:
    """xdist's scheduler for `dist`, with each gate module one work unit."""
    from xdist.scheduler import LoadGroupScheduling, LoadScopeScheduling  # type: ignore[import-untyped]

    base = {"load": LoadScopeScheduling, "loadscope": LoadScopeScheduling, "loadgroup": LoadGroupScheduling}[dist]

    class Grouped(base):  # type: ignore[misc, valid-type]
        gates: frozenset[str] = frozenset()

        def _split_scope(self, nodeid: str) -> str:
            if dist == "loadgroup" and nodeid.rfind("@") > nodeid.rfind("]"):
                return str(super()._split_scope(nodeid))  # the test's own xdist_group
            if module_of(nodeid) in self.gates:
                return module_of(nodeid)
            return nodeid if dist == "load" else str(super()._split_scope(nodeid))

    Grouped.__name__ = Grouped.__qualname__ = f"MlxgateGateModules{base.__name__}"
    return Grouped


def _xdist_class(dist: str) -> Any:
    from xdist.scheduler import (
        LoadGroupScheduling,
        LoadScheduling,
        LoadScopeScheduling,
        WorkStealingScheduling,
    )

    return {
        "load": LoadScheduling,
        "loadscope": LoadScopeScheduling,
        "loadgroup": LoadGroupScheduling,
        "worksteal": WorkStealingScheduling,
    }[dist]


class GateModuleScheduling:
    """xdist's `Scheduling` for the run, chosen when the first worker's collection arrives (before
    that only nodes are added): gate modules whole when there are gates, xdist's own otherwise."""

    def __init__(
        self, config: Any, log: Any, run_dir: Path | None, *, warn: Callable[[str], None] | None = None
    ) -> None:
        self._config, self._log, self._run_dir, self._warn = config, log, run_dir, warn
        self._dist = str(config.getvalue("dist"))
        self._early: list[Any] = []  # nodes added before the choice
        self.inner: Any = None

    def _choose(self) -> None:
        gates = read_gate_modules(self._run_dir)
        if gates and self._dist in GROUPED_DISTS:
            cls = _grouped_class(self._dist)
            cls.gates = frozenset(gates)
        else:
            cls = _xdist_class(self._dist)
            if gates and self._dist == "worksteal" and self._warn is not None:
                self._warn(
                    "--dist worksteal can split a gate module over workers: each one then builds the "
                    "module's run and times its speed again; --dist load keeps each gate module on one worker"
                )
        self.inner = cls(self._config, self._log)
        for node in self._early:
            self.inner.add_node(node)
        self._early = []

    @property
    def nodes(self) -> list[Any]:
        return list(self._early) if self.inner is None else list(self.inner.nodes)

    @property
    def collection_is_completed(self) -> bool:
        return self.inner is not None and bool(self.inner.collection_is_completed)

    @property
    def tests_finished(self) -> bool:
        return self.inner is not None and bool(self.inner.tests_finished)

    @property
    def has_pending(self) -> bool:
        return self.inner is not None and bool(self.inner.has_pending)

    def add_node(self, node: Any) -> None:
        if self.inner is None:
            self._early.append(node)
        else:
            self.inner.add_node(node)

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        if self.inner is None:
            self._choose()
        self.inner.add_node_collection(node, collection)

    def remove_node(self, node: Any) -> str | None:
        if self.inner is None:
            self._early.remove(node)
            return None
        return self.inner.remove_node(node)  # type: ignore[no-any-return]

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.inner.mark_test_complete(node, item_index, duration)

    def mark_test_pending(self, item: str) -> None:
        self.inner.mark_test_pending(item)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        self.inner.remove_pending_tests_from_node(node, indices)

    def schedule(self) -> None:
        self.inner.schedule()


def make_scheduler(
    config: Any, log: Any, run_dir: Path | None, warn: Callable[[str], None] | None = None
) -> GateModuleScheduling | None:
    """`pytest_xdist_make_scheduler`'s answer: ours for the dists it knows, None (xdist's) for the rest."""
    dist = str(config.getvalue("dist"))
    if run_dir is None or dist not in (*GROUPED_DISTS, "worksteal"):
        return None
    return GateModuleScheduling(config, log, run_dir, warn=warn)
