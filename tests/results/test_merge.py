"""`mlxgate merge`: the worst verdict of a gate wins (error > fail > inconclusive > pass), one commit or no
merge, every shard of a plan or no merge, nothing a plan lists vanishes (a module without a record, an
interrupted shard, an unknown verdict fail the merge), the Capability Score made again over all shards,
exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.cli import main
from pytest_mlxgate.results.json_report import write_json_report
from pytest_mlxgate.results.merge import MergeError, merge_reports, read_report, worst
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import RunInfo

COMMIT = "a" * 40


def run_info(
    run_id: str,
    *,
    commit: str | None = COMMIT,
    shard: tuple[int, int] | None = None,
    plan: str = "p1",
    started: str = "2026-12-01T10:00:00Z",
    inconclusive: str = "fail",
    modules: list[str] | None = None,
    total_modules: int | None = None,
    **facts: Any,
) -> RunInfo:
    config: dict[str, Any] = {
        "candidate": "smollm2-135m",
        "gate": {"shard": None, "inconclusive": inconclusive},
        **facts,
    }
    argv = ["gates"]
    if shard is not None:
        config["shard"] = {"index": shard[0], "count": shard[1], "plan": plan, "modules": modules or []}
        if total_modules is not None:
            config["shard"]["total_modules"] = total_modules
        config["gate"]["shard"] = f"{shard[0]}/{shard[1]}"
        argv += ["--mlx-shard", f"{shard[0]}/{shard[1]}", f"--mlx-shard={shard[0]}/{shard[1]}"]
    return RunInfo(
        run_id=run_id,
        started=started,
        code_commit=commit,
        code_dirty=False,
        argv=argv,
        config=config,
        machine={"device": "cpu", "mlx": "0.32"},
    )


#: A mean KL check of each verdict, its interval [5e-5, 2e-4] against a limit that interval shows it.
CHECKS = {
    "pass": 1e-3,  # the interval inside the limit
    "fail": 1e-5,  # the interval wholly beyond it
    "inconclusive": 1e-4,  # the limit inside the interval
}


def mean_check(verdict: str, **more: Any) -> dict[str, Any]:
    return {
        "metric": "mean KL",
        "key": "mean",
        "value": 1e-4,
        "lower": 5e-5,
        "upper": 2e-4,
        "limit": CHECKS.get(verdict, 1e-3),
        "direction": "max",
        "verdict": verdict,
        "n": 16,
        "n_needed": None,
        "method": "95% interval over prompts",
        **more,
    }


def record(nodeid: str, verdict: str = "pass", **more: Any) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "gate": nodeid.replace(".py", ""),
        "mode": "gate",
        "verdict": verdict,
        "time": "2026-12-01T10:01:00Z",
        "stats": {"mean": 1e-4, "mean_ci": [5e-5, 2e-4]},
        "checks": [mean_check(verdict)] if verdict in CHECKS else [],
        **more,
    }


def capability(nodeid: str, task: str, ref: float, cand: float) -> dict[str, Any]:
    return record(nodeid, mode="capability", tasks={task: {"ref_score": ref, "cand_score": cand, "n": 10}})


def write(path: Path, run: RunInfo, records: list[dict[str, Any]]) -> Path:
    write_json_report(path, run, [parse_record(r) for r in records])
    return path


def test_worst_verdict_wins_fail_over_inconclusive_over_pass() -> None:
    for verdicts, expected in (
        (["pass", "fail"], "fail"),
        (["inconclusive", "pass"], "inconclusive"),
        (["inconclusive", "fail"], "fail"),
        (["fail", "inconclusive", "pass"], "fail"),
        (["pass", "pass"], "pass"),
        (["pass", "measured"], "measured"),
        (["error", "fail"], "error"),
    ):
        records = [parse_record(record("t.py::g", v)) for v in verdicts]
        assert worst(records).verdict == expected
        assert worst(records[::-1]).verdict == expected


def test_a_gate_in_two_shards_keeps_its_worst_record_and_says_so(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", run_info("1" * 32), [record("t.py::g", "pass"), record("a.py::x")])
    b = write(tmp_path / "b.json", run_info("2" * 32), [record("t.py::g", "inconclusive", marker="b")])
    merged = merge_reports([read_report(a), read_report(b)])
    kept = {r.nodeid: r for r in merged.records}
    assert sorted(kept) == ["a.py::x", "t.py::g"]
    assert kept["t.py::g"].verdict == "inconclusive" and kept["t.py::g"].to_json().get("marker") == "b"
    (note,) = merged.notes
    assert note.startswith("t.py::g is in 2 reports (pass in ") and note.endswith("kept the worst, inconclusive")


def test_reports_of_different_commits_do_not_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a.json", run_info("1" * 32), [record("a.py::x")])
    b = write(tmp_path / "b.json", run_info("2" * 32, commit="b" * 40), [record("b.py::x")])
    assert main(["merge", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mlxgate: error: the reports ran different code ({a} at aaaaaaaaaaaa; {b} at bbbbbbbbbbbb)")
    assert "Re-run the shards on one commit" in err


def test_shards_must_all_be_there_once_and_planned_alike(tmp_path: Path) -> None:
    s1 = read_report(write(tmp_path / "1.json", run_info("1" * 32, shard=(1, 3)), [record("a.py::x")]))
    s2 = read_report(write(tmp_path / "2.json", run_info("2" * 32, shard=(2, 3)), [record("b.py::x")]))
    s3 = read_report(write(tmp_path / "3.json", run_info("3" * 32, shard=(3, 3)), []))  # an empty shard counts
    other = read_report(write(tmp_path / "o.json", run_info("4" * 32, shard=(3, 3), plan="p2"), []))
    two = read_report(write(tmp_path / "t.json", run_info("5" * 32, shard=(2, 2)), []))
    assert [r.nodeid for r in merge_reports([s3, s1, s2]).records] == ["a.py::x", "b.py::x"]
    with pytest.raises(MergeError, match=r"shard 3/3 missing: a merged run without it would pass gates that never"):
        merge_reports([s1, s2])
    with pytest.raises(MergeError, match=r"shard 2/3 given twice"):
        merge_reports([s1, s2, s2, s3])
    with pytest.raises(MergeError, match=r"planned from different histories.*same --mlx-db file"):
        merge_reports([s1, s2, other])
    twelve = {
        i: read_report(write(tmp_path / f"{i}-12.json", run_info(f"{i:032d}", shard=(i, 12)), [])) for i in (2, 10)
    }
    with pytest.raises(MergeError, match=r"shard 2/12, 10/12 given twice"):  # named in number order
        merge_reports([twelve[10], twelve[2], twelve[10], twelve[2]])
    with pytest.raises(MergeError, match=r"cut in different numbers of pieces"):
        merge_reports([s1, s2, s3, two])


def test_the_merged_run_one_id_the_first_start_no_shard_and_the_score_made_again(tmp_path: Path) -> None:
    score = {
        "nodeid": "mlxgate::capability_score",
        "gate": "Capability Score",
        "mode": "score",
        "verdict": "partial",
        "time": "2026-12-01T10:02:00Z",
        "capability_score": {"candidate": 0.0},
    }
    a = write(
        tmp_path / "a.json",
        run_info("1" * 32, shard=(1, 2), started="2026-12-01T10:05:00Z"),
        [capability("cap_a.py::t", "mmlu", 0.5, 0.4), score],
    )
    b = write(
        tmp_path / "b.json", run_info("2" * 32, shard=(2, 2)), [capability("cap_b.py::t", "gsm8k", 0.3, 0.3), score]
    )
    first = merge_reports([read_report(a), read_report(b)])
    again = merge_reports([read_report(b), read_report(a)])
    assert first.run.run_id == again.run.run_id and len(first.run.run_id) == 32  # the same shards, the same run
    assert first.run.started == "2026-12-01T10:00:00Z" and first.run.code_commit == COMMIT
    assert "shard" not in first.run.config and first.run.config["gate"]["shard"] is None
    assert first.run.argv == ["gates"]  # --mlx-shard I/N and --mlx-shard=I/N dropped
    assert [m["shard"] for m in first.run.config["merged"]] == ["1/2", "2/2"]
    scores = [r.to_json() for r in first.records if r.nodeid == "mlxgate::capability_score"]
    (s,) = scores
    assert s["capability_score"]["tasks"] == {
        "mmlu": {"reference": 0.5, "candidate": 0.4, "n": 10},
        "gsm8k": {"reference": 0.3, "candidate": 0.3, "n": 10},
    }
    assert s["capability_score"]["partial"] is True and s["time"] == "2026-12-01T10:01:00Z"


def test_merge_exits_1_when_a_gate_fails_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path / "a.json", run_info("1" * 32, shard=(1, 2)), [record("a.py::x", "pass")])
    b = write(tmp_path / "b.json", run_info("2" * 32, shard=(2, 2)), [record("b.py::x", "fail")])
    out = tmp_path / "m.json"
    assert main(["merge", str(a), str(b), f"--json={out}"]) == 1
    captured = capsys.readouterr()
    assert "mlxgate merge: 1 gate(s) failing: b.py::x" in captured.err
    assert captured.out.startswith("mlxgate run ") and "merged from 2 reports" in captured.out.splitlines()[0]
    doc = json.loads(out.read_text())
    assert [(g["nodeid"], g["verdict"]) for g in doc["gates"]] == [("a.py::x", "pass"), ("b.py::x", "fail")]


def test_an_inconclusive_gate_fails_the_merge_only_where_the_run_failed_it(tmp_path: Path) -> None:
    for policy, code in (("fail", 1), ("warn", 0)):
        a = write(
            tmp_path / f"{policy}.json", run_info("1" * 32, inconclusive=policy), [record("a.py::x", "inconclusive")]
        )
        assert main(["merge", str(a)]) == code


def test_merge_refuses_what_is_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.json").write_text("{")
    (tmp_path / "other.json").write_text('{"a": 1}')
    good = write(tmp_path / "good.json", run_info("1" * 32), [])
    newer = json.loads(good.read_text())
    newer["mlxgate_report"] = 99
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    for name, message in (
        ("junk.json", "is not JSON"),
        ("other.json", "is not an mlxgate JSON report"),
        ("newer.json", "report of version 99, this mlxgate reads version 1"),
        ("missing.json", "cannot read the report"),
    ):
        assert main(["merge", str(tmp_path / name)]) == 2
        assert message in capsys.readouterr().err


def test_a_planned_module_without_a_record_is_an_error_record_and_fails_the_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path / "a.json", run_info("1" * 32, shard=(1, 2), modules=["a.py", "b.py"]), [record("a.py::x")])
    b = write(tmp_path / "b.json", run_info("2" * 32, shard=(2, 2), modules=["c.py"]), [record("c.py::x")])
    merged = merge_reports([read_report(a), read_report(b)])
    kept = {r.nodeid: r.to_json() for r in merged.records}
    assert kept["b.py"]["verdict"] == "error" and "shard 1/2" in kept["b.py"]["error"]["message"]
    assert merged.problems == [f"{a} (shard 1/2): planned module(s) without a record: b.py"]
    out = tmp_path / "m.json"
    assert main(["merge", str(a), str(b), f"--json={out}"]) == 1
    err = capsys.readouterr().err
    assert f"mlxgate merge: FAIL: {a} (shard 1/2): planned module(s) without a record: b.py" in err
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "error" and ("b.py", "error") in [(g["nodeid"], g["verdict"]) for g in doc["gates"]]


def test_a_module_the_shard_says_ran_without_a_record_is_no_failure(tmp_path: Path) -> None:
    """All its gates skipped (an untrained model, a missing GPU): a skip is not a vanished gate."""
    a = write(
        tmp_path / "a.json",
        run_info("1" * 32, shard=(1, 1), modules=["a.py", "b.py"], without_records={"b.py": "2 skipped"}),
        [record("a.py::x")],
    )
    merged = merge_reports([read_report(a)])
    assert merged.problems == [] and [r.nodeid for r in merged.records] == ["a.py::x"]
    assert main(["merge", str(a)]) == 0


def test_an_empty_or_interrupted_shard_fails_the_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = write(tmp_path / "e.json", run_info("1" * 32, shard=(1, 1), modules=["a.py"]), [])
    assert main(["merge", str(empty)]) == 1
    assert "(its report has no gates at all): a.py" in capsys.readouterr().err
    stopped = write(
        tmp_path / "s.json",
        run_info(
            "2" * 32, shard=(1, 1), modules=["a.py"], interrupted={"reason": "KeyboardInterrupt", "not_run": ["a.py"]}
        ),
        [],
    )
    merged = merge_reports([read_report(stopped)])
    assert merged.run.config["interrupted"] == {"reason": f"{stopped}: KeyboardInterrupt", "not_run": ["a.py"]}
    assert main(["merge", str(stopped)]) == 1
    assert f"{stopped} (shard 1/1) was interrupted (KeyboardInterrupt); did not run: a.py" in capsys.readouterr().err


# -- a pass is what its own checks show ------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ({"checks": [mean_check("fail")]}, "its check mean KL says fail"),  # a shard edited fail -> pass
        ({"checks": [mean_check("pass", limit=1e-5)]}, "its check mean KL shows fail"),  # the numbers say fail
        ({"checks": [mean_check("pass", value=5.0, lower=4.0, upper=6.0, limit=2e-3)]}, "shows fail"),
        ({"checks": [mean_check("pass", limit=1.5e-4)]}, "shows inconclusive"),  # the limit inside the interval
        ({"checks": [mean_check("pass", value=3e-4)]}, "outside its own interval"),
        ({"checks": []}, "it has no checks"),  # a pass that checked nothing
        ({"checks": [mean_check("pass", limit=None)]}, "has no limit to clear"),
    ],
)
def test_a_pass_its_own_checks_contradict_fails_the_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, Any], said: str
) -> None:
    good = write(tmp_path / "good.json", run_info("1" * 32), [record("a.py::x")])
    assert main(["merge", str(good)]) == 0  # the honest record merges green
    capsys.readouterr()
    forged = write(tmp_path / "forged.json", run_info("1" * 32), [record("a.py::x", **edit)])
    assert main(["merge", str(forged)]) == 1
    err = capsys.readouterr().err
    assert "a.py::x reads pass, but" in err and said in err, err


def limits(status: str, **more: Any) -> dict[str, Any]:
    return {"limits_from": {"status": status, "model": "smollm2-135m", "backend": "cpu", **more}}


PROVEN = limits("proven", known_bad={"value": "m:bad", "verdict": "fail", "figures": ["mean KL > 1e-3"]})


@pytest.mark.parametrize(
    ("edit", "require", "said"),
    [
        (limits("refuted", why="known-bad m:bad passes them"), False, "its limits are refuted (limits do not catch"),
        (limits("unproven", why="no known-bad"), True, "its limits are unproven (limits unproven on smollm2-135m"),
        ({}, True, "it says nowhere where its limits come from, and the run required proof"),
        (limits("proven", known_bad={"value": "m:bad", "verdict": "pass"}), False, "known-bad's verdict against"),
        (limits("proven"), False, "its known-bad's verdict against them is not given"),
        (limits("shown"), False, "limits_from status 'shown' is not one mlxgate writes"),
    ],
)
def test_a_pass_its_own_limits_from_denies_fails_the_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, Any], require: bool, said: str
) -> None:
    """Issue 55: merge derives `limits_from` again as it does the checks: refuted limits never pass, nor
    unproven ones in shards run with --mlx-require-proof (their settings say so)."""
    run = run_info("1" * 32, gate={"shard": None, "inconclusive": "fail", "require_proof": require})
    for honest in (PROVEN, limits("calibrated", file="calibration/a.json"), limits("unproven") if not require else {}):
        if honest:
            good = write(tmp_path / "good.json", run, [record("a.py::x", **honest)])
            assert main(["merge", str(good)]) == 0, honest
    capsys.readouterr()
    forged = write(tmp_path / "forged.json", run, [record("a.py::x", **edit), record("b.py::y", **edit)])
    assert main(["merge", str(forged)]) == 1
    err = capsys.readouterr().err
    assert "a.py::x reads pass, but" in err and "b.py::y reads pass, but" in err and said in err, err
    # a capability or speed record's limits are not proven by a known-bad: its status is no contradiction
    other = write(tmp_path / "cap.json", run, [record("c.py::z", mode="speed", **limits("unproven"))])
    assert main(["merge", str(other)]) == 0


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("candidate", "gemma3-270m"),
        ("gate.kl_prompts", 64),
        ("gate.kl_tokens", 256),
        ("gate.cand_value", "mymod:other"),
        ("gate.lever", "kv_cache"),
        ("gate.prove", "off"),
    ],
)
def test_shards_run_with_other_models_sizes_or_lever_values_do_not_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: Any
) -> None:
    a = write(tmp_path / "a.json", run_info("1" * 32, shard=(1, 2)), [record("a.py::x")])
    other = run_info("2" * 32, shard=(2, 2))
    section, _, key = where.rpartition(".")
    (other.config[section] if section else other.config)[key] = value
    b = write(tmp_path / "b.json", other, [record("b.py::x")])
    assert main(["merge", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"the reports ran with different {where}" in err and repr(value) in err, err


def test_shards_that_judged_different_model_commits_do_not_merge(tmp_path: Path) -> None:
    def model(commit: str) -> dict[str, Any]:
        return {"name": "e4b", "repo_id": "org/e4b", "commit": commit, "pinned": f"org/e4b@{commit[:7]}"}

    a = write(tmp_path / "a.json", run_info("1" * 32, shard=(1, 2)), [record("a.py::x", candidate=model("1" * 40))])
    b = write(tmp_path / "b.json", run_info("2" * 32, shard=(2, 2)), [record("b.py::x", candidate=model("2" * 40))])
    with pytest.raises(MergeError, match="the reports judged different models"):
        merge_reports([read_report(a), read_report(b)])


@pytest.mark.parametrize(
    ("lists", "totals", "message"),
    [
        # a shard's list cut to nothing: its module's record could vanish unseen
        ((["a.py", "b.py"], []), (3, 3), r"the plan holds 3 modules, but the shards list 2: 1 planned"),
        ((["a.py", "b.py"], ["b.py"]), (2, 2), r"b.py is planned in both shard 1/2 and shard 2/2"),
        ((["a.py"], None), (2, 2), r"shard 2/2\) list no modules of the plan"),
        ((["a.py"], ["b.py"]), (2, 3), r"the shards disagree on how many modules the plan holds"),
        ((["a.py"], ["b.py"]), (2, None), r"the shards disagree on how many modules the plan holds"),
    ],
)
def test_shards_whose_plans_do_not_cover_the_whole_plan_are_refused(
    tmp_path: Path, lists: tuple[Any, Any], totals: tuple[Any, Any], message: str
) -> None:
    """Before: a shard whose plan listed no modules hid its dropped records, and total_modules was never
    checked against the shards' lists."""
    reports = []
    for i, (modules, total) in enumerate(zip(lists, totals, strict=True), start=1):
        info = run_info(str(i) * 32, shard=(i, 2), modules=modules, total_modules=total)
        if modules is None:
            del info.config["shard"]["modules"]
        records = [record(f"{m}::x") for m in modules or []]
        reports.append(read_report(write(tmp_path / f"{i}.json", info, records)))
    with pytest.raises(MergeError, match=message):
        merge_reports(reports)
    # the same shards, their lists whole and one plan: merged
    whole = [
        read_report(
            write(
                tmp_path / f"w{i}.json",
                run_info(str(i) * 32, shard=(i, 2), modules=[m], total_modules=2),
                [record(f"{m}::x")],
            )
        )
        for i, m in ((1, "a.py"), (2, "b.py"))
    ]
    merged = merge_reports(whole)
    assert [r.nodeid for r in merged.records] == ["a.py::x", "b.py::x"] and not merged.problems


