"""False green by omission: nothing a run was to test may vanish from its results.

Each scenario is a real pytest session (pytester, a subprocess) on the tiny llama: a candidate whose
logits are NaN (and a gate whose setup fails) leaves an error record in the JSON report, the DB, JUnit,
the HTML report and the summary, plain and under xdist; Ctrl-C in the second module leaves a report that
says interrupted and names the modules that never ran; a report that cannot be written fails the run
and leaves no earlier report to mistake for it; `mlxgate merge` fails a short shard, an empty one, an
unknown verdict and an error record; a locked results DB costs one short stated wait, and its rows wait
beside it until the next run adds them.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gate_folder import gate_folder
from report_records import junit_gate_properties

from pytest_mlxgate.cli import main
from pytest_mlxgate.results.history import DB_BUSY_TIMEOUT_S, ResultsDB, pending_path

pytestmark = pytest.mark.slow  # pytester gate sessions in subprocesses

KERNELS = '''
import mlx.core as mx

_rms = mx.fast.rms_norm


def nan_rms_norm(x, weight, eps):
    """A broken kernel: NaN everywhere."""
    return _rms(x, weight, eps) * float("nan")


def drifting_rms_norm(x, weight, eps):
    """Weights 2% too large: a small, real drift."""
    return _rms(x, weight * 1.02, eps)
'''

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="kernels:{cand}"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1.0)
"""
NAN_GATE = GATE.format(cand="nan_rms_norm")
PASSING_GATE = GATE.format(cand="drifting_rms_norm")  # a real drift, well inside 1.0
NO_LEVER = "def test_drift(paired):\n    pass\n"  # a setup error: the module declares no lever
SKIPPED = "import pytest\n\n\ndef test_later():\n    pytest.skip('not on this machine')\n"
CTRL_C = PASSING_GATE.replace("    assert_kl_below(paired, mean=1.0)", "    raise KeyboardInterrupt")


@pytest.fixture
def gates(pytester: pytest.Pytester) -> pytest.Pytester:
    return gate_folder(pytester, kernels=KERNELS)


def _run(p: pytest.Pytester, model: Path, tmp: Path, *more: str, db: str | None = None) -> pytest.RunResult:
    return p.runpytest_subprocess(
        f"--mlx-candidate={model}",
        f"--mlx-db={db or tmp / 'results.sqlite'}",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "-p",
        "no:randomly",
        *more,
    )


def _no_traceback(result: pytest.RunResult) -> None:
    assert "Traceback (most recent call last)" not in result.stdout.str() + result.stderr.str()


# --- an error is a record ------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["plain", "xdist"])
def test_nan_logits_and_a_setup_error_are_error_records_everywhere(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path, dist: str
) -> None:
    if dist == "xdist":
        pytest.importorskip("xdist")
    gates.makepyfile(test_nan=NAN_GATE, test_nolever=NO_LEVER, test_ok=PASSING_GATE, test_skip=SKIPPED)
    report, html, xml = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "r.xml"
    result = _run(
        gates,
        tiny_model_dir,
        tmp_path,
        f"--mlx-report={report}",
        f"--mlx-html={html}",
        f"--junit-xml={xml}",
        "--mlx-shard=1/1",
        *(["-n", "2"] if dist == "xdist" else []),
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=1)
    _no_traceback(result)

    doc = json.loads(report.read_text())
    gates_by_id = {g["nodeid"]: g for g in doc["gates"]}
    assert set(gates_by_id) == {"test_nan.py::test_drift", "test_nolever.py::test_drift", "test_ok.py::test_drift"}
    nan, setup = gates_by_id["test_nan.py::test_drift"], gates_by_id["test_nolever.py::test_drift"]
    assert nan["verdict"] == "error" and nan["error"]["type"] == "NonFiniteLogitsError"
    assert nan["error"]["phase"] == "call" and "NaN" in nan["error"]["message"]
    assert nan["lever"]["cand"] == "kernels:nan_rms_norm" and nan["rerun"].startswith("pytest test_nan.py::test_drift")
    assert setup["verdict"] == "error" and setup["error"]["phase"] == "setup"
    assert "declares no lever" in setup["error"]["message"]
    assert gates_by_id["test_ok.py::test_drift"]["verdict"] == "pass"  # a real measurement still passes
    assert doc["verdict"] == "error" and doc["interrupted"] is False
    assert doc["run"]["config"]["without_records"] == {"test_skip.py": "1 skipped"}  # a skip stays a skip

    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        rows = dict(db.execute("SELECT nodeid, verdict FROM quality_runs").fetchall())
    assert rows == {
        "test_nan.py::test_drift": "error",
        "test_nolever.py::test_drift": "error",
        "test_ok.py::test_drift": "pass",
    }

    props = junit_gate_properties(xml)
    assert props["test_nan.py::test_drift"]["mlxgate.verdict"] == "error"
    assert props["test_nan.py::test_drift"]["mlxgate.error.type"] == "NonFiniteLogitsError"
    assert props["test_nolever.py::test_drift"]["mlxgate.error.phase"] == "setup"

    page = html.read_text()
    assert page.count('class="badge v-error"') >= 2 and "NonFiniteLogitsError" in page and "declares no lever" in page

    result.stdout.fnmatch_lines(
        [
            "test_nan::test_drift *error in call*ERROR",
            "  NonFiniteLogitsError: the candidate arm (norm=kernels:nan_rms_norm) produced*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "test_nolever::test_drift *error in setup*ERROR",
            "  test_nolever.py::test_drift uses `paired` but declares no lever*",
        ]
    )

    # the shard's merge is no pass either (before, "1 gate record(s)" and exit 0)
    assert main(["merge", str(report)]) == 1


