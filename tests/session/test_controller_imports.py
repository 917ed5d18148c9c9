"""The xdist controller never loads numpy or mlx: it prints, reports and writes the history only.

A real `-n 2` run through pytester whose gates publish a KL record and a capability record, so the
controller goes through every path it has (header, records, Capability Score, summary, JSON
report, sqlite history, HTML report); a plugin in the run records what the controller had imported at the end.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_CONFTEST = """
import json, os, sys

def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        return
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "mlx", "mlx_lm"})
    with open(os.environ["MLXGATE_TEST_MODULES_OUT"], "w") as f:
        json.dump(heavy, f)
"""

_GATES = """
CAPABILITY = {
    "nodeid": "test_gates.py::test_capability", "gate": "test_gates::test_capability", "mode": "capability",
    "verdict": "pass", "time": "2026-12-01T00:00:00Z", "candidate": None, "reference_model": None,
    "lever": {"name": "x", "kind": "env", "ref": "0", "cand": "1"}, "path": "prefill",
    "sizes": {"prompts": 8}, "stats": {"n_prompts": 8}, "bounds": {"max_drop": 0.1}, "checks": [],
    "tasks": {"mmlu": {"ref_score": 0.5, "cand_score": 0.5, "n": 8, "durations": {"reference_s": 1.0}}},
    "skipped": {}, "durations": {"total_s": 2.0}, "rerun": "pytest test_gates.py::test_capability",
}
KL = {
    "nodeid": "test_gates.py::test_drift", "gate": "test_gates::test_drift", "mode": "gate", "verdict": "pass",
    "time": "2026-12-01T00:00:00Z", "stats": {"n_prompts": 4, "n_tokens": 64, "mean": 1e-4, "mean_ci": [0, 2e-4]},
    "checks": [{"metric": "mean KL", "key": "mean", "value": 1e-4, "bound": 2e-4, "limit": 1e-3,
                "direction": "max", "passed": True}],
}

from pytest_mlxgate.results.records import RECORD_PROPERTY
from pytest_mlxgate.session.transport import stage

def test_capability(request):
    stage(request.node, RECORD_PROPERTY, CAPABILITY)

def test_drift(request):
    stage(request.node, RECORD_PROPERTY, KL)
"""


def test_the_xdist_controller_imports_neither_numpy_nor_mlx(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "modules.json"
    monkeypatch.setenv("MLXGATE_TEST_MODULES_OUT", str(out))
    model = tmp_path / "model"
    model.mkdir()
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_gates=_GATES)
    report, db = tmp_path / "report.json", tmp_path / "results.sqlite"
    from pytest_mlxgate.results.history import ResultsDB
    from pytest_mlxgate.results.model import parse_record
    from pytest_mlxgate.results.records import RunInfo

    earlier = RunInfo(
        run_id="e" * 32,
        started="2026-11-30T00:00:00Z",
        code_commit=None,
        code_dirty=None,
        argv=[],
        config={},
        machine={},
    )
    row = {
        "nodeid": "test_gates.py::test_drift",
        "gate": "g",
        "mode": "gate",
        "verdict": "pass",
        "time": "2026-11-30T00:00:00Z",
        "durations": {"total_s": 3.0},
    }
    ResultsDB(db).append(earlier, [parse_record(row)])
    # --mlx-shard 1/1: the controller reads the history's durations and ships them to the workers
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "xdist",
        f"--mlx-candidate={model}",
        f"--mlx-report={report}",
        f"--mlx-db={db}",
        "--mlx-shard=1/1",
        f"--mlx-html={tmp_path / 'report.html'}",
    )
    result.assert_outcomes(passed=2)
    assert json.loads(out.read_text()) == []  # what the controller imported
    # ...while it did all of its work: the summary, the Capability Score, the report and the history
    result.stdout.fnmatch_lines(
        ["*mlxgate: *model*", "Capability Score*mmlu*50.0% → 50.0%*", "*test_gates::test_capability*"]
    )
    doc = json.loads(report.read_text())
    shard = doc["run"]["config"]["shard"]  # the plan a worker applied, back through workeroutput
    assert (shard["index"], shard["count"], shard["modules"], shard["timed"]) == (1, 1, ["test_gates.py"], 1)
    gates = {g["nodeid"]: g for g in doc["gates"]}
    assert gates["mlxgate::capability_score"]["capability_score"]["candidate"] == 0.5
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM quality_runs").fetchone()[0] == 1 + 3
    page = (tmp_path / "report.html").read_text(encoding="utf-8")  # the HTML report, its SVG and the history
    assert 'data-plot="capability-scores"><svg' in page and '<svg class="plot spark"' in page
