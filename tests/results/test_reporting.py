"""The run's outputs: strict, atomic JSON report; sqlite history that never loses or clobbers rows;
an aligned terminal summary. All on real files, a real sqlite database and real git repos."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.results import history
from pytest_mlxgate.results.git import git_state
from pytest_mlxgate.results.history import ResultsDB, ResultsDBError
from pytest_mlxgate.results.json_report import write_json_report
from pytest_mlxgate.results.model import Record, parse_record
from pytest_mlxgate.results.records import RunInfo
from pytest_mlxgate.results.summary import format_value, summary_lines

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_run(run_id: str = "a" * 32, **over: Any) -> RunInfo:
    fields: dict[str, Any] = dict(
        run_id=run_id,
        started="2026-11-29T23:30:00Z",
        code_commit="f" * 40,
        code_dirty=True,
        argv=["pytest", "gates", "--mlx-candidate", "smollm2-135m"],
        config={"candidate": "smollm2-135m", "offline": True, "sizes": {"prompts": 16, "tokens": 128}},
        machine={
            "device": "cpu",
            "blas": "OpenBLAS",
            "mlx": "0.32.4",
            "mlx_lm": "0.32.2",
            "python": "3.11.7",
            "platform": "Linux-x86_64",
        },
    )
    fields.update(over)
    return RunInfo(**fields)


def record_dict(nodeid: str = "gates/test_kv_cache.py::test_drift", **over: Any) -> dict[str, Any]:
    """A KL gate's record in its wire form (version-1 checks), to change before `parse_record`."""
    module, _, func = nodeid.partition("::")
    record: dict[str, Any] = {
        "nodeid": nodeid,
        "gate": f"{Path(module).stem}::{func}",
        "mode": "gate",
        "candidate": {
            "name": "smollm2-135m",
            "repo_id": "mlxgate/SmolLM2-135M-Instruct-f32",
            "commit": COMMIT,
            "pinned": "mlxgate/SmolLM2-135M-Instruct-f32@0123456",
        },
        "reference_model": None,
        "lever": {
            "name": "kv8",
            "kind": "kv",
            "target": None,
            "ref": "plain",
            "cand": "8-bit g64 from token 0",
            "path": "serving",
        },
        "path": "serving",
        "sizes": {"prompts": 16, "tokens": 128, "decode": 32},
        "stats": {
            "n_prompts": 16,
            "n_tokens": 512,
            "confidence": 0.95,
            "mean": 3.1e-4,
            "mean_ci": [2.5e-4, 4.0e-4],
            "median": 1.2e-4,
            "p90": 8e-4,
            "p95": 1.1e-3,
            "p99": 2.2e-3,
            "p999": 4e-3,
            "quantile_ci": {
                "median": [1e-4, 1.4e-4],
                "p90": [7e-4, 9e-4],
                "p95": [1e-3, 1.3e-3],
                "p99": [1.8e-3, 2.9e-3],
                "p999": [3e-3, None],
            },
            "max": 5.5e-3,
            "max_at": {"prompt": 3, "position": 120, "token_id": 42},
            "same_top": 0.991,
            "same_top_ci": [0.988, 0.995],
            "top1": 0.991,
            "top1_ci": [0.988, 0.995],
            "flips": 4,
            "near_tie_flips": 1,
            "near_ties": 3,
            "ln_ppl_ratio": 1.5e-4,
            "ln_ppl_ratio_ci": [-1e-4, 4e-4],
            "delta_p": {"mean": 0.0, "rms": 1e-3, "p1": -2e-3, "p5": -1e-3, "median": 0.0, "p95": 1e-3, "p99": 2e-3},
            "worst": [
                {
                    "prompt": 3,
                    "position": 120,
                    "kl": 5.5e-3,
                    "token_id": 42,
                    "ref_top1": 42,
                    "cand_top1": 17,
                    "p_ref": 0.41,
                    "p_cand": 0.39,
                }
            ],
            "worst_prompts": [{"prompt": 3, "mean_kl": 9e-4}],
        },
        "bounds": {"mean": 1e-3, "p99": 1e-2, "top1": 0.98},
        "checks": [
            {
                "metric": "mean KL",
                "key": "mean",
                "value": 3.1e-4,
                "bound": 4.0e-4,
                "limit": 1e-3,
                "direction": "max",
                "passed": True,
            },
            {
                "metric": "p99 KL",
                "key": "p99",
                "value": 2.2e-3,
                "bound": 2.9e-3,
                "limit": 1e-2,
                "direction": "max",
                "passed": True,
            },
            {
                "metric": "top-1",
                "key": "top1",
                "value": 0.991,
                "bound": 0.988,
                "limit": 0.98,
                "direction": "min",
                "passed": True,
            },
        ],
        "verdict": "pass",
        "reference_source": "cache",
        "durations": {"reference_s": 12.1, "candidate_s": 11.8, "total_s": 24.3},
        "aa": None,
        "time": "2026-11-29T23:40:00Z",
        "rerun": f"pytest '{nodeid}' --mlx-candidate smollm2-135m",
    }
    record.update(over)
    return record


