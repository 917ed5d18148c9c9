"""GitHub Actions outputs as pure functions: workflow commands escaped as actions/toolkit does, at most
10 annotations per kind at the gate's `def` line and one notice counting the rest, and a job summary
that puts failing gates first and stays under its size limit, saying how many gates it left out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.github import (
    STEP_SUMMARY_LIMIT,
    annotation_lines,
    check_text,
    def_line,
    escape_data,
    escape_property,
    gate_line,
    gate_location,
    step_summary,
    workflow_command,
)
from pytest_mlxgate.results.model import Record
from pytest_mlxgate.results.records import gate_record
from pytest_mlxgate.results.verdicts import overall_verdict

STATS: dict[str, Any] = {
    "n_prompts": 16,
    "n_tokens": 512,
    "mean": 3.1e-4,
    "mean_ci": [2.5e-4, 4.0e-4],
    "top1": 0.99,
    "top1_ci": [0.97, 0.995],
    "max": 6e-3,
}
MODEL = {"name": "e4b", "pinned": "mlx-community/gemma-4-e4b-it-4bit@abcdef0"}


def record(nodeid: str, mean: float, **more: Any) -> Record:
    checks = kl_checks(STATS, {"mean": mean, "top1": 0.95})
    return gate_record(
        nodeid=nodeid,
        mode="gate",
        verdict=overall_verdict(checks),
        checks=checks,
        stats=STATS,
        candidate=MODEL,
        rerun=f"pytest {nodeid}",
        **more,
    )


FAIL, UNSURE, PASS = 1e-4, 3.5e-4, 1e-3  # mean limits below, inside and above the interval [2.5e-4, 4e-4]


def unescape(text: str) -> str:
    return text.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def test_escaping_follows_actions_toolkit() -> None:
    assert escape_data("50% done\r\nnext: a,b") == "50%25 done%0D%0Anext: a,b"
    assert escape_property("50% done\r\nnext: a,b") == "50%25 done%0D%0Anext%3A a%2Cb"
    assert escape_data("%0A") == "%250A"  # an escape in the text is not read as one
    assert workflow_command("error", "m\n", file="a b.py", line=3, title="t: x", col=None) == (
        "::error file=a b.py,line=3,title=t%3A x::m%0A"
    )
    assert workflow_command("notice", "plain") == "::notice::plain"


def test_check_text_says_value_interval_limit_and_verdict() -> None:
    (mean, top1) = kl_checks(STATS, {"mean": FAIL, "top1": 0.95})
    assert check_text(mean) == "mean KL 3.1e-04 [2.5e-04, 4.0e-04] vs limit ≤ 1e-04: fail"
    assert check_text(top1) == "top-1 99.0% [97.0%, 99.5%] vs limit ≥ 95.0%: pass"
    (unsure,) = kl_checks(STATS, {"mean": UNSURE})
    assert re.fullmatch(r"mean KL .* vs limit ≤ 3.5e-04: inconclusive \(n≈\d+\)", check_text(unsure))


def test_def_line_skips_decorators_to_the_def(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        "import pytest\n\n\n@pytest.mark.parametrize(\n    'x', [1],\n)\n@pytest.mark.slow\n"
        "async def test_a(x):\n    pass\n\n\ndef test_b():\n    pass\n"
    )
    assert def_line(source, 3) == 8  # pytest reports the first decorator's line, 0-based
    assert def_line(source, 11) == 12
    assert def_line(tmp_path / "gone.py", 4) == 5


def test_gate_location_is_relative_to_the_checkout(tmp_path: Path) -> None:
    root = tmp_path / "repo" / "sub"
    (root / "gates").mkdir(parents=True)
    (root / "gates" / "test_kv.py").write_text("\n\ndef test_drift(paired):\n    pass\n")
    location = ("gates/test_kv.py", 2, "test_drift")
    assert gate_location(root, location, tmp_path / "repo") == ("sub/gates/test_kv.py", 3)
    assert gate_location(root, location, None) == ("gates/test_kv.py", 3)
    assert gate_location(root, location, tmp_path / "elsewhere") == ("gates/test_kv.py", 3)


def test_annotations_error_per_failing_gate_warning_per_inconclusive_at_most_ten_each() -> None:
    failing = [record(f"gates/test_f.py::test_{i:02d}", FAIL) for i in range(13)]
    unsure = [record(f"gates/test_u.py::test_{i}", UNSURE) for i in range(3)]
    passing = [record("gates/test_p.py::test_ok", PASS)]
    unplaced = record("gates/test_f.py::test_not_a_test_item", FAIL)  # no location: nothing to point at
    everything = [*failing, *unsure, *passing, unplaced]
    locations = {r.nodeid: (r.nodeid.split("::")[0], 10 + i) for i, r in enumerate(everything[:-1])}
    lines = annotation_lines(everything, locations)
    errors = [line for line in lines if line.startswith("::error ")]
    assert len(errors) == 10 and errors[0].startswith(
        "::error file=gates/test_f.py,line=10,title=mlxgate fail%3A "
        "test_f%3A%3Atest_00::FAIL test_f::test_00: mean KL 3.1e-04"
    )
    assert "vs limit ≤ 1e-04: fail · top-1 99.0%25 [97.0%25, 99.5%25]" in errors[0]  # % is escaped in the message
    assert "re-run: pytest gates/test_f.py::test_00" in errors[0]
    assert lines[10] == (
        "::notice title=mlxgate::3 more failing gates not annotated (GitHub shows 10 per kind); "
        "the job summary and the JSON report list every gate"
    )
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert len(warnings) == 3 and all("::INCONCLUSIVE " in w for w in warnings)
    assert len(lines) == 14 and not any("test_ok" in line or "not_a_test_item" in line for line in lines)


def test_an_annotation_is_one_line_whatever_the_gate_holds() -> None:
    odd = record("gates/test_x.py::test_y[50%\nsplit, a:b]", FAIL)
    (line,) = annotation_lines([odd], {odd.nodeid: ("gates/test_x.py", 4)})
    assert "\n" not in line and "\r" not in line
    head, message = line.split("::", 2)[1:]
    title = head.split(",title=", 1)[1]
    assert unescape(title) == "mlxgate fail: test_x::test_y[50%\nsplit, a:b]"
    assert unescape(message) == gate_line(odd)
    assert "%25%0Asplit" in message and "%2C" not in message  # the message keeps its commas and colons


def test_the_step_summary_puts_failing_gates_first_with_figures_models_and_reports() -> None:
    speed = {
        "id": "s",
        "contexts": {
            "256": {
                "reference": {"decode_tps": 10.0, "kv_bytes": 1 << 20},
                "candidate": {"decode_tps": 13.0, "kv_bytes": 1 << 19},
                "decode": {"ratio": 1.3, "ratio_ci": [1.2, 1.4]},
            }
        },
    }
    records = [
        record("gates/test_a.py::test_pass", PASS, speed=speed),
        record("gates/test_b.py::test_unsure", UNSURE),
        record("gates/test_c.py::test_fail", FAIL),
    ]
    text = step_summary(records, reports=[("JSON report", "results/gates.json")])
    lines = text.splitlines()
    assert lines[0] == "### mlxgate: 3 gates — 1 fail · 1 inconclusive · 1 pass"
    rows = [line for line in lines if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["test_c::test_fail", "test_b::test_unsure", "test_a::test_pass"]
    assert rows[0].startswith(
        "| `test_c::test_fail` | ❌ fail | mean KL 3.1e-04 [2.5e-04, 4.0e-04] vs limit ≤ "
        "1e-04: fail<br>top-1 99.0% [97.0%, 99.5%] vs limit ≥ 95.0%: pass | 16 prompts · "
        "512 tokens |"
    )
    assert "⚠️ inconclusive" in rows[1] and "✅ pass" in rows[2]
    assert "- `test_a::test_pass`: speed @256: prefill ×? (tok/s ? → ?) · decode ×1.30 [1.20, 1.40]" in text
    assert f"Model: `{MODEL['pinned']}`  " in lines and "JSON report: `results/gates.json`  " in lines
    assert "left out" not in text


def test_a_pipe_in_a_gate_name_does_not_break_the_table() -> None:
    text = step_summary([record("gates/test_a.py::test_x[a|b]", PASS)])
    (row,) = [line for line in text.splitlines() if line.startswith("| `")]
    assert row.startswith("| `test_a::test_x[a\\|b]` |") and row.count(" | ") == 3


@pytest.mark.parametrize("limit", [20_000, STEP_SUMMARY_LIMIT])
def test_the_step_summary_stays_under_its_limit_and_counts_what_it_left_out(limit: int) -> None:
    n = 2 + limit // 150  # more rows than fit: each is over 150 bytes
    records = [record(f"gates/test_many.py::test_{i:05d}", PASS if i % 3 else FAIL) for i in range(n)]
    text = step_summary(records, limit=limit)
    assert len(text.encode("utf-8")) <= limit
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    (cut,) = [line for line in text.splitlines() if "left out" in line]
    assert f"| {n - len(rows)} more gates left out |" in cut and f"{limit // 1024} KiB" in cut
    assert 0 < len(rows) < n and all("❌ fail" in r for r in rows[: min(len(rows), n // 3)])  # failing ones kept first
    assert len(text.encode("utf-8")) > limit * 0.9  # cut near the limit, not far below it


def test_a_step_summary_with_no_room_is_not_written() -> None:
    assert step_summary([record("a.py::t", PASS)], limit=100) == ""
