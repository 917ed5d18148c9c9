"""The speed measurement's whole behaviour on a fake lever and model: every forward it makes (which arm,
which tokens, in which order), every trial's figures, each context's stop, the record's fields, and the
progress it reports. Time is a fake clock advanced only by the fake forwards, in costs that are exact
binary fractions, so every timed span is known to the last bit; nothing is timed for real. Then the
stopping rule, the pairs' loop and the cache byte counts on hand-made estimates and cache layers."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import pytest

from pytest_mlxgate.speed import load, measure
from pytest_mlxgate.speed.load import CpuSample
from pytest_mlxgate.speed.measure import ArmModel, cache_bytes, cache_held_bytes, measure_speed, stop_reason
from pytest_mlxgate.speed.result import ContextSpeed, Trial
from pytest_mlxgate.speed.shape import SpeedGoal, SpeedShape
from pytest_mlxgate.stats.ratios import RatioEstimate

ALLOCATED = 3000  # positions each fake cache layer allocates
PREFILL_PER_TOKEN = 1 / 1024  # fake seconds, the reference arm's; the candidate's are half
DECODE_PER_STEP = 1 / 64
PEAK = {"reference": 4096, "candidate": 1024}  # bytes a trial grows by, plus one per forward since the reset
FACTOR = {"reference": 1.0, "candidate": 0.5}


class Clock:
    def __init__(self) -> None:
        self.now = 1024.0

    def perf_counter(self) -> float:
        return self.now


class Layer:
    """A cache layer as mlx_lm's: keys and values (batch, heads, positions, dim) and the tokens it holds."""

    def __init__(self, dtype: Any) -> None:
        self.keys = mx.zeros((1, 2, ALLOCATED, 4), dtype=dtype)
        self.values = mx.zeros((1, 2, ALLOCATED, 4), dtype=dtype)
        self.offset = 0

    @property
    def state(self) -> list[Any]:
        return [self.keys, self.values]


class Rig:
    """A lever whose arms differ in speed, cache dtype and peak, a fake clock, probe, watcher and load."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.arm: str | None = None
        self.forwards: list[tuple[str, list[int]]] = []  # (arm, token ids fed) per forward
        self.since_reset = 0
        self.events: list[Any] = []
        self.checks = 0
        self.evaluated: list[Any] = []
        self.last_out: Any = None

    def eval(self, x: Any) -> None:
        """mx.eval, noting what it was asked to evaluate: the cache's state, or the last forward's output."""
        self.evaluated.append(("state", len(x)) if isinstance(x, list) else ("out", x is self.last_out))
        mx.eval(x)

    # the lever
    @contextlib.contextmanager
    def applied(self, arm: str) -> Iterator[None]:
        assert self.arm is None
        self.arm = arm
        try:
            yield
        finally:
            self.arm = None

    def kv_plan(self, arm: str) -> Any:
        assert arm == self.arm
        rig = self

        class Plan:
            def make_cache(self, model: Any) -> list[Layer]:
                assert model.name == arm
                return [Layer(mx.float32 if arm == "reference" else mx.float16)]

            def forward(self, model: Any, ids: Any, cache: list[Layer]) -> Any:
                assert model.name == arm
                tokens = int(ids.shape[1])
                rig.forwards.append((arm, ids[0].tolist()))
                rig.since_reset += 1
                cache[0].offset += tokens
                per = PREFILL_PER_TOKEN * tokens if tokens > 1 else DECODE_PER_STEP
                rig.clock.now += per * FACTOR[arm]
                rig.last_out = mx.zeros((1, tokens, 8))
                return rig.last_out

        return Plan()

    # the memory probe
    method = "fake peak probe"

    def reset(self) -> None:
        self.since_reset = 0

    def peak(self) -> int:
        assert self.arm is not None
        return PEAK[self.arm] + self.since_reset

    # the watcher and its meter
    @contextlib.contextmanager
    def timing_alone(self, what: str) -> Iterator[float]:
        self.events.append(("alone", what))
        yield 1.5
        self.events.append("released")

    def arm_meter(self, label: str, total: int, **kw: Any) -> Rig:
        self.events.append(("arm", label, total, kw))
        return self

    def check(self) -> None:
        self.checks += 1

    def advance(self) -> None:
        self.events.append(("advance", len(self.forwards)))

    def finish(self) -> None:
        self.events.append("finish")


class Model:
    def __init__(self, name: str, floats: int) -> None:
        self.name = name
        self.floats = floats

    def parameters(self) -> dict[str, Any]:
        return {
            "embed": mx.zeros((self.floats,)),
            "layers": [{"w": mx.zeros((3,), dtype=mx.float16)}, (mx.zeros((1,)),)],
        }


BEFORE = CpuSample(wall=100.0, busy_s=10.0, own_s=1.0, loadavg=0.5, cores=4)
AFTER = CpuSample(wall=110.0, busy_s=30.0, own_s=6.0, loadavg=0.75, cores=4)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Rig:
    made = Rig()
    samples = iter([BEFORE, AFTER])
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=made.clock.perf_counter))
    monkeypatch.setattr(measure, "memory_probe", lambda: made)
    monkeypatch.setattr(measure, "sample", lambda: next(samples))
    monkeypatch.setattr(measure, "mx", types.SimpleNamespace(array=mx.array, int32=mx.int32, eval=made.eval))
    return made


def _run(rig: Rig, shape: SpeedShape, ids: list[int], *, watched: bool, aa: bool = False) -> tuple[Any, list[str]]:
    said: list[str] = []
    watch = types.SimpleNamespace(timing_alone=rig.timing_alone, arm=rig.arm_meter) if watched else None
    lever = types.SimpleNamespace(applied=rig.applied, kv_plan=rig.kv_plan)
    result = measure_speed(
        lever=lever,  # type: ignore[arg-type]
        reference=ArmModel(Model("reference", 10), "reference"),
        candidate=ArmModel(Model("reference" if aa else "candidate", 20), "reference" if aa else "candidate"),
        token_ids=ids,
        shape=shape,
        say=said.append if watched else None,
        watch=watch,  # type: ignore[arg-type]
    )
    return result, said


def _cycled(ids: list[int], n: int) -> list[int]:
    return [ids[i % len(ids)] for i in range(n)]


def _trial_forwards(arm: str, context: int, decode: int, ids: list[int]) -> list[tuple[str, list[int]]]:
    """One trial's forwards: the context in chunks of 2048, then one token at a time."""
    fed = _cycled(ids, context + decode)
    chunks = [(arm, fed[s : min(s + 2048, context)]) for s in range(0, context, 2048)]
    return chunks + [(arm, [fed[p]]) for p in range(context, context + decode)]


