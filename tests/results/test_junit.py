"""A record as JUnit properties: flat `mlxgate.*` names with interval ends and limits for every check
(KL, capability per task, speed and memory), each name once, then the record as strict JSON; the
`<testsuite>` form scopes each name by node id and reads back. Records from the real check builders."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pytest_mlxgate.capability.assertions import capability_checks
from pytest_mlxgate.capability.base import Item, ItemResult
from pytest_mlxgate.capability.result import CapabilityRun
from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.fields import jsonable
from pytest_mlxgate.results.junit import junit_properties, property_text, split_suite_name, suite_properties
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import RECORD_PROPERTY, gate_record
from pytest_mlxgate.results.verdicts import overall_verdict
from pytest_mlxgate.speed.assertions import speed_checks

MODEL = {"name": "smollm2-135m", "repo_id": "mlxgate/SmolLM2", "commit": "0" * 40, "pinned": "mlxgate/SmolLM2@0000000"}
STATS: dict[str, Any] = {
    "n_prompts": 16,
    "n_tokens": 512,
    "confidence": 0.95,
    "mean": 3.1e-4,
    "mean_ci": [2.5e-4, 4.0e-4],
    "median": 1.2e-4,
    "p90": 8e-4,
    "p95": 1.1e-3,
    "p99": 2.2e-3,
    "p999": 4e-3,
    "quantile_ci": {
        "median": [1e-4, 1.4e-4],
        "p90": [7e-4, 9e-4],
        "p95": [1e-3, 1.3e-3],
        "p99": [1.9e-3, 2.6e-3],
        "p999": [3e-3, 5e-3],
    },
    "max": 6e-3,
    "same_top": 0.98,
    "same_top_ci": [0.96, 0.99],
    "top1": 0.99,
    "top1_ci": [0.97, 0.995],
    "flips": 3,
    "near_tie_flips": 1,
    "ln_ppl_ratio": float("nan"),
    "ln_ppl_ratio_ci": [float("nan"), float("nan")],
}


def kl_record(**bounds: float) -> dict[str, Any]:
    checks = kl_checks(STATS, bounds)
    return gate_record(
        nodeid="gates/test_kv.py::test_drift",
        mode="gate",
        verdict=overall_verdict(checks),
        checks=checks,
        bounds=bounds,
        stats=STATS,
        candidate=MODEL,
        reference_model=None,
        lever={"name": "kv8", "ref": "plain", "cand": "8-bit"},
        path="serving",
        reference_source="cache",
        durations={"total_s": 1.5},
        rerun="pytest gates/test_kv.py",
    ).to_json()


def props(record: dict[str, Any]) -> dict[str, str]:
    pairs = junit_properties(parse_record(record))
    names = [n for n, _ in pairs]
    assert len(names) == len(set(names)), "a property name twice"
    assert names[-1] == RECORD_PROPERTY
    return dict(pairs)


def test_a_kl_gate_gives_value_interval_limit_and_verdict_for_every_bound_it_asserted() -> None:
    p = props(kl_record(mean=1e-3, p99=2.4e-3, top1=0.95))
    assert p["mlxgate.verdict"] == "inconclusive" and p["mlxgate.mode"] == "gate"
    assert p["mlxgate.model"] == MODEL["pinned"] and p["mlxgate.lever"] == "kv8"
    assert (p["mlxgate.n_prompts"], p["mlxgate.n_tokens"]) == ("16", "512")
    assert [float(p[f"mlxgate.kl.mean{s}"]) for s in ("", ".lower", ".upper", ".limit")] == [3.1e-4, 2.5e-4, 4e-4, 1e-3]
    assert p["mlxgate.kl.mean.verdict"] == "pass"
    # p99's interval [1.9e-3, 2.6e-3] straddles 2.4e-3: inconclusive, with about how many prompts would tell
    assert (
        p["mlxgate.kl.p99.lower"],
        p["mlxgate.kl.p99.upper"],
        p["mlxgate.kl.p99.limit"],
        p["mlxgate.kl.p99.verdict"],
    ) == ("0.0019", "0.0026", "0.0024", "inconclusive")
    assert int(p["mlxgate.kl.p99.n_needed"]) > 16
    # a must-reach metric compares its lower end: .lower is the bound, .upper the far end
    assert (p["mlxgate.kl.top1.lower"], p["mlxgate.kl.top1.upper"], p["mlxgate.kl.top1.verdict"]) == (
        "0.97",
        "0.995",
        "pass",
    )
    assert p["mlxgate.kl.max"] == "0.006" and p["mlxgate.kl.flips"] == "3"
    assert "mlxgate.kl.ln_ppl" not in p  # NaN is left out, not written as "nan"


def test_the_record_property_is_the_record_as_strict_json() -> None:
    record = kl_record(mean=1e-3)
    text = props(record)[RECORD_PROPERTY]
    loaded = json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert loaded == jsonable(record) and loaded["stats"]["ln_ppl_ratio"] is None


def test_a_gate_that_only_measured_still_gives_its_figures() -> None:
    record = kl_record()
    record["checks"], record["verdict"] = [], "measured"
    p = props(record)
    assert p["mlxgate.verdict"] == "measured" and p["mlxgate.kl.mean.upper"] == "0.0004"
    assert "mlxgate.kl.mean.limit" not in p


def _run(task: str, ref: list[float], cand: list[float]) -> CapabilityRun:
    items = [Item(id=f"q{i}", text=f"question {i}") for i in range(len(ref))]

    def results(scores: list[float]) -> list[ItemResult]:
        return [
            ItemResult(item_id=it.id, prompt_hash="h", output="o", score=s, verdict="correct" if s else "wrong")
            for it, s in zip(items, scores, strict=True)
        ]

    return CapabilityRun(
        task=task, tier="smoke", graded=False, items=items, reference=results(ref), candidate=results(cand)
    )


def test_capability_gives_both_scores_and_the_drop_with_its_bounds_per_task() -> None:
    runs = {
        "gsm8k": _run("gsm8k", [1.0] * 30 + [0.0] * 10, [1.0] * 29 + [0.0] * 11),
        "mmlu": _run("mmlu", [1.0] * 20 + [0.0] * 20, [1.0] * 20 + [0.0] * 20),
    }
    checks, tasks = capability_checks(runs, floor=0.3, max_drop=0.1, alpha=0.05)
    record = gate_record(
        nodeid="gates/test_cap.py::test_capability",
        mode="capability",
        verdict=overall_verdict(checks),
        checks=checks,
        tasks=tasks,
        skipped={"humaneval": "no sandbox"},
        candidate=MODEL,
        stats={"n_prompts": 80},
    ).to_json()
    p = props(record)
    drop = tasks["gsm8k"]["drop_verdict"]
    assert float(p["mlxgate.capability.gsm8k.reference"]) == 0.75
    assert float(p["mlxgate.capability.gsm8k.candidate"]) == 29 / 40
    assert float(p["mlxgate.capability.gsm8k.drop"]) == pytest.approx(drop["value"])
    assert float(p["mlxgate.capability.gsm8k.drop.lower"]) == drop["lower"]
    assert float(p["mlxgate.capability.gsm8k.drop.upper"]) == drop["upper"]
    assert (p["mlxgate.capability.gsm8k.drop.limit"], p["mlxgate.capability.gsm8k.drop.verdict"]) == (
        "0.1",
        drop["verdict"],
    )
    assert float(p["mlxgate.capability.mmlu.score.lower"]) == tasks["mmlu"]["floor_verdict"]["lower"]
    assert p["mlxgate.capability.mmlu.score.limit"] == "0.3"
    assert p["mlxgate.capability.mmlu.candidate.lower"] < p["mlxgate.capability.mmlu.candidate.upper"]
    assert p["mlxgate.capability.mmlu.n"] == "40" and p["mlxgate.capability.humaneval.skipped"] == "no sandbox"


def _speed() -> dict[str, Any]:
    def est(ratio: float, lo: float, hi: float) -> dict[str, Any]:
        return {"ratio": ratio, "ratio_ci": [lo, hi], "n": 9, "log_sd": 0.05}

    ref = {
        "prefill_tps": 100.0,
        "decode_tps": 10.0,
        "peak_bytes": 4 << 20,
        "kv_bytes": 2 << 20,
        "kv_held_bytes": 3 << 19,
    }
    cand = {
        "prefill_tps": 110.0,
        "decode_tps": 13.0,
        "peak_bytes": 3 << 20,
        "kv_bytes": 1 << 20,
        "kv_held_bytes": 3 << 18,
    }
    return {
        "id": "s1",
        "shape": {"contexts": [64, 256], "decode": 16, "repetitions": 9},
        "weights_bytes": {"reference": 1000, "candidate": 250},
        "contexts": {
            str(c): {
                "context": c,
                "reference": ref,
                "candidate": cand,
                "prefill": est(1.1, 1.0, 1.2),
                "decode": est(1.3 if c == 256 else 1.2, 1.25, 1.35),
                "peak": est(0.75, 0.7, 0.8),
                "kv": {"ratio": 0.5},
            }
            for c in (64, 256)
        },
    }


def test_speed_gives_the_longest_context_plain_others_by_context_and_each_goals_limit() -> None:
    speed = _speed()
    checks = speed_checks(speed, {"decode": 1.05, "memory": 0.9, "kv": 0.6, "weights": 0.3}, "all")
    record = gate_record(
        nodeid="gates/test_kv.py::test_speed",
        mode="speed",
        verdict=overall_verdict(checks),
        checks=checks,
        speed=speed,
    ).to_json()
    p = props(record)
    assert p["mlxgate.speed.context"] == "256"
    assert (
        p["mlxgate.speed.decode.ratio"],
        p["mlxgate.speed.decode.ratio.lower"],
        p["mlxgate.speed.decode.ratio.upper"],
    ) == ("1.3", "1.25", "1.35")
    assert p["mlxgate.speed@64.decode.ratio"] == "1.2" and p["mlxgate.speed.prefill.ratio"] == "1.1"
    assert (p["mlxgate.speed.decode.limit"], p["mlxgate.speed.decode.verdict"]) == ("1.05", "pass")
    assert p["mlxgate.speed@64.decode.limit"] == "1.05"  # at="all": the goal at every context
    assert (p["mlxgate.speed.peak.ratio.upper"], p["mlxgate.speed.peak.limit"]) == ("0.8", "0.9")
    assert (p["mlxgate.speed.kv.ratio"], p["mlxgate.speed.kv.limit"]) == ("0.5", "0.6")
    assert (p["mlxgate.speed.kv.reference_bytes"], p["mlxgate.speed.decode.candidate_tps"]) == (str(2 << 20), "13.0")
    assert (p["mlxgate.speed.kv.reference_held_bytes"], p["mlxgate.speed.kv.candidate_held_bytes"]) == (
        str(3 << 19),
        str(3 << 18),
    )
    assert (p["mlxgate.speed.weights.ratio"], p["mlxgate.speed.weights.verdict"]) == ("0.25", "pass")


def test_suite_properties_are_scoped_by_node_id_and_read_back() -> None:
    record = kl_record(mean=1e-3)
    record["nodeid"] = "gates/test_kv.py::test_drift[a].b]"  # a parameter id may hold "]." itself
    pairs = suite_properties(parse_record(record))
    assert pairs[0][0].startswith("mlxgate[gates/test_kv.py::test_drift[a].b]].")
    back = {split_suite_name(n): v for n, v in pairs}
    assert back[(record["nodeid"], "mlxgate.verdict")] == "pass"
    assert json.loads(back[(record["nodeid"], RECORD_PROPERTY)]) == jsonable(record)
    assert dict(junit_properties(parse_record(record))) == {k[1]: v for k, v in back.items()}  # type: ignore[index]
    assert split_suite_name("mlxgate.verdict") is None and split_suite_name("other[x].y") is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        (True, "true"),
        (3, "3"),
        (1e-9, "1e-09"),
        (float("nan"), None),
        (math.inf, None),
        ("x", "x"),
        ([1, 2], "[1, 2]"),
    ],
)
def test_property_text(value: Any, text: str | None) -> None:
    assert property_text(value) == text


def test_the_record_survives_what_junitxml_does_to_text_xml_cannot_hold() -> None:
    from _pytest.junitxml import bin_xml_escape  # what pytest applies to every property value

    record = kl_record(mean=1e-3)
    record["tokens"] = {"7": "a\x7fb → \x00\ufffe"}  # a token's text may hold any of these
    text = props(record)[RECORD_PROPERTY]
    assert bin_xml_escape(text) == text and text.isascii()
    assert json.loads(text) == jsonable(record)
