"""gates: the main job, `./dev gates`, timed per gate and per phase, cold and cached, beside another commit.

Each run is `pytest gates/ --mlx-offline -n WORKERS` in a fresh process, exactly what `./dev gates`
runs (the worker count read from `dev`, MLXGATE_GATES_WORKERS as there), with its own reference cache
folder: *cold* starts from an empty one (every reference arm and capability reference computed),
*cached* runs again over what the cold run stored. With `--against REV` (default: the commit before
HEAD; `none`: this tree only) REV's tree is checked out in a temporary worktree and run the same way,
interleaved (this tree cold, REV cold, REV cached, this tree cached), so both see the same machine.
Per gate: the wall time pytest measured (setup, call and teardown), and from the records' `phases`
(session/phases.py) the seconds of load, reference, candidate, speed, capability (and check,
explain); a tree whose records carry no phases shows only the totals. Verdicts of the two trees are
compared gate by gate: a speed-up that changes a verdict is no speed-up.

Goals (issue 23): cached <= 5 min, cold <= 8 min; speed beside drift costs a gate <= 1.3x its KL arms
(from the phases: (reference + candidate + speed) / (reference + candidate), per module; under two
workers a module's KL arms share the cores with another module's, so the ratio reads lower than in
one process would: the speed column's sum is the plainer figure). Figures go to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import REPO_ROOT, header, verdict

GOALS_S = {"cold": 8 * 60.0, "cached": 5 * 60.0}
OVERHEAD_GOAL = 1.3  # a gate with speed beside its drift / the same gate without
PHASE_COLUMNS = ("load", "check", "reference", "candidate", "speed", "capability", "explain")


@dataclass
class SuiteRun:
    """One `pytest gates/` run of one tree: its wall time, exit status, and per gate (node id) the wall
    time, the outcome, the verdict and the phases."""

    tree: str
    state: str  # cold | cached
    wall_s: float
    returncode: int
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "tree": self.tree,
            "state": self.state,
            "wall_s": round(self.wall_s, 1),
            "returncode": self.returncode,
            "tests": self.tests,
        }


def dev_gates_workers(dev_script: Path = REPO_ROOT / "dev") -> int:
    """The xdist workers `./dev gates` runs with: MLXGATE_GATES_WORKERS, else the script's default
    (read from it, so the benchmark times what the main job runs, not a copy of its settings)."""
    found = re.search(r"MLXGATE_GATES_WORKERS:-([0-9]+)", dev_script.read_text(encoding="utf-8"))
    if found is None:
        raise SystemExit(f"{dev_script}: no MLXGATE_GATES_WORKERS default in its gates command; say here what it runs")
    return int(os.environ.get("MLXGATE_GATES_WORKERS", found.group(1)))


def workers_args(workers: int) -> list[str]:
    """pytest's arguments for that many workers, as `./dev gates` passes them (0: no xdist)."""
    return ["-n", str(workers)] if workers else []