def _trial(arm: str, context: int, decode: int) -> Trial:
    chunks = -(-context // 2048)
    dtype_bytes = 4 if arm == "reference" else 2
    per_position = 2 * 2 * 4 * dtype_bytes  # keys and values, 2 heads, dim 4
    return Trial(
        prefill_s=context * PREFILL_PER_TOKEN * FACTOR[arm],
        decode_s=decode * DECODE_PER_STEP * FACTOR[arm],
        peak_bytes=PEAK[arm] + chunks + decode,
        kv_bytes=ALLOCATED * per_position,
        kv_held_bytes=(context + decode) * per_position,
    )


def test_every_forward_trial_and_figure_of_a_watched_run(rig: Rig) -> None:
    ids = [7, 8, 9]
    # a budget of 4 pairs: its one look is the budget, so every context times all four (ABBA)
    shape = SpeedShape(contexts=(5, 2050), decode=2, repetitions=4, warmup=1)
    result, said = _run(rig, shape, ids, watched=True)

    order = [("reference", "candidate"), ("candidate", "reference")]
    expected: list[tuple[str, list[int]]] = []
    for context in shape.contexts:
        for arm in ("reference", "candidate"):  # the warm-up
            expected += _trial_forwards(arm, context, shape.decode, ids)
        for rep in range(shape.repetitions):
            for arm in order[rep % 2]:
                expected += _trial_forwards(arm, context, shape.decode, ids)
    assert rig.forwards == expected

    for context in shape.contexts:
        ref = [_trial("reference", context, shape.decode)] * shape.repetitions
        cand = [_trial("candidate", context, shape.decode)] * shape.repetitions
        made = ContextSpeed.from_trials(context, shape.decode, ref, cand, budget=4, stopped="budget")
        assert result.contexts[context] == made
        assert made.decode.ratio == 2.0 and made.prefill.ratio == 2.0 and made.peak.ratio < 1.0  # type: ignore[union-attr]
    assert list(result.contexts) == [5, 2050]
    assert said == [f"speed at {c} tokens: {result.contexts[c].short_text()}" for c in shape.contexts]

    trials = 2 * 2 * (1 + 4)  # contexts x arms x (warm-up + pairs)
    fed = sum(FACTOR[arm] * (c * PREFILL_PER_TOKEN + 2 * DECODE_PER_STEP) for arm in FACTOR for c in (5, 2050))
    assert result.duration_s == 5 * fed  # every trial's spans, nothing else: the fake clock moved only there
    assert (result.shape, result.memory_method) == (shape, "fake peak probe")
    assert result.weights == {"reference": 10 * 4 + 3 * 2 + 4, "candidate": 20 * 4 + 3 * 2 + 4}
    assert result.arms == {"reference": "reference", "candidate": "candidate"}
    assert result.load_seen == {
        "cores": 4,
        "wall_s": 10.0,
        "loadavg_1m": [0.5, 0.75],
        "waited_for_lock_s": 1.5,
        "method": "per-CPU times (psutil) on this process's CPUs minus its own CPU time",
        "other_cpu_s": 15.0,
        "other_cores": 1.5,
        "share": 0.375,
        "high": True,
    }
    assert result.to_json() == {
        "shape": shape.to_json(),
        "memory_method": "fake peak probe",
        "weights_bytes": {"reference": 50, "candidate": 90},
        "arms": {"reference": "reference", "candidate": "candidate"},
        "duration_s": round(5 * fed, 3),
        "contexts": {"5": result.contexts[5].to_json(), "2050": result.contexts[2050].to_json()},
        "load_seen": result.load_seen,
    }
    assert result.to_json()["duration_s"] == 15.52  # 15.52001953125 s, to the millisecond
    assert dataclasses.replace(result, load_seen=None).to_json()["load_seen"] is None
    arm_call = (
        "arm",
        "speed trials (both arms, ABBA)",
        trials,
        {"unit": "trials", "action": "timing", "verb": "timed"},
    )
    advances = [e for e in rig.events if isinstance(e, tuple) and e[0] == "advance"]
    assert rig.events == [("alone", "speed trials"), arm_call, *advances, "finish", "released"]
    per_trial = [len(_trial_forwards("reference", c, 2, ids)) for c in shape.contexts]
    assert [n for _, n in advances] == [per_trial[0] * (i + 1) for i in range(10)] + [
        10 * per_trial[0] + per_trial[1] * (i + 1) for i in range(10)
    ]  # one advance after each trial's last forward
    assert rig.checks == len(rig.forwards)  # the time limit is checked after every forward
    # each prefill chunk evaluates the cache (its one layer's state), each decode step its output
    assert rig.evaluated == [("state", 1) if len(fed) > 1 else ("out", True) for _, fed in rig.forwards]


def test_an_unwatched_run_stops_each_context_once_it_is_precise_and_waits_for_no_lock(rig: Rig) -> None:
    shape = SpeedShape(contexts=(6,), decode=3, repetitions=9, warmup=0)
    result, said = _run(rig, shape, [1, 2, 3, 4], watched=False, aa=True)
    ref = [_trial("reference", 6, 3)] * 4  # every pair alike: precise at the first look, 4 pairs
    assert result.contexts[6] == ContextSpeed.from_trials(6, 3, ref, ref, budget=9, stopped="precise")
    assert len(rig.forwards) == 4 * 2 * (1 + 3)
    assert result.arms == {"reference": "reference", "candidate": "reference"}
    assert result.weights == {"reference": 10 * 4 + 10, "candidate": 20 * 4 + 10}
    assert result.load_seen is not None and result.load_seen["waited_for_lock_s"] == 0.0
    assert said == [] and rig.events == [] and rig.checks == 0


def test_a_goal_decides_a_context_and_no_ids_is_refused(rig: Rig) -> None:
    shape = SpeedShape(contexts=(6,), decode=3, repetitions=9, warmup=0, goals=(SpeedGoal("decode", 1.5),))
    result, _ = _run(rig, shape, [5], watched=False)
    assert (result.contexts[6].stopped, result.contexts[6].decode.n) == ("decided", 4)
    assert rig.forwards[:4] == [("reference", [5] * 6), ("reference", [5]), ("reference", [5]), ("reference", [5])]
    with pytest.raises(ValueError, match="^speed needs token ids to feed the model$"):
        _run(rig, shape, [], watched=False)


# -- the stopping rule -----------------------------------------------------------------------------------


def est(lower: float, upper: float, *, n: int = 4, log_sd: float = 0.0) -> RatioEstimate:
    return RatioEstimate(math.sqrt(lower * upper), lower, upper, n, log_sd)


def speed_at(
    context: int = 64,
    *,
    prefill: RatioEstimate | None = None,
    decode: RatioEstimate | None = None,
    peak: RatioEstimate | None = None,
) -> ContextSpeed:
    flat = est(1.0, 1.0)
    return ContextSpeed(context, 4, [], [], prefill or flat, decode or flat, peak)


def shape_of(*goals: SpeedGoal, contexts: tuple[int, ...] = (64, 512), precision: float = 0.04) -> SpeedShape:
    return SpeedShape(contexts=contexts, decode=4, goals=goals, precision=precision)


@pytest.mark.parametrize(
    ("goal", "lower", "upper", "reason"),
    [
        # "min": shown met at lower >= limit, shown missed at upper < limit
        (SpeedGoal("decode", 1.1, at=64), 1.1, 1.3, "decided"),
        (SpeedGoal("decode", 1.1, at=64), 1.09, 1.3, None),
        (SpeedGoal("decode", 1.1, at=64), 0.9, 1.1, None),
        (SpeedGoal("decode", 1.1, at=64), 0.9, 1.09, "decided"),
        (SpeedGoal("prefill", 1.1, at="all"), 1.1, 1.3, "decided"),
        (SpeedGoal("prefill", 1.1, at="all"), 0.9, 1.1, None),
        # "max": shown met at upper <= limit, shown missed at lower > limit
        (SpeedGoal("memory", 0.6, at=64), 0.4, 0.6, "decided"),
        (SpeedGoal("memory", 0.6, at=64), 0.4, 0.61, None),
        (SpeedGoal("memory", 0.6, at=64), 0.6, 0.8, None),
        (SpeedGoal("memory", 0.6, at=64), 0.61, 0.8, "decided"),
    ],
)
def test_a_goal_decides_its_context_at_its_interval_s_edges(
    goal: SpeedGoal, lower: float, upper: float, reason: str | None
) -> None:
    decided = est(lower, upper)
    wide = est(0.01, 100.0, n=2, log_sd=9.0)  # the other estimates: never precise, never deciding
    estimates = {"decode": wide, "prefill": wide, "peak": wide}
    estimates["peak" if goal.key == "memory" else goal.key] = decided
    assert stop_reason(speed_at(**estimates), shape_of(goal)) == reason


def test_every_goal_there_must_be_decided_and_unmeasured_ones_never_will_be() -> None:
    met, open_ = est(1.2, 1.3), est(1.0, 1.3)
    goals = (SpeedGoal("decode", 1.1, at=64), SpeedGoal("prefill", 1.1, at=64))
    assert stop_reason(speed_at(decode=met, prefill=met), shape_of(*goals)) == "decided"
    assert stop_reason(speed_at(decode=met, prefill=open_), shape_of(*goals)) is None
    assert stop_reason(speed_at(decode=open_, prefill=met), shape_of(*goals)) is None
    memory = SpeedGoal("memory", 0.5, at=64)
    assert stop_reason(speed_at(decode=met, peak=None), shape_of(goals[0], memory)) == "decided"  # no peak here
    nan_end = RatioEstimate(1.0, math.nan, 1.2, 1, math.nan)
    assert stop_reason(speed_at(decode=met, peak=nan_end), shape_of(goals[0], memory)) == "decided"
    low_inf = RatioEstimate(1.0, 0.5, math.inf, 2, 1.0)
    assert stop_reason(speed_at(decode=met, peak=low_inf), shape_of(goals[0], memory)) == "decided"
    assert stop_reason(speed_at(decode=nan_end), shape_of(goals[0])) == "decided"
    # an unmeasured goal is passed over, not the end of the look: the goals after it still decide
    assert stop_reason(speed_at(decode=open_, peak=None), shape_of(memory, goals[0])) is None


def test_a_goal_elsewhere_leaves_the_context_to_the_precision_rule() -> None:
    open_ = est(1.0, 1.3, n=4, log_sd=0.08)  # standard error 0.04: exactly the precision
    longest = SpeedGoal("decode", 1.1)  # at None: the longest context only
    assert stop_reason(speed_at(64, decode=open_, prefill=open_), shape_of(longest)) == "precise"
    assert stop_reason(speed_at(512, decode=open_, prefill=open_), shape_of(longest)) is None
    assert stop_reason(speed_at(64, decode=open_), shape_of(SpeedGoal("kv", 0.3, at=64))) == "precise"  # bytes


@pytest.mark.parametrize(
    ("prefill", "decode", "reason"),
    [
        ((4, 0.08), (4, 0.08), "precise"),  # 0.08 / sqrt(4) = 0.04: within
        ((4, 0.0801), (4, 0.08), None),
        ((4, 0.08), (4, 0.0801), None),
        ((2, 0.0), (2, 0.0), "precise"),  # two pairs are enough to tell a spread
        ((1, 0.0), (2, 0.0), None),
        ((2, 0.0), (1, 0.0), None),
        ((4, math.nan), (4, 0.0), None),
        ((4, 0.0), (4, math.inf), None),
    ],
)
def test_with_no_goal_both_standard_errors_must_be_within_the_precision(
    prefill: tuple[int, float], decode: tuple[int, float], reason: str | None
) -> None:
    made = speed_at(
        prefill=est(0.9, 1.1, n=prefill[0], log_sd=prefill[1]), decode=est(0.9, 1.1, n=decode[0], log_sd=decode[1])
    )
    assert stop_reason(made, shape_of()) == reason


# -- the pairs' loop -----------------------------------------------------------------------------------


def _pairs(
    monkeypatch: pytest.MonkeyPatch, budget: int, answers: dict[int, str | None]
) -> tuple[Any, list[int], list[int]]:
    """`pairs_until_decided` with a scripted stopping rule (pairs so far -> its answer): what it returned,
    which reps it timed and at which pair counts it asked."""
    asked: list[int] = []

    def scripted(speed: ContextSpeed, shape: SpeedShape) -> str | None:
        assert shape.repetitions == budget
        asked.append(len(speed.reference))
        return answers.get(len(speed.reference))

    monkeypatch.setattr(measure, "stop_reason", scripted)
    reps: list[int] = []

    def pair(rep: int) -> dict[str, Trial]:
        reps.append(rep)
        return {"reference": Trial(1.0 + rep / 8, 0.5, 100, 64), "candidate": Trial(0.5, 0.25 + rep / 16, 50, 32)}

    shape = SpeedShape(contexts=(16,), decode=4, repetitions=budget)
    return measure.pairs_until_decided(shape, 16, pair), reps, asked


def _expected(n: int, budget: int, stopped: str) -> ContextSpeed:
    ref = [Trial(1.0 + rep / 8, 0.5, 100, 64) for rep in range(n)]
    cand = [Trial(0.5, 0.25 + rep / 16, 50, 32) for rep in range(n)]
    return ContextSpeed.from_trials(16, 4, ref, cand, budget=budget, stopped=stopped)


@pytest.mark.parametrize(
    ("budget", "answers", "n", "stopped", "looks"),
    [
        (9, {}, 9, "budget", [4, 6]),  # asked at each look before the budget, never at it
        (9, {4: "precise"}, 4, "precise", [4]),
        (9, {6: "decided"}, 6, "decided", [4, 6]),
        (9, {9: "decided"}, 9, "budget", [4, 6]),  # the budget's own look is no stop: it is the end
        (4, {4: "precise"}, 4, "budget", []),
        (5, {4: "decided"}, 4, "decided", [4]),
        (3, {}, 3, "budget", []),
    ],
)
def test_pairs_are_added_until_a_look_stops_them_or_the_budget_ends(
    monkeypatch: pytest.MonkeyPatch, budget: int, answers: dict[int, str], n: int, stopped: str, looks: list[int]
) -> None:
    made, reps, asked = _pairs(monkeypatch, budget, answers)
    assert reps == list(range(n)) and asked == looks
    assert made == _expected(n, budget, stopped)


def test_a_look_s_intervals_are_the_sequential_looks_not_a_fixed_count_s(monkeypatch: pytest.MonkeyPatch) -> None:
    made, _, _ = _pairs(monkeypatch, 9, {6: "decided"})
    fixed = ContextSpeed.from_trials(16, 4, made.reference, made.candidate)
    assert made.decode.upper - made.decode.lower > fixed.decode.upper - fixed.decode.lower
    assert dataclasses.replace(made, stopped=None) != fixed


# -- bytes counted over a cache ------------------------------------------------------------------------


class Keyed:
    def __init__(self, keys: Any, values: Any, offset: Any = None, state: Any = None) -> None:
        self.keys, self.values, self.offset = keys, values, offset
        if state is not None:
            self.state = state


class Stated:
    def __init__(self, state: Any, offset: Any = None) -> None:
        self.state = state
        if offset is not None:
            self.offset = offset


class Bare:
    """A layer object that holds no cache of its own (no keys, no state, no offset)."""

    keys = None


def kv(positions: int, dtype: Any = mx.float32, dim: int = 8) -> Any:
    return mx.zeros((1, 2, positions, dim), dtype=dtype)  # 2 heads


def test_cache_bytes_count_every_array_of_every_layer() -> None:
    plain = Keyed(kv(256), kv(256), offset=40)  # 256 * 2 heads * 8 dim * 4 bytes = 16 KiB each
    quantized = Stated([(kv(256, mx.uint32, 2), kv(256, mx.float16, 1)), {"v": [kv(256, mx.uint32, 2)]}], offset=40)
    shared = Keyed(None, None, state=[])  # a KV-shared layer: nothing of its own
    empty = Stated(())
    half_keyed = Keyed(kv(4), None, state=[kv(8)])  # keys without values: its state is what it holds
    assert cache_bytes([plain]) == 2 * 16384
    assert cache_bytes([quantized]) == 256 * 2 * (2 * 4 + 2 + 2 * 4)
    assert cache_bytes([shared, empty, Bare()]) == 0
    assert cache_bytes([half_keyed]) == 8 * 2 * 8 * 4
    assert cache_bytes([plain, shared, quantized, empty, half_keyed]) == 2 * 16384 + 256 * 2 * 18 + 512


@pytest.mark.parametrize(
    ("layer", "held"),
    [
        (Keyed(kv(256), kv(256), offset=40), 2 * 40 * 2 * 8 * 4),  # the positions holding a token
        (Keyed(kv(256), kv(256), offset=300), 2 * 256 * 2 * 8 * 4),  # a wrapped window: all it allocated
        (Keyed(kv(256), kv(256), offset=256), 2 * 256 * 2 * 8 * 4),
        (Keyed(kv(256), kv(256)), 2 * 256 * 2 * 8 * 4),  # no offset: what it allocated
        (Keyed(kv(256), kv(256), offset=40.0), 2 * 256 * 2 * 8 * 4),  # not a token count
        (Keyed(kv(0), kv(0), offset=40), 0),  # nothing allocated yet
        (Stated([mx.zeros((2, 256, 8)), kv(256)], offset=40), 2 * 256 * 8 * 4 + 40 * 2 * 8 * 4),  # 3-d: all of it
        (Stated([(kv(256, mx.uint32, 2), kv(256, mx.float16, 1))], offset=10), 10 * 2 * (2 * 4 + 2)),
        (Keyed(None, None, offset=40, state=[]), 0),
        (Bare(), 0),
        (Stated([kv(16)]), 16 * 2 * 8 * 4),  # a layer without an offset attribute: what it allocated
    ],
)
def test_cache_held_bytes_count_the_positions_holding_a_token(layer: Any, held: int) -> None:
    assert cache_held_bytes([layer]) == held
    assert type(cache_held_bytes([layer])) is int  # a byte count, whole: the record's JSON says 5120, not 5120.0
    assert cache_held_bytes([layer, Keyed(kv(256), kv(256), offset=1)]) == held + 2 * 2 * 8 * 4


# -- which memory probe --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counters", "active", "clear_refs", "probe", "method"),
    [
        (
            ("get_peak_memory", "reset_peak_memory"),
            1,
            True,
            "_MlxAllocatorProbe",
            "mlx allocator peak (mx.get_peak_memory)",
        ),
        (
            ("get_peak_memory", "reset_peak_memory"),
            0,
            True,
            "_LinuxRSSProbe",
            "RSS high-water mark (/proc/self/status VmHWM)",
        ),
        (("get_peak_memory",), 1, True, "_LinuxRSSProbe", "RSS high-water mark (/proc/self/status VmHWM)"),
        (("reset_peak_memory",), 1, True, "_LinuxRSSProbe", "RSS high-water mark (/proc/self/status VmHWM)"),
        (
            ("get_peak_memory", "reset_peak_memory"),
            0,
            False,
            "_NoMemoryProbe",
            "not measured (no allocator counters, no /proc)",
        ),
        ((), 1, False, "_NoMemoryProbe", "not measured (no allocator counters, no /proc)"),
    ],
)
def test_the_memory_probe_is_the_allocator_s_else_rss_else_none(
    monkeypatch: pytest.MonkeyPatch, counters: tuple[str, ...], active: int, clear_refs: bool, probe: str, method: str
) -> None:
    fake_mx = types.SimpleNamespace(get_active_memory=lambda: active, **{name: lambda: 0 for name in counters})
    asked: list[str] = []

    def exists(path: str) -> bool:
        asked.append(path)
        return clear_refs

    monkeypatch.setattr(measure, "mx", fake_mx)
    monkeypatch.setattr(measure, "os", types.SimpleNamespace(path=types.SimpleNamespace(exists=exists)))
    made = measure.memory_probe()
    assert type(made).__name__ == probe and made.method == method
    assert asked in ([], ["/proc/self/clear_refs"])
    assert (asked == []) == (probe == "_MlxAllocatorProbe")


