"""A gate that raised is an error record, and every reader shows it as one: the verdict words (error is
worse than fail, an unknown word is no pass), the summary table, JUnit properties, the GitHub line, the
HTML report, the JSON report's run verdict, the DB row and `mlxgate compare`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_mlxgate.results.github import gate_line
from pytest_mlxgate.results.history import ResultsDB
from pytest_mlxgate.results.history_text import Source, compare_lines
from pytest_mlxgate.results.html_report import html_report
from pytest_mlxgate.results.json_report import write_json_report
from pytest_mlxgate.results.junit import junit_properties
from pytest_mlxgate.results.model import Record, parse_record
from pytest_mlxgate.results.records import (
    ERROR_LINES,
    RunInfo,
    error_record,
    gate_record,
)
from pytest_mlxgate.results.summary import summary_lines
from pytest_mlxgate.results.verdicts import (
    RECORD_VERDICTS,
    is_failing,
    run_verdict,
    verdict_rank,
    worst_verdict,
)

MESSAGE = (
    "the candidate arm (norm=kernels:nan) produced NaN logits at prompt 0, position 3: a broken kernel "
    "or overflow, not drift\nsecond line <b>bold</b>"
)


def nan_record() -> Record:
    return error_record(
        nodeid="gates/test_nan.py::test_drift",
        phase="call",
        error_type="NonFiniteLogitsError",
        message=MESSAGE,
        rerun="pytest gates/test_nan.py::test_drift",
    )


def run_info(**config: object) -> RunInfo:
    return RunInfo(
        run_id="r" * 32,
        started="2026-12-01T10:00:00Z",
        code_commit=None,
        code_dirty=None,
        argv=[],
        config=dict(config),
        machine={},
    )


def test_error_is_the_worst_word_and_no_unknown_word_passes() -> None:
    assert verdict_rank("error") > verdict_rank("fail") > verdict_rank("inconclusive") > verdict_rank("maybe")
    assert verdict_rank("maybe") == verdict_rank(None) > verdict_rank("measured") > verdict_rank("pass")
    assert worst_verdict(["pass", "error", "fail"]) == "error" and worst_verdict([]) is None
    for word in ("error", "fail", "maybe", "", None, 1):
        assert is_failing(word) and is_failing(word, "warn")
    for word in ("pass", "floor", "measured", "complete", "partial"):
        assert not is_failing(word)
    assert is_failing("inconclusive") and not is_failing("inconclusive", "warn")
    assert set(RECORD_VERDICTS) >= {"pass", "fail", "inconclusive", "error"}


def test_the_run_verdict_never_says_pass_for_an_error_an_interruption_or_nothing() -> None:
    assert run_verdict(["pass", "measured", "floor"]) == "pass"
    assert run_verdict(["pass", "error"]) == "error" and run_verdict(["pass", "fail"]) == "fail"
    assert run_verdict(["pass", "maybe"]) == "error"  # an unknown word is no pass
    assert run_verdict(["pass"], interrupted=True) == "error"
    assert run_verdict([]) == "none"


def test_an_error_record_keeps_the_first_lines_of_its_message() -> None:
    record = error_record(
        nodeid="a.py::t", phase="setup", error_type="OSError", message="\n".join(f"line {i}" for i in range(40))
    ).to_json()
    assert record["verdict"] == "error" and record["mode"] == "error" and record["gate"] == "a::t"
    lines = record["error"]["message"].splitlines()
    assert lines[:ERROR_LINES] == [f"line {i}" for i in range(ERROR_LINES)] and lines[-1] == "…"
    assert record["error"] == {"type": "OSError", "message": record["error"]["message"], "phase": "setup"}


def test_the_summary_shows_the_error_and_its_words() -> None:
    lines = summary_lines([nan_record()], width=100)
    assert lines[1].startswith("test_nan::test_drift") and lines[1].endswith("ERROR") and "error in call" in lines[1]
    assert lines[2].startswith("  NonFiniteLogitsError: the candidate arm (norm=kernels:nan) produced NaN")
    assert any("second line <b>bold</b>" in line for line in lines)
    assert not any(line.rstrip().endswith("pass") for line in lines)


def test_junit_and_github_carry_the_error() -> None:
    props = dict(junit_properties(nan_record()))
    assert props["mlxgate.verdict"] == "error" and props["mlxgate.error.type"] == "NonFiniteLogitsError"
    assert props["mlxgate.error.phase"] == "call" and props["mlxgate.error.message"] == MESSAGE
    assert json.loads(props["mlxgate.record"])["error"]["message"] == MESSAGE
    line = gate_line(nan_record())
    assert line.startswith("ERROR test_nan::test_drift: NonFiniteLogitsError in call: the candidate arm")
    assert "second line" not in line and line.endswith("re-run: pytest gates/test_nan.py::test_drift")


def test_the_html_report_shows_the_error_escaped_and_an_interrupted_banner() -> None:
    page = html_report(
        [nan_record()],
        run=run_info(
            interrupted={
                "reason": "KeyboardInterrupt",
                "not_run": ["gates/test_b.py"],
            }
        ),
    )
    assert '<section class="gate v-error"' in page and '<span class="badge v-error">ERROR</span>' in page
    assert "<h3>Error in call</h3>" in page and "second line &lt;b&gt;bold&lt;/b&gt;" in page
    assert "<b>bold</b>" not in page
    assert 'class="banner interrupted"' in page and "1 module(s) did not run: gates/test_b.py" in page
    assert 'class="banner' not in html_report([nan_record()], run=run_info())


def test_the_json_report_says_the_run_verdict_and_the_interruption(tmp_path: Path) -> None:
    ok = gate_record(nodeid="a.py::t", mode="gate", verdict="pass")
    path = tmp_path / "r.json"
    write_json_report(path, run_info(), [ok])
    doc = json.loads(path.read_text())
    assert doc["verdict"] == "pass" and doc["interrupted"] is False and "not_run" not in doc
    write_json_report(path, run_info(), [ok, nan_record()])
    assert json.loads(path.read_text())["verdict"] == "error"
    write_json_report(path, run_info(interrupted={"reason": "KeyboardInterrupt", "not_run": ["b.py"]}), [ok])
    doc = json.loads(path.read_text())
    assert doc["verdict"] == "error" and doc["interrupted"] is True and doc["not_run"] == ["b.py"]


def test_the_db_keeps_an_error_row_and_compare_calls_pass_to_error_a_regression(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "h.sqlite")
    db.append(run_info(), [nan_record()])
    (row,) = db.rows(columns=("verdict", "mode", "record_json"))
    assert row["verdict"] == "error" and row["mode"] == "error"
    assert json.loads(row["record_json"])["error"]["type"] == "NonFiniteLogitsError"

    wire = dict(nan_record().to_json(), verdict="pass", mode="gate")
    wire.pop("error")
    passed = parse_record(wire)
    lines, regressions = compare_lines(Source("a", run_info(), [passed]), Source("b", run_info(), [nan_record()]))
    assert regressions == ["gates/test_nan.py::test_drift"] and "pass → error  REGRESSION" in "\n".join(lines)


@pytest.mark.parametrize("verdict", ["error", "maybe", None])
def test_merge_fails_on_an_error_or_an_unknown_verdict(
    tmp_path: Path, verdict: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_mlxgate.cli import main

    passing = gate_record(nodeid="a.py::t", mode="gate", verdict="pass")
    record = nan_record() if verdict == "error" else dataclasses.replace(passing, verdict=verdict)
    path = tmp_path / "r.json"
    write_json_report(path, run_info(), [record])
    assert main(["merge", str(path)]) == 1
    assert "gate(s) failing" in capsys.readouterr().err
