"""The paired ratio behind every speed and memory verdict: its algebra, and its error rates under
the timing noise and drift a real machine has (simulated, seeded: many runs, not one)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.speed.measure import pair_order
from pytest_mlxgate.speed.result import ContextSpeed, Trial
from pytest_mlxgate.stats.intervals import t_quantile
from pytest_mlxgate.stats.ratios import RatioEstimate, paired_ratio, ratio_pairs_needed

positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
pairs = st.lists(st.tuples(positive, positive), min_size=2, max_size=30)


@given(pairs, st.floats(min_value=0.01, max_value=100))
def test_scaling_the_candidate_scales_ratio_and_interval(values: list[tuple[float, float]], k: float) -> None:
    cand, ref = [c for c, _ in values], [r for _, r in values]
    base, scaled = paired_ratio(cand, ref), paired_ratio([c * k for c in cand], ref)
    for a, b in ((base.ratio, scaled.ratio), (base.lower, scaled.lower), (base.upper, scaled.upper)):
        assert b == pytest.approx(a * k, rel=1e-9)


@given(pairs)
def test_swapping_the_arms_inverts_the_ratio_and_the_interval(values: list[tuple[float, float]]) -> None:
    cand, ref = [c for c, _ in values], [r for _, r in values]
    ab, ba = paired_ratio(cand, ref), paired_ratio(ref, cand)
    assert ba.ratio == pytest.approx(1 / ab.ratio, rel=1e-9)
    assert ba.lower == pytest.approx(1 / ab.upper, rel=1e-9) and ba.upper == pytest.approx(1 / ab.lower, rel=1e-9)
    assert ab.lower <= ab.ratio <= ab.upper


def test_the_estimate_is_the_geometric_mean_and_one_pair_has_no_interval() -> None:
    est = paired_ratio([2.0, 8.0], [1.0, 1.0])
    assert est.ratio == pytest.approx(4.0) and est.n == 2
    one = paired_ratio([3.0], [1.0])
    assert one.ratio == pytest.approx(3.0) and math.isnan(one.lower) and math.isnan(one.upper)
    same = paired_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert same.lower == same.upper == pytest.approx(2.0)  # no spread: the interval is the point


@pytest.mark.parametrize("bad", [[0.0, 1.0], [-1.0, 1.0], [math.inf, 1.0], [math.nan, 1.0]])
def test_a_failed_measurement_is_refused_not_averaged(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="positive, finite"):
        paired_ratio(bad, [1.0, 1.0])
    with pytest.raises(ValueError, match="as many"):
        paired_ratio([1.0], [1.0, 1.0])


def test_pairs_needed_shrinks_the_interval_past_the_limit() -> None:
    rng = np.random.default_rng(3)
    ref = np.exp(rng.normal(0, 0.05, 9))
    cand = ref * 1.04 * np.exp(rng.normal(0, 0.05, 9))
    est = paired_ratio(cand, ref)
    assert est.lower < 1.0 < est.upper  # 9 pairs cannot tell 4% at 5% noise
    need = ratio_pairs_needed(est, 1.0)
    assert need is not None and need > 9
    # at that many pairs with the same spread and estimate, the half-width clears the gap
    half = math.log(est.upper / est.ratio) * math.sqrt(9 / need)
    assert math.log(est.ratio) - half >= -0.01
    assert ratio_pairs_needed(est, est.ratio) is None  # sitting on the limit: no n tells


def test_pairs_needed_is_the_t_interval_sized_to_the_gap() -> None:
    def est(ratio: float, n: int, log_sd: float) -> RatioEstimate:
        return RatioEstimate(ratio, math.nan, math.nan, n, log_sd)

    def expected(ratio: float, n: int, log_sd: float, limit: float, confidence: float) -> int:
        z = t_quantile(0.5 + confidence / 2, n - 1)
        return max(n + 1, math.ceil((z * log_sd / abs(math.log(ratio / limit))) ** 2))

    for ratio, n, sd, limit, confidence in (
        (1.1, 10, 0.2, 1.0, 0.95),
        (0.8, 2, 0.3, 1.0, 0.95),
        (1.05, 25, 1.0, 1.2, 0.8),
    ):
        need = ratio_pairs_needed(est(ratio, n, sd), limit, confidence)
        assert need == expected(ratio, n, sd, limit, confidence) > n + 1
    assert ratio_pairs_needed(est(1.1, 10, 0.2), 1.0) == 23  # (2.262 * 0.2 / ln 1.1)^2 = 22.5
    assert ratio_pairs_needed(est(2.0, 10, 0.01), 1.0) == 11  # already clear: one pair more
    # Nothing to size it from: one pair, no spread, or a limit that is no ratio.
    assert ratio_pairs_needed(est(1.1, 1, 0.2), 1.0) is None
    assert ratio_pairs_needed(est(1.1, 10, math.nan), 1.0) is None
    assert ratio_pairs_needed(est(1.1, 10, 0.2), 0.0) is None
    assert ratio_pairs_needed(est(1.1, 10, 0.2), -1.0) is None


def test_ratio_json_gives_nan_as_none() -> None:
    assert paired_ratio([2.0, 4.0], [1.0, 2.0]).to_json() == {
        "ratio": 2.0,
        "ratio_ci": [2.0, 2.0],
        "n": 2,
        "log_sd": 0.0,
    }
    assert paired_ratio([4.0], [2.0]).to_json() == {"ratio": 2.0, "ratio_ci": [None, None], "n": 1, "log_sd": None}


def test_paired_ratio_refuses_what_is_no_pair_of_measurements() -> None:
    for cand, ref in (([[1.0, 2.0]], [[1.0, 2.0]]), ([], []), ([1.0, 2.0], [1.0])):
        with pytest.raises(ValueError, match=r"^need as many candidate as reference values, at least one"):
            paired_ratio(cand, ref)
    for cand, ref in (([1.0, 2.0], [1.0, 0.0]), ([0.0], [1.0]), ([1.0], [math.inf]), ([math.nan], [1.0])):
        with pytest.raises(ValueError, match=r"^ratios need positive, finite measurements on both arms$"):
            paired_ratio(cand, ref)


def test_paired_ratio_is_the_t_interval_of_the_log_ratios() -> None:
    est = paired_ratio([2.0, 8.0, 3.0], [1.0, 2.0, 1.0])  # log ratios ln 2, ln 4, ln 3
    logs = [math.log(2), math.log(4), math.log(3)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)  # the sample sd (n - 1)
    half = t_quantile(0.975, 2) * sd / math.sqrt(3)
    assert est.log_sd == pytest.approx(sd, rel=1e-12) and est.n == 3
    assert (est.ratio, est.lower, est.upper) == pytest.approx(
        (math.exp(mean), math.exp(mean - half), math.exp(mean + half)), rel=1e-12
    )


def _simulated_context(
    rng: np.random.Generator, true_ratio: float, reps: int, drift: float, *, noise: float = 0.05, order=pair_order
) -> ContextSpeed:  # noqa: ANN001
    """A machine whose speed drifts by `drift` over the run (thermal, a background job) with `noise`
    multiplicative noise per trial; the candidate's true decode time is 1/true_ratio of the reference's."""
    trials: dict[str, list[Trial]] = {"reference": [], "candidate": []}
    slot = 0
    for rep in range(reps):
        for side in order(rep):
            slowdown = 1.0 + drift * slot / (2 * reps)
            t = 0.1 * slowdown * math.exp(rng.normal(0, noise)) / (true_ratio if side == "candidate" else 1.0)
            trials[side].append(Trial(prefill_s=t, decode_s=t, peak_bytes=1, kv_bytes=1))
            slot += 1
    return ContextSpeed.from_trials(100, 16, trials["reference"], trials["candidate"])


@given(st.floats(min_value=0.0, max_value=1.0), st.integers(min_value=2, max_value=12))
def test_abba_pairs_cancel_a_linear_drift(drift: float, half_reps: int) -> None:
    """Reference-first in every pair, a drift that slows the machine reads as a faster reference;
    ABBA pairs put it on both arms alike, so a noise-free A/A run centres on 1 whatever the drift."""
    rng = np.random.default_rng(0)
    reps = 2 * half_reps
    abba = _simulated_context(rng, 1.0, reps, drift, noise=0.0)
    same_order = _simulated_context(rng, 1.0, reps, drift, noise=0.0, order=lambda rep: ("reference", "candidate"))
    step = drift / (2 * reps)  # the slowdown between the two trials of a pair
    assert abs(math.log(abba.decode.ratio)) <= 2 * step**2 + 1e-12  # first order cancels: O(step²) left
    if drift > 0.05:
        assert abs(math.log(same_order.decode.ratio)) > 5 * abs(math.log(abba.decode.ratio))


def test_an_aa_lever_is_called_faster_in_at_most_5_percent_of_runs() -> None:
    rng = np.random.default_rng(20261201)
    runs = [_simulated_context(rng, 1.0, 9, drift=0.2) for _ in range(2000)]
    false_faster = sum(r.decode.lower > 1.0 for r in runs) / len(runs)
    covered = sum(r.decode.lower <= 1.0 <= r.decode.upper for r in runs) / len(runs)
    assert false_faster <= 0.05
    assert 0.92 <= covered <= 0.98  # a 95% interval: neither too narrow nor uselessly wide


def test_a_real_speed_up_is_shown_at_nine_pairs() -> None:
    rng = np.random.default_rng(7)
    runs = [_simulated_context(rng, 1.15, 9, drift=0.2) for _ in range(500)]
    shown = sum(r.decode.lower > 1.05 for r in runs) / len(runs)
    assert shown >= 0.9  # 15% faster at 5% noise: 9 pairs show >= 5% almost always


def test_the_ratio_is_taken_in_float64_whatever_the_measurements_dtype() -> None:
    """Timings may arrive as float32 (an MLX array's values): the estimate equals the one from the same
    values in float64, bit for bit, on both sides."""
    cand = np.array([101.3, 99.7, 100.9, 102.2, 98.8], np.float32)
    ref = np.array([95.1, 96.4, 94.9, 97.3, 95.8], np.float32)
    wide = paired_ratio(cand.astype(np.float64), ref.astype(np.float64))
    assert paired_ratio(cand, ref) == wide
    assert paired_ratio(cand, ref.astype(np.float64)) == wide == paired_ratio(cand.astype(np.float64), ref)


@given(st.integers(min_value=3, max_value=40))
def test_the_looks_spend_exactly_the_error_rate_and_the_last_look_half_of_it(budget: int) -> None:
    """Bonferroni over the looks (4, 6, 9, ... and the budget): their error rates sum to 5%, so whenever
    the trials stop, the interval read then holds the true ratio with 95% at least; a whole budget
    reads at 97.5%. Counts that are no look have no level."""
    from pytest_mlxgate.stats.ratios import look_confidence, look_points

    looks = look_points(budget)
    assert looks[-1] == budget and list(looks) == sorted(set(looks)) and looks[0] >= 3
    spent = sum(1 - look_confidence(n, budget) for n in looks)
    assert spent == pytest.approx(0.05, abs=1e-12)
    assert look_confidence(budget, budget) == pytest.approx(0.975 if len(looks) > 1 else 0.95)
    if len(looks) > 2:
        assert look_confidence(looks[0], budget) > look_confidence(budget, budget)  # earlier looks: stricter
    between = [n for n in range(3, budget) if n not in looks]
    for n in between[:1]:
        with pytest.raises(ValueError, match="is not a look"):
            look_confidence(n, budget)
    with pytest.raises(ValueError, match="looks from 3 pairs"):
        look_points(2)


def _sequential_runs(
    rng: np.random.Generator,
    true_ratio: float,
    goals: tuple[Any, ...],
    runs: int,
    *,
    sequential: bool = True,
    noise: float = 0.05,
    precision: float | None = None,
) -> list[ContextSpeed]:
    """The trials' own loop (`pairs_until_decided`) on a simulated machine (`noise` per trial, a
    drifting speed), budget 9 (looks at 4, 6 and 9 pairs); `sequential=False` reads fixed-n 95%
    intervals at every look instead, the mistake the looks' levels exist to prevent."""
    from pytest_mlxgate.speed import measure
    from pytest_mlxgate.speed.shape import SpeedShape

    shape = SpeedShape(contexts=(100,), decode=16, repetitions=9, goals=goals)
    if precision is not None:
        shape = dataclasses.replace(shape, precision=precision)

    def pair(rep: int) -> dict[str, Trial]:
        out = {}
        for i, side in enumerate(pair_order(rep)):
            slowdown = 1.0 + 0.2 * (2 * rep + i) / 18
            t = 0.1 * slowdown * math.exp(rng.normal(0, noise)) / (true_ratio if side == "candidate" else 1.0)
            out[side] = Trial(prefill_s=t, decode_s=t, peak_bytes=1, kv_bytes=1)
        return out

    if sequential:
        return [measure.pairs_until_decided(shape, 100, pair) for _ in range(runs)]
    fixed = ContextSpeed.from_trials
    try:  # the same loop with the fixed-n level at every look
        ContextSpeed.from_trials = classmethod(  # type: ignore[method-assign,assignment]
            lambda cls, *a, budget=None, **k: fixed(*a, **k)
        )
        return [measure.pairs_until_decided(shape, 100, pair) for _ in range(runs)]
    finally:
        ContextSpeed.from_trials = fixed  # type: ignore[method-assign]


