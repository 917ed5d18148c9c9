"""What became of a run's tests, through real pytest sessions without a model: -x and Ctrl-C leave a
report that says interrupted and names the modules that never ran (an -x stop at the last test does
not); an earlier run's report is moved to PATH.stale before anything runs; a report the run cannot
write fails it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FAILS = "def test_fails():\n    assert False\n"
PASSES = "def test_passes():\n    pass\n"
CTRL_C = "def test_stops():\n    raise KeyboardInterrupt\n"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    return pytester


def _run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest_subprocess("--mlx-db=off", "-p", "no:randomly", *args)


def test_an_x_stop_with_modules_left_is_an_interrupted_run(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_a=FAILS, test_b=PASSES, test_c=PASSES)
    report = tmp_path / "r.json"
    result = _run(project, "-x", f"--mlx-report={report}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["verdict"] == "error"
    assert doc["not_run"] == ["test_b.py", "test_c.py"]
    assert doc["run"]["config"]["interrupted"]["reason"] == "stopping after 1 failures"
    result.stdout.fnmatch_lines(
        [
            "mlxgate: INTERRUPTED (stopping after 1 failures): 2 module(s) did not run: "
            "test_b.py, test_c.py; the reports say so*"
        ]
    )


def test_an_x_stop_at_the_last_test_ran_everything(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_a=PASSES, test_b=FAILS)
    report = tmp_path / "r.json"
    result = _run(project, "-x", f"--mlx-report={report}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not report.exists()  # no gate record and nothing left unrun: nothing to report
    assert "INTERRUPTED" not in result.stdout.str()


def test_ctrl_c_names_the_module_it_stopped_in_and_the_ones_after(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_a=PASSES, test_b=CTRL_C, test_c=PASSES)
    report = tmp_path / "r.json"
    result = _run(project, f"--mlx-report={report}")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["verdict"] == "error" and doc["not_run"] == ["test_b.py", "test_c.py"]
    assert doc["run"]["config"]["interrupted"]["reason"] == "KeyboardInterrupt"


@pytest.mark.slow  # two pytest sessions
def test_an_earlier_report_is_moved_aside_before_the_run(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_a=PASSES)
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    report.write_text('{"verdict": "pass", "old": true}')
    html.write_text("<p>old</p>")
    result = _run(project, f"--mlx-report={report}", f"--mlx-html={html}")
    assert result.ret == pytest.ExitCode.OK
    assert not report.exists() and not html.exists()  # this run had no gate record: no report, no old one either
    assert json.loads((tmp_path / "r.json.stale").read_text())["old"] is True
    assert (tmp_path / "r.html.stale").read_text() == "<p>old</p>"

    report.write_text('{"verdict": "pass", "older": true}')
    sharded = _run(project, f"--mlx-report={report}", "--mlx-shard=1/1")  # a shard writes its report always
    assert sharded.ret == pytest.ExitCode.OK
    doc = json.loads(report.read_text())
    assert doc["verdict"] == "none" and doc["gates"] == []  # nothing tested is not "pass"
    assert doc["run"]["config"]["without_records"] == {"test_a.py": "1 without a gate record"}
    assert json.loads((tmp_path / "r.json.stale").read_text())["older"] is True  # the newest earlier one


def test_a_report_path_that_is_a_directory_stops_the_run(project: pytest.Pytester, tmp_path: Path) -> None:
    project.makepyfile(test_a=PASSES)
    (tmp_path / "r.json").mkdir()
    result = _run(project, f"--mlx-report={tmp_path / 'r.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlx-report */r.json: it is a folder; give a file in a folder you can write*"])
    assert (tmp_path / "r.json").is_dir()  # left as it was


def test_a_report_that_cannot_be_written_stops_the_run_before_its_tests(
    project: pytest.Pytester, tmp_path: Path
) -> None:
    """Before: found after the tests had run (the report then not written)."""
    project.makepyfile(test_a=PASSES)
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "r.json"
    result = _run(project, f"--mlx-report={target}", "--mlx-shard=1/1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--mlx-report {target}: {tmp_path / 'afile'} is a file, not a folder*"])
    assert "passed" not in result.stdout.str()  # no test ran
