"""The record's read model: one parse, one migration of older shapes, derived facts computed once.

Version-1 records (before `record_version`) are written here as the old code wrote them: checks with
`bound` (the end on the passing side), `other_bound` or `lower`/`upper` (the far end) and `passed`;
capability tasks without `flipped`. Each is paired with the record the current code writes for the same
measurement, and both must read the same in every report. A results DB of schema version 1 holding such
rows still reads from the shell."""

from __future__ import annotations

import ast
import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.cli import main
from pytest_mlxgate.results import history
from pytest_mlxgate.results.github import gate_line, step_summary
from pytest_mlxgate.results.history import ResultsDB
from pytest_mlxgate.results.history_text import Source, compare_lines
from pytest_mlxgate.results.html_report import html_report
from pytest_mlxgate.results.json_report import write_json_report
from pytest_mlxgate.results.junit import junit_properties
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import RECORD_PROPERTY, RunInfo, gate_record
from pytest_mlxgate.results.runs import parse_row
from pytest_mlxgate.results.summary import summary_lines
from pytest_mlxgate.results.wire import RECORD_VERSION, migrate_check

RESULTS = Path(__file__).resolve().parents[2] / "pytest_mlxgate" / "results"

# -- checks: (as version 1 wrote them, as the current code writes them) ------------------------------