# --- an interrupted run says so --------------------------------------------------------------------


def test_ctrl_c_in_the_second_module_leaves_a_report_that_says_interrupted(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_a=PASSING_GATE, test_b=CTRL_C, test_c=PASSING_GATE)
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    result = _run(gates, tiny_model_dir, tmp_path, f"--mlx-report={report}", f"--mlx-html={html}")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["verdict"] == "error"  # test_a passed: the run did not
    assert doc["not_run"] == ["test_b.py", "test_c.py"]
    assert [(g["nodeid"], g["verdict"]) for g in doc["gates"]] == [("test_a.py::test_drift", "pass")]
    assert doc["run"]["config"]["interrupted"]["reason"] == "KeyboardInterrupt"
    result.stdout.fnmatch_lines(
        ["*mlxgate: INTERRUPTED (KeyboardInterrupt): 2 module(s) did not run: test_b.py, test_c.py*"]
    )
    assert 'class="banner interrupted"' in html.read_text()
    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        (config_json,) = db.execute("SELECT config_json FROM quality_runs").fetchone()
    assert json.loads(config_json)["config"]["interrupted"]["not_run"] == ["test_b.py", "test_c.py"]


# --- a report that cannot be written -----------------------------------------------------------------


def test_a_report_under_a_file_is_refused_before_any_gate_runs(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before: found after the whole run (the gates measured, the report then not written)."""
    gates.makepyfile(test_ok=PASSING_GATE)
    (tmp_path / "afile").write_text("not a directory")
    result = _run(gates, tiny_model_dir, tmp_path, f"--mlx-report={tmp_path / 'afile' / 'r.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--mlx-report {tmp_path / 'afile' / 'r.json'}: {tmp_path / 'afile'} is a file, not a folder; give a file*"]
    )
    assert "reference arm" not in result.stdout.str() + result.stderr.str()  # nothing was measured
    _no_traceback(result)


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(args)}): {done.stderr.strip() or done.returncode}")


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 8 KiB tmpfs holding an earlier run's small report: room for it, not for a new one."""
    where = tmp_path / "full"
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=8k", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_a_full_disk_fails_the_run_and_leaves_no_earlier_report_to_mistake(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path, full_disk: Path
) -> None:
    report = full_disk / "r.json"
    report.write_text('{"mlxgate_report": 1, "verdict": "pass", "gates": []}')  # the last run's
    gates.makepyfile(test_ok=PASSING_GATE)
    result = _run(gates, tiny_model_dir, tmp_path, f"--mlx-report={report}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert not report.exists()  # CI's upload of r.json finds nothing, not the last run's pass
    assert json.loads((full_disk / "r.json.stale").read_text())["verdict"] == "pass"  # kept, by another name
    result.stdout.fnmatch_lines(
        [f"*ERROR: JSON report {report} not written: No space left on device*moved to {report}.stale*"]
    )


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "ro"
    where.mkdir()
    (where / "r.json").write_text('{"mlxgate_report": 1, "verdict": "pass", "gates": []}')
    _mount("--bind", str(where), str(where))
    try:
        _mount("-o", "remount,bind,ro", str(where))
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_an_earlier_report_that_cannot_be_moved_aside_stops_the_run_before_it_starts(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path, read_only_dir: Path
) -> None:
    gates.makepyfile(test_ok=PASSING_GATE)
    report = read_only_dir / "r.json"
    result = _run(gates, tiny_model_dir, tmp_path, f"--mlx-report={report}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--mlx-report {report}: the folder {read_only_dir} cannot be written; give a file in a folder*"]
    )
    assert "passed" not in result.stdout.str()  # no gate ran for a report that could not be delivered
    assert report.exists()  # the earlier run's report is left as it was


# --- merge: nothing planned may vanish ------------------------------------------------------------


def _merge(tmp: Path, name: str, doc: dict[str, Any]) -> int:
    path = tmp / name
    path.write_text(json.dumps(doc))
    return main(["merge", str(path)])


