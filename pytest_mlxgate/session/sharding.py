"""`--mlx-shard I/N` in the session: this shard's modules kept, the others deselected, the plan reported.

Every process plans from the same durations (the controller ships them down); the plan a worker
applied comes back up for the controller's report. The planning itself is `shards.py`'s.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..config.settings import GateSettings
from ..errors import MlxgateWarning
from .process import Process

__all__ = ["SHARD_DURATIONS_KEY", "SHARD_PLAN_KEY", "ShardPlanner"]

#: workerinput: the modules' recorded durations, read once by the controller (--mlx-shard), so every
#: worker plans from the same history even when a run appends to it meanwhile.
SHARD_DURATIONS_KEY = "mlxgate_shard_durations"
#: workeroutput: the shard plan a worker applied, for the controller's report and summary.
SHARD_PLAN_KEY = "mlxgate_shard_plan"


class ShardPlanner:
    """This run's shard: which modules it keeps, from which durations, and the plan for the report."""

    def __init__(self, config: pytest.Config, gate: GateSettings | None, process: Process) -> None:
        self.config = config
        self.gate = gate
        self.process = process
        self.plan: dict[str, Any] | None = None  # the plan applied (from a worker under xdist)
        self._text: str | None = None
        self._durations: dict[str, float] | None = None  # read from the history once

    def select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Keep the whole modules of shard I; the others are reported deselected."""
        gate = self.gate
        if gate is None or gate.shard is None:
            return
        from ..config.shards import module_of, plan_shards

        plan = plan_shards({module_of(item.nodeid) for item in items}, self.durations(), gate.shard.count)
        keep = set(plan.modules(gate.shard))
        selected = [item for item in items if module_of(item.nodeid) in keep]
        deselected = [item for item in items if module_of(item.nodeid) not in keep]
        self.plan = plan.to_json(gate.shard)
        self._text = plan.describe(gate.shard)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = selected
        if self.process.workerinput is not None:
            output = getattr(config, "workeroutput", None)
            if isinstance(output, dict):
                output[SHARD_PLAN_KEY] = self.plan

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        return [f"mlxgate: {self._text}"] if self._text and not self.process.is_worker else []

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """More shards than modules: an empty shard is the plan, not an error."""
        if (
            self.plan is not None
            and not self.plan.get("modules")
            and not self.process.is_worker
            and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        ):
            session.exitstatus = pytest.ExitCode.OK

    def durations(self) -> dict[str, float]:
        """Each module's recorded seconds (balancing): shipped by the controller under xdist, else read
        from the results DB once; none without a DB (the plan then splits by node id)."""
        if self._durations is None:
            shipped = (self.process.workerinput or {}).get(SHARD_DURATIONS_KEY)
            if isinstance(shipped, dict):
                self._durations = {str(k): float(v) for k, v in shipped.items()}
            else:
                self._durations = self._read_durations()
        return self._durations

    def _read_durations(self) -> dict[str, float]:
        gate = self.gate
        if gate is None or gate.db is None or not gate.db.is_file():
            return {}  # never create a DB just to find it empty
        from ..config.shards import module_durations
        from ..results.history import ResultsDB, ResultsDBError

        try:
            rows = ResultsDB(gate.db).rows(columns=("run_id", "started", "nodeid", "total_s", "config_json"))
        except (OSError, ResultsDBError) as e:
            self.config.issue_config_time_warning(
                MlxgateWarning(
                    f"--mlx-shard: the results DB {gate.db} cannot be read ({e}); the shards split by node id, "
                    "unbalanced. Fix: --mlx-db PATH to a readable history (every shard the same file)"
                ),
                2,
            )
            return {}
        return module_durations(rows)

    def payload(self) -> dict[str, Any]:
        """The workers' part of `workerinput`: the durations every worker plans from."""
        if self.gate is not None and self.gate.shard is not None:
            return {SHARD_DURATIONS_KEY: self.durations()}
        return {}

    def worker_done(self, output: dict[str, Any]) -> None:
        """A worker's workeroutput (xdist's testnodedown): the shard plan it applied, for the report."""
        plan = output.get(SHARD_PLAN_KEY)
        if self.plan is None and isinstance(plan, dict):
            self.plan = plan
