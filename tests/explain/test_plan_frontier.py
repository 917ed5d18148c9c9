"""`mlxgate plan kv --frontier`: points along the greedy's path measured beside the uniform plans, the
frontier no measured plan beats, the answer (cheapest passing, or least drift within a budget), its table,
its page in a real browser, and the search on a real (tiny) model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from headless import Browser, find_chromium
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.explain.plan_frontier import (
    DEEPEST,
    FrontierPoint,
    frontier_levels,
    frontier_page,
    frontier_table,
    on_frontier,
    trace,
)
from pytest_mlxgate.explain.plan_kv import PLAIN_OPTION, Option

FOUR, EIGHT, APART = Option(4, 64), Option(8, 64), Option(8, 64, 4)
LIMITS = {"mean": 1e-3}


@dataclass
class Stats:
    """What the search reads of a plan's statistics (the mean, its interval, and `kl_checks`' JSON)."""

    mean: float
    mean_ci: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {"n_prompts": 8, "mean": self.mean, "mean_ci": list(self.mean_ci), "p99": self.mean * 10, "top1": 0.99}


def _additive(noise: Mapping[Option, float]) -> Any:
    """A measurement whose mean KL is each layer's option's noise summed (plain: 0), interval ±20%."""
    seen: list[tuple[dict[int, Option], str]] = []

    def measure(plan: Mapping[int, Option], what: str) -> Stats:
        seen.append((dict(plan), what))
        mean = sum(noise.get(o, 0.0) for o in plan.values())
        return Stats(mean, (mean * 0.8, mean * 1.2))

    measure.seen = seen  # type: ignore[attr-defined]
    return measure


def test_the_levels_run_geometrically_from_the_cheapest_plan_down_to_a_thousandth() -> None:
    levels = frontier_levels(2e-3, 4)
    assert levels[0] == 2e-3 and math.isclose(levels[-1], 2e-3 * DEEPEST) and len(levels) == 4
    assert all(math.isclose(a / b, levels[0] / levels[1]) for a, b in zip(levels, levels[1:], strict=False))
    assert frontier_levels(2e-3, 1) == [2e-3] and frontier_levels(0.0, 5) == [] and frontier_levels(1.0, 0) == []


def _point(k: int, b: float, upper: float) -> FrontierPoint:
    return FrontierPoint(f"p{k}", {}, b, None, upper / 2, (0.0, upper), None, None, "pass")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.0, 4.0]), st.sampled_from([1.0, 2.0, 3.0])), max_size=9))
def test_the_frontier_is_every_point_no_other_beats_and_it_beats_the_rest(pairs: list[tuple[float, float]]) -> None:
    """No frontier point has another with bytes and mean bound both <= (one of them strictly, or the same
    point seen first); every point off the frontier has a frontier point that beats it."""
    points = on_frontier([_point(k, b, u) for k, (b, u) in enumerate(pairs)])

    def beats(q: FrontierPoint, p: FrontierPoint) -> bool:
        le = q.bytes_per_token <= p.bytes_per_token and q.mean_ci[1] <= p.mean_ci[1]
        strict = q.bytes_per_token < p.bytes_per_token or q.mean_ci[1] < p.mean_ci[1]
        return le and (strict or points.index(q) < points.index(p))

    for p in points:
        if p.frontier:
            assert not any(beats(q, p) for q in points if q is not p)
        else:
            assert any(beats(q, p) for q in points if q.frontier)
    assert (not pairs) or any(p.frontier for p in points)


def test_the_trace_measures_the_uniform_plans_and_points_along_the_path_and_answers_the_cheapest_pass() -> None:
    sizes = {0: 100.0, 1: 100.0, 2: 100.0}
    noise = {FOUR: 1e-3, APART: 2e-4, EIGHT: 1e-5, PLAIN_OPTION: 0.0}
    measure = _additive(noise)
    frontier = trace(sizes, [FOUR, EIGHT, APART], 2, LIMITS, measure, points=5)
    whats = [w for _, w in measure.seen]
    assert whats[:3] == ["uniform 4-bit g64", "uniform 8-bit g64", "uniform K8/V4 g64"]
    assert sum(w.startswith("frontier: path step") for w in whats) == len(frontier.points) - 3 > 0
    sources = [p.source for p in frontier.points]
    path_points = [p for p in frontier.points if p.source.startswith("path")]
    assert all(len(set(p.layers.values())) > 1 for p in path_points)  # uniform plans are measured once, above
    assert {"uniform 4-bit g64", "uniform 8-bit g64", "uniform K8/V4 g64"} <= set(sources)
    assert [p.bytes_per_token for p in frontier.points] == sorted(p.bytes_per_token for p in frontier.points)
    for p in frontier.points:  # each point is what was measured of its own plan
        assert p.mean == pytest.approx(sum(noise[o] for o in p.layers.values()))
        assert p.bytes_per_token == pytest.approx(sum(o.bytes_per_value(2) * sizes[i] for i, o in p.layers.items()))
    passing = [p for p in frontier.points if p.verdict == "pass"]
    assert frontier.answer is not None and frontier.answer.verdict == "pass"
    assert frontier.answer.bytes_per_token == min(p.bytes_per_token for p in passing)
    assert frontier.answer.frontier and frontier.succeeded  # no verification: the selection's pass stands in
    assert frontier.kv_config() == frontier.answer.kv_config()
    record = frontier.to_json()
    assert record["frontier"][record["answer"]]["kv_config"] == frontier.kv_config()
    assert json.loads(json.dumps(record)) == record


def test_a_budget_answers_the_least_drift_that_fits_and_none_when_nothing_fits() -> None:
    sizes = {0: 100.0, 1: 100.0}
    noise = {FOUR: 1e-3, APART: 2e-4, EIGHT: 1e-5}
    budget = APART.bytes_per_value(2) * 200  # uniform K8/V4 fits exactly; uniform 8-bit does not
    frontier = trace(sizes, [FOUR, EIGHT, APART], 2, LIMITS, _additive(noise), points=4, budget_bytes=budget)
    assert frontier.answer is not None and frontier.answer.bytes_per_token <= budget
    fits = [p for p in frontier.points if p.bytes_per_token <= budget]
    assert frontier.answer.mean_ci[1] == min(p.mean_ci[1] for p in fits)
    none = trace(sizes, [FOUR, EIGHT], 2, LIMITS, _additive(noise), points=2, budget_bytes=10.0)
    assert none.answer is None and not none.succeeded and "fits in 10 KV bytes" in none.notes[0]


def test_when_no_plan_passes_there_is_no_answer_and_the_note_says_what_to_widen() -> None:
    frontier = trace({0: 100.0}, [FOUR], 2, {"mean": 1e-9}, _additive({FOUR: 1e-3}), points=3)
    assert frontier.answer is None and not frontier.succeeded
    assert "--apart" in frontier.notes[0] and all(p.verdict != "pass" for p in frontier.points)


def test_a_failed_verification_is_no_success_whatever_the_selection_said() -> None:
    frontier = trace({0: 100.0}, [FOUR, EIGHT], 2, LIMITS, _additive({FOUR: 1e-2, EIGHT: 1e-5}), points=2)
    assert frontier.answer is not None and frontier.succeeded
    frontier.verification = {"verified": False, "verdicts": {"g::t": "fail"}}
    assert not frontier.succeeded
    assert any("NOT verified" in line for line in frontier_table(frontier))


def test_the_table_has_a_row_per_point_marks_the_answer_and_says_it_is_unverified() -> None:
    frontier = trace({0: 100.0, 1: 50.0}, [FOUR, EIGHT], 2, LIMITS, _additive({FOUR: 1e-3, EIGHT: 1e-5}), points=3)
    frontier.selection = 6
    lines = frontier_table(frontier)
    assert lines[0].startswith(f"frontier: {len(frontier.points)} plans measured on 6 selection sequences")
    rows = [line for line in lines if line.startswith("  ") and "g64" in line and "note" not in line]
    assert len(rows) == len(frontier.points)
    assert sum(row.startswith("  >") for row in rows) == 1
    assert sum(row[3] == "*" for row in rows) == sum(p.frontier for p in frontier.points)
    assert any("not verified (--no-verify)" in line for line in lines)


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (./dev test installs it)")
def test_the_frontier_page_plots_every_point_and_the_answer_in_a_real_browser(tmp_path: Path) -> None:
    frontier = trace(
        {0: 100.0, 1: 100.0}, [FOUR, EIGHT, APART], 2, LIMITS, _additive({FOUR: 1e-3, APART: 2e-4, EIGHT: 1e-5})
    )
    page_path = tmp_path / "kv_config.frontier.html"
    page_path.write_text(frontier_page(frontier))
    assert CHROMIUM is not None
    with Browser(CHROMIUM) as browser:
        page = browser.open(page_path)
        assert page.errors == []
        drawn = page.evaluate(
            """({points: document.querySelectorAll('figure[data-plot=frontier] circle.point').length,
                answer: document.querySelectorAll('circle.point.answer').length,
                beaten: document.querySelectorAll('circle.point.off').length,
                line: document.querySelectorAll('polyline.frontier').length,
                rows: document.querySelectorAll('table.frontier tr').length - 1,
                width: document.querySelector('figure[data-plot=frontier] svg').getBoundingClientRect().width})"""
        )
    assert drawn["points"] == drawn["rows"] == len(frontier.points)
    assert drawn["answer"] == 1 and drawn["beaten"] == sum(not p.frontier for p in frontier.points)
    assert drawn["line"] == 1 and drawn["width"] > 200


GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv", kv=True, ref="plain", cand=8, path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=24, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=5e-2)
"""