KL_MEAN = (
    {
        "metric": "mean KL",
        "key": "mean",
        "value": 3.1e-4,
        "bound": 4e-4,
        "other_bound": 2.5e-4,
        "limit": 1e-3,
        "direction": "max",
        "n": 16,
        "n_needed": None,
        "verdict": "pass",
        "passed": True,
    },
    {
        "metric": "mean KL",
        "key": "mean",
        "value": 3.1e-4,
        "lower": 2.5e-4,
        "upper": 4e-4,
        "limit": 1e-3,
        "direction": "max",
        "n": 16,
        "n_needed": None,
        "verdict": "pass",
    },
)
KL_P99 = (
    {
        "metric": "p99 KL",
        "key": "p99",
        "value": 2.2e-3,
        "bound": 2.6e-3,
        "other_bound": 1.9e-3,
        "limit": 2.4e-3,
        "direction": "max",
        "n": 16,
        "n_needed": 65,
        "verdict": "inconclusive",
        "passed": False,
    },
    {
        "metric": "p99 KL",
        "key": "p99",
        "value": 2.2e-3,
        "lower": 1.9e-3,
        "upper": 2.6e-3,
        "limit": 2.4e-3,
        "direction": "max",
        "n": 16,
        "n_needed": 65,
        "verdict": "inconclusive",
    },
)
KL_TOP1 = (
    {
        "metric": "top-1",
        "key": "top1",
        "value": 0.99,
        "bound": 0.97,
        "other_bound": 0.995,
        "limit": 0.95,
        "direction": "min",
        "n": 16,
        "n_needed": None,
        "verdict": "pass",
        "passed": True,
    },
    {
        "metric": "top-1",
        "key": "top1",
        "value": 0.99,
        "lower": 0.97,
        "upper": 0.995,
        "limit": 0.95,
        "direction": "min",
        "n": 16,
        "n_needed": None,
        "verdict": "pass",
    },
)
DROP = (
    {
        "metric": "gsm8k drop",
        "key": "drop",
        "value": 0.025,
        "bound": 0.1046,
        "lower": -0.0648,
        "limit": 0.1,
        "direction": "max",
        "p_value": 0.854,
        "n": 40,
        "n_needed": 44,
        "method": "Tango score",
        "verdict": "inconclusive",
        "passed": False,
    },
    {
        "metric": "gsm8k drop",
        "key": "drop",
        "value": 0.025,
        "lower": -0.0648,
        "upper": 0.1046,
        "limit": 0.1,
        "direction": "max",
        "p_value": 0.854,
        "n": 40,
        "n_needed": 44,
        "method": "Tango score",
        "verdict": "inconclusive",
    },
)
SCORE = (
    {
        "metric": "gsm8k score",
        "key": "score",
        "value": 0.725,
        "bound": 0.597,
        "upper": 0.824,
        "limit": 0.3,
        "direction": "min",
        "n": 40,
        "n_needed": None,
        "method": "Wilson score",
        "verdict": "pass",
        "passed": True,
    },
    {
        "metric": "gsm8k score",
        "key": "score",
        "value": 0.725,
        "lower": 0.597,
        "upper": 0.824,
        "limit": 0.3,
        "direction": "min",
        "n": 40,
        "n_needed": None,
        "method": "Wilson score",
        "verdict": "pass",
    },
)
DECODE = (
    {
        "metric": "decode tok/s @512",
        "key": "speed.decode",
        "limit": 1.05,
        "direction": "min",
        "context": 512,
        "value": 1.3,
        "bound": 1.2,
        "other_bound": 1.4,
        "n": 9,
        "n_needed": None,
        "method": "geometric mean of paired ratios, Student-t on their logs",
        "verdict": "pass",
        "passed": True,
    },
    {
        "metric": "decode tok/s @512",
        "key": "speed.decode",
        "limit": 1.05,
        "direction": "min",
        "context": 512,
        "value": 1.3,
        "lower": 1.2,
        "upper": 1.4,
        "n": 9,
        "n_needed": None,
        "method": "geometric mean of paired ratios, Student-t on their logs",
        "verdict": "pass",
    },
)
KV = (
    {
        "metric": "KV bytes @128",
        "key": "speed.kv",
        "limit": 0.3,
        "direction": "max",
        "context": 128,
        "value": 0.25,
        "bound": 0.25,
        "other_bound": 0.25,
        "n": 1,
        "n_needed": None,
        "method": "bytes counted over the cache arrays (exact)",
        "verdict": "pass",
        "passed": True,
    },
    {
        "metric": "KV bytes @128",
        "key": "speed.kv",
        "limit": 0.3,
        "direction": "max",
        "context": 128,
        "value": 0.25,
        "lower": 0.25,
        "upper": 0.25,
        "n": 1,
        "n_needed": None,
        "method": "bytes counted over the cache arrays (exact)",
        "verdict": "pass",
    },
)
# A/A: the floor is one figure, compared with the limit; `passed` was its only verdict
FLOOR_MAX = (
    {
        "metric": "p99 KL floor",
        "key": "p99",
        "value": 1e-3,
        "bound": 1e-3,
        "limit": 5e-4,
        "direction": "max",
        "passed": False,
    },
    {
        "metric": "p99 KL floor",
        "key": "p99",
        "value": 1e-3,
        "lower": None,
        "upper": 1e-3,
        "limit": 5e-4,
        "direction": "max",
        "verdict": "fail",
    },
)
FLOOR_MIN = (
    {
        "metric": "top-1 floor",
        "key": "top1",
        "value": 0.97,
        "bound": 0.97,
        "limit": 0.95,
        "direction": "min",
        "passed": True,
    },
    {
        "metric": "top-1 floor",
        "key": "top1",
        "value": 0.97,
        "lower": 0.97,
        "upper": None,
        "limit": 0.95,
        "direction": "min",
        "verdict": "pass",
    },
)
# the oldest records: `passed` only, no far end
OLDEST = (
    {
        "metric": "mean KL",
        "key": "mean",
        "value": 3.1e-4,
        "bound": 4e-4,
        "limit": 1e-3,
        "direction": "max",
        "passed": True,
    },
    {
        "metric": "mean KL",
        "key": "mean",
        "value": 3.1e-4,
        "lower": None,
        "upper": 4e-4,
        "limit": 1e-3,
        "direction": "max",
        "verdict": "pass",
    },
)
CHECKS = {
    "kl max": KL_MEAN,
    "kl inconclusive": KL_P99,
    "kl min": KL_TOP1,
    "capability drop": DROP,
    "capability floor": SCORE,
    "speed min": DECODE,
    "memory max": KV,
    "aa floor max": FLOOR_MAX,
    "aa floor min": FLOOR_MIN,
    "oldest": OLDEST,
}