def make_record(nodeid: str = "gates/test_kv_cache.py::test_drift", **over: Any) -> Record:
    return parse_record(record_dict(nodeid, **over))


def _no_constants(name: str) -> Any:
    raise AssertionError(f"non-strict JSON constant {name} in the report")


def load_strict(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constants)


# --------------------------------------------------------------------------------------------
# stdlib only


def test_module_imports_only_the_standard_library() -> None:
    """The xdist controller imports this: pulling in mlx (or numpy, or pytest) there is a bug."""
    code = textwrap.dedent("""
        import sys
        before = set(sys.modules)
        import pytest_mlxgate.results.fields, pytest_mlxgate.results.git, pytest_mlxgate.results.history
        import pytest_mlxgate.results.json_report, pytest_mlxgate.results.records, pytest_mlxgate.results.score
        import pytest_mlxgate.results.summary, pytest_mlxgate.common.atomic, pytest_mlxgate.common.format
        import pytest_mlxgate.results.junit, pytest_mlxgate.results.github, pytest_mlxgate.results.speed_text
        import pytest_mlxgate.history_cli, pytest_mlxgate.results.merge, pytest_mlxgate.config.shards
        new = {m.partition(".")[0] for m in set(sys.modules) - before}
        print(sorted(m for m in new if m not in sys.stdlib_module_names and m != "pytest_mlxgate"))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------
# JSON report


def test_json_report_round_trips_sorted_by_nodeid(tmp_path: Path) -> None:
    run = make_run()
    records = [make_record("gates/test_z.py::test_b"), make_record("gates/test_a.py::test_a")]
    path = tmp_path / "deep" / "er" / "report.json"  # parents created
    write_json_report(path, run, records)
    doc = load_strict(path)
    assert doc["mlxgate_report"] == 1
    assert doc["run"] == {
        "run_id": run.run_id,
        "started": run.started,
        "code_commit": run.code_commit,
        "code_dirty": True,
        "argv": run.argv,
        "config": run.config,
        "machine": run.machine,
    }
    assert [g["nodeid"] for g in doc["gates"]] == ["gates/test_a.py::test_a", "gates/test_z.py::test_b"]
    assert doc["gates"][0] == records[1].to_json()
    assert doc["gates"][1] == records[0].to_json()


def test_json_report_is_strict_even_with_nan_and_inf(tmp_path: Path) -> None:
    wire = record_dict()
    wire["stats"]["max"] = float("inf")
    wire["stats"]["mean"] = float("nan")
    wire["stats"]["mean_ci"] = (float("-inf"), 4e-4)  # a tuple, too
    wire["checks"][0]["value"] = float("nan")
    record = parse_record(wire)
    original = copy.deepcopy(record)
    path = tmp_path / "report.json"
    write_json_report(path, make_run(), [record])
    text = path.read_text(encoding="utf-8")
    for token in ("NaN", "Infinity"):
        assert token not in text
    gate = load_strict(path)["gates"][0]
    assert gate["stats"]["max"] is None
    assert gate["stats"]["mean"] is None
    assert gate["stats"]["mean_ci"] == [None, 4e-4]
    assert gate["checks"][0]["value"] is None
    assert gate["stats"]["p99"] == 2.2e-3
    assert record == original  # the caller's record is not rewritten in place


def test_json_report_replaces_an_existing_report_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json_report(path, make_run("1" * 32), [make_record(f"gates/test_{i}.py::t") for i in range(50)])
    big = path.stat().st_size
    write_json_report(path, make_run("2" * 32), [make_record()])
    assert path.stat().st_size < big  # nothing of the longer old file left at the end
    doc = load_strict(path)
    assert doc["run"]["run_id"] == "2" * 32
    assert len(doc["gates"]) == 1
    assert sorted(os.listdir(tmp_path)) == ["report.json"]


def test_json_report_failure_keeps_the_old_report_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.json"
    write_json_report(path, make_run("1" * 32), [make_record()])
    before = path.read_bytes()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_json_report(path, make_run("2" * 32), [make_record()])
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["report.json"]


def test_json_report_keeps_readable_permissions(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json_report(path, make_run(), [])
    assert path.stat().st_mode & 0o644 == 0o644  # not mkstemp's 0600
    assert load_strict(path)["gates"] == []


# --------------------------------------------------------------------------------------------
# sqlite history


def test_db_appends_rows_across_runs_with_columns_from_the_record(tmp_path: Path) -> None:
    path = tmp_path / "hist" / "results.sqlite"
    run1, run2 = make_run("1" * 32), make_run("2" * 32, code_commit=None, code_dirty=None)
    failing = make_record(
        "gates/test_b.py::test_other",
        verdict="fail",
        time="2026-11-29T23:50:00Z",
        reference_model={"name": "big", "repo_id": "org/big", "commit": "b" * 40, "pinned": "org/big@bbbbbbb"},
    )
    assert ResultsDB(path).append(run1, [make_record(), failing]) == 2
    assert ResultsDB(path).append(run2, [make_record(time="2026-11-30T00:10:00Z")]) == 1
    assert ResultsDB(path).append(run2, []) == 0

    db = ResultsDB(path)
    rows = db.rows()
    assert [r["run_id"] for r in rows] == ["1" * 32, "1" * 32, "2" * 32]  # by record time
    first = rows[0]
    expected = {
        "run_id": "1" * 32,
        "time": "2026-11-29T23:40:00Z",
        "started": "2026-11-29T23:30:00Z",
        "nodeid": "gates/test_kv_cache.py::test_drift",
        "gate": "test_kv_cache::test_drift",
        "mode": "gate",
        "candidate": "mlxgate/SmolLM2-135M-Instruct-f32@0123456",
        "candidate_commit": COMMIT,
        "reference_model": None,
        "lever_name": "kv8",
        "lever_kind": "kv",
        "ref_value": "plain",
        "cand_value": "8-bit g64 from token 0",
        "path": "serving",
        "verdict": "pass",
        "n_prompts": 16,
        "n_tokens": 512,
        "mean_kl": 3.1e-4,
        "mean_kl_lo": 2.5e-4,
        "mean_kl_hi": 4.0e-4,
        "p99_kl": 2.2e-3,
        "max_kl": 5.5e-3,
        "same_top": 0.991,
        "top1_lo": 0.988,
        "ln_ppl_ratio": 1.5e-4,
        "reference_source": "cache",
        "total_s": 24.3,
        "code_commit": "f" * 40,
        "code_dirty": True,
    }
    assert {k: first[k] for k in expected} == expected
    assert isinstance(first["id"], int)
    assert json.loads(first["config_json"]) == {"config": run1.config, "machine": run1.machine, "argv": run1.argv}
    assert json.loads(first["record_json"]) == make_record().to_json()

    assert rows[1]["verdict"] == "fail"
    assert rows[1]["reference_model"] == "org/big@bbbbbbb"
    assert rows[2]["code_commit"] is None and rows[2]["code_dirty"] is None

    only = db.rows(nodeid="gates/test_b.py::test_other")
    assert [r["id"] for r in only] == [rows[1]["id"]]
    assert db.rows(nodeid="nope") == []


def test_db_tolerates_sparse_and_odd_records(tmp_path: Path) -> None:
    """Missing optional keys, nulls, NaN and wrong types give NULL columns, never a lost run."""
    db = ResultsDB(tmp_path / "r.sqlite")
    sparse = parse_record({"nodeid": "gates/t.py::t", "verdict": "error"})
    odd_wire = record_dict(lever={"name": "temp", "kind": "sampling", "ref": 0.0, "cand": 0.7})
    odd_wire["stats"]["mean"] = float("nan")
    odd_wire["stats"]["max"] = float("inf")
    odd_wire["stats"]["mean_ci"] = [None, "x"]
    odd_wire["stats"]["n_tokens"] = "many"
    odd = parse_record(odd_wire)
    assert db.append(make_run(), [sparse, odd]) == 2
    by_node = {r["nodeid"]: r for r in db.rows()}
    s = by_node["gates/t.py::t"]
    assert s["time"] == "2026-11-29T23:30:00Z"  # falls back to the run's start
    assert s["verdict"] == "error" and s["candidate"] is None and s["mean_kl"] is None
    assert json.loads(s["record_json"]) == sparse.to_json()
    o = by_node["gates/test_kv_cache.py::test_drift"]
    assert (o["mean_kl"], o["max_kl"], o["mean_kl_lo"], o["mean_kl_hi"], o["n_tokens"]) == (None,) * 5
    assert (o["ref_value"], o["cand_value"]) == ("0.0", "0.7")
    assert json.loads(o["record_json"])["stats"]["max"] is None


def test_db_creation_is_idempotent_with_version_and_index(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ResultsDB(path).append(make_run(), [make_record()])
    ResultsDB(path)
    ResultsDB(path)
    assert len(ResultsDB(path).rows()) == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
        indexes = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name='quality_runs'"
        ).fetchall()
        assert any("(nodeid, time)" in (sql or "") for (sql,) in indexes)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(quality_runs)")]
    assert columns[0] == "id" and columns[30:32] == ["config_json", "record_json"]
    assert len(columns) == 32 + len(history._SPEED_COLUMNS) and columns[32] == "speed_context"


def _batch(tag: str, i: int) -> list[Record]:
    return [make_record(f"gates/test_{tag}.py::t{i}_{j}") for j in range(5)]


def test_db_threads_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    shared = ResultsDB(path)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(tag: str, own: bool) -> None:
        try:
            barrier.wait()
            db = ResultsDB(path) if own else shared
            for i in range(25):
                assert db.append(make_run(tag * 32), _batch(tag, i)) == 5
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(tag, tag in "ab")) for tag in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    rows = ResultsDB(path).rows()
    assert len(rows) == 4 * 25 * 5
    assert len({r["nodeid"] for r in rows}) == len(rows)


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_reporting import make_run, _batch
    from pytest_mlxgate.results.history import ResultsDB
    path, tag = Path(sys.argv[1]), sys.argv[2]
    while time.time() < float(sys.argv[4]):  # start together: creation races too
        pass
    for i in range(40):
        assert ResultsDB(path).append(make_run(tag * 32), _batch(tag, i)) == 5
""")