def test_a_frontier_on_a_real_model_measures_plans_apart_and_alike(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    import mlx_lm

    from pytest_mlxgate.explain.plan_frontier import Reach, search_frontier
    from pytest_mlxgate.explain.plan_gate import read_gate

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    path = tmp_path / "test_kv_gate.py"
    path.write_text(GATE)
    said: list[str] = []
    frontier = search_frontier(
        model, tokenizer, read_gate(path), Reach(8), bits=(2, 8), groups=(64,), selection=2, apart=True, say=said.append
    )
    assert frontier.selection == 2 and frontier.seconds > 0
    assert {"uniform 2-bit g64", "uniform 8-bit g64", "uniform K8/V2 g64"} <= {p.source for p in frontier.points}
    assert any(w.startswith("plan kv: frontier: path step") for w in said)
    by_source = {p.source: p for p in frontier.points}
    assert (
        by_source["uniform 2-bit g64"].mean > by_source["uniform K8/V2 g64"].mean > by_source["uniform 8-bit g64"].mean
    )
    assert any(p.frontier for p in frontier.points)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget-bytes", "100"], "--budget-bytes picks a plan from the frontier: add --frontier"),
        (["--frontier", "--points", "0"], "--points 0: give at least 1"),
        (["--frontier", "--budget-bytes", "0"], "--budget-bytes 0: give the KV bytes per token"),
    ],
)
def test_frontier_options_are_refused_by_name_before_any_load(tmp_path: Path, extra: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_mlxgate.cli", "plan", "kv", "--gate", str(tmp_path / "nope.py"), *extra],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_cli_writes_the_frontier_its_page_and_the_verified_answer(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    """`plan kv --frontier`: the table on stderr, every point in the search record, the page beside it, and
    --out written only once the gate passed the answer on its own prompts."""
    import os

    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "kv_config.json"
    command = [
        sys.executable, "-m", "pytest_mlxgate.cli", "plan", "kv", "--gate", str(gate),
        "--model", str(tiny_kv_model_dir), "--out", str(out), "--bits", "2,8", "--group-sizes", "64",
        "--selection", "2", "--frontier", "--points", "2",
    ]  # fmt: skip
    env = {**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    record = json.loads(out.with_suffix(".search.json").read_text())
    assert record["answer"] is not None, done.stderr
    answer = record["frontier"][record["answer"]]
    assert record["verification"]["verified"] is True and done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == answer["kv_config"] == record["kv_config"]
    assert "<svg" in out.with_suffix(".frontier.html").read_text()
    assert f"frontier: {len(record['frontier'])} plans measured on 2 selection sequences" in done.stderr
    assert "VERIFIED: passes the gate" in done.stderr
