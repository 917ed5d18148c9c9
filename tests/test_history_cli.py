"""`mlxgate history | compare | report | merge` on real results: one unsharded pytest run on the tiny model,
the same gates as shards 1/2 and 2/2, all into the default results DB, then one run built with the
ResultsDB API from the real records with a gate gone from pass to fail (the regression `compare` must
find). The merged shards must give the unsharded run's gates; `report` must give its JSON report back
byte for byte."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.cli import main
from pytest_mlxgate.history_cli import CliError, match_gates, resolve_run
from pytest_mlxgate.results.history import ResultsDB
from pytest_mlxgate.results.json_report import REPORT_VERSION
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import RunInfo
from pytest_mlxgate.results.summary import summary_lines

PERTURB = """
import mlx.core as mx

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    return _fused(x, weight * 1.02, eps)
"""

DRIFT = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=3, tokens=24),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1.0, top1=0.2)
"""

NEUTRAL = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-9, max=1e-9)
"""

KV = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=2, tokens=24, decode=4),
    pytest.mark.mlx_speed(contexts=(16,), decode=2, repetitions=3),
]


def test_drift(paired):
    assert_kl_below(paired, mean=10.0)


def test_memory(paired):
    assert_smaller(paired, kv=0.5)
"""

GATES = [
    "test_drift.py::test_drift",
    "test_kv.py::test_drift",
    "test_kv.py::test_memory",
    "test_neutral.py::test_drift",
]


@dataclass(frozen=True)
class Runs:
    root: Path  # where pytest ran: its rootdir, so the default DB is root/.mlxgate/results.sqlite
    db: Path
    full: Path  # the unsharded run's JSON report
    shards: tuple[Path, Path]
    regressed_run: str  # the API-built run after them: test_drift.py::test_drift failed

    def doc(self, path: Path) -> dict[str, Any]:
        return json.loads(path.read_text())