def test_stopping_once_decided_passes_a_lever_at_its_goal_at_most_2_5_percent_of_the_time() -> None:
    """The worst case for a false pass: the candidate exactly at its goal (1.05x). Stopping at the first
    decided look, the verdict passes it in at most 2.5% of runs (+ the simulation's own error; 2.0%
    measured); fixed-n 95% intervals at the same looks pass it twice as often (5.0%)."""
    from pytest_mlxgate.speed.shape import SpeedGoal

    goal = (SpeedGoal("decode", 1.05),)
    runs = _sequential_runs(np.random.default_rng(20261203), 1.05, goal, 3000)
    false_pass = sum(r.decode.lower >= 1.05 for r in runs) / len(runs)
    assert false_pass <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / len(runs))
    assert any(len(r.reference) < 9 for r in runs), "some runs stopped early"
    naive = _sequential_runs(np.random.default_rng(20261203), 1.05, goal, 3000, sequential=False)
    naive_pass = sum(r.decode.lower >= 1.05 for r in naive) / len(naive)
    assert naive_pass > 0.025 + 3 * math.sqrt(0.025 * 0.975 / len(naive)) > false_pass


def test_a_clear_speed_up_stops_early_and_an_exact_lever_stops_once_precise() -> None:
    """A lever 40% faster against a 1.05 goal is shown within a few pairs and stops there ("decided");
    with no goal, an exact lever stops once both estimates' standard errors are within the precision
    ("precise"): at 5% noise per trial, mostly at the first look, its interval still holding 1."""
    from pytest_mlxgate.speed.shape import DEFAULT_PRECISION, SpeedGoal

    fast = _sequential_runs(np.random.default_rng(3), 1.4, (SpeedGoal("decode", 1.05),), 200)
    assert all(r.stopped == "decided" and r.decode.lower >= 1.05 for r in fast)
    assert np.median([len(r.reference) for r in fast]) <= 4
    exact = _sequential_runs(np.random.default_rng(4), 1.0, (), 200)
    assert {r.stopped for r in exact} <= {"precise", "budget"}
    assert sum(r.stopped == "precise" for r in exact) >= 0.5 * len(exact)
    for r in exact:
        if r.stopped == "precise":
            for est in (r.prefill, r.decode):
                assert est.log_sd / math.sqrt(est.n) <= DEFAULT_PRECISION
    assert sum(r.decode.lower <= 1.0 <= r.decode.upper for r in exact) / len(exact) >= 0.95


