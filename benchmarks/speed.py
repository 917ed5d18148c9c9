"""speed: what the speed measurement costs, how repeatable its ratio is, and the batched serving path.

On the embedded model, with the KV gate's lever (plain vs 8-bit, group 64) and sizes:
1. overhead: the KL arms of a serving gate (16 prompts x 128 tokens, 32 decoded) vs the same plus
   the speed measurement at the CPU defaults (128 tokens, 8 decoded, up to 9 pairs): the ratio.
2. repeatability: `--runs` (5) whole A/B measurements back to back: the spread of the decode and
   prefill ratio point estimates (min, max, sd of their logs) and whether every interval holds
   every other run's estimate. Goal: sd of log decode ratio <= 0.05.
3. serving path: decoded positions/s of one arm, the gate's sequences batched vs one at a time,
   interleaved repeats, medians. Goal: batched >= 2x.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

from ._common import header, median, verdict

SPREAD_GOAL, BATCH_GOAL = 0.05, 2.0


def _setup(prompts: int) -> tuple[Any, Any, Any, Any]:
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts
    from pytest_mlxgate.kl.shape import RunShape
    from pytest_mlxgate.levers.lever import Lever

    from .kl_gate import _load

    loaded = _load()
    lever = Lever(
        name="kv_cache",
        kind="kv",
        target=None,
        ref="plain",
        cand={"bits": 8, "group_size": 64, "start": 0},
        path="serving",
    )
    shape = RunShape(path="serving", tokens=128, decode=32)
    seqs = build_sequences(default_prompts(), loaded.tokenizer, n=prompts, tokens=shape.tokens)
    return loaded, lever, shape, seqs


def _speed(loaded: Any, lever: Any, seqs: Any) -> dict[str, Any]:
    from pytest_mlxgate.speed.measure import ArmModel, measure_speed
    from pytest_mlxgate.speed.shape import SpeedShape, default_contexts, default_decode

    shape = SpeedShape(contexts=default_contexts("cpu"), decode=default_decode("cpu"))
    return measure_speed(
        lever=lever,
        reference=ArmModel(loaded.model, "reference"),
        candidate=ArmModel(loaded.model, "candidate"),
        token_ids=[t for s in seqs for t in s.ids],
        shape=shape,
    ).to_json()


def _kl_arms(loaded: Any, lever: Any, shape: Any, seqs: Any) -> float:
    from pytest_mlxgate.kl.arms import run_candidate, run_reference
    from pytest_mlxgate.kl.shape import ArmCounters

    t0 = time.perf_counter()
    refs = run_reference(loaded.model, seqs, shape, lever, counters=ArmCounters())
    run_candidate(loaded.model, seqs, shape, lever, refs, counters=ArmCounters())
    return time.perf_counter() - t0


def overhead(loaded: Any, lever: Any, shape: Any, seqs: Any) -> None:
    header("speed overhead: a serving KV gate's KL arms, without and with the speed measurement")
    kl_s = _kl_arms(loaded, lever, shape, seqs)
    t0 = time.perf_counter()
    _speed(loaded, lever, seqs)
    speed_s = time.perf_counter() - t0
    print(f"KL arms {kl_s:.1f} s; speed {speed_s:.1f} s; gate with speed / without: {(kl_s + speed_s) / kl_s:.2f}x")


def repeatability(loaded: Any, lever: Any, seqs: Any, runs: int) -> None:
    header(f"speed repeatability: {runs} whole A/B measurements of plain vs 8-bit KV, back to back")
    found = [_speed(loaded, lever, seqs) for _ in range(runs)]
    for context in found[0]["contexts"]:
        for what in ("prefill", "decode"):
            est = [f["contexts"][context][what] for f in found]
            logs = [math.log(e["ratio"]) for e in est]
            inside = all(e["ratio_ci"][0] <= o["ratio"] <= e["ratio_ci"][1] for e in est for o in est)
            sd = statistics.stdev(logs)
            goal = f" — goal sd <= {SPREAD_GOAL}: {verdict(sd <= SPREAD_GOAL)}" if what == "decode" else ""
            print(
                f"@{context} {what}: ratios "
                + ", ".join(f"{e['ratio']:.3f}" for e in est)
                + f"; min {min(e['ratio'] for e in est):.3f} max {max(e['ratio'] for e in est):.3f}, "
                f"sd of logs {sd:.3f}; every interval holds every estimate: {inside}{goal}"
            )


def serving(loaded: Any, lever: Any, shape: Any, seqs: Any, repeats: int) -> None:
    import dataclasses

    from pytest_mlxgate.kl.arms import run_reference
    from pytest_mlxgate.kl.shape import ArmCounters

    header(f"serving path: {len(seqs)} sequences x {shape.decode} decoded positions, one arm, batched vs one at a time")
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for batched in (False, True):
            s = dataclasses.replace(shape, batched=batched)
            t0 = time.perf_counter()
            run_reference(loaded.model, seqs, s, lever, counters=ArmCounters())
            times[batched].append(time.perf_counter() - t0)
    positions = len(seqs) * shape.decode
    one, many = median(times[False]), median(times[True])
    print(
        f"one at a time {positions / one:.1f} positions/s ({one:.1f} s); batched {positions / many:.1f} positions/s "
        f"({many:.1f} s): {one / many:.2f}x — goal >= {BATCH_GOAL}x: {verdict(one / many >= BATCH_GOAL)}"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks speed")
    parser.add_argument("--only", choices=("overhead", "repeatability", "serving"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    loaded, lever, shape, seqs = _setup(args.prompts)
    if args.only in (None, "serving"):
        serving(loaded, lever, shape, seqs, args.repeats)
    if args.only in (None, "overhead"):
        overhead(loaded, lever, shape, seqs)
    if args.only in (None, "repeatability"):
        repeatability(loaded, lever, seqs, args.runs)
