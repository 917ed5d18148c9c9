"""Where a gate's limits were shown to work (`limits_from`), in every report: the one line of words
(`LimitsFrom.words`) in the summary table, JUnit properties, the GitHub line, job summary and
annotations, and the HTML report; limits not shown (unproven, refuted) marked; a refuted gate an error
everywhere; an older record without the field shows nothing; the JSON report and the DB keep it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from report_records import HOSTILE, run_info

from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.github import annotation_lines, gate_line, step_summary
from pytest_mlxgate.results.history import ResultsDB
from pytest_mlxgate.results.html_report import html_report
from pytest_mlxgate.results.json_report import write_json_report
from pytest_mlxgate.results.junit import junit_properties
from pytest_mlxgate.results.model import Record, parse_record
from pytest_mlxgate.results.records import gate_record
from pytest_mlxgate.results.runs import parse_row
from pytest_mlxgate.results.summary import summary_lines
from pytest_mlxgate.results.verdicts import overall_verdict

NODEID = "gates/test_kv_cache.py::test_drift"
STATS: dict[str, Any] = {
    "n_prompts": 16,
    "n_tokens": 512,
    "confidence": 0.95,
    "mean": 3.1e-4,
    "mean_ci": [2.5e-4, 4.0e-4],
    "top1": 0.99,
    "top1_ci": [0.97, 0.995],
    "max": 6e-3,
}
KNOWN_BAD = {"value": {"bits": 4}, "verdict": "fail", "figures": ["mean KL 2.1e-02"]}
LIMITS: dict[str, dict[str, Any]] = {
    "calibrated": {
        "status": "calibrated",
        "model": "smollm2-135m",
        "backend": "cpu",
        "file": "gates/calibration/test_kv_cache.json",
    },
    "proven": {"status": "proven", "model": "e4b", "backend": "metal", "known_bad": KNOWN_BAD},
    "unproven": {"status": "unproven", "model": "e4b", "backend": "metal", "why": "no known-bad"},
    "refuted": {
        "status": "refuted",
        "model": "e4b",
        "backend": "metal",
        "why": 'known-bad {"bits": 4} passes them',
        "known_bad": dict(KNOWN_BAD, verdict="pass"),
    },
}
WORDS = {
    "calibrated": "limits shown on smollm2-135m (cpu) by gates/calibration/test_kv_cache.json",
    "proven": 'limits proven on e4b (metal): known-bad {"bits": 4} fails them',
    "unproven": "limits unproven on e4b (metal): no known-bad",
    "refuted": 'limits do not catch the known-bad on e4b (metal): known-bad {"bits": 4} passes them',
}
#: What each report shows: limits not shown to work here carry the marker.
SHOWN = {s: (w if s in ("calibrated", "proven") else f"⚠ {w}") for s, w in WORDS.items()}
STATUSES = list(LIMITS)
ANY_WORDS = r"limits (shown|proven|unproven|do not)"  # the start of any status's words


def record(status: str | None, *, nodeid: str = NODEID, **over: Any) -> Record:
    """A passing KL gate (its checks pass), with the limits_from of `status` (None: an older record without
    it); a refuted one is an error, as `authoring.proof` makes it."""
    checks = kl_checks(STATS, {"mean": 1e-3, "top1": 0.95})
    verdict = "error" if status == "refuted" else overall_verdict(checks)
    fields: dict[str, Any] = dict(
        checks=checks,
        stats=STATS,
        candidate={"name": "e4b", "pinned": "mlx-community/gemma-4-e4b-it-4bit@abcdef0"},
        rerun=f"pytest {nodeid}",
    )
    if status is not None:
        fields["limits_from"] = LIMITS[status]
    fields.update(over)
    return gate_record(nodeid=nodeid, mode="gate", verdict=verdict, **fields)


def test_the_records_read_back_with_the_words_these_tests_expect() -> None:
    for status in STATUSES:
        limits = parse_record(record(status).to_json()).limits_from
        assert limits is not None and limits.status == status and limits.words == WORDS[status]
    assert parse_record(record(None).to_json()).limits_from is None
    assert record("calibrated").verdict == "pass" and record("refuted").verdict == "error"


# -- the terminal summary ------------------------------------------------------------------------


@pytest.mark.parametrize("status", STATUSES)
def test_the_summary_shows_the_words_under_the_gate_rows(status: str) -> None:
    lines = summary_lines([record(status)], width=200)
    assert f"  {SHOWN[status]}" in lines
    at = lines.index(f"  {SHOWN[status]}")
    rows = [i for i, line in enumerate(lines) if re.search(r"(pass|ERROR)$", line)]
    n_line = next(i for i, line in enumerate(lines) if re.match(r"\s+n\s", line))
    assert rows and max(rows) < at < n_line  # under the rows, before what the verdict rests on
    assert sum("limits" in line for line in lines) == 1


def test_the_summary_wraps_long_words_and_keeps_the_marker() -> None:
    long = dict(LIMITS["unproven"], why="no known-bad " + "x" * 30 + " and more words " * 6)
    lines = summary_lines([record("unproven", limits_from=long)], width=60)
    at = next(i for i, line in enumerate(lines) if "limits unproven" in line)
    assert lines[at].startswith("  ⚠ limits unproven on e4b (metal): no known-bad")
    assert lines[at + 1].startswith("    ") and all(len(line) <= 60 for line in lines[at : at + 3])


def test_the_summary_of_an_older_record_has_no_limits_line() -> None:
    for limits in (None, {"status": "proven"}, "not a mapping"):
        over: dict[str, Any] = {} if limits is None else {"limits_from": limits}
        lines = summary_lines([record(None, **over)], width=200)
        assert not any(re.search(f"⚠|{ANY_WORDS}", line) for line in lines), lines
        assert lines[1].startswith("test_kv_cache::test_drift") and lines[1].endswith("pass")


def test_a_refuted_gate_reads_as_an_error_in_the_summary() -> None:
    lines = summary_lines([record("refuted")], width=200)
    at = lines.index(f"  {SHOWN['refuted']}")
    assert re.fullmatch(r"\s+verdict\s+—\s+—\s+—\s+ERROR", lines[at - 1]), lines  # the gate's word: last row
    assert not re.search(r"\bpass\b", lines[at - 1]) and lines[1].startswith("test_kv_cache::test_drift")


# -- JUnit properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", STATUSES)
def test_junit_carries_the_words_and_the_status(status: str) -> None:
    props = dict(junit_properties(record(status)))
    assert props["mlxgate.limits_from"] == WORDS[status]
    assert props["mlxgate.limits_from.status"] == status
    assert props["mlxgate.limits_from.shown"] == ("true" if status in ("calibrated", "proven") else "false")
    assert props["mlxgate.limits_from.model"] == LIMITS[status]["model"]
    assert props["mlxgate.limits_from.backend"] == LIMITS[status]["backend"]
    if status == "calibrated":
        assert props["mlxgate.limits_from.file"] == "gates/calibration/test_kv_cache.json"
    else:
        assert "mlxgate.limits_from.file" not in props
    if status in ("proven", "refuted"):
        assert props["mlxgate.limits_from.known_bad"] == '{"bits": 4}'
    assert json.loads(props["mlxgate.record"])["limits_from"] == LIMITS[status]


def test_junit_of_an_older_record_has_no_limits_property_and_a_refuted_one_is_an_error() -> None:
    props = dict(junit_properties(record(None)))
    assert props["mlxgate.verdict"] == "pass" and not any(k.startswith("mlxgate.limits_from") for k in props)
    refuted = dict(junit_properties(record("refuted")))
    assert refuted["mlxgate.verdict"] == "error" and refuted["mlxgate.limits_from.status"] == "refuted"


# -- GitHub: the gate's line, the job summary, the annotations -----------------------------------


@pytest.mark.parametrize("status", STATUSES)
def test_the_github_line_and_job_summary_show_the_words(status: str) -> None:
    line = gate_line(record(status))
    verdict = "ERROR" if status == "refuted" else "PASS"
    assert line.startswith(f"{verdict} test_kv_cache::test_drift: ") and f"{SHOWN[status]} · " in line
    summary = step_summary([record(status)])
    (row,) = [r for r in summary.splitlines() if r.startswith("| `test_kv_cache::test_drift`")]
    label = "❌ error" if status == "refuted" else "✅ pass"
    assert f"| {label} |" in row and SHOWN[status].replace("|", "\\|") in row


def test_a_pass_on_unproven_limits_says_so_and_a_refuted_gate_says_why_first() -> None:
    line = gate_line(record("unproven"))
    assert line.startswith("PASS ") and "mean KL" in line.split("⚠ limits unproven")[0]  # after the figures
    refuted = gate_line(record("refuted"))
    assert refuted.startswith(f"ERROR test_kv_cache::test_drift: {SHOWN['refuted']} · mean KL")
    summary = step_summary([record("refuted")])
    assert "✅" not in summary and "1 error" in summary.splitlines()[0]


def test_the_annotation_of_a_refuted_gate_carries_the_words() -> None:
    locations = {NODEID: ("gates/test_kv_cache.py", 12), "gates/test_b.py::t": ("gates/test_b.py", 3)}
    lines = annotation_lines([record("refuted"), record("unproven", nodeid="gates/test_b.py::t")], locations)
    (line,) = lines  # a pass is not annotated, whatever its limits
    assert line.startswith("::error file=gates/test_kv_cache.py,line=12,title=mlxgate error%3A test_kv_cache")
    assert "limits do not catch the known-bad on e4b (metal)" in line


def test_github_of_an_older_record_says_nothing_of_limits() -> None:
    line = gate_line(record(None))
    summary = step_summary([record(None)])
    assert line.startswith("PASS ") and not re.search(f"⚠|{ANY_WORDS}", line)
    assert not re.search(f"⚠|{ANY_WORDS}", summary)


# -- the HTML report -----------------------------------------------------------------------------


def markup(page: str) -> str:
    """The page without its stylesheet (which names every class)."""
    return page.split("</style>", 1)[1]


def section(page: str) -> str:
    (found,) = re.findall(r'<section class="gate[^"]*" id="g0".*?</section>', page, re.S)
    return str(found)


@pytest.mark.parametrize("status", STATUSES)
def test_the_html_report_shows_the_words_marked_when_not_shown(status: str) -> None:
    page = html_report([record(status)], run=run_info())
    gate = section(page)
    words = WORDS[status].replace('"', "&quot;")
    if status in ("calibrated", "proven"):
        assert f'<p class="limits shown l-{status}" data-limits="{status}">{words}</p>' in gate
        assert "not-shown" not in markup(page) and "⚠" not in page
    else:
        assert (
            f'<p class="limits not-shown l-{status}" data-limits="{status}" role="note"><strong>⚠ {words}</strong></p>'
            in gate
        )
        assert f'<span class="badge limits not-shown l-{status}">limits {status}</span>' in page  # the contents
    badge = "ERROR" if status == "refuted" else "pass"
    assert f'<span class="badge v-{badge.lower()}">{badge}</span>' in gate


def test_the_html_report_escapes_the_words_and_shows_a_refuted_gate_as_an_error() -> None:
    hostile = dict(LIMITS["refuted"], why=HOSTILE, model="<b>m</b>")
    page = html_report([record("refuted", limits_from=hostile)], run=run_info())
    assert HOSTILE not in page and "<b>m</b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "&lt;b&gt;m&lt;/b&gt; (metal)" in page
    gate = section(page)
    assert gate.startswith('<section class="gate v-error"')
    assert '<h2>test_kv_cache::test_drift <span class="badge v-error">ERROR</span></h2>' in gate
    (tally,) = re.findall(r'<p class="tally">.*?</p>', page)
    assert "v-error" in tally and "v-pass" not in tally  # its checks pass; the gate does not


def test_the_html_report_of_an_older_record_has_no_limits_line() -> None:
    page = html_report([record(None)], run=run_info())
    assert not re.search(f'class="[^"]*limits|data-limits|⚠|{ANY_WORDS}', markup(page))


# -- the JSON report and the DB keep it ----------------------------------------------------------


def test_the_json_report_keeps_limits_from(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json_report(path, run_info(), [record(s, nodeid=f"gates/test_{s}.py::t") for s in STATUSES])
    doc = json.loads(path.read_text())
    assert doc["verdict"] == "error"  # the refuted gate
    read = {parse_record(g).nodeid: parse_record(g).limits_from for g in doc["gates"]}
    for status in STATUSES:
        limits = read[f"gates/test_{status}.py::t"]
        assert limits is not None and limits.words == WORDS[status] and limits.status == status


def test_the_db_keeps_limits_from_and_reads_it_back(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "history.sqlite")
    records = [record(s, nodeid=f"gates/test_{s}.py::t") for s in STATUSES] + [record(None)]
    db.append(run_info(), records)
    rows = {r["nodeid"]: parse_row(r) for r in ResultsDB(tmp_path / "history.sqlite").rows()}
    for status in STATUSES:
        stored = rows[f"gates/test_{status}.py::t"].record
        assert stored is not None and stored.limits_from is not None
        assert stored.limits_from.words == WORDS[status] and stored.limits_from.shown == (
            status in ("calibrated", "proven")
        )
    assert rows["gates/test_refuted.py::t"].verdict == "error"
    older = rows[NODEID].record
    assert older is not None and older.limits_from is None
