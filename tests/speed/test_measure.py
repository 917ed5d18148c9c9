"""Speed and memory measured on real MLX forwards of tiny models: a planted slowdown is measured at
its exact size and fails an asked speed-up; KV bytes match the cache's layout counted by hand; a
planted allocation shows in the peak; an A/A run on a drifting machine reads as no difference.

Time is a fake clock in place of the measurement's `time.perf_counter`, advanced by each real forward
by a planted cost: what every timed span holds is known exactly, so no assertion depends on the
machine's speed or load (the real timer is the same call, read the same way)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate import assert_faster, assert_smaller
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.speed.measure import ArmModel, measure_speed
from pytest_mlxgate.speed.shape import SpeedGoal, SpeedShape

IDS = list(range(200, 520))


@pytest.fixture(scope="module")
def tiny(tiny_kv_model_dir: Path) -> Any:
    from mlx_lm import load

    return load(str(tiny_kv_model_dir))[0]


def _wrapping_call(
    model: Any, before: Any, *, clock: FakeClock | None = None, cost: Any = None
) -> contextlib.AbstractContextManager[None]:
    """Patch the model class's __call__ so `before()` runs at every forward (restored on exit); with
    `clock`, each forward also advances it by `cost(tokens fed)`."""

    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        cls = type(model)
        original = cls.__call__

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            before()
            out = original(self, *args, **kwargs)
            if clock is not None:
                clock.now += float(cost(int(args[0].shape[1])))
            return out

        cls.__call__ = call
        try:
            yield
        finally:
            cls.__call__ = original

    return patch()


def _measure(model: Any, lever: Lever, shape: SpeedShape, *, aa: bool = False) -> dict[str, Any]:
    cand = ArmModel(model, "reference" if aa else "candidate")
    return measure_speed(
        lever=lever, reference=ArmModel(model, "reference"), candidate=cand, token_ids=IDS, shape=shape
    ).to_json()


class FakeClock:
    """The measurement's `time.perf_counter`, advanced only by the forwards' planted costs: what the
    timed spans hold is then known exactly, whatever else runs on the machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    import types

    from pytest_mlxgate.speed import measure

    fake = FakeClock()
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def _costed(model: Any, clock: FakeClock, cost: Any) -> contextlib.AbstractContextManager[None]:
    """Every real forward of `model` also advances `clock` by `cost(tokens fed)` seconds."""
    return _wrapping_call(model, lambda *args, **kw: None, clock=clock, cost=cost)


PREFILL_S, DECODE_S = 0.004, 0.001  # per prefill call, per decode call (fake seconds)


def _base_cost(tokens: int) -> float:
    return PREFILL_S if tokens > 1 else DECODE_S


def test_a_planted_slowdown_is_measured_at_its_exact_size_and_fails_a_speed_up(tiny: Any, clock: FakeClock) -> None:
    planted = 0.03  # seconds per forward, candidate arm only
    arm_cost: list[float] = [0.0]

    @contextlib.contextmanager
    def slowed(seconds: float) -> Iterator[None]:
        arm_cost[0] = seconds
        try:
            yield
        finally:
            arm_cost[0] = 0.0

    lever = Lever(name="sleepy", kind="context", target=None, ref=0.0, cand=planted, path="serving", factory=slowed)
    shape = SpeedShape(contexts=(32,), decode=6, repetitions=5)
    with _costed(tiny, clock, lambda tokens: _base_cost(tokens) + arm_cost[0]):
        speed = _measure(tiny, lever, shape)
    ctx = speed["contexts"]["32"]
    for arm, extra in (("reference", 0.0), ("candidate", planted)):  # each span holds exactly its own calls
        for trial in ctx[arm]["trials"]:
            assert trial["prefill_s"] == pytest.approx(PREFILL_S + extra, rel=1e-9)
            assert trial["decode_s"] == pytest.approx(shape.decode * (DECODE_S + extra), rel=1e-9)
    # decode tok/s, candidate / reference, every pair alike: the interval is that one ratio
    assert ctx["decode"]["ratio"] == pytest.approx(DECODE_S / (DECODE_S + planted), rel=1e-9)
    assert ctx["prefill"]["ratio"] == pytest.approx(PREFILL_S / (PREFILL_S + planted), rel=1e-9)
    assert ctx["decode"]["ratio_ci"][1] == pytest.approx(ctx["decode"]["ratio"], rel=1e-9)
    with pytest.raises(AssertionError, match=r"(?s)speed gate failed.*decode tok/s @32.*✗ fail"):
        assert_faster(speed, decode=1.0)
    assert ctx["kv"]["ratio"] == 1.0  # the same cache plan on both arms
    # every pair alike: the first look (4 pairs) already has its interval within 10%, so no more pairs
    assert (ctx["stopped"], len(ctx["reference"]["trials"]), ctx["decode"]["n"]) == ("precise", 4, 4)
    with _costed(tiny, clock, lambda tokens: _base_cost(tokens) + arm_cost[0]):  # a goal: decided at the first look
        goal = _measure(tiny, lever, dataclasses.replace(shape, goals=(SpeedGoal("decode", 1.0),)))["contexts"]["32"]
    assert (goal["stopped"], goal["decode"]["n"]) == ("decided", 4)
    assert goal["decode"]["ratio_ci"][1] < 1.0  # shown slower