def run_suite(tree: Path, label: str, state: str, cache: Path, extra: list[str], work: Path) -> SuiteRun:
    """`python -m pytest gates/ --mlx-offline -n WORKERS` in `tree` (its own package first on the path), timed."""
    slug = label.replace(" ", "-")
    report, junit = work / f"{slug}-{state}.json", work / f"{slug}-{state}.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    imported = subprocess.run(
        [sys.executable, "-c", "import pytest_mlxgate; print(pytest_mlxgate.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(
            f"{label}: pytest_mlxgate imports from {imported}, not from {tree}: the comparison would be void"
        )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "gates/",
        "--mlx-offline",
        *workers_args(dev_gates_workers()),
        f"--mlx-reference-cache={cache}",
        f"--mlx-report={report}",
        "--mlx-db=off",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-q",
        *extra,
    ]
    print(f"[{label} {state}] {' '.join(cmd[3:])}  (in {tree})", flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (work / f"{slug}-{state}.log").write_text(done.stdout + done.stderr)
    run = SuiteRun(label, state, wall, done.returncode)
    run.tests = _tests(junit, report)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    print(f"[{label} {state}] {wall:.0f} s, exit {done.returncode}: {last}", flush=True)
    return run


def _tests(junit: Path, report: Path) -> dict[str, dict[str, Any]]:
    tests: dict[str, dict[str, Any]] = {}
    if junit.is_file():
        for case in ET.parse(junit).iter("testcase"):
            path = case.get("classname", "").replace(".", "/")
            nodeid = f"{path}.py::{case.get('name')}"
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
            tests[nodeid] = {"wall_s": float(case.get("time") or 0.0), "outcome": outcome}
    if report.is_file():
        for record in json.loads(report.read_text()).get("gates", []):
            entry = tests.setdefault(record["nodeid"], {"wall_s": None, "outcome": None})
            entry["verdict"] = record.get("verdict")
            entry["phases"] = record.get("phases")
            entry["reference_source"] = record.get("reference_source")
    return tests


def _worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(where), rev], check=True)
    return where


def _print_table(runs: list[SuiteRun]) -> None:
    nodeids = sorted({n for r in runs for n in r.tests})
    labels = [f"{r.tree} {r.state}" for r in runs]
    width = max(len(n) for n in nodeids) if nodeids else 10
    print(f"{'gate':<{width}}  " + "  ".join(f"{lab:>16}" for lab in labels))
    for nodeid in nodeids:
        cells = []
        for r in runs:
            t = r.tests.get(nodeid)
            cells.append(
                f"{'—':>16}" if t is None or t.get("wall_s") is None else f"{t['wall_s']:>9.1f} s {_mark(t):>4}"
            )
        print(f"{nodeid:<{width}}  " + "  ".join(cells))
    print(f"{'whole run':<{width}}  " + "  ".join(f"{r.wall_s:>9.1f} s exit{r.returncode}" for r in runs))


def _mark(test: dict[str, Any]) -> str:
    return {"pass": "pass", "fail": "FAIL", "inconclusive": "inc", "measured": "meas"}.get(
        str(test.get("verdict")),
        {"skipped": "skip", "failed": "FAIL", "error": "ERR"}.get(str(test.get("outcome")), ""),
    )


def _print_phases(run: SuiteRun) -> None:
    header(f"where the time goes: {run.tree}, {run.state} (seconds per phase, from the records)")
    rows = {n: t["phases"] for n, t in run.tests.items() if t.get("phases") is not None}
    if not rows:
        print("(this tree's records carry no phases)")
        return
    width = max(len(n) for n in rows)
    print(f"{'gate':<{width}}  " + "".join(f"{p:>11}" for p in PHASE_COLUMNS) + f"{'other':>9}")
    totals = dict.fromkeys(PHASE_COLUMNS, 0.0)
    for nodeid in sorted(rows):
        phases = rows[nodeid]
        for p in PHASE_COLUMNS:
            totals[p] += float(phases.get(p, 0.0))
        wall = run.tests[nodeid].get("wall_s") or 0.0
        other = wall - sum(float(v) for v in phases.values())
        print(
            f"{nodeid:<{width}}  "
            + "".join(f"{float(phases[p]):>11.1f}" if p in phases else f"{'·':>11}" for p in PHASE_COLUMNS)
            + f"{other:>9.1f}"
        )
    print(f"{'sum':<{width}}  " + "".join(f"{totals[p]:>11.1f}" for p in PHASE_COLUMNS))