@pytest.mark.parametrize("name", CHECKS)
def test_migrate_check_reads_every_old_shape_into_lower_upper_and_a_verdict(name: str) -> None:
    old, new = CHECKS[name]
    before = copy.deepcopy(old)
    assert dict(migrate_check(old)) == new
    assert old == before  # the caller's check is not rewritten in place
    assert dict(migrate_check(new)) == new  # the current shape goes through unchanged


# -- records: (version 1, current) ---------------------------------------------------------------

MODEL = {"name": "smollm2-135m", "repo_id": "org/SmolLM2", "commit": "0" * 40, "pinned": "org/SmolLM2@0000000"}
STATS = {
    "n_prompts": 16,
    "n_tokens": 512,
    "confidence": 0.95,
    "mean": 3.1e-4,
    "mean_ci": [2.5e-4, 4e-4],
    "p99": 2.2e-3,
    "quantile_ci": {"p99": [1.9e-3, 2.6e-3]},
    "max": 6e-3,
    "same_top": 0.98,
    "same_top_ci": [0.96, 0.99],
    "top1": 0.99,
    "top1_ci": [0.97, 0.995],
    "flips": 3,
    "near_tie_flips": 1,
    "worst": [
        {
            "prompt": 3,
            "position": 40,
            "kl": 6e-3,
            "token_id": 7,
            "ref_top1": 7,
            "cand_top1": 9,
            "p_ref": 0.4,
            "p_cand": 0.3,
        }
    ],
}


def _base(nodeid: str, mode: str, verdict: str, **more: Any) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "gate": nodeid.replace("gates/", "").replace(".py", ""),
        "mode": mode,
        "candidate": MODEL,
        "reference_model": None,
        "lever": {"name": "kv8", "kind": "kv", "ref": "plain", "cand": "8-bit"},
        "path": "serving",
        "verdict": verdict,
        "time": "2026-11-01T10:00:00Z",
        "durations": {"total_s": 2.5},
        "rerun": f"pytest {nodeid}",
        **more,
    }


def _items(n: int, lost: int) -> list[dict[str, Any]]:
    """A task's paired items as the capability runner records them; the first `lost` flip to wrong."""
    return [
        {
            "id": f"q{i}",
            "prompt_hash": "h",
            "reference": {"output": f"answer {i}", "score": 1.0, "verdict": "correct"},
            "candidate": {
                "output": "no idea" if i < lost else f"answer {i}",
                "score": 0.0 if i < lost else 1.0,
                "verdict": "wrong" if i < lost else "correct",
            },
        }
        for i in range(n)
    ]


def _speed() -> dict[str, Any]:
    def arm(tps: float, kv: int) -> dict[str, Any]:
        return {"prefill_tps": 200.0, "decode_tps": tps, "peak_bytes": 3 << 20, "kv_bytes": kv}

    return {
        "id": "s1",
        "shape": {"contexts": [128, 512], "decode": 16, "repetitions": 9},
        "contexts": {
            str(c): {
                "context": c,
                "reference": arm(10.0, c << 13),
                "candidate": arm(13.0, c << 11),
                "prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1], "n": 9},
                "decode": {"ratio": 1.3, "ratio_ci": [1.2, 1.4], "n": 9},
                "kv": {"ratio": 0.25},
            }
            for c in (128, 512)
        },
        "weights_bytes": {"reference": 1 << 20, "candidate": 1 << 20},
    }


