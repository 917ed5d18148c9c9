"""Gate records as a run makes them, built from synthetic measurements through the package's own code
(summarize, kl_profile, kl_checks, capability_checks, SpeedResult, speed_checks): a KL gate, a capability
gate and a speed gate, plus results-DB rows of earlier runs. For the HTML report's tests."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from pytest_mlxgate.capability.assertions import capability_checks
from pytest_mlxgate.capability.base import Item, ItemResult
from pytest_mlxgate.capability.result import CapabilityRun
from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.junit import split_suite_name
from pytest_mlxgate.results.model import Record
from pytest_mlxgate.results.records import RunInfo, gate_record
from pytest_mlxgate.results.verdicts import overall_verdict
from pytest_mlxgate.speed.assertions import speed_checks
from pytest_mlxgate.speed.result import ContextSpeed, SpeedResult, Trial
from pytest_mlxgate.speed.shape import SpeedShape
from pytest_mlxgate.stats.divergence import TokenScores
from pytest_mlxgate.stats.kl_profile import kl_profile
from pytest_mlxgate.stats.kl_stats import summarize

#: The text of the worst token's context in `kl_record`: what an unescaped report would run.
HOSTILE = "<script>alert('x')</script>"

MODEL = {"name": "tiny", "repo_id": "org/tiny", "commit": "0" * 40, "pinned": "org/tiny@0000000"}
LEVER = {"name": "kv_cache", "kind": "kv", "ref": "plain", "cand": {"bits": 8, "group_size": 64}}


def synthetic_scores(n_prompts: int, tokens: int, *, seed: int = 0, scale: float = 3e-4) -> list[TokenScores]:
    """Heavy-tailed per-token KL with a rise along the position, a few top-1 flips and near ties."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(n_prompts):
        drift = 1.0 + np.linspace(0, 2, tokens)
        kl = rng.lognormal(np.log(scale), 1.2, size=tokens) * drift * (1 + 0.5 * (p % 3))
        kl[rng.random(tokens) < 0.05] = 0.0
        ref_top = rng.integers(0, 50, size=tokens).astype(np.int32)
        cand_top = ref_top.copy()
        flip = rng.random(tokens) < 0.04
        cand_top[flip] += 1
        near_tie = rng.random(tokens) < 0.06
        out.append(
            TokenScores(
                kl=kl,
                ref_top1=ref_top,
                cand_top1=cand_top,
                near_tie=near_tie,
                ref_next_logprob=np.full(tokens, -1.0, dtype=np.float32),
                cand_next_logprob=(np.full(tokens, -1.0) - kl).astype(np.float32),
                next_tokens=rng.integers(0, 50, size=tokens).astype(np.int32),
                positions=np.arange(tokens, dtype=np.int32),
            )
        )
    return out


def kl_record(
    *,
    n_prompts: int = 6,
    tokens: int = 48,
    mean_limit: float = 2e-3,
    nodeid: str | None = None,
    with_profile: bool = True,
) -> Record:
    """A KL gate's record; its worst token's context holds `HOSTILE`."""
    scores = synthetic_scores(n_prompts, tokens)
    stats = summarize(scores)
    j = stats.to_json()
    checks = kl_checks(j, {"mean": mean_limit, "p99": 5e-2, "top1": 0.8})
    fields: dict[str, Any] = {}
    if with_profile:
        contexts = [
            {
                "prompt": w.prompt,
                "position": w.position,
                "before": f"The answer is {HOSTILE} and ",
                "token": " <b>bold</b>",
                "after": " & more",
            }
            for w in stats.worst
        ]
        fields["kl_profile"] = {**kl_profile(scores), "worst_context": contexts}
    ids = {w.token_id for w in stats.worst} | {w.ref_top1 for w in stats.worst} | {w.cand_top1 for w in stats.worst}
    return gate_record(
        nodeid=nodeid or "gates/test_kv_cache.py::test_drift",
        mode="gate",
        verdict=overall_verdict(checks),
        checks=checks,
        bounds={"mean": mean_limit, "p99": 5e-2, "top1": 0.8},
        candidate=MODEL,
        reference_model=None,
        lever=LEVER,
        path="serving",
        sizes={"prompts": n_prompts, "tokens": tokens, "decode": 8, "chunk": None},
        stats=j,
        reference_source="computed",
        durations={"total_s": 3.2},
        forwards={"reference": 6, "candidate": 6},
        aa=None,
        tokens={str(i): f"tok{i}<&>" for i in ids},
        rerun="pytest 'gates/test_kv_cache.py::test_drift'",
        **fields,
    )