# -- the load seen around the trials -------------------------------------------------------------------


def cpu(wall: float, busy: float | None, own: float, cores: int = 2, loadavg: float | None = 1.0) -> CpuSample:
    return CpuSample(wall=wall, busy_s=busy, own_s=own, loadavg=loadavg, cores=cores)


PSUTIL = "per-CPU times (psutil) on this process's CPUs minus its own CPU time"


def test_the_load_seen_is_every_field_rounded_to_the_millisecond() -> None:
    # 2.5004 s of wall; all processes 11.73456 CPU-s, this one 10: others 1.73456 over 2 cores
    seen = load.load_seen(
        cpu(10.0, 100.0, 5.0, loadavg=0.5), cpu(12.5004, 111.73456, 15.0, loadavg=2.25), waited_s=0.12345
    )
    assert seen == {
        "cores": 2,
        "wall_s": 2.5,
        "loadavg_1m": [0.5, 2.25],
        "waited_for_lock_s": 0.123,
        "method": PSUTIL,
        "other_cpu_s": 1.735,
        "other_cores": 0.694,
        "share": 0.347,
        "high": True,
    }
    assert load.load_seen(cpu(0.0, 0.0, 0.0), cpu(4.0, 1.0, 0.0))["waited_for_lock_s"] == 0.0  # none by default


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (cpu(0.0, None, 0.0), cpu(5.0, 10.0, 1.0)),
        (cpu(0.0, 10.0, 0.0), cpu(5.0, None, 1.0)),
        (cpu(0.0, None, 0.0), cpu(5.0, None, 1.0)),
    ],
)
def test_without_per_cpu_times_only_the_load_average_is_recorded(before: CpuSample, after: CpuSample) -> None:
    assert load.load_seen(before, dataclasses.replace(after, cores=3, loadavg=None), waited_s=2.0) == {
        "cores": 3,
        "wall_s": 5.0,
        "loadavg_1m": [1.0, None],
        "waited_for_lock_s": 2.0,
        "method": "os.getloadavg (counts this process too: no verdict)",
        "other_cores": None,
        "share": None,
        "high": None,
    }