def _pairs() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    items = _items(10, 2)
    task = {
        "n": 10,
        "ref_score": 1.0,
        "cand_score": 0.8,
        "ref_ci": [0.72, 1.0],
        "cand_ci": [0.49, 0.94],
        "items": items,
        "drop_verdict": {
            "verdict": "inconclusive",
            "value": 0.2,
            "lower": 0.03,
            "upper": 0.47,
            "limit": 0.1,
            "n": 10,
            "n_needed": 60,
            "method": "Tango score",
        },
    }
    flipped = {"total": 2, "items": items[:2]}  # what the current runner keeps (with prompts, when it has them)
    pairs = {}
    for name, mode, checks, more in (
        ("kl", "gate", (KL_MEAN, KL_P99, KL_TOP1), {"stats": STATS, "sizes": {"prompts": 16}}),
        ("capability", "capability", (DROP, SCORE), {"stats": {"n_prompts": 10}, "skipped": {"mmlu": "no data"}}),
        ("speed", "speed", (DECODE, KV), {"speed": _speed()}),
        ("aa", "aa", (FLOOR_MAX, FLOOR_MIN), {"stats": STATS, "aa": {"floors": {"p99": 1e-3, "top1": 0.97}}}),
        ("oldest", "gate", (OLDEST,), {"stats": STATS}),
    ):
        verdict = "fail" if name == "aa" else "inconclusive" if name in ("kl", "capability") else "pass"
        old = _base(f"gates/test_{name}.py::test_{name}", mode, verdict, checks=[c for c, _ in checks], **more)
        new = _base(
            f"gates/test_{name}.py::test_{name}",
            mode,
            verdict,
            checks=[c for _, c in checks],
            **more,
            record_version=RECORD_VERSION,
        )
        if name == "capability":
            old["tasks"] = {"gsm8k": copy.deepcopy(task)}
            new["tasks"] = {"gsm8k": {**copy.deepcopy(task), "flipped": flipped}}
        pairs[name] = (old, new)
    return pairs


PAIRS = _pairs()
RUN = RunInfo(
    run_id="1" * 32,
    started="2026-11-01T09:59:00Z",
    code_commit="c" * 40,
    code_dirty=False,
    argv=["gates"],
    config={},
    machine={"device": "cpu"},
)


def _without_record_property(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in pairs if k != RECORD_PROPERTY]


@pytest.mark.parametrize("name", PAIRS)
def test_an_old_record_reads_as_the_same_record_written_today_in_every_report(name: str) -> None:
    old, new = PAIRS[name]
    read_old, read_new = parse_record(old), parse_record(new)
    assert (read_old.record_version, read_new.record_version) == (1, RECORD_VERSION)
    assert read_old == type(read_old)(**{**read_new.__dict__, "record_version": 1})  # the same model, field by field
    assert summary_lines([read_old], width=120) == summary_lines([read_new], width=120)
    assert _without_record_property(junit_properties(read_old)) == _without_record_property(junit_properties(read_new))
    assert gate_line(read_old) == gate_line(read_new)
    assert step_summary([read_old]) == step_summary([read_new])
    assert html_report([read_old], run=RUN) == html_report([read_new], run=RUN)
    row_old, row_new = (
        dict(zip(history._COLUMN_NAMES, history._row(RUN, r), strict=True)) for r in (read_old, read_new)
    )
    assert {k: v for k, v in row_old.items() if k != "record_json"} == {
        k: v for k, v in row_new.items() if k != "record_json"
    }