def capability_record() -> Record:
    """A capability gate over two tasks, one with items that flipped between the arms."""
    runs = {}
    for task, n, flips in (("gsm8k", 30, 4), ("mmlu", 40, 0)):
        items = [
            Item(id=f"{task}-{i}", text=f"Question {i}: what is {i} + {i}? <img src=x onerror=alert(1)>")
            for i in range(n)
        ]
        ref = [
            ItemResult(it.id, "h", f"The answer is {2 * i}.", 1.0 if i % 3 else 0.0, "correct" if i % 3 else "wrong")
            for i, it in enumerate(items)
        ]
        cand = list(ref)
        for i in range(1, 1 + flips):
            cand[i] = ItemResult(items[i].id, "h", "<script>no</script>", 0.0, "wrong")
        runs[task] = CapabilityRun(
            task=task,
            tier="smoke",
            graded=False,
            items=items,
            reference=ref,
            candidate=cand,
            durations={"reference_s": 1.0, "candidate_s": 1.0},
            rendered={it.id: f"<|user|>{it.text}<|assistant|>" for it in items},
        )
    checks, tasks = capability_checks(runs, floor=None, max_drop=0.1, alpha=0.05)
    return gate_record(
        nodeid="gates/test_kv_cache.py::test_capability",
        mode="capability",
        verdict=overall_verdict(checks),
        checks=checks,
        bounds={"max_drop": 0.1, "alpha": 0.05},
        candidate=MODEL,
        reference_model=None,
        lever=LEVER,
        path="serving",
        sizes={"prompts": 70},
        stats={"n_prompts": 70},
        tasks=tasks,
        skipped={"humaneval": "no sandbox"},
        durations={"total_s": 4.0},
        rerun="pytest 'gates/test_kv_cache.py::test_capability'",
    )


def speed_record() -> Record:
    """A speed gate at two contexts: the candidate a little faster at decode, its KV cache half."""
    rng = np.random.default_rng(1)
    contexts = {}
    for context in (64, 256):
        ref = [
            Trial(
                prefill_s=context / 900 * (1 + 0.03 * rng.random()),
                decode_s=8 / 40 * (1 + 0.03 * rng.random()),
                peak_bytes=40 << 20,
                kv_bytes=context * 4096,
                kv_held_bytes=context * 3072,
            )
            for _ in range(5)
        ]
        cand = [
            Trial(
                prefill_s=context / 950 * (1 + 0.03 * rng.random()),
                decode_s=8 / 44 * (1 + 0.03 * rng.random()),
                peak_bytes=30 << 20,
                kv_bytes=context * 2048,
                kv_held_bytes=context * 1536,
            )
            for _ in range(5)
        ]
        contexts[context] = ContextSpeed.from_trials(context, 8, ref, cand)
    result = SpeedResult(
        shape=SpeedShape(contexts=(64, 256), decode=8, repetitions=5),
        contexts=contexts,
        memory_method="mx.get_peak_memory",
        weights={"reference": 1 << 20, "candidate": 1 << 20},
        arms={"reference": "reference", "candidate": "candidate"},
        duration_s=2.5,
    )
    speed = {"id": "speed-1", **result.to_json()}
    goals = {"decode": 1.02, "kv": 0.6}
    checks = speed_checks(speed, goals, None)
    return gate_record(
        nodeid="gates/test_kv_cache.py::test_speed",
        mode="speed",
        verdict=overall_verdict(checks),
        checks=checks,
        bounds=goals,
        candidate=MODEL,
        reference_model=None,
        lever=LEVER,
        path="serving",
        speed=speed,
        durations={"total_s": 2.5},
        rerun="pytest 'gates/test_kv_cache.py::test_speed'",
    )