@pytest.mark.parametrize("noise", [0.03, 0.07, 0.10])
def test_figures_only_reported_repeat_within_the_goal_and_cost_fewer_pairs_on_a_quiet_machine(noise: float) -> None:
    """What the precision rule is for: an exact lever with no goal, measured again and again on a machine
    whose trials spread `noise` each (this CPU's pairs: 5-14%), gives estimates whose spread across runs (sd
    of their logs) stays within the repeatability goal, 0.05, where the whole budget's does, and never far
    above the whole budget's where even that is at the goal; a quieter machine stops sooner: pairs are spent
    where the noise needs them. Stopping on the spread does not move the estimate (the mean log stays ~0)
    nor the intervals' coverage."""
    seed = int(noise * 1000)
    runs = _sequential_runs(np.random.default_rng(seed), 1.0, (), 400, noise=noise)
    every = _sequential_runs(np.random.default_rng(seed), 1.0, (), 400, noise=noise, precision=1e-12)
    spread, spread_every = (float(np.std(np.log([r.decode.ratio for r in rs]), ddof=1)) for rs in (runs, every))
    assert all(len(r.reference) == 9 for r in every)
    assert spread <= max(0.05, 1.1 * spread_every), (spread, spread_every)
    if spread_every <= 0.045:
        assert spread <= 0.05
    logs = np.log([r.decode.ratio for r in runs])
    assert abs(float(np.mean(logs))) <= 3 * spread / math.sqrt(len(runs))
    assert sum(r.decode.lower <= 1.0 <= r.decode.upper for r in runs) / len(runs) >= 0.95
    pairs = float(np.mean([len(r.reference) for r in runs]))
    assert pairs <= (4.5 if noise <= 0.03 else 8.5)  # a quiet machine stops at the first look