def test_old_checks_read_with_their_bounds_on_the_right_side() -> None:
    """What the readers show of version-1 checks: the bound compared, the far end, the verdict."""
    kl = parse_record(PAIRS["kl"][0])
    mean, p99, top1 = kl.checks
    assert (mean.lower, mean.upper, mean.bound, mean.passed) == (2.5e-4, 4e-4, 4e-4, True)
    assert (top1.lower, top1.upper, top1.bound) == (0.97, 0.995, 0.97)  # a must-reach metric compares its lower end
    assert (p99.verdict, p99.passed, p99.n_needed) == ("inconclusive", False, 65)
    lines = summary_lines([kl])
    assert any("top-1" in line and "≥ 97.0%" in line and "pass" in line for line in lines)
    assert any("p99 KL" in line and "≤ 2.6e-03" in line and "INCONCLUSIVE (n≈65)" in line for line in lines)
    drop, score = parse_record(PAIRS["capability"][0]).checks
    assert (drop.lower, drop.upper, drop.p_value) == (-0.0648, 0.1046, 0.854)
    assert (score.lower, score.upper) == (0.597, 0.824)
    props = dict(junit_properties(parse_record(PAIRS["speed"][0])))
    assert (props["mlxgate.speed.decode.limit"], props["mlxgate.speed.decode.verdict"]) == ("1.05", "pass")
    assert props["mlxgate.speed@128.kv.limit"] == "0.3"  # a check at a shorter context keeps its context
    floor_max, floor_min = parse_record(PAIRS["aa"][0]).checks
    assert (floor_max.verdict, floor_min.verdict) == ("fail", "pass")  # from `passed`, the only word they had
    (oldest,) = parse_record(PAIRS["oldest"][0]).checks
    assert (oldest.verdict, oldest.upper, oldest.lower) == ("pass", 4e-4, None)


def test_an_old_capability_task_gets_its_flipped_items_from_its_paired_items() -> None:
    (task,) = parse_record(PAIRS["capability"][0]).tasks.values()
    assert task.flipped is not None and task.flipped.total == 2
    assert [i.id for i in task.flipped.items] == ["q0", "q1"] and task.flipped.items[0].prompt is None
    assert task.flipped.items[0].candidate.output == "no idea"
    page = html_report([parse_record(PAIRS["capability"][0])])
    assert "gsm8k: 2 items flipped" in page and "prompt not recorded" in page
    no_items = copy.deepcopy(PAIRS["capability"][0])
    del no_items["tasks"]["gsm8k"]["items"]
    (bare,) = parse_record(no_items).tasks.values()
    assert bare.flipped is None  # nothing to make them from: "not recorded", never "no item changed"
    assert "gsm8k: flipped items not recorded" in html_report([parse_record(no_items)])


def test_gate_record_writes_the_current_shape_whatever_shape_its_checks_came_in(tmp_path: Path) -> None:
    old_checks = [copy.deepcopy(c) for c, _ in (KL_MEAN, KL_TOP1, FLOOR_MAX)]
    given = copy.deepcopy(old_checks)
    record = gate_record(nodeid="gates/test_kv.py::test_drift", mode="gate", verdict="fail", checks=given, stats=STATS)
    assert record.to_json()["record_version"] == RECORD_VERSION
    assert record.to_json()["checks"] == [new for _, new in (KL_MEAN, KL_TOP1, FLOOR_MAX)]
    assert given == old_checks  # the producer's dicts are left as they were
    path = tmp_path / "report.json"
    write_json_report(path, RUN, [record])
    (written,) = json.loads(path.read_text())["gates"]
    assert written["record_version"] == RECORD_VERSION
    assert not {"bound", "other_bound", "passed"} & {k for c in written["checks"] for k in c}
    with pytest.raises(TypeError, match="record_version"):
        gate_record(nodeid="a.py::t", mode="gate", verdict="pass", record_version=1)  # the constructor sets it


def _version_1_db(path: Path, rows: list[tuple[RunInfo, dict[str, Any]]]) -> None:
    """A results DB as mlxgate wrote it before the speed columns (schema 1), holding version-1 records."""
    v1 = history._COLUMNS[: len(history._COLUMNS) - len(history._SPEED_COLUMNS)]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE quality_runs (id INTEGER PRIMARY KEY, " + ", ".join(f"{n} {k}" for n, k in v1) + ")")
        for run, record in rows:
            values = dict(zip(history._COLUMN_NAMES, history._row(run, parse_record(record)), strict=True))
            values["record_json"] = json.dumps(record)  # the record exactly as the old code stored it
            names = ", ".join(n for n, _ in v1)
            conn.execute(
                f"INSERT INTO quality_runs ({names}) VALUES ({', '.join('?' * len(v1))})", [values[n] for n, _ in v1]
            )
        conn.execute("PRAGMA user_version = 1")
    conn.close()