def _expected_kv_bytes(
    config: dict[str, Any], tokens: int, bits: int | None, group: int = 64, *, held: bool = False
) -> int:
    """mlx_lm's caches by hand: K and V per layer, (kv heads, allocated positions, head dim),
    grown 256 positions at a time (`held`: the positions holding a token); a quantized cache holds
    packed uint32 words plus a float32 scale and bias per group."""
    step = 256
    positions = tokens if held else -(-tokens // step) * step
    heads, dim, layers = config["num_key_value_heads"], config["head_dim"], config["num_hidden_layers"]
    per_position = dim * 4 if bits is None else dim * bits // 32 * 4 + 2 * (dim // group) * 4
    return layers * 2 * heads * positions * per_position


def test_kv_bytes_are_the_caches_own_arrays_counted_by_hand(tiny: Any, tiny_kv_model_dir: Path) -> None:
    import json

    config = json.loads((tiny_kv_model_dir / "config.json").read_text())
    lever = Lever(
        name="kv", kind="kv", target=None, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}, path="serving"
    )
    shape = SpeedShape(contexts=(40, 300), decode=4, repetitions=3, warmup=0)
    speed = _measure(tiny, lever, shape)
    for context in shape.contexts:
        ctx = speed["contexts"][str(context)]
        tokens = context + shape.decode
        assert ctx["reference"]["kv_bytes"] == _expected_kv_bytes(config, tokens, None)
        assert ctx["candidate"]["kv_bytes"] == _expected_kv_bytes(config, tokens, 8)
        assert ctx["reference"]["kv_held_bytes"] == _expected_kv_bytes(config, tokens, None, held=True)
        assert ctx["candidate"]["kv_held_bytes"] == _expected_kv_bytes(config, tokens, 8, held=True)
        assert ctx["kv"]["ratio"] == pytest.approx(72 / 256)  # (16 words + scale + bias) / 64 floats, x4 bytes
    assert_smaller(speed, kv=0.3, at="all")
    with pytest.raises(AssertionError, match="(?s)memory gate failed.*KV bytes @300"):
        assert_smaller(speed, kv=0.25)