def test_merge_fails_a_short_shard_an_empty_one_an_unknown_verdict_and_an_interrupted_one(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates.makepyfile(test_a=PASSING_GATE, test_b=PASSING_GATE)
    report = tmp_path / "shard.json"
    _run(gates, tiny_model_dir, tmp_path, "--mlx-shard=1/1", f"--mlx-report={report}").assert_outcomes(passed=2)
    real = json.loads(report.read_text())
    assert real["run"]["config"]["shard"]["modules"] == ["test_a.py", "test_b.py"]
    assert main(["merge", str(report)]) == 0  # the real, whole shard merges green
    capsys.readouterr()

    short = copy.deepcopy(real)
    short["gates"] = [g for g in short["gates"] if not g["nodeid"].startswith("test_b.py")]
    assert _merge(tmp_path, "short.json", short) == 1
    assert "planned module(s) without a record: test_b.py" in capsys.readouterr().err

    empty = copy.deepcopy(real)
    empty["gates"] = []
    assert _merge(tmp_path, "empty.json", empty) == 1
    assert "(its report has no gates at all): test_a.py, test_b.py" in capsys.readouterr().err

    for verdict in ("maybe", None):
        odd = copy.deepcopy(real)
        if verdict is None:
            del odd["gates"][0]["verdict"]
        else:
            odd["gates"][0]["verdict"] = verdict
        assert _merge(tmp_path, f"odd-{verdict}.json", odd) == 1
        assert f"has verdict {verdict!r}, not one mlxgate writes" in capsys.readouterr().err

    stopped = copy.deepcopy(real)
    stopped["run"]["config"]["interrupted"] = {"reason": "KeyboardInterrupt", "not_run": []}
    out = tmp_path / "merged.json"
    (tmp_path / "stopped.json").write_text(json.dumps(stopped))
    assert main(["merge", str(tmp_path / "stopped.json"), f"--json={out}"]) == 1
    assert "was interrupted (KeyboardInterrupt)" in capsys.readouterr().err
    merged = json.loads(out.read_text())
    assert merged["interrupted"] is True and merged["verdict"] == "error"


# --- a locked results DB ------------------------------------------------------------------------------


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


def test_a_locked_db_costs_one_short_wait_and_its_rows_arrive_with_the_next_run(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert DB_BUSY_TIMEOUT_S == 5.0  # the stated wait (it was 60 s per access)
    db = tmp_path / "results.sqlite"
    ResultsDB(db)  # the file exists, as after any earlier run
    gates.makepyfile(test_ok=PASSING_GATE)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        first = _run(gates, tiny_model_dir, tmp_path, db=str(db))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    first.assert_outcomes(passed=1)
    assert first.ret == pytest.ExitCode.OK  # the history is a by-product: its rows are queued, not lost
    pending = pending_path(db)
    first.stdout.fnmatch_lines(
        [
            f"*results not recorded in the DB yet: {db} is locked by another process (PID "
            f"{holder.pid}) (waited 5 s); 1 row(s) queued to {pending}, merged on the next run*"
        ]
    )
    assert ResultsDB(db).runs() == []
    [queued] = pending.read_text().splitlines()
    first_run = json.loads(queued)["run"]["run_id"]

    second = _run(gates, tiny_model_dir, tmp_path, db=str(db))
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([f"*1 row(s) → {db} (quality_runs), and 1 row(s) queued by earlier runs*"])
    runs = [r["run_id"] for r in ResultsDB(db).runs()]
    assert len(runs) == 2 and first_run in runs  # the locked-out run's row arrived
    assert not pending.exists()


# --- teardown reports what was measured, once, and measures nothing -----------------------------

RAISES_AFTER_KL = PASSING_GATE.replace(
    "    assert_kl_below(paired, mean=1.0)",
    "    paired.kl()\n    raise ValueError('the test broke after its arms ran')",
)
MEASURES_ONLY_KL = PASSING_GATE.replace(
    "    pytest.mark.mlx_kl(", "    pytest.mark.mlx_speed(),\n    pytest.mark.mlx_kl("
).replace("    assert_kl_below(paired, mean=1.0)", "    paired.kl()")


def test_a_test_that_raises_after_its_arms_ran_has_one_record_and_teardown_starts_no_trial(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_raises=RAISES_AFTER_KL, test_kl_only=MEASURES_ONLY_KL)
    report = tmp_path / "r.json"
    result = _run(gates, tiny_model_dir, tmp_path, f"--mlx-report={report}", "--mlx-speed-reps=3")
    result.assert_outcomes(passed=1, failed=1)
    records = json.loads(report.read_text())["gates"]
    by_id: dict[str, list[str]] = {}
    for record in records:
        by_id.setdefault(record["nodeid"], []).append(record["verdict"])
    # one record for the test that raised (before: "error" and "measured" side by side)
    assert by_id["test_raises.py::test_drift"] == ["error"]
    # the KL-only test reports what it measured; its module asks for speed, but teardown starts no trial
    assert by_id["test_kl_only.py::test_drift"] == ["measured"]
    (kl_only,) = [r for r in records if r["nodeid"] == "test_kl_only.py::test_drift"]
    assert "speed" not in kl_only and "speed (both arms" not in result.stdout.str()