def run_info() -> RunInfo:
    return RunInfo(
        run_id="f" * 32,
        started="2026-12-01T00:00:00Z",
        code_commit="a" * 40,
        code_dirty=False,
        argv=["gates/"],
        config={},
        machine={"device": "cpu", "blas": "openblas", "mlx": "0.30", "mlx_lm": "0.30", "python": "3.11"},
    )


def history_for(records: list[Record], runs: int = 6) -> dict[str, list[dict[str, Any]]]:
    """Results-DB rows (the columns the sparkline reads) of `runs` earlier runs of each gate."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        rows = []
        for k in range(runs):
            tasks = {t: {"cand_score": 0.6 + 0.02 * k} for t in record.tasks}
            rows.append(
                {
                    "run_id": f"{k:032x}",
                    "time": f"2026-11-{k + 1:02d}T00:00:00Z",
                    "nodeid": record.nodeid,
                    "code_commit": f"{k:040x}",
                    "code_dirty": k == 2,
                    "verdict": "pass" if k % 4 else "fail",
                    "mean_kl": 2e-4 * (1 + k),
                    "decode_ratio": 1.0 + 0.02 * k,
                    "record_json": json.dumps({"tasks": tasks}),
                }
            )
        out[record.nodeid] = rows
    return out


def attribution_data(*, hostile: str = HOSTILE) -> dict[str, Any]:
    """An `attribution` as `explain.attribute` writes it: four layers, layer 2 carrying the drift, a
    sliding and a full type scope (one with KL by position), the output-error curve stepping at layer 2."""
    scores = synthetic_scores(4, 16)

    def scope(name: str, layers: list[int], kind: str, mean: float, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "layers": layers,
            "kind": kind,
            "level": 1,
            "ranked": True,
            "n": 4,
            "mean": mean,
            "mean_ci": [mean * 0.5, mean * 1.5],
            "p99": mean * 10,
            "top1": 0.99,
            **extra,
        }

    return {
        "version": 1,
        "budget": 3.0,
        "sequences": 4,
        "whole": {"mean": 0.02, "mean_ci": [0.01, 0.03], "n": 4},
        "scopes": [
            scope("sliding layers", [0, 2], "type", 0.019, by_position=kl_profile(scores)["by_position"]),
            scope("full layers", [1, 3], "type", 1e-4),
            *(scope(f"layer {i}", [i], "layer", 0.018 if i == 2 else 1e-4) for i in range(4)),
            scope(f"layer {hostile}", [], "rest", 0.0),
        ],
        "residual": {
            "sequences": 2,
            "layers": [
                {"layer": i, "type": "sliding_attention", "rel_error": e, "ci": [e * 0.8, e * 1.2]}
                for i, e in enumerate([1e-4, 1.2e-4, 0.01, 0.011])
            ],
        },
        "notes": [f"a note with {hostile}"],
        "cost": {"sequence_arms": 30, "gate_sequence_arms": 12, "seconds": 9.0, "gate_seconds": 4.0},
        "source": "computed",
    }


def junit_gate_properties(xml: Path) -> dict[str, dict[str, str]]:
    """A JUnit file's mlxgate properties by gate: {NODEID: {"mlxgate.verdict": …}} from `mlxgate[NODEID].verdict`."""
    props: dict[str, dict[str, str]] = {}
    for prop in ET.parse(xml).getroot().iter("property"):
        split = split_suite_name(prop.get("name") or "")
        if split:
            props.setdefault(split[0], {})[split[1]] = prop.get("value") or ""
    return props