def test_a_planted_allocation_shows_in_the_peak(tiny: Any) -> None:
    import mlx.core as mx

    hog_bytes = 32 << 20
    held: list[Any] = []

    @contextlib.contextmanager
    def hog(on: bool) -> Iterator[None]:
        def allocate() -> None:
            if on and not held:
                held.append(mx.zeros((hog_bytes // 4,), dtype=mx.float32))
                mx.eval(held[0])

        with _wrapping_call(tiny, allocate):
            try:
                yield
            finally:
                held.clear()

    lever = Lever(name="hog", kind="context", target=None, ref=False, cand=True, path="serving", factory=hog)
    speed = _measure(tiny, lever, SpeedShape(contexts=(64,), decode=2, repetitions=3))
    if speed["memory_method"].startswith("not measured"):
        pytest.skip(speed["memory_method"])
    ctx = speed["contexts"]["64"]
    grown = ctx["candidate"]["peak_bytes"] - ctx["reference"]["peak_bytes"]
    assert grown == pytest.approx(hog_bytes, rel=0.10)
    assert_smaller(speed, memory=100.0)  # +32 MiB over ~1 MiB of activations: ~x34
    with pytest.raises(AssertionError, match="(?s)memory gate failed.*peak memory @64"):
        assert_smaller(speed, memory=10.0)


def test_an_aa_run_reads_as_no_difference_and_abba_cancels_a_drifting_machine(tiny: Any, clock: FakeClock) -> None:
    """A/A on a machine that slows down steadily over the run (every forward a little dearer than
    the last): the ABBA order puts the drift on both sides alike, so the interval of the ratio holds
    1 — where reference-first in every pair would show the second side slower. Counted, not timed."""
    forwards = [0]

    def drifting(tokens: int) -> float:
        forwards[0] += 1
        return _base_cost(tokens) * (1.0 + 0.01 * forwards[0])

    from pytest_mlxgate.serving.caches import kv_head_dims

    lever = Lever(name="kv", kind="kv", target=None, ref="plain", cand={"bits": 4}, path="serving")
    # every pair of the budget (a precision no interval reaches: this test counts them), and the plan's
    # one-token shape probe made before counting starts (else it counts in whichever test runs first)
    shape = SpeedShape(contexts=(48,), decode=8, repetitions=9, precision=1e-9)
    kv_head_dims(tiny)
    with _costed(tiny, clock, drifting):
        speed = _measure(tiny, lever, shape, aa=True)
    ctx = speed["contexts"]["48"]
    assert speed["arms"] == {"reference": "reference", "candidate": "reference"}
    assert ctx["kv"]["ratio"] == 1.0 and ctx["reference"]["kv_bytes"] == ctx["candidate"]["kv_bytes"]
    assert forwards[0] == 2 * (shape.warmup + shape.repetitions) * (1 + shape.decode)  # every trial's calls
    for key in ("decode", "prefill"):
        lo, hi = ctx[key]["ratio_ci"]
        assert lo < 1.0 < hi, (key, ctx[key])
        ratios = [
            c[f"{key}_s"] / r[f"{key}_s"]
            for r, c in zip(ctx["reference"]["trials"], ctx["candidate"]["trials"], strict=True)
        ]
        assert all(r > 1.0 for r in ratios[::2]) and all(r < 1.0 for r in ratios[1::2])  # A first, then B first
    assert all(math.isfinite(x) for x in ctx["decode"]["ratio_ci"])


def test_gemma4_kv_shared_layers_hold_no_bytes_and_a_quantized_plan_runs(tiny_gemma4_dir: Path) -> None:
    from mlx_lm import load

    from pytest_mlxgate.speed.measure import cache_bytes

    model = load(str(tiny_gemma4_dir))[0]
    lever = Lever(
        name="kv", kind="kv", target=None, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}, path="serving"
    )
    speed = _measure(model, lever, SpeedShape(contexts=(24, 80), decode=4, repetitions=3, warmup=0))
    for context in ("24", "80"):
        ctx = speed["contexts"][context]
        assert 0 < ctx["candidate"]["kv_bytes"] < ctx["reference"]["kv_bytes"]
    import mlx.core as mx

    from pytest_mlxgate.serving.caches import SharedKVReader

    plan = lever.kv_plan("candidate")
    cache = plan.make_cache(model)
    model(mx.array([IDS[:40]]), cache=cache)
    plan.maybe_quantize(cache)

    shared = [c for c in cache if isinstance(c, SharedKVReader)]
    assert shared and cache_bytes(shared) == 0
    assert cache_bytes(cache) == sum(c.nbytes for c in cache if not isinstance(c, SharedKVReader))


def test_a_wrapped_window_holds_its_window_and_the_default_contexts_reach_past_it() -> None:
    """A sliding-window model's speed is timed past its window by default (1.5x), and there the KV
    bytes held show the wrap: each sliding layer holds its window, each full layer every token, by
    hand, plain and quantized; before the wrap both hold every token."""
    from tinygemma import tiny_gemma3_model

    from pytest_mlxgate.serving.caches import sliding_window
    from pytest_mlxgate.speed.shape import past_the_window

    window = 8
    model = tiny_gemma3_model(window)
    assert sliding_window(model) == window
    contexts = past_the_window((4,), sliding_window(model))
    assert contexts == (4, 12)
    assert past_the_window((4, 64), window) == (4, 64), "a default context already past the window"
    assert past_the_window((4,), None) == (4,), "no window, nothing added"
    lever = Lever(
        name="kv", kind="kv", target=None, ref="plain", cand={"bits": 8, "group_size": 32, "start": 0}, path="serving"
    )
    speed = _measure(model, lever, SpeedShape(contexts=contexts, decode=4, repetitions=3, warmup=0))
    heads, dim = 1, 32
    for context in contexts:
        tokens = context + 4
        for arm, per_position in (("reference", dim * 4), ("candidate", dim * 8 // 32 * 4 + 2 * (dim // 32) * 4)):
            held = 2 * heads * per_position * (2 * min(tokens, window) + 2 * tokens)  # 2 sliding + 2 full layers
            assert speed["contexts"][str(context)][arm]["kv_held_bytes"] == held, (context, arm)
    past = speed["contexts"]["12"]
    assert past["reference"]["kv_held_bytes"] < past["reference"]["kv_bytes"]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the RSS probe reads Linux's /proc")
def test_the_rss_probe_counts_what_the_trial_grew_by_not_what_the_process_held() -> None:
    """Reset, then 32 MiB touched: the probe's peak is about those 32 MiB above the level at the reset, never the
    process's whole resident set (python, pytest, numpy and mlx already hold far more than the slack)."""
    import numpy as np

    from pytest_mlxgate.speed.measure import _LinuxRSSProbe

    probe = _LinuxRSSProbe()
    probe.reset()
    grown = np.ones(32 * 2**20, dtype=np.uint8)  # written, so resident
    peak = probe.peak()
    assert int(grown.sum()) == 32 * 2**20
    assert 30 * 2**20 <= peak <= 48 * 2**20, peak