def test_a_users_old_db_still_reads_from_the_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    db = tmp_path / "results.sqlite"
    old_run = RunInfo(**{**RUN.to_dict(), "run_id": "a" * 32, "started": "2026-10-01T00:00:00Z"})
    _version_1_db(db, [(old_run, PAIRS[name][0]) for name in ("kl", "capability", "aa", "oldest")])
    ResultsDB(db).append(RUN, [parse_record(PAIRS[name][1]) for name in ("kl", "capability", "aa", "oldest")])

    assert main(["report", "a" * 8, "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "mean KL" in out and "≤ 4.0e-04" in out and "≥ 97.0%" in out and "INCONCLUSIVE (n≈65)" in out
    assert "gsm8k drop" in out and "≤ 0.105" in out and "above floor" in out
    assert main(["history", "test_kl.py::test_kl", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.count("3.1e-04 [2.5e-04, 4.0e-04]") == 2 and "99.0% (97.0%)" in out  # both runs, same figures
    assert main(["compare", "a" * 8, "latest", "--db", str(db)]) == 0  # no regression: the same measurement
    out = capsys.readouterr().out
    assert "4 gate(s) in both runs, 0 changed verdict" in out and "Δ 0" in out
    old_rows = [parse_row(r) for r in ResultsDB(db).rows(run_id="a" * 32)]
    assert all(r.record is not None and r.record.record_version == 1 for r in old_rows)
    assert {r.record.checks[0].verdict for r in old_rows if r.record} == {"pass", "fail", "inconclusive"}


def test_compare_of_an_old_and_a_new_record_sees_no_change() -> None:
    old = Source("old", RUN, [parse_record(PAIRS[n][0]) for n in PAIRS])
    new = Source("new", RUN, [parse_record(PAIRS[n][1]) for n in PAIRS])
    lines, regressions = compare_lines(old, new)
    assert regressions == [] and f"{len(PAIRS)} gate(s) in both runs, 0 changed verdict" in lines[-1]


# -- derived facts, once, on the model ------------------------------------------------------------


def test_the_longest_context_is_the_longest_number_not_the_last_key() -> None:
    speed = _speed()
    speed["contexts"] = {
        "64": speed["contexts"]["128"] | {"context": 64},
        "1024": speed["contexts"]["512"] | {"context": 1024},
        "256": speed["contexts"]["128"] | {"context": 256},
        "x": {},
    }
    speed["contexts"]["1024"]["decode"] = {"ratio": 1.7, "ratio_ci": [1.6, 1.8], "n": 9}
    record = _base("gates/test_s.py::test_speed", "speed", "pass", speed=speed)
    read = parse_record(record)
    assert read.speed is not None and [c.length for c in read.speed.contexts] == [64, 256, 1024]
    assert read.speed.longest is not None and read.speed.longest.length == 1024  # "64" > "1024" as text
    row = dict(zip(history._COLUMN_NAMES, history._row(RUN, read), strict=True))
    assert (row["speed_context"], row["decode_ratio"]) == (1024, 1.7)
    props = dict(junit_properties(read))
    assert props["mlxgate.speed.context"] == "1024" and props["mlxgate.speed.decode.ratio"] == "1.7"
    assert props["mlxgate.speed@64.decode.ratio"] == "1.3"


def test_derived_facts_of_the_model() -> None:
    speed = _speed()
    del speed["contexts"]["512"]["kv"]  # no recorded ratio: from the arms' bytes
    read = parse_record(
        _base(
            "gates/t.py::t",
            "speed",
            "pass",
            speed=speed,
            sizes={"prompts": 7},
            tasks={"a": {"ref_score": 0.75, "cand_score": 0.5}},
        )
    )
    assert read.speed is not None and read.speed.longest is not None
    assert read.speed.longest.kv_ratio == pytest.approx(0.25) and read.speed.contexts[0].kv_ratio == 0.25
    assert read.speed.weights_ratio == 1.0
    assert read.tasks["a"].drop == pytest.approx(0.25)  # reference − candidate
    assert read.n_prompts == 7  # no stats: the sizes'
    counted = parse_record(_base("gates/t.py::t", "gate", "pass", stats={"n_prompts": None}, sizes={"prompts": 7}))
    assert counted.n_prompts is None  # the stats say it, even as null: what every reader showed before


def test_a_record_of_the_wrong_types_reads_as_dashes_and_never_raises(tmp_path: Path) -> None:
    odd: dict[str, Any] = {
        "nodeid": "gates/t.py::t",
        "gate": 3,
        "mode": "gate",
        "verdict": None,
        "candidate": ["x"],
        "lever": "kv8",
        "stats": {
            "mean": "small",
            "mean_ci": [None, "x"],
            "n_tokens": "many",
            "quantile_ci": "p99",
            "worst": ["nope", {"prompt": "3"}],
        },
        "checks": ["a string", {"key": None, "value": "v", "bound": "b", "direction": 5}],
        "kl_profile": {"histogram": {"counts": "abc", "decades": [1]}, "by_position": {"first": 3}, "prompts": []},
        "tasks": {"t": 5, "u": {"flipped": {"items": [5]}}},
        "speed": {"contexts": {"abc": 1, "5": "x"}},
        "aa": {"floors": ["mean"]},
        "error": "boom",
        "capability_score": [1],
        "durations": [],
    }
    read = parse_record(odd)
    assert read.stats.mean is None and read.stats.n_tokens is None and read.checks[0].value is None
    assert read.speed is not None and [c.length for c in read.speed.contexts] == [5]
    records = [read]
    assert summary_lines(records, width=80) and step_summary(records) and html_report(records, history={})
    assert junit_properties(read) and history._row(RUN, read)
    db = ResultsDB(tmp_path / "r.sqlite")
    assert db.append(RUN, [read]) == 1


# -- the one parse: readers hold no dict lookups of record fields ------------------------------------

#: Where a dict's keys may be read in results/: the read model's parse (model.py and its parts) and the wire
#: form's migration (wire.py); `verdicts.check_verdict` reads a check as the assertions build it
#: (before any record).
_READERS_ALLOWED = {
    "model.py": None,
    "record_checks.py": None,
    "record_kl.py": None,
    "record_oracle.py": None,
    "record_capability.py": None,
    "record_speed.py": None,
    "record_server.py": None,
    "runs.py": None,
    "wire.py": {"migrate_check", "migrate_record", "_flipped_from_items", "score", "_without_flipped"},
    "verdicts.py": {"check_verdict"},
}


def test_results_reads_record_fields_only_in_the_parse_and_the_migration() -> None:
    found = []
    for path in sorted(RESULTS.glob("*.py")):
        allowed = _READERS_ALLOWED.get(path.name, set())
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]:
            body = (
                func.body
                if not isinstance(func, ast.Module)
                else [n for n in func.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            )
            for node in (n for stmt in body for n in ast.walk(stmt)):
                call = isinstance(node, ast.Call)
                literal_get = (
                    call
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"  # type: ignore[attr-defined]
                    and node.args
                    and isinstance(node.args[0], ast.Constant)  # type: ignore[attr-defined]
                    and isinstance(node.args[0].value, str)
                )  # type: ignore[attr-defined]
                as_map = call and isinstance(node.func, ast.Name) and node.func.id == "as_map"  # type: ignore[attr-defined]
                name = getattr(func, "name", "<module>")
                if (literal_get or as_map) and allowed is not None and name not in allowed:
                    found.append(f"{path.name}:{node.lineno} in {name}")  # type: ignore[attr-defined]
    assert found == []
