"""The KL serving path in batches: the batch size keeps the held logits bounded, and a gate's
verdict is the same batched as one at a time. (Each row of a batch against mlx_lm's own decode
loop, position by position: tests/kl/test_serving_path.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.kl import arms
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts
from pytest_mlxgate.kl.shape import ArmCounters, RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.serving.kv_plan import parse_kv_value


def _model(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(path))


def test_batches_hold_a_bounded_amount_of_logits(tiny_kv_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = _model(tiny_kv_model_dir)
    shape = RunShape(path="serving", tokens=24, decode=4)
    seqs = build_sequences(default_prompts(), tok, n=9, tokens=shape.tokens)
    vocab = 49152
    monkeypatch.setattr(arms, "SERVING_BATCH_BYTES", 2 * shape.decode * vocab * 4)  # two sequences' rows
    counters = ArmCounters()
    seen = [seq.index for seq, _ in arms._batches(model, seqs, shape, parse_kv_value("plain"), counters, "reference")]
    assert seen == list(range(9))  # every sequence, in order
    # the first batch of 4 (vocabulary unknown yet), then batches of 2: 4 + 2 + 2 + 1
    assert counters.reference_forwards == 4 * (1 + shape.decode)
    one_at_a_time = ArmCounters()
    list(
        arms._batches(
            model, seqs, dataclasses.replace(shape, batched=False), parse_kv_value("plain"), one_at_a_time, "reference"
        )
    )
    assert one_at_a_time.reference_forwards == 9 * (1 + shape.decode)


def test_a_kv_gate_decides_the_same_batched_and_one_at_a_time(tiny_kv_model_dir: Path) -> None:
    from pytest_mlxgate.stats.kl_stats import summarize

    model, tok = _model(tiny_kv_model_dir)
    lever = Lever(name="kv", kind="kv", target=None, ref="plain", cand="bits=4,group_size=64,start=0", path="serving")
    shape = RunShape(path="serving", tokens=48, decode=16)
    seqs = build_sequences(default_prompts(), tok, n=8, tokens=shape.tokens)
    results = {}
    for batched in (True, False):
        s = dataclasses.replace(shape, batched=batched)
        refs = arms.run_reference(model, seqs, s, lever, counters=ArmCounters())
        results[batched] = summarize(arms.run_candidate(model, seqs, s, lever, refs, counters=ArmCounters()))
    b, one = results[True].to_json(), results[False].to_json()
    assert b["mean"] > 1e-4  # a real drift to agree on
    assert b["mean"] == pytest.approx(one["mean"], rel=0.02)  # 4-bit rounding flips at most a few groups
    assert b["p99"] == pytest.approx(one["p99"], rel=0.05)
    assert abs(b["top1"] - one["top1"]) <= 2 / b["n_tokens"]