@pytest.mark.parametrize(
    ("before", "after", "other", "cores", "share", "high"),
    [
        (cpu(0, 0, 0, cores=2), cpu(10, 5, 0, cores=2), 5.0, 0.5, 0.25, True),  # half a core, a quarter: high
        (cpu(0, 0, 0, cores=2), cpu(10, 4.9, 0, cores=2), 4.9, 0.49, 0.245, False),
        (cpu(0, 0, 0, cores=1), cpu(10, 4.9, 0, cores=1), 4.9, 0.49, 0.49, False),  # a big share, under half a core
        (cpu(0, 0, 0, cores=4), cpu(10, 9.9, 0, cores=4), 9.9, 0.99, 0.247, False),  # a core, under a quarter
        (cpu(0, 10, 0, cores=2), cpu(10, 12, 3, cores=2), 0.0, 0.0, 0.0, False),  # more of ours than all: none
        (cpu(5, 0, 0, cores=2), cpu(5, 2e-9, 0, cores=2), 0.0, 2.0, 1.0, True),  # no wall time: a nanosecond
    ],
)
def test_high_load_is_a_quarter_of_the_cores_and_half_a_core(
    before: CpuSample, after: CpuSample, other: float, cores: float, share: float, high: bool
) -> None:
    seen = load.load_seen(before, after)
    assert (seen["other_cpu_s"], seen["other_cores"], seen["share"], seen["high"]) == (other, cores, share, high)
    assert seen["wall_s"] == round(max(after.wall - before.wall, 0.0), 3)