@pytest.mark.parametrize(
    "argv",
    [
        ["gates", "--mlx-shard=1/2", "-x", "--mlx-candidate", "e4b"],
        ["gates", "--mlx-shard", "1/2", "-k", "drift", "--mlx-shard=1/2", "-q"],
        ["--mlx-shard", "2/2", "gates/test_kv.py"],
    ],
)
def test_the_merged_command_is_each_shard_s_without_its_shard_option_and_nothing_else(argv: list[str]) -> None:
    """What a reader re-runs: every other option kept, in order, wherever the shard option sat."""
    from pytest_mlxgate.results.merge import _without_shard

    kept = [a for i, a in enumerate(argv) if not a.startswith("--mlx-shard") and argv[i - 1] != "--mlx-shard"]
    assert _without_shard(argv) == kept and all("shard" not in a for a in kept)


def test_a_report_whose_run_is_cut_short_names_what_it_lacks(tmp_path: Path) -> None:
    from pytest_mlxgate.results.json_report import REPORT_VERSION

    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"mlxgate_report": REPORT_VERSION, "run": {"started": "2026-12-07"}, "gates": []}))
    with pytest.raises(MergeError) as e:
        read_report(cut)
    assert str(e.value) == f"{cut}: its run lacks 'run_id'; is it cut short?"
