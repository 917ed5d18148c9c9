"""--mlx-shard I/N: every module in exactly one shard, the same plan in any process (PYTHONHASHSEED varied),
balancing never worse than not balancing, durations from unsharded runs only; bad values are usage errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.config.shards import (
    Shard,
    module_durations,
    module_of,
    parse_shard,
    plan_shards,
    unbalanced,
)

ROOT = Path(__file__).resolve().parents[2]

_segment = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
_module = st.builds(lambda d, m: f"{d}/test_{m}.py", st.sampled_from(["gates", "gates/kv", "tests"]), _segment)
_modules = st.lists(_module, min_size=0, max_size=30, unique=True)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[str], dict[str, float], int]:
    modules = draw(_modules)
    timed = draw(st.lists(st.sampled_from(modules), unique=True)) if modules else []
    durations = {m: draw(st.floats(0, 1e4, allow_nan=False)) for m in timed}
    return modules, durations, draw(st.integers(1, 8))


def _loads(assignment: dict[str, int], weights: dict[str, float], count: int) -> list[float]:
    loads = [0.0] * count
    for module, shard in assignment.items():
        loads[shard] += weights[module]
    return loads


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_the_shards_partition_the_modules(case: tuple[list[str], dict[str, float], int]) -> None:
    modules, durations, count = case
    plan = plan_shards(modules, durations, count)
    shards = [plan.modules(Shard(i, count)) for i in range(1, count + 1)]
    kept = [m for shard in shards for m in shard]
    assert sorted(kept) == sorted(modules)  # each in exactly one shard, none left out
    assert plan.balanced == bool(durations)


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_balancing_never_makes_the_largest_shard_worse_than_the_unbalanced_split(
    case: tuple[list[str], dict[str, float], int],
) -> None:
    modules, durations, count = case
    if not durations:
        return
    plan = plan_shards(modules, durations, count)
    known = sorted(durations.values())
    n = len(known)
    median = known[n // 2] if n % 2 else (known[n // 2 - 1] + known[n // 2]) / 2
    weights = {m: durations.get(m, median) for m in modules}  # what the plan knows: the history, else the median
    assert max(_loads(plan.assignment, weights, count)) <= max(_loads(unbalanced(modules, count), weights, count))


def test_balancing_spreads_recorded_durations_where_the_node_id_split_would_not() -> None:
    modules = [f"gates/test_{i}.py" for i in range(6)]
    plain = unbalanced(modules, 2)
    heavy = [m for m in modules if plain[m] == 0]  # every module the plain split puts in shard 1 is the slow one
    durations = {m: 100.0 if m in heavy else 1.0 for m in modules}
    plan = plan_shards(modules, durations, 2)
    assert max(_loads(plain, durations, 2)) == 300.0
    assert max(_loads(plan.assignment, durations, 2)) == 200.0  # two slow ones together is the best there is
    assert {plan.assignment[m] for m in heavy} == {0, 1}


_PLAN_IN_A_SUBPROCESS = """
import json, sys
from pytest_mlxgate.config.shards import plan_shards
case = json.loads(sys.stdin.read())
plan = plan_shards(set(case["modules"]), case["durations"], case["count"])
print(json.dumps({"assignment": sorted(plan.assignment.items()), "digest": plan.digest}))
"""


@settings(max_examples=12, deadline=None)
@given(_cases(), st.integers(0, 2**32 - 1))
def test_the_plan_is_identical_in_a_fresh_process_whatever_its_hash_seed(
    case: tuple[list[str], dict[str, float], int], seed: int
) -> None:
    modules, durations, count = case
    here = plan_shards(modules, durations, count)
    out = subprocess.run(
        [sys.executable, "-c", _PLAN_IN_A_SUBPROCESS],
        cwd=ROOT,
        text=True,
        capture_output=True,
        input=json.dumps({"modules": modules[::-1], "durations": durations, "count": count}),
        env={**os.environ, "PYTHONHASHSEED": str(seed)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    there = json.loads(out.stdout)
    assert there == {"assignment": [list(p) for p in sorted(here.assignment.items())], "digest": here.digest}


def test_module_of_keeps_the_file_part_of_a_node_id() -> None:
    assert module_of("gates/test_kv.py::test_drift[8-bit]") == "gates/test_kv.py"
    assert module_of("gates/test_kv.py::Class::test") == "gates/test_kv.py"
    assert module_of("gates/test_kv.py") == "gates/test_kv.py"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2", "is not a shard: write I/N"),
        ("a/b", "is not a shard"),
        ("1/2/3", "is not a shard"),
        ("-1/2", "is not a shard"),
        ("0/2", "I counts from 1 to N, so with N=2 write 1/2 ... 2/2"),
        ("3/2", "I counts from 1 to N"),
        ("1/0", "N must be at least 1"),
        ("", "is not a shard"),
    ],
)
def test_parse_shard_refuses_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_shard(text)


def test_parse_shard() -> None:
    assert parse_shard(" 2/3 ") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    assert parse_shard("1/1") == Shard(1, 1)


def _row(run: str, started: str, nodeid: str, total: float | None, shard: bool = False) -> dict[str, object]:
    config = {"config": {"shard": {"index": 1, "count": 2}} if shard else {"gate": {}}}
    return {"run_id": run, "started": started, "nodeid": nodeid, "total_s": total, "config_json": json.dumps(config)}


def test_module_durations_take_each_modules_last_unsharded_run_and_count_shared_totals_once() -> None:
    rows = [
        _row("r1", "2026-01-01T00:00:00Z", "gates/test_a.py::test_drift", 10.0),
        _row("r2", "2026-01-02T00:00:00Z", "gates/test_a.py::test_drift", 20.0),
        _row("r2", "2026-01-02T00:00:00Z", "gates/test_a.py::test_memory", 20.0),  # the same shared measurement
        _row("r2", "2026-01-02T00:00:00Z", "gates/test_a.py::test_speed", 5.0),  # the module's speed gate
        _row("r3", "2026-01-03T00:00:00Z", "gates/test_a.py::test_drift", 99.0, shard=True),  # a shard: not counted
        _row("r1", "2026-01-01T00:00:00Z", "gates/test_b.py::test_drift", 7.0),
        _row("r2", "2026-01-02T00:00:00Z", "gates/test_c.py::test_drift", None),  # nothing recorded
        _row("r2", "2026-01-02T00:00:00Z", "mlxgate::capability_score", 1.0),
    ]
    assert module_durations(rows) == {"gates/test_a.py": 25.0, "gates/test_b.py": 7.0}


# --- in a pytest session ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mlx-shard", "0/2"], "*--mlx-shard: '0/2': I counts from 1 to N, so with N=2 write 1/2 ... 2/2*"),
        (["--mlx-shard=3/2"], "*--mlx-shard: '3/2': I counts from 1 to N*"),
        (["--mlx-shard", "1-2"], "*--mlx-shard: '1-2' is not a shard: write I/N*"),
        (["--mlx-shard", "1/0"], "*--mlx-shard: '1/0': N must be at least 1*"),
    ],
)
def test_bad_shards_are_usage_errors_with_the_fix(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_bad_ini_shard_is_a_usage_error_naming_the_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmlx_shard = 2\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*mlx_shard in *tox.ini: '2' is not a shard: write I/N*"])


def test_a_shard_keeps_whole_modules_and_reports_the_others_deselected(pytester: pytest.Pytester) -> None:
    for name in ("a", "b", "c", "d", "e"):
        pytester.makepyfile(**{f"test_{name}": "def test_one():\n    pass\n\ndef test_two():\n    pass\n"})
    pytester.makeini("[pytest]\n")
    seen: dict[str, set[str]] = {}
    for i in (1, 2, 3):
        result = pytester.runpytest_subprocess(f"--mlx-shard={i}/3", "--mlx-db=off", "-p", "no:randomly", "-v")
        result.stdout.fnmatch_lines([f"mlxgate: shard {i}/3: * of 5 modules, no recorded durations: split by node id"])
        passed = {line.split("::")[0] for line in result.stdout.lines if " PASSED" in line}
        outcomes = result.parseoutcomes()
        assert outcomes["passed"] == 2 * len(passed) and outcomes.get("deselected", 0) == 10 - 2 * len(passed)
        seen[str(i)] = passed
    assert sorted(m for ms in seen.values() for m in ms) == [f"test_{n}.py" for n in "abcde"]


def test_an_empty_shard_passes_and_still_writes_its_report(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_only="def test_one():\n    pass\n")
    pytester.makeini("[pytest]\n")
    reports = [tmp_path / f"{i}.json" for i in (1, 2)]
    results = [
        pytester.runpytest_subprocess(f"--mlx-shard={i}/2", "--mlx-db=off", f"--mlx-report={reports[i - 1]}")
        for i in (1, 2)
    ]
    empty = next(i for i, r in enumerate(results) if "0 of 1 modules" in r.stdout.str())
    assert results[empty].ret == pytest.ExitCode.OK and results[1 - empty].ret == pytest.ExitCode.OK
    results[1 - empty].assert_outcomes(passed=1)
    doc = json.loads(reports[empty].read_text())
    assert doc["gates"] == [] and doc["run"]["config"]["shard"]["modules"] == []
    full = json.loads(reports[1 - empty].read_text())["run"]["config"]["shard"]
    assert full["modules"] == ["test_only.py"] and full["plan"] == doc["run"]["config"]["shard"]["plan"]