@pytest.mark.parametrize(
    ("affinity", "cpu_count", "cores"), [({0, 3, 5}, 8, 3), (None, 8, 8), (None, None, 1), (set(), 6, 6)]
)
def test_a_sample_reads_the_clocks_the_load_average_and_our_cores(
    monkeypatch: pytest.MonkeyPatch, affinity: set[int] | None, cpu_count: int | None, cores: int
) -> None:
    asked: list[Any] = []

    def busy(of: Any) -> float:
        asked.append(of)
        return 42.5

    monkeypatch.setattr(load, "_cores", lambda: affinity)
    monkeypatch.setattr(load, "_busy_seconds", busy)
    monkeypatch.setattr(load, "time", types.SimpleNamespace(monotonic=lambda: 7.25, process_time=lambda: 1.5))
    monkeypatch.setattr(
        load, "os", types.SimpleNamespace(getloadavg=lambda: (0.75, 2.0, 3.0), cpu_count=lambda: cpu_count)
    )
    assert load.sample() == CpuSample(wall=7.25, busy_s=42.5, own_s=1.5, loadavg=0.75, cores=cores)
    assert asked == [affinity]


@pytest.mark.parametrize("error", [OSError, AttributeError])
def test_a_sample_without_a_load_average_says_none(monkeypatch: pytest.MonkeyPatch, error: type[Exception]) -> None:
    def no_loadavg() -> tuple[float, float, float]:
        raise error("no load average here")

    monkeypatch.setattr(load, "os", types.SimpleNamespace(getloadavg=no_loadavg, cpu_count=lambda: 2))
    monkeypatch.setattr(load, "_cores", lambda: None)
    assert load.sample().loadavg is None and load.sample().cores == 2