def _speed_overhead(run: SuiteRun) -> list[float]:
    """Per module that measured speed beside its KL arms: (KL arms + speed) / KL arms, from its records' phases."""
    modules: dict[str, dict[str, float]] = {}
    for nodeid, test in run.tests.items():
        for phase, seconds in (test.get("phases") or {}).items():
            totals = modules.setdefault(nodeid.split("::")[0], {})
            totals[phase] = totals.get(phase, 0.0) + float(seconds)
    ratios = []
    for module, totals in sorted(modules.items()):
        kl = totals.get("reference", 0.0) + totals.get("candidate", 0.0)
        if kl > 0 and totals.get("speed"):
            ratio = (kl + totals["speed"]) / kl
            ratios.append(ratio)
            print(f"  {module}: KL arms {kl:.1f} s, speed {totals['speed']:.1f} s: {ratio:.2f}x")
    return ratios


def _compare_verdicts(a: SuiteRun, b: SuiteRun) -> bool:
    """True when every gate both runs have ends the same way (verdict, else outcome)."""
    same = True
    for nodeid in sorted(set(a.tests) & set(b.tests)):
        va, vb = (_mark(t.tests[nodeid]) for t in (a, b))
        if va != vb:
            same = False
            print(f"  verdict differs: {nodeid}: {a.tree} {va} vs {b.tree} {vb}")
    only = sorted(set(a.tests) ^ set(b.tests))
    if only:
        print(f"  in one run only: {', '.join(only)}")
    return same


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gates")
    parser.add_argument("--against", default="HEAD~1", help="a commit to run side by side, or 'none'")
    parser.add_argument("--only", choices=("cold", "cached"), help="one state only (cached runs a cold one first)")
    parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="mlxgate-bench-gates-"))
    trees: list[tuple[str, Path]] = [("this tree", REPO_ROOT)]
    against = None if args.against == "none" else args.against
    if against is not None:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", against], capture_output=True, text=True, check=True
        ).stdout.strip()
        trees.append((rev, _worktree(rev, work / "rev")))
    runs: list[SuiteRun] = []
    try:
        caches = {label: work / f"cache-{i}" for i, (label, _) in enumerate(trees)}
        order = trees + trees[::-1]  # ABBA: this tree cold, REV cold, REV cached, this tree cached
        for i, (label, tree) in enumerate(order):
            state = "cold" if i < len(trees) else "cached"
            if args.only == "cold" and state == "cached":
                continue
            run = run_suite(tree, label, state, caches[label], args.pytest_args, work)
            if not (args.only == "cached" and state == "cold"):
                runs.append(run)
    finally:
        if against is not None:
            subprocess.run(
                ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(work / "rev")], check=False
            )

    header("gates: wall time per gate (pytest's setup + call + teardown) and each run's whole")
    _print_table(runs)
    for run in runs:
        _print_phases(run)
    header("goals")
    for run in runs:
        if run.tree == "this tree":
            goal = GOALS_S[run.state]
            print(f"{run.state}: {run.wall_s:.0f} s — goal <= {goal:.0f} s: {verdict(run.wall_s <= goal)}")
    for run in runs:
        if run.tree == "this tree":
            print(f"speed overhead in a gate ({run.state}; goal <= {OVERHEAD_GOAL}x):")
            ratios = _speed_overhead(run)
            if ratios:
                worst = max(ratios)
                print(
                    f"  median {statistics.median(ratios):.2f}x, worst {worst:.2f}x: {verdict(worst <= OVERHEAD_GOAL)}"
                )
    by = {(r.tree, r.state): r for r in runs}
    for state in ("cold", "cached"):
        mine = by.get(("this tree", state))
        theirs = next((r for (t, s), r in by.items() if s == state and t != "this tree"), None)
        if mine is not None and theirs is not None:
            print(f"{state}: this tree / {theirs.tree} = {mine.wall_s / theirs.wall_s:.2f}x")
            print(f"{state}: verdicts the same: {_compare_verdicts(mine, theirs)}")
    if args.out is not None:
        args.out.write_text(json.dumps([r.to_json() for r in runs], indent=1))
        print(f"figures: {args.out}")
    shutil.rmtree(work, ignore_errors=True)
