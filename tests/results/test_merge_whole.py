"""`mlxgate merge`, whole: the merged run's every field (its id, start, commit, dirtiness, config, machine,
command), the merged records, notes, problems and calibrations, and each refusal's whole message, on
reports built in memory."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from pytest_mlxgate.results.merge import Merged, MergeError, Report, merge_reports
from pytest_mlxgate.results.model import Record, parse_record
from pytest_mlxgate.results.records import RunInfo, error_record
from pytest_mlxgate.results.verdicts import RECORD_VERDICTS

COMMIT = "c" * 40


def check(verdict: str = "pass") -> dict[str, Any]:
    limit = {"pass": 1e-3, "fail": 1e-5, "inconclusive": 1e-4}[verdict]
    return {
        "metric": "mean KL",
        "key": "mean",
        "value": 1e-4,
        "lower": 5e-5,
        "upper": 2e-4,
        "limit": limit,
        "direction": "max",
        "verdict": verdict,
        "n": 16,
        "n_needed": None,
        "method": "95% interval over prompts",
    }


def gate(nodeid: str, verdict: str = "pass", **more: Any) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "gate": nodeid,
        "mode": "gate",
        "verdict": verdict,
        "time": "2026-12-01T10:01:00Z",
        "checks": [check(verdict)] if verdict in ("pass", "fail", "inconclusive") else [],
        **more,
    }


def run(
    run_id: str,
    *,
    shard: tuple[int, int] | None = None,
    modules: list[str] | None = None,
    total: int | None = None,
    commit: str | None = COMMIT,
    dirty: bool | None = False,
    started: str = "2026-12-01T10:00:00Z",
    machine: dict[str, str] | None = None,
    argv: list[str] | None = None,
    plan: str = "p1",
    index: int | None = None,
    **config: Any,
) -> RunInfo:
    conf: dict[str, Any] = {"candidate": "smollm2-135m", "gate": {"shard": None, "inconclusive": "fail"}, **config}
    if shard is not None:
        conf["shard"] = {"index": shard[0] if index is None else index, "count": shard[1], "plan": plan}
        if modules is not None:
            conf["shard"]["modules"] = modules
        if total is not None:
            conf["shard"]["total_modules"] = total
        conf["gate"] = {**conf["gate"], "shard": f"{shard[0]}/{shard[1]}", "report": f"r{shard[0]}.json"}
    return RunInfo(
        run_id=run_id,
        started=started,
        code_commit=commit,
        code_dirty=dirty,
        argv=argv if argv is not None else ["gates"],
        config=conf,
        machine=machine if machine is not None else {"device": "cpu", "mlx": "0.32"},
    )


def report(path: str, info: RunInfo, *records: dict[str, Any], calibrations: list[Any] | None = None) -> Report:
    return Report(path, info, [parse_record(r) for r in records], calibrations or [])


def parsed(nodeid: str, verdict: str = "pass", **more: Any) -> Record:
    """`gate(...)` as the merge holds it: read."""
    return parse_record(gate(nodeid, verdict, **more))


def merged_id(*run_ids: str) -> str:
    return hashlib.sha256(("merge:" + ",".join(sorted(run_ids))).encode()).hexdigest()[:32]


# -- the merged run ------------------------------------------------------------------------------------


def test_the_merged_run_field_by_field() -> None:
    a = report(
        "a.json",
        run(
            "b" * 32,
            shard=(1, 2),
            modules=["a.py"],
            started="2026-12-01T10:05:00Z",
            machine={"device": "cpu", "mlx": "0.32", "blas": "openblas", "empty": ""},
            argv=["gates", "--mlx-shard", "1/2", "-x", "--mlx-shard=1/2", "-q"],
            without_records={"z.py": "1 skipped"},
            interrupted={"reason": "KeyboardInterrupt", "not_run": ["c.py", "a2.py"]},
        ),
        gate("a.py::x"),
    )
    b = report(
        "b.json",
        run(
            "a" * 32,
            shard=(2, 2),
            modules=["b.py"],
            started="2026-12-01T09:59:00Z",
            machine={"device": "metal", "mlx": "0.32", "blas": "", "empty": "x"},
            argv=["gates", "--mlx-shard", "2/2"],
            interrupted={"reason": None, "not_run": ["c.py", "b2.py"]},
        ),
        gate("b.py::x"),
    )
    merged = merge_reports([a, b])
    assert merged.run == RunInfo(
        run_id=merged_id("b" * 32, "a" * 32),
        started="2026-12-01T09:59:00Z",  # the first to start
        code_commit=COMMIT,
        code_dirty=False,
        argv=["gates", "-x", "-q"],  # the first report's command, without its shard
        config={
            "candidate": "smollm2-135m",
            "gate": {"shard": None, "inconclusive": "fail", "report": None},
            "interrupted": {
                "reason": "a.json: KeyboardInterrupt; b.json: interrupted",
                "not_run": ["a2.py", "b2.py", "c.py"],
            },
            "merged": [
                {
                    "run_id": "b" * 32,
                    "started": "2026-12-01T10:05:00Z",
                    "report": "a.json",
                    "shard": "1/2",
                    "argv": ["gates", "--mlx-shard", "1/2", "-x", "--mlx-shard=1/2", "-q"],
                },
                {
                    "run_id": "a" * 32,
                    "started": "2026-12-01T09:59:00Z",
                    "report": "b.json",
                    "shard": "2/2",
                    "argv": ["gates", "--mlx-shard", "2/2"],
                },
            ],
        },
        machine={"device": "cpu | metal", "mlx": "0.32", "blas": "openblas", "empty": "x"},
    )
    assert merge_reports([b, a]).run.run_id == merged.run.run_id  # the same shards, the same id


@pytest.mark.parametrize(
    ("dirty", "merged"),
    [
        ((False, False), False),
        ((False, True), True),
        ((True, None), True),
        ((None, True), True),
        ((False, None), None),
        ((None, False), None),
        ((None, None), None),
    ],
)
def test_the_merged_run_is_dirty_if_any_shard_was_and_unknown_if_any_is(
    dirty: tuple[bool | None, bool | None], merged: bool | None
) -> None:
    reports = [report(f"{i}.json", run(f"{i}" * 32, dirty=d)) for i, d in enumerate(dirty)]
    assert merge_reports(reports).run.code_dirty is merged


def test_an_unsharded_uninterrupted_run_merges_its_config_as_it_was() -> None:
    info = run("1" * 32, commit=None, dirty=None, gate="not a section", argv=["gates", "-q"], interrupted={})
    merged = merge_reports([report("only.json", info)])
    assert merged == Merged(
        run=RunInfo(
            run_id=merged_id("1" * 32),
            started="2026-12-01T10:00:00Z",
            code_commit=None,
            code_dirty=None,
            argv=["gates", "-q"],
            config={
                "candidate": "smollm2-135m",
                "gate": "not a section",
                "merged": [
                    {
                        "run_id": "1" * 32,
                        "started": "2026-12-01T10:00:00Z",
                        "report": "only.json",
                        "shard": None,
                        "argv": ["gates", "-q"],
                    }
                ],
            },
            machine={"device": "cpu", "mlx": "0.32"},
        ),
        records=[],
        calibrations=[],
        notes=[],
        problems=[],
    )


# -- the merged records --------------------------------------------------------------------------------


def test_every_gate_once_its_worst_kept_in_nodeid_order_with_notes_and_calibrations() -> None:
    a = report(
        "a.json",
        run("1" * 32),
        gate("z.py::g", "pass"),
        gate("m.py::g", "fail", marker="a"),
        gate("a.py::g"),
        gate("k.py::g", "inconclusive"),
        calibrations=[{"file": "one"}],
    )
    b = report(
        "b.json",
        run("2" * 32),
        gate("m.py::g", "inconclusive"),
        gate("z.py::g", "pass", marker="b"),
        gate("k.py::g", "error", marker="b"),
    )
    c = report(
        "c.json", run("3" * 32), gate("m.py::g", "fail", marker="c"), calibrations=[{"file": "two"}, {"file": "3"}]
    )
    merged = merge_reports([a, b, c])
    assert merged.records == [
        parsed("a.py::g"),
        parsed("k.py::g", "error", marker="b"),
        parsed("m.py::g", "fail", marker="a"),  # the first of the worst
        parsed("z.py::g", "pass"),
    ]
    assert merged.notes == [
        "k.py::g is in 2 reports (inconclusive in a.json, error in b.json): kept the worst, error",
        "m.py::g is in 3 reports (fail in a.json, inconclusive in b.json, fail in c.json): kept the worst, fail",
        "z.py::g is in 2 reports (pass in a.json, pass in b.json): kept the worst, pass",
    ]
    assert merged.calibrations == [{"file": "one"}, {"file": "two"}, {"file": "3"}]
    assert merged.problems == []


def test_a_planned_module_without_a_record_becomes_an_error_record_of_the_merge() -> None:
    a = report(
        "a.json",
        run("1" * 32, shard=(1, 2), modules=["a.py", "b.py", "s.py", "d.py"], total=5, without_records={"s.py": "1"}),
        gate("a.py::Class::x"),  # a test in a class: its module is still a.py
    )
    b = report("b.json", run("2" * 32, shard=(2, 2), modules=["c.py"], total=5))
    merged = merge_reports([a, b])

    def missing(module: str, where: str) -> Record:
        return error_record(
            nodeid=module,
            phase="merge",
            error_type="MissingRecord",
            message=f"{module} is in the plan of {where}, but that report holds no record of it and does not say it "
            "ran without one: it did not run, or its records were lost. Re-run the shard",
        )

    assert merged.records == [
        parsed("a.py::Class::x"),
        missing("b.py", "shard 1/2 (a.json)"),
        missing("c.py", "shard 2/2 (b.json)"),
        missing("d.py", "shard 1/2 (a.json)"),
    ]
    assert merged.problems == [
        "a.json (shard 1/2): planned module(s) without a record: b.py, d.py",
        "b.json (shard 2/2): planned module(s) without a record (its report has no gates at all): c.py",
    ]


def test_the_problems_of_each_report_in_whole_words() -> None:
    stopped = report(
        "s.json",
        run("1" * 32, interrupted={"reason": "", "not_run": []}),
        gate("a.py::x", "unheard"),
        gate("b.py::x", "pass", checks=[]),
        gate("c.py::x", "pass", checks=[{**check("pass"), "limit": 1e-5}]),
        gate("d.py::x", "fail"),
    )
    cut = report("t.json", run("2" * 32, interrupted={"reason": "time limit", "not_run": ["e.py", "f.py"]}))
    merged = merge_reports([stopped, cut])
    assert merged.problems == [
        "s.json was interrupted (interrupted)",
        f"s.json: a.py::x has verdict 'unheard', not one mlxgate writes ({', '.join(RECORD_VERDICTS)}): no pass",
        "s.json: b.py::x reads pass, but it has no checks: no pass",
        "s.json: c.py::x reads pass, but its check mean KL shows fail (95% interval [5e-05, 0.0002], limit 1e-05): "
        "no pass",
        "t.json was interrupted (time limit); did not run: e.py, f.py",
    ]


def test_a_shard_s_score_is_made_again_over_every_shard() -> None:
    def capability(nodeid: str, task: str, time: str | None) -> dict[str, Any]:
        return gate(nodeid, mode="capability", time=time, tasks={task: {"ref_score": 0.5, "cand_score": 0.4, "n": 10}})

    old_score = {"nodeid": "mlxgate::capability_score", "mode": "score", "verdict": "partial", "time": "z"}
    a = report("a.json", run("1" * 32), capability("a.py::t", "mmlu", "2026-12-01T10:03:00Z"), old_score)
    b = report("b.json", run("2" * 32), capability("b.py::t", "gsm8k", "2026-12-01T10:02:00Z"), old_score)
    c = report("c.json", run("3" * 32), capability("c.py::t", "ifeval", None))
    merged = merge_reports([a, b, c])
    nodeids = [r.nodeid for r in merged.records]
    assert nodeids == ["a.py::t", "b.py::t", "c.py::t", "mlxgate::capability_score"]  # the score last, made once
    score = merged.records[-1].to_json()
    assert score["time"] == "2026-12-01T10:03:00Z"  # the latest capability record's
    assert list(score["capability_score"]["tasks"]) == ["ifeval", "gsm8k", "mmlu"]  # in time order, none first
    assert merge_reports([report("c.json", run("3" * 32), gate("a.py::x"), old_score)]).records == [parsed("a.py::x")]
    # capability gates of a gate author's own task only: no score among the six to make again, and no error
    own = capability("d.py::t", "my_task", "2026-12-01T10:04:00Z")
    assert merge_reports([report("d.json", run("4" * 32), own, old_score)]).records == [parse_record(own)]


# -- refusals --------------------------------------------------------------------------------------------


def _refused(reports: list[Report]) -> str:
    with pytest.raises(MergeError) as info:
        merge_reports(reports)
    return str(info.value)


def test_no_reports_and_two_commits_are_refused_in_whole_words() -> None:
    assert _refused([]) == "no reports to merge"
    a = report("a.json", run("1" * 32))
    b = report("b.json", run("2" * 32, commit="d" * 40))
    assert _refused([a, b]) == (
        "the reports ran different code (a.json at cccccccccccc; b.json at dddddddddddd): one merged verdict "
        "cannot speak for two commits. Re-run the shards on one commit, or compare the runs: mlxgate compare A B"
    )
    # a report run outside git says so whole (only a commit is cut to 12 characters)
    c = report("c.json", run("3" * 32, commit=None))
    assert _refused([a, c]).startswith(
        "the reports ran different code (a.json at cccccccccccc; c.json at no git commit):"
    )


@pytest.mark.parametrize(
    ("name", "where", "first", "second"),
    [
        ("candidate", (), "smollm2-135m", "e4b"),
        ("reference", (), None, "e2b"),
        ("gate.lever", ("gate",), "kv", "weights"),
        ("gate.speed_reps", ("gate",), 9, None),
        ("gate.require_proof", ("gate",), False, True),
        ("gate.speed", ("gate",), {"a": 1}, {"a": 2}),
    ],
)
def test_reports_run_with_other_settings_are_refused_naming_the_setting(
    name: str, where: tuple[str, ...], first: Any, second: Any
) -> None:
    infos = [run("1" * 32), run("2" * 32)]
    for info, value in zip(infos, (first, second), strict=True):
        section = info.config[where[0]] if where else info.config
        key = name.rsplit(".", 1)[-1]
        if value is None:
            section.pop(key, None)
        else:
            section[key] = value
    assert _refused([report("a.json", infos[0]), report("b.json", infos[1])]) == (
        f"the reports ran with different {name} (a.json: {first!r}; b.json: {second!r}): their gates measured other "
        "arms, so one merged verdict cannot speak for them. Re-run the shards with the same options"
    )


def test_a_setting_s_key_order_is_no_difference() -> None:
    a = run("1" * 32, gate={"shard": None, "speed": {"contexts": [64], "decode": 8}})
    b = run("2" * 32, gate={"speed": {"decode": 8, "contexts": [64]}, "shard": None})
    assert [r.nodeid for r in merge_reports([report("a.json", a, gate("a.py::x")), report("b.json", b)]).records] == [
        "a.py::x"
    ]


def test_reports_that_judged_other_models_are_refused() -> None:
    def model(pinned: str) -> dict[str, Any]:
        return {"name": "e4b", "repo_id": "org/e4b", "pinned": pinned}

    a = report("a.json", run("1" * 32), gate("a.py::x", candidate=model("org/e4b@111")), gate("a.py::y"))
    b = report("b.json", run("2" * 32), gate("b.py::x", candidate=model("org/e4b@222")))
    same = report("c.json", run("3" * 32), gate("c.py::x", candidate=model("org/e4b@111")))
    assert _refused([a, b]) == (
        "the reports judged different models (org/e4b@111 in a.json; org/e4b@222 in b.json): re-run the shards on one "
        "model"
    )
    assert len(merge_reports([a, same]).records) == 3


def _shards(*plans: tuple[list[str] | None, int | None], count: int | None = None) -> list[Report]:
    out = []
    for i, (modules, total) in enumerate(plans, start=1):
        info = run(str(i) * 32, shard=(i, count or len(plans)), modules=modules, total=total)
        out.append(report(f"{i}.json", info, *(gate(f"{m}::x") for m in modules or [])))
    return out


@pytest.mark.parametrize(
    ("plans", "message"),
    [
        (
            ((["a.py"], None), (None, None), (None, None)),
            "2.json (shard 2/3), 3.json (shard 3/3) list no modules of the plan, so a module it dropped could not be "
            "seen. Re-run that shard with this version of mlxgate (its report lists them)",
        ),
        (
            ((["a.py", "b.py"], None), (["c.py", "b.py"], None)),
            "b.py is planned in both shard 1/2 and shard 2/2: not one plan",
        ),
        (
            ((["a.py"], 2), (["b.py"], 3)),
            "the shards disagree on how many modules the plan holds (['2', '3'])",
        ),
        (
            ((["a.py"], None), (["b.py"], 2)),
            "the shards disagree on how many modules the plan holds (['2', 'None'])",
        ),
        (
            ((["a.py"], 4), (["b.py"], 4)),
            "the plan holds 4 modules, but the shards list 2: 2 planned module(s) are in no shard's list, so their "
            "records could vanish unseen. Re-run every shard on one plan",
        ),
        (
            ((["a.py", "b.py"], 1), ([], 1)),
            "the plan holds 1 modules, but the shards list 2: -1 planned module(s) are in no shard's list, so their "
            "records could vanish unseen. Re-run every shard on one plan",
        ),
    ],
)
def test_shards_whose_lists_do_not_cover_the_plan_are_refused_in_whole_words(
    plans: tuple[tuple[list[str] | None, int | None], ...], message: str
) -> None:
    assert _refused(_shards(*plans)) == message


@pytest.mark.parametrize(
    "plans",
    [
        ((["a.py"], 2), (["b.py"], 2)),
        ((["a.py"], None), (["b.py"], None)),
        ((["a.py", "b.py"], 3), (["c.py"], 3)),
        (([], None), ([], None)),
    ],
)
def test_shards_that_cover_the_plan_once_merge(plans: tuple[tuple[list[str], int | None], ...]) -> None:
    merged = merge_reports(_shards(*plans))
    assert [r.nodeid for r in merged.records] == sorted(f"{m}::x" for modules, _ in plans for m in modules)
    assert merged.problems == []


def _sharded(path: str, index: int | None, count: int | None, plan: str = "p1") -> Report:
    info = run(path * 32, shard=(0, 0), plan=plan)
    info.config["shard"].update(index=index, count=count, modules=[])
    return report(f"{path}.json", info)


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        (
            [("1", 1, 2), ("2", 2, 3), ("3", 3, 3)],
            "the shards were cut in different numbers of pieces: 1.json is shard 1/2 (plan p1); 2.json is shard 2/3 "
            "(plan p1); 3.json is shard 3/3 (plan p1)",
        ),
        (
            [("1", 1, 3, "p1"), ("2", 2, 3, "p1"), ("3", 3, 3, "p2")],
            "the shards were planned from different histories, so they need not cover every module exactly once: "
            "1.json is shard 1/3 (plan p1); 2.json is shard 2/3 (plan p1); 3.json is shard 3/3 (plan p2). Give every "
            "shard the same --mlx-db file (or none) and re-run",
        ),
        (
            [("1", 1, 3), ("2", 1, 3), ("3", 3, 3), ("4", 3, 3), ("5", 2, 3)],
            "shard 1/3, 3/3 given twice: 1.json is shard 1/3 (plan p1); 2.json is shard 1/3 (plan p1); 3.json is "
            "shard 3/3 (plan p1); 4.json is shard 3/3 (plan p1); 5.json is shard 2/3 (plan p1)",
        ),
        (
            [("1", None, 2), ("2", None, 2), ("3", 2, 2), ("4", 2, 2)],
            "shard 2/2, None/2 given twice: 1.json is shard None/2 (plan p1); 2.json is shard None/2 (plan p1); "
            "3.json is shard 2/2 (plan p1); 4.json is shard 2/2 (plan p1)",
        ),
        (
            [("2", 2, 4)],
            "shard 1/4, 3/4, 4/4 missing: a merged run without it would pass gates that never ran. Given: 2.json is "
            "shard 2/4 (plan p1)",
        ),
        (
            [("1", 1, 2)],
            "shard 2/2 missing: a merged run without it would pass gates that never ran. Given: 1.json is shard 1/2 "
            "(plan p1)",
        ),
    ],
)
def test_shards_not_all_there_once_and_alike_are_refused_in_whole_words(shards: list[Any], message: str) -> None:
    assert _refused([_sharded(*s) for s in shards]) == message


def test_shards_that_say_no_count_are_not_counted() -> None:
    merged = merge_reports([_sharded("1", 1, None), _sharded("2", 5, None)])
    assert merged.records == [] and [m["shard"] for m in merged.run.config["merged"]] == ["1/None", "5/None"]


@pytest.mark.parametrize(
    ("check", "why"),
    [
        ({"verdict": "fail"}, "its check mean KL says fail"),
        ({"limit": None}, "its check mean KL has no limit to clear"),
        ({"direction": "between"}, "its check mean KL has no limit to clear"),
        ({"direction": "min", "limit": 5e-5}, None),  # the lower end on the limit: shown
        (
            {"direction": "min", "limit": 6e-5},
            "its check mean KL shows inconclusive (95% interval [5e-05, 0.0002], limit 6e-05)",
        ),
        ({"limit": 2e-4}, None),  # the upper end on the limit: shown
        ({"value": 5e-5}, None),  # at either end of its interval: inside
        ({"value": 2e-4}, None),
        ({"value": None}, None),
        ({"value": 4e-5}, "its check mean KL has its value 4e-05 outside its own interval [5e-05, 0.0002]"),
        ({"value": 3e-4}, "its check mean KL has its value 0.0003 outside its own interval [5e-05, 0.0002]"),
        ({"value": 9.0, "lower": None}, "its check mean KL has its value 9.0 outside its own interval [None, 0.0002]"),
        (
            {"value": 1e-6, "upper": None, "direction": "min", "limit": 1e-7},
            "its check mean KL has its value 1e-06 outside its own interval [5e-05, None]",
        ),
    ],
)
def test_a_pass_is_what_its_check_s_own_numbers_show(check: dict[str, Any], why: str | None) -> None:
    from pytest_mlxgate.results.merge import pass_contradicted

    record = gate("a.py::x", "pass")
    record["checks"] = [{**record["checks"][0], **check}]
    assert pass_contradicted(parse_record(record)) == why