def _waits(readings: list[float | None], **kw: Any) -> tuple[float, list[float], int]:
    """wait_for_siblings on scripted sibling CPU seconds: what it returned, what it slept, how often it read."""
    now = [100.0]
    slept: list[float] = []
    left = iter(readings)
    reads = [0]

    def read() -> float | None:
        reads[0] += 1
        return next(left)

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    waited = load.wait_for_siblings(read=read, clock=lambda: now[0], sleep=sleep, **kw)
    return waited, slept, reads[0]


@pytest.mark.parametrize(
    ("readings", "kw", "waited", "windows"),
    [
        ([1.0, 1.0], {}, 0.3, 1),
        ([1.0, 1.0299], {}, 0.3, 1),  # under a tenth of a core over the window: quiet
        ([1.0, 1.03, 1.03], {}, 0.6, 2),  # a tenth exactly: not yet
        ([1.0, 1.5, 0.5], {}, 0.6, 2),  # a sibling exited: its seconds gone, no use
        ([1.0, None], {}, 0.3, 1),  # lost sight of them: stop
        ([1.0, 2.0, 3.0, 4.0], {"window_s": 0.5, "limit_s": 1.0}, 1.0, 2),  # the limit, reached exactly
        ([1.0, 2.0, 3.0, 4.0, 5.0], {"window_s": 0.5, "limit_s": 1.1}, 1.5, 3),
        ([1.0, 1.25, 1.5], {"window_s": 1.0, "quiet_cores": 0.3}, 1.0, 1),  # 0.25 core < 0.3
        ([1.0, 1.25, 1.45], {"window_s": 1.0, "quiet_cores": 0.25}, 2.0, 2),  # 0.25 is not under 0.25
    ],
)
def test_waiting_for_siblings_window_by_window(
    readings: list[float | None], kw: dict[str, float], waited: float, windows: int
) -> None:
    got, slept, reads = _waits(readings, **kw)
    assert got == pytest.approx(waited, abs=1e-9)
    assert slept == [kw.get("window_s", load.SIBLING_WINDOW_S)] * windows and reads == windows + 1


def test_the_sibling_wait_s_defaults_and_an_unknown_start() -> None:
    assert (load.SIBLING_WINDOW_S, load.SIBLING_QUIET_CORES, load.SIBLING_WAIT_LIMIT_S) == (0.3, 0.1, 120.0)
    assert _waits([None]) == (0.0, [], 1)
    busy = [float(i) for i in range(1000)]  # a full core, forever
    waited, slept, _ = _waits(busy)
    assert waited == pytest.approx(120.0, abs=0.3) and waited >= 120.0 and len(slept) == 400