def _pytest(root: Path, model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--mlx-candidate={model}",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_kv_model_dir: Path) -> Runs:
    root = tmp_path_factory.mktemp("history")
    (root / "tox.ini").write_text("[pytest]\n")
    (root / "perturb.py").write_text(PERTURB)
    for name, text in (("test_drift", DRIFT), ("test_neutral", NEUTRAL), ("test_kv", KV)):
        (root / f"{name}.py").write_text(text)
    (root / ".gitignore").write_text("*.json\n.mlxgate/\n__pycache__/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "gates"]):  # a commit for the rows to name
        subprocess.run([*git, *args], cwd=root, check=True, capture_output=True)
    full = root / "full.json"
    out = _pytest(root, tiny_kv_model_dir, f"--mlx-report={full}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    shards = (root / "s1.json", root / "s2.json")
    for i, report in enumerate(shards, 1):  # planned from the full run's durations, the same for both
        out = _pytest(root, tiny_kv_model_dir, f"--mlx-shard={i}/2", f"--mlx-report={report}")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert f"mlxgate: shard {i}/2: " in out.stdout and "balanced by recorded durations (3 of 3" in out.stdout
    db = root / ".mlxgate" / "results.sqlite"  # the default: no --mlx-db above
    doc = json.loads(full.read_text())
    records = copy.deepcopy(doc["gates"])
    for record in records:
        record["time"] = "2099-01-01T00:00:00Z"
        if record["nodeid"] == "test_drift.py::test_drift":
            record["verdict"] = "fail"
            stats = record["stats"]
            stats["mean"], stats["mean_ci"] = stats["mean"] * 10, [x * 10 for x in stats["mean_ci"]]
    run = RunInfo(**{**doc["run"], "run_id": "f" * 32, "started": "2099-01-01T00:00:00Z", "code_commit": "c" * 40})
    ResultsDB(db).append(run, [parse_record(r) for r in records])
    return Runs(root, db, full, shards, run.run_id)


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # the summary's width, as on a 120-column terminal


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_report_gives_the_runs_json_report_back_byte_for_byte(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = runs.doc(runs.full)
    again = tmp_path / "again.json"
    code, out, err = cli(capsys, "report", full["run"]["run_id"][:10], f"--db={runs.db}", f"--json={again}")
    assert (code, err) == (0, "")
    assert again.read_bytes() == runs.full.read_bytes()  # the history keeps the whole record and the whole run
    lines = out.splitlines()
    assert lines[0].startswith(f"mlxgate run {full['run']['run_id'][:8]} · started ")
    assert lines[1:-1] == summary_lines(
        [parse_record(g) for g in full["gates"]], width=120
    )  # the table pytest printed at the end
    assert lines[-1] == f"mlxgate: JSON report → {again}"


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_report_of_a_json_report_and_of_latest(
    runs: Runs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = cli(capsys, "report", str(runs.full))
    assert code == 0 and f"from {runs.full}" in out.splitlines()[0]
    monkeypatch.chdir(runs.root)  # the default DB: the one pytest wrote under its rootdir
    code, out, _ = cli(capsys, "report", "latest")
    assert code == 0 and out.startswith(f"mlxgate run {runs.regressed_run[:8]} ")
    assert "test_drift::test_drift" in out and "FAIL" in out


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_history_shows_each_gate_by_commit_and_time(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "history", f"--db={runs.db}")
    assert (code, err) == (0, "")
    print(out, file=sys.stderr)  # for the record: what it looks like
    blocks = {line.split("  (")[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert sorted(blocks) == GATES
    # each gate: the full run, the one shard that ran it, the API-built run
    assert all(line.endswith("(3 runs)") for line in blocks.values()), blocks
    lines = out.splitlines()
    at = lines.index(blocks["test_kv.py::test_drift"])
    header = lines[at + 1]  # a column no run of the gate fills is left out: this gate has them all
    for column in ("run", "commit", "verdict", "mean KL [95% interval]", "top-1 (lower)", "decode", "KV"):
        assert column in header
    at = lines.index(blocks["test_drift.py::test_drift"])
    drift = lines[at + 2 : at + 5]
    assert [row.split()[4] for row in drift] == ["pass", "pass", "fail"] and drift[2].split()[3] == "ccccccc"
    commit = runs.doc(runs.full)["run"]["code_commit"]
    assert drift[0].split()[3] == commit[:7] and runs.doc(runs.full)["run"]["code_dirty"] is False
    memory = lines[lines.index(blocks["test_kv.py::test_memory"]) + 2]
    assert "×" in memory and "×0.2" in memory  # decode ratio with its interval, KV 8-bit vs float (×0.25..0.3)


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_history_of_one_gate_by_the_end_of_its_node_id_and_last(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "history", "test_drift.py::test_drift", "--last", "1", f"--db={runs.db}")
    assert code == 0
    assert out.splitlines()[0] == "test_drift.py::test_drift  (last 1 of 3 runs)" and len(out.splitlines()) == 3
    code, out, _ = cli(capsys, "history", "test_kv.py", f"--db={runs.db}")  # a module: its gates
    assert code == 0 and [line.split("  (")[0] for line in out.splitlines() if not line.startswith(" ")] == [
        "test_kv.py::test_drift",
        "test_kv.py::test_memory",
    ]
    code, _, err = cli(capsys, "history", "test_nothing", f"--db={runs.db}")
    assert code == 2 and "no gate 'test_nothing' in the results history" in err and "test_kv.py::test_memory" in err


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_compare_finds_the_regression_and_exits_1(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    full_id = runs.doc(runs.full)["run"]["run_id"]
    code, out, err = cli(capsys, "compare", full_id[:8], "latest", f"--db={runs.db}")
    print(out, file=sys.stderr)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"A: run {full_id[:8]}") and lines[1].startswith("B: run ffffffff  started 2099-01-01")
    at = lines.index("test_drift.py::test_drift  pass → fail  REGRESSION")
    kl = lines[at + 1]
    assert kl.lstrip().startswith("mean KL") and " → " in kl and "Δ +" in kl
    assert "test_kv.py::test_memory  pass" in lines
    assert any(line.lstrip().startswith("decode") and "Δ +0.00" in line for line in lines)
    assert any(line.lstrip().startswith("KV") and "Δ +0.000" in line for line in lines)
    assert lines[-1] == (
        "4 gate(s) in both runs, 1 changed verdict; 1 regression(s) (pass → fail or error): test_drift.py::test_drift"
    )
    code, out, _ = cli(capsys, "compare", "latest", full_id, f"--db={runs.db}")  # fail -> pass is no regression
    assert code == 0 and out.splitlines()[-1].endswith("no regression (pass → fail or error)")


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_compare_json_reports_lists_gates_in_one_run_only(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    s1, s2 = (runs.doc(p) for p in runs.shards)
    code, out, _ = cli(capsys, "compare", str(runs.shards[0]), str(runs.shards[1]))
    assert code == 0
    only_a = next(line for line in out.splitlines() if line.startswith("only in A: "))
    only_b = next(line for line in out.splitlines() if line.startswith("only in B: "))
    assert only_a == "only in A: " + ", ".join(f"{g['nodeid']} (pass)" for g in s1["gates"])
    assert only_b == "only in B: " + ", ".join(f"{g['nodeid']} (pass)" for g in s2["gates"])
    code, out, _ = cli(capsys, "compare", str(runs.full), "latest~0", f"--db={runs.db}")  # a report vs a DB run
    assert code == 1


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_merged_shards_are_the_unsharded_runs_gates(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s1, s2 = (runs.doc(p) for p in runs.shards)
    assert s1["run"]["config"]["shard"]["plan"] == s2["run"]["config"]["shard"]["plan"]  # planned alike
    assert {g["nodeid"] for g in s1["gates"]}.isdisjoint(g["nodeid"] for g in s2["gates"])
    assert all("--mlx-shard" not in g["rerun"] for g in s1["gates"] + s2["gates"])  # a re-run finds its gate
    merged, db = tmp_path / "merged.json", tmp_path / "merged.sqlite"
    code, out, err = cli(capsys, "merge", *map(str, runs.shards), f"--json={merged}", f"--db={db}")
    assert (code, err) == (0, ""), err
    doc = json.loads(merged.read_text())
    full = runs.doc(runs.full)
    assert doc["mlxgate_report"] == REPORT_VERSION
    assert [(g["nodeid"], g["verdict"]) for g in doc["gates"]] == [(g["nodeid"], g["verdict"]) for g in full["gates"]]
    assert doc["run"]["code_commit"] == full["run"]["code_commit"]
    assert [m["shard"] for m in doc["run"]["config"]["merged"]] == ["1/2", "2/2"]
    assert not any(a.startswith("--mlx-shard") for a in doc["run"]["argv"])
    assert f"mlxgate: JSON report → {merged}" in out and f"mlxgate: 4 row(s) → {db} (quality_runs)" in out
    (entry,) = ResultsDB(db).runs()
    assert entry["run_id"] == doc["run"]["run_id"] and entry["gates"] == 4
    code, out, _ = cli(capsys, "merge", *map(str, runs.shards), f"--db={db}")  # the same shards again: no new rows
    assert code == 0 and "is already in" in out and len(ResultsDB(db).rows()) == 4


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_the_console_script_exit_codes(runs: Runs) -> None:
    def mlxgate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_mlxgate.cli", *args],
            cwd=runs.root,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert mlxgate("history").returncode == 0  # the default DB under the rootdir
    assert mlxgate("compare", "latest~3", "latest").returncode == 1  # the full run, then the regressed one
    bad = mlxgate("compare", "latest~9", "latest")
    assert bad.returncode == 2 and "holds 4 run(s), so latest~3 is the oldest" in bad.stderr
    bad = mlxgate("report", "0123")
    assert bad.returncode == 2 and "no run '0123' in the results history; the latest: ffffffff" in bad.stderr
    assert mlxgate("history", "--last", "-1").returncode == 2  # argparse: usage


# --- without a pytest session -------------------------------------------------------------------------


def test_resolve_run_latest_back_and_prefixes() -> None:
    runs = [
        {"run_id": rid, "started": f"2026-12-0{i}T00:00:00Z"} for i, rid in enumerate(("abc111", "abc222", "def333"), 1)
    ]
    assert resolve_run(runs, "latest")["run_id"] == "def333"
    assert resolve_run(runs, "latest~2")["run_id"] == "abc111"
    assert resolve_run(runs, "ABC2")["run_id"] == "abc222"
    for spec, message in (
        ("abc", "'abc' starts 2 run ids: abc111, abc222; give more of it"),
        ("latest~3", "holds 3 run(s), so latest~2 is the oldest"),
        ("latest~x", "write latest, latest~1"),
        ("", "no run ''"),
        ("zzz", "no run 'zzz' in the results history; the latest: def333"),
    ):
        with pytest.raises(CliError, match=re.escape(message)):
            resolve_run(runs, spec)
    with pytest.raises(CliError, match="no runs yet"):
        resolve_run([], "latest")


def test_match_gates_by_node_id_its_end_module_or_name() -> None:
    ids = [
        "gates/test_kv.py::test_drift",
        "gates/test_kv.py::test_memory",
        "gates/sub/test_attn.py::test_drift",
        "mlxgate::capability_score",
    ]
    names = {"gates/test_kv.py::test_drift": "test_kv::test_drift"}
    assert match_gates(ids, "gates/test_kv.py::test_drift") == ids[:1]
    assert match_gates(ids, "test_kv.py::test_drift") == ids[:1]
    assert match_gates(ids, "test_drift") == [ids[0], ids[2]]  # every module's test_drift
    assert match_gates(ids, "test_kv.py") == ids[:2] and match_gates(ids, "sub/test_attn.py") == ids[2:3]
    assert match_gates(ids, "test_kv::test_drift", names) == ids[:1]
    assert match_gates(ids, "drift") == [] and match_gates(ids, "kv.py") == []  # only whole parts
    assert match_gates(ids, "capability_score") == ids[3:]


def _capability_record(cand: float, verdict: str) -> dict[str, Any]:
    return {
        "nodeid": "gates/test_cap.py::test_mmlu",
        "gate": "test_cap::test_mmlu",
        "mode": "capability",
        "verdict": verdict,
        "time": "2026-12-01T00:00:00Z",
        "stats": {"n_prompts": 20},
        "tasks": {
            "mmlu": {"ref_score": 0.5, "cand_score": cand, "n": 20},
            "gsm8k": {"ref_score": 0.25, "cand_score": 0.25, "n": 20},
        },
    }


def test_history_and_compare_show_capability_per_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = ResultsDB(tmp_path / "h.sqlite")
    for i, (cand, verdict) in enumerate(((0.5, "pass"), (0.35, "fail")), 1):
        run = RunInfo(
            run_id=str(i) * 32,
            started=f"2026-12-0{i}T00:00:00Z",
            code_commit="ab"[i - 1] * 40,
            code_dirty=True,
            argv=[],
            config={},
            machine={},
        )
        db.append(run, [parse_record(_capability_record(cand, verdict))])
    code, out, _ = cli(capsys, "history", "test_cap.py::test_mmlu", f"--db={tmp_path / 'h.sqlite'}")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["when", "(UTC)", "run", "commit", "verdict", "capability", "ref", "→", "cand"]
    assert lines[2].endswith("aaaaaaa+  pass     gsm8k 25.0% → 25.0%, mmlu 50.0% → 50.0%")
    assert lines[3].endswith("bbbbbbb+  fail     gsm8k 25.0% → 25.0%, mmlu 50.0% → 35.0%")
    code, out, _ = cli(capsys, "compare", "1111", "2222", f"--db={tmp_path / 'h.sqlite'}")
    assert code == 1
    assert "  mmlu   ref → cand 50.0% → 50.0% vs 50.0% → 35.0%   Δ cand − ref -15.0 points" in out.splitlines()
    assert "  gsm8k  ref → cand 25.0% → 25.0% vs 25.0% → 25.0%   Δ cand − ref +0.0 points" in out.splitlines()


def test_commands_without_a_history_say_where_they_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tox.ini").write_text("[pytest]\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # the rootdir is where pytest would put it: the ini's folder
    for args in (["history"], ["compare", "latest~1", "latest"], ["report", "latest"]):
        code, _, err = cli(capsys, *args)
        assert code == 2
        assert err == (
            f"mlxgate: error: no results history at {tmp_path / '.mlxgate' / 'results.sqlite'} (the "
            "default: .mlxgate/results.sqlite under pytest's rootdir here); run the gates first (pytest "
            "gates/), or pass --db PATH (the file --mlx-db wrote)\n"
        )


@pytest.mark.slow  # the three pytest sessions of `runs`
def test_report_and_merge_write_the_html_report_with_the_history_as_it_stood(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, last = tmp_path / "first.html", tmp_path / "last.html"
    code, out, _ = cli(capsys, "report", "latest~3", f"--db={runs.db}", f"--html={first}")
    assert code == 0 and out.splitlines()[-1] == f"mlxgate: HTML report → {first}"
    code, _, _ = cli(capsys, "report", "latest", f"--db={runs.db}", f"--html={last}")
    assert code == 0
    page_first, page_last = first.read_text(), last.read_text()
    assert page_first.startswith("<!DOCTYPE html>") and all(g.split("::")[0] in page_first for g in GATES)
    # the full run was each gate's first: then no earlier run; the latest one has three to draw
    assert page_first.count("no earlier runs of this gate in the results DB yet") == len(GATES)
    assert "no earlier runs" not in page_last and page_last.count("The last 3 runs of this gate") == len(GATES)
    merged = tmp_path / "merged.html"
    code, out, _ = cli(capsys, "merge", *map(str, runs.shards), f"--html={merged}", f"--db={tmp_path / 'm.sqlite'}")
    assert code == 0 and f"mlxgate: HTML report → {merged}" in out and merged.read_text().startswith("<!DOCTYPE")