@pytest.mark.slow  # two interpreters racing
def test_db_processes_creating_and_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    import time

    path = tmp_path / "fresh" / "r.sqlite"  # neither writer finds it: both create it
    start_at = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), tag, str(Path(__file__).parent), start_at],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in "pq"
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    rows = ResultsDB(path).rows()
    assert len(rows) == 2 * 40 * 5
    assert {r["run_id"] for r in rows} == {"p" * 32, "q" * 32}


def _foreign_db(path: Path, version: int, table: str = "quality_runs") -> bytes:
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, something_new TEXT)")
        conn.execute(f"INSERT INTO {table} (something_new) VALUES ('precious')")
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    return path.read_bytes()


def test_db_refuses_a_newer_schema_without_touching_it(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    before = _foreign_db(path, 99)
    with pytest.raises(ResultsDBError) as info:
        ResultsDB(path)
    message = str(info.value)
    assert str(path) in message and "version 99" in message
    assert "upgrade" in message and "untouched" in message
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["r.sqlite"]


def test_db_refuses_a_schema_that_changes_after_opening(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    db = ResultsDB(path)
    path.unlink()
    before = _foreign_db(path, 1)  # an older file put in its place
    with pytest.raises(ResultsDBError, match="version 1 now"):
        db.append(make_run(), [make_record()])
    with pytest.raises(ResultsDBError, match="version 1 now"):
        db.rows()
    assert path.read_bytes() == before


def test_db_refuses_an_unversioned_foreign_table_and_a_non_database(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite"
    before = _foreign_db(foreign, 0)
    with pytest.raises(ResultsDBError, match="another program"):
        ResultsDB(foreign)
    assert foreign.read_bytes() == before

    other_tables = tmp_path / "other.sqlite"
    _foreign_db(other_tables, 0, table="unrelated")  # someone else's tables stay; ours joins them
    ResultsDB(other_tables).append(make_run(), [make_record()])
    with sqlite3.connect(other_tables) as conn:
        assert conn.execute("SELECT something_new FROM unrelated").fetchall() == [("precious",)]
    conn.close()

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database, it is a text file " * 100)
    before = junk.read_bytes()
    with pytest.raises(ResultsDBError, match="unusable"):
        ResultsDB(junk)
    assert junk.read_bytes() == before


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_locked_db_waits_its_short_stated_timeout_and_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    ResultsDB(path)
    assert ResultsDB(path).timeout == history.DB_BUSY_TIMEOUT_S == 5.0  # not the minute it was
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(history.ResultsDBLocked) as info:
            ResultsDB(path, timeout=0.2).append(make_run(), [make_record()])
        assert info.value.timeout == 0.2 and info.value.holder == holder.pid
        assert str(info.value) == (
            f"the results database {path} is locked by another process (PID {holder.pid}); waited 0.2 s"
        )
        assert "move this one aside" not in str(info.value)  # it is not broken
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert ResultsDB(path).rows() == []


def test_queued_rows_arrive_with_the_next_append_once_and_unreadable_lines_stay(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    db = ResultsDB(path)
    queued = history.queue_pending(path, make_run("b" * 32), [make_record(), make_record("gates/t.py::u")])
    assert queued == history.pending_path(path) == tmp_path / "h.sqlite.pending.jsonl"
    line = queued.read_text()
    assert db.append(make_run("c" * 32), [make_record()]) == 1 and db.pending_merged == 2
    assert not queued.exists()
    assert sorted(r["run_id"] for r in db.runs()) == ["b" * 32, "c" * 32]
    queued.write_text(line + "{not json\n")  # the same run again (a merge cut short) and a broken line
    assert db.append(make_run("d" * 32), [make_record()]) == 1 and db.pending_merged == 0  # not added twice
    assert queued.read_text() == "{not json\n"  # never dropped
    assert len(db.rows()) == 4  # b twice, c, d


_QUEUE = """
import sys
from pathlib import Path
from pytest_mlxgate.results.history import queue_pending
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import RunInfo
for i in range(20):
    run = RunInfo(run_id=f"{sys.argv[2]}-{i}", started="2026-01-01T00:00:00Z", code_commit=None, code_dirty=None,
                  argv=[], config={}, machine={})
    queue_pending(Path(sys.argv[1]), run, [parse_record({"nodeid": "a.py::t", "verdict": "pass", "x": "y" * 5000})])
"""


def test_runs_queueing_at_once_while_one_merges_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    db = ResultsDB(path)
    procs = [subprocess.Popen([sys.executable, "-c", _QUEUE, str(path), f"p{i}"], cwd=ROOT) for i in range(3)]
    merged = 0
    while any(p.poll() is None for p in procs):
        db.append(make_run(os.urandom(16).hex()), [make_record()])
        merged += db.pending_merged
    assert all(p.wait() == 0 for p in procs)
    db.append(make_run(os.urandom(16).hex()), [make_record()])
    merged += db.pending_merged
    assert merged == 60 and not history.pending_path(path).exists()
    assert len({r["run_id"] for r in db.rows() if r["run_id"].startswith("p")}) == 60


# --------------------------------------------------------------------------------------------
# git


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=a@b", "-c", "user.name=t", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=30,
    )


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_git_state_clean_dirty_and_untracked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    assert git_state(repo) == (None, False)  # a repo without commits: no HEAD yet
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert len(head) == 40
    assert git_state(repo) == (head, False)
    sub = repo / "sub"
    sub.mkdir()
    (sub / "new.txt").write_text("untracked\n")
    assert git_state(sub) == (head, True)  # from a subdirectory, and untracked files count
    (sub / "new.txt").unlink()
    assert git_state(repo) == (head, False)
    (repo / "a.txt").write_text("two\n")
    assert git_state(repo) == (head, True)


@needs_git
def test_git_state_outside_a_repo_and_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never find a repo above tmp
    assert git_state(plain) == (None, None)
    assert git_state(tmp_path / "does-not-exist") == (None, None)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert git_state(repo) == (None, None)


@needs_git
def test_run_info_new(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "commit", "-q", "-m", "c")
    argv = ["pytest", "-x"]
    run = RunInfo.new(repo, argv=argv, config={"offline": True}, machine={"device": "cpu"})
    assert len(run.run_id) == 32 and int(run.run_id, 16) >= 0
    assert run.started.endswith("Z") and run.started[10] == "T"
    assert run.code_commit is not None and len(run.code_commit) == 40 and run.code_dirty is False
    argv.append("--changed-later")
    assert run.argv == ["pytest", "-x"]
    assert RunInfo.new(repo, argv=[], config={}, machine={}).run_id != run.run_id


# --------------------------------------------------------------------------------------------
# terminal summary


def column_starts(header: str) -> list[int]:
    """Where each header cell starts: after two or more spaces ("95% bound" holds only one)."""
    starts = [0] + [m.start() for m in re.finditer(r"(?<=  )\S", header)]
    assert len(starts) == 6, header
    return starts


def is_n_line(line: str, starts: list[int]) -> bool:
    """The sizes line ("n  16 prompts · …") and its continuations span the columns from value on."""
    return line[: starts[1]].strip() == "" and line[starts[1] : starts[2]].strip() in ("n", "")


def cells(line: str, starts: list[int]) -> list[str]:
    """Split at the header's column starts, checking each column starts right after a space."""
    for s in starts[1:]:
        if len(line) > s:
            assert line[s - 1] == " ", (line, s)
    bounds = [*starts, len(line) + 1]
    return [line[a:b].strip() for a, b in pairwise(bounds)]


def test_summary_pass_matches_the_documented_layout() -> None:
    lines = summary_lines([make_record()])
    starts = column_starts(lines[0])
    assert cells(lines[0], starts) == ["gate", "metric", "value", "95% bound", "limit", "verdict"]
    assert [cells(line, starts) for line in lines[1:4]] == [
        ["test_kv_cache::test_drift", "mean KL", "3.1e-04", "≤ 4.0e-04", "1e-03", "pass"],
        ["", "p99 KL", "2.2e-03", "≤ 2.9e-03", "1e-02", "pass"],
        ["", "top-1", "99.1%", "≥ 98.8%", "98.0%", "pass"],
    ]
    n_line = lines[4]
    assert n_line[: starts[2]].strip() == "n"
    assert n_line[starts[2] :] == "16 prompts · 512 tokens · ref: cache · 24.3 s"
    assert len(lines) == 5


def test_a_capability_gate_counts_items_not_prompts() -> None:
    record = make_record("gates/test_a.py::test_capability", mode="capability", stats={"n_prompts": 48})
    (n_line,) = [line for line in summary_lines([record]) if "48" in line]
    assert "48 items" in n_line and "prompts" not in n_line


def test_summary_columns_align_across_gates_of_every_kind() -> None:
    failing_wire = record_dict("gates/test_kv_cache.py::test_drift_kv4", verdict="fail")
    failing_wire["checks"][0].update(value=2.5e-3, bound=3.1e-3, passed=False)
    failing = parse_record(failing_wire)
    measured = make_record("gates/test_measure.py::test_only", verdict="measured", checks=[], bounds={})
    aa = make_record(
        "gates/test_aa.py::test_floor",
        mode="aa",
        verdict="measured",
        checks=[],
        aa={"floors": {"mean": 2e-6, "p99": 1.5e-5, "max": 8e-5}, "chunk": 32},
    )
    error = parse_record(
        {"nodeid": "gates/test_err.py::test_broken", "gate": "test_err::test_broken", "verdict": "error"}
    )
    lines = summary_lines([make_record(), failing, measured, aa, error])
    starts = column_starts(lines[0])
    assert all(len(line) <= 120 for line in lines)
    table = [cells(line, starts) for line in lines if not is_n_line(line, starts)]
    by_gate: dict[str, list[list[str]]] = {}
    current = ""
    for row in table[1:]:
        current = row[0] or current
        by_gate.setdefault(current, []).append(row)
    for rows in by_gate.values():  # every line of every block is on the same grid
        assert all(r[0] == "" for r in rows[1:])

    fail_rows = by_gate["test_kv_cache::test_drift_kv4"]
    assert fail_rows[0][1:] == ["mean KL", "2.5e-03", "≤ 3.1e-03", "1e-03", "FAIL"]
    assert [r[5] for r in fail_rows[1:3]] == ["pass", "pass"]

    m = by_gate["test_measure::test_only"]
    assert [r[1] for r in m[:4]] == ["mean KL", "p99 KL", "max KL", "same-top"]
    assert [r[4] for r in m[:4]] == ["—"] * 4 and [r[5] for r in m[:4]] == ["measured"] * 4
    assert m[0][2:4] == ["3.1e-04", "≤ 4.0e-04"]
    assert m[2][2:4] == ["5.5e-03", "—"]
    assert m[3][2:4] == ["99.1%", "≥ 98.8%"]

    a = by_gate["test_aa::test_floor"]
    assert [r[1:] for r in a[:3]] == [
        ["mean KL", "2.0e-06", "—", "—", "floor"],
        ["p99 KL", "1.5e-05", "—", "—", "floor"],
        ["max KL", "8.0e-05", "—", "—", "floor"],
    ]
    assert by_gate["test_err::test_broken"] == [["test_err::test_broken", "verdict", "—", "—", "—", "ERROR"]]
    # n lines start at the value column too
    for line in lines:
        if line[: starts[2]].strip() == "n":
            assert line[starts[2]] != " "


def test_summary_never_shows_a_failed_gate_as_all_pass() -> None:
    record = make_record(verdict="fail")  # every check passed, yet the gate failed
    lines = summary_lines([record])
    assert sum("FAIL" in line for line in lines) == 1
    assert not any("FAIL" in line for line in summary_lines([make_record()]))


def test_summary_never_clips_a_gate_name_it_wraps_it_above_its_rows() -> None:
    long_name = "test_" + "very_" * 40 + "long_module::test_drift[kv8-g64-from-token-0]"
    twin = long_name.replace("kv8", "kv4")  # differs only in the middle: a middle cut would hide it
    records = [
        make_record(gate=long_name),
        make_record("gates/test_c.py::test_c", gate=twin),
        make_record("gates/test_b.py::test_b", gate="short::gate"),
    ]
    for width in (60, 80, 120):
        lines = summary_lines(records, width=width)
        assert all(len(line) <= width for line in lines), [len(line) for line in lines]
        assert not any("…" in line for line in lines)
        text = "".join(line for line in lines if not line.startswith(" "))
        assert long_name in text and twin in text  # whole, read across its lines
        starts = column_starts(lines[0])
        pieces = {line for line in lines if line in long_name or line in twin}  # the wrapped names' lines
        named = [
            cells(line, starts)[0]
            for line in lines[1:]
            if line not in pieces and not is_n_line(line, starts) and cells(line, starts)[0]
        ]
        assert named == ["short::gate"]  # a name that fits keeps its column; the long ones left it
        first = next(i for i, line in enumerate(lines) if line.startswith(long_name[:width]))
        block = lines[first : first + 6]
        assert any("mean KL" in line for line in block)  # its rows follow its name


def test_at_a_narrow_width_a_long_name_reads_as_its_module_then_its_test_names() -> None:
    """`./dev gates` printed `test_c…le::test_drift`. A name too wide for the gate column goes above its
    rows, whole on one line when it fits the width; wider than that, its module on one line and the test
    name under it (as pytest's -rA lists them), a test name longer than the width cut every width
    characters, never shortened."""
    module = "test_capability_and_drift_of_the_kv_cache_quantiser"
    params = "test_drift[kv8-g64-from-token-0-with-a-rather-long-parametrisation-id]"
    records = [
        make_record(f"gates/{module}.py::test_drift", gate=f"{module}::test_drift"),
        make_record(f"gates/{module}.py::test_capability", gate=f"{module}::test_capability"),
        make_record(f"gates/{module}.py::{params}", gate=f"{module}::{params}"),
        make_record("gates/test_kv.py::test_drift_of_the_cache", gate="test_kv::test_drift_of_the_cache"),
    ]
    width = 60
    lines = summary_lines(records, width=width)
    assert all(len(line) <= width for line in lines) and not any("…" in line for line in lines)
    heads = [i for i, line in enumerate(lines) if line == f"{module}::"]  # the module alone on its line
    assert len(heads) == 3 and not any(line.startswith(f"{module}::test") for line in lines)
    assert sorted(lines[i + 1] for i in heads) == sorted(["test_capability", "test_drift", params[:width]])
    j = lines.index(params[:width])
    assert "".join(lines[j : j + 2]) == params and "mean KL" in lines[j + 2]  # cut at the width, whole; its rows
    i = lines.index("test_drift")
    assert "mean KL" in lines[i + 1]  # each test name right above its rows
    assert "test_kv::test_drift_of_the_cache" in lines  # too wide for its column, not for the width: one line
    wide = summary_lines(records, width=250)  # wide enough: each name whole in its column, as before
    assert sorted(line.split("  ")[0] for line in wide if line.startswith(("test_c", "test_kv"))) == sorted(
        r.gate for r in records
    )


def test_summary_header_without_a_common_confidence_says_bound() -> None:
    other_wire = record_dict("gates/test_b.py::t")
    other_wire["stats"]["confidence"] = 0.99
    other = parse_record(other_wire)
    assert "99% bound" in summary_lines([other])[0]
    header = summary_lines([make_record(), other])[0]
    assert "bound" in header and "%" not in header
    assert summary_lines([]) == [summary_lines([])[0]]  # no gates: just the header


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("mean", 3.1e-4, "3.1e-04"),
        ("p99", 0.0, "0"),
        ("max", 12.5, "1.2e+01"),
        ("max", float("inf"), "inf"),
        ("mean", float("nan"), "nan"),
        ("mean", None, "—"),
        ("mean", "n/a", "—"),
        ("top1", 0.991, "99.1%"),
        ("same_top", 1.0, "100.0%"),
        ("top1", 0.9996, "99.96%"),  # one flip in 2500 is not 100%
        ("top1", 0.00001, "0.001%"),
        ("ln_ppl_ratio", -2.5e-4, "-2.5e-04"),
        ("ln_ppl_ratio", 2.5e-4, "+2.5e-04"),
        ("flips", 4, "4"),
        ("something_else", 1234.5678, "1.23e+03"),
    ],
)
def test_format_value(key: str, value: Any, text: str) -> None:
    assert format_value(key, value) == text


def _speed(decode_ratio: float = 1.3) -> dict[str, Any]:
    def arm(tps: float, kv: int) -> dict[str, Any]:
        return {"prefill_tps": 200.0, "decode_tps": tps, "peak_bytes": 3 << 20, "kv_bytes": kv, "trials": []}

    return {
        "id": "s1",
        "shape": {"contexts": [128, 512], "decode": 16, "repetitions": 9, "warmup": 1},
        "contexts": {
            str(c): {
                "context": c,
                "reference": arm(10.0, 4 << 20),
                "candidate": arm(13.0, 1 << 20),
                "prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1], "n": 9, "log_sd": 0.1},
                "decode": {"ratio": decode_ratio * c / 512, "ratio_ci": [1.2, 1.4], "n": 9, "log_sd": 0.1},
                "peak": {"ratio": 0.8, "ratio_ci": [0.8, 0.8], "n": 9, "log_sd": 0.0},
                "kv": {"ratio": 0.25},
            }
            for c in (128, 512)
        },
    }


def test_db_version_1_gains_the_speed_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    v1 = history._COLUMNS[: len(history._COLUMNS) - len(history._SPEED_COLUMNS)]
    old_row = history._row(make_run(), make_record())[: len(v1)]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE quality_runs (id INTEGER PRIMARY KEY, " + ", ".join(f"{n} {k}" for n, k in v1) + ")")
        conn.execute(
            f"INSERT INTO quality_runs ({', '.join(n for n, _ in v1)}) VALUES ({', '.join('?' * len(v1))})", old_row
        )
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    db = ResultsDB(path)
    db.append(make_run("b" * 32), [make_record("gates/test_kv_cache.py::test_speed", mode="speed", speed=_speed())])
    old, new = db.rows()
    assert old["mean_kl"] == make_record().stats.mean and old["decode_ratio"] is None
    assert new["speed_context"] == 512  # the longest context's figures
    assert (new["decode_ratio"], new["decode_ratio_lo"], new["decode_ratio_hi"]) == (1.3, 1.2, 1.4)
    assert (new["ref_decode_tps"], new["cand_decode_tps"], new["peak_ratio"]) == (10.0, 13.0, 0.8)
    assert (new["ref_kv_bytes"], new["cand_kv_bytes"]) == (4 << 20, 1 << 20)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    conn.close()


def test_summary_shows_a_modules_speed_once_and_speed_checks_as_ratios() -> None:
    speed = _speed()
    drift = make_record(speed=speed)
    checks = [
        {
            "metric": "decode tok/s @512",
            "key": "speed.decode",
            "value": 1.3,
            "bound": 1.2,
            "other_bound": 1.4,
            "limit": 1.05,
            "direction": "min",
            "n": 9,
            "verdict": "pass",
            "passed": True,
        }
    ]
    gate = make_record("gates/test_kv_cache.py::test_speed", mode="speed", speed=speed, checks=checks, stats={})
    lines = summary_lines([drift, gate], width=200)
    text = "\n".join(lines)
    assert (
        text.count(
            "speed @512: prefill ×1.00 [0.90, 1.10] (tok/s 200 → 200) · decode ×1.30 [1.20, 1.40] "
            "(tok/s 10.0 → 13.0) · KV 4.0 MiB → 1.0 MiB · peak +3.0 MiB → +3.0 MiB"
        )
        == 1
    )
    assert text.count("speed @128:") == 1
    assert "holds" not in text, "an old record without the bytes held says nothing of them"
    held = _speed()
    for ctx in held["contexts"].values():
        ctx["reference"]["kv_held_bytes"], ctx["candidate"]["kv_held_bytes"] = 3 << 20, 3 << 18
    held["contexts"]["512"]["stopped"] = "decided"  # sequential trials say how many pairs, and why no more
    wrapped = "\n".join(summary_lines([make_record(speed=held)], width=200))
    assert "KV 4.0 MiB → 1.0 MiB (holds 3.0 MiB → 0.8 MiB) · peak" in wrapped
    assert "9 pairs (decided)" in wrapped and wrapped.count("pairs (") == 1
    row = next(line for line in lines if "decode tok/s @512" in line)
    assert "×1.300" in row and "≥ ×1.200" in row and "×1.050" in row and "pass" in row
    narrow = summary_lines([drift], width=80)
    assert all(len(line) <= 80 for line in narrow)
    i = next(i for i, line in enumerate(narrow) if line.startswith("  speed @512: prefill ×1.00"))
    assert (
        narrow[i + 1].strip().startswith("decode ×1.30 [1.20, 1.40] (tok/s 10.0 → 13.0)")
    )  # wrapped at its separators
    assert narrow[i + 1].index("decode") == narrow[i].index("prefill")


def test_a_lever_identical_on_this_backend_says_so_instead_of_only_passing() -> None:
    exact_wire = record_dict()
    exact_wire["stats"].update(max=0.0, same_top=1.0, mean=0.0)
    exact = parse_record(exact_wire)
    text = "\n".join(summary_lines([exact], width=200))
    assert "identical on this backend" in text
    assert "identical" not in "\n".join(summary_lines([make_record()], width=200))  # a real drift: no such claim
