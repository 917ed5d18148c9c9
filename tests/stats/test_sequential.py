"""The sequential capability gate (`stats.sequential`): verdicts, properties, and simulated error rates.

Every simulation looks after EVERY batch of 8 items, up to an item budget, alpha = 0.05, and stops at
the first verdict, exactly as `run_sequential` does (`simulate` is its vectorized twin, and
`test_simulate_matches_run_sequential` checks that they agree run by run). Items are paired outcomes
drawn i.i.d.: a loss (ref right, cand wrong: X = +1) with P(loss), a win (X = -1) with P(win), else
concordant; true drop = P(loss) - P(win), discordance = P(loss) + P(win).

Measured (seeded, at the seeds below; the slow lane's bigger runs agree):
* size, true drop AT the margin 0.05, 10% discordant (7.5% losses, 2.5% wins), budget 400, 2000 runs:
  false pass 3.3%, false fail 2.3% (one-sided 95% Wilson upper bounds 4.0% and 2.9%, <= alpha).
  Slow lane, 20000 runs each: that null 3.3% / 2.2%; 5% discordant all losses 3.7% / 0.8%; 50%
  discordant 3.6% / 3.4%; margin 0 with no drop (10% discordant) 2.8% / 2.8%; margin 0.10 with 12%
  discordant (11% / 1%) 3.8% / 1.9%.
* the same null with a naive fixed-n normal bound re-checked after every batch from n = 80: false
  pass 22% (5.6% if it looks once): the harness can fail, and optional stopping does inflate it.
* near-exact lever, margin 0.05, no drop, budget 400, 1000 runs: 0% discordant passes every run at 80
  items; 1%: 100% pass, 93 items on average (median 80); 2%: 99.3%, 114 items (median 88).
* regression, margin 0.02, true drop 0.05 (3 points over the margin), 10% discordant, 1000 runs:
  shown in 28% of runs within 400 items (never passed), 42% with bets tuned to the budget
  (horizon = 400); slow lane (4000 runs): 27% within 400, 53% within 1000, 79% within 2000.
  Margin 0, true drop 0.03, 5% discordant: 55% within 400, 83% within 800 (the fixed-n exact McNemar
  test needs 371 items for 80% power, but may look only once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats import sequential as seq
from pytest_mlxgate.stats.intervals import normal_quantile, wilson_bounds
from pytest_mlxgate.stats.sequential import (
    N_CAP,
    bounds_from_diffs,
    decide,
    drop_bounds,
    log_capital,
    run_sequential,
)

ALPHA = 0.05
Z95 = normal_quantile(0.95)  # one-sided 95% Wilson bounds on simulated rates


def arms(diffs: list[int] | np.ndarray, concordant: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """0/1 (ref, cand) with these differences; agreeing items both right (1) or both wrong (0)."""
    x = np.asarray(diffs, dtype=np.int64)
    ref = np.where(x == 1, 1, np.where(x == -1, 0, concordant))
    cand = np.where(x == 1, 0, np.where(x == -1, 1, concordant))
    return ref.astype(float), cand.astype(float)


def draws(p_loss: float, p_win: float, runs: int, n: int, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).random((runs, n))
    return np.where(u < p_loss, 1.0, np.where(u < p_loss + p_win, -1.0, 0.0))


def first_look(shown: np.ndarray) -> np.ndarray:
    """Index of the first look (column) where `shown` holds; the number of looks where it never does."""
    return np.asarray(np.where(shown.any(axis=1), shown.argmax(axis=1), shown.shape[1]), dtype=np.int64)


def simulate(
    x: np.ndarray, max_drop: float, *, batch: int = 8, alpha: float = ALPHA, horizon: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """run_sequential over every row of x (runs x budget): verdict per run (+1 pass, -1 fail, 0 none)
    and items used. A look after every batch; the running max of the log capital at the margin is the
    test `decide` applies; both shown at the same look: inconclusive, as `decide` reports it. (Bounds
    crossing away from the margin, which `decide` also reports, are not modelled: on i.i.d. items they
    practically never happen, and `test_simulate_matches_run_sequential` would see it.)"""
    budget = x.shape[1]
    looks = np.unique(np.minimum(np.arange(batch, budget + batch, batch), budget)) - 1
    threshold = math.log(1.0 / alpha)
    shown = {
        side: np.maximum.accumulate(log_capital(x, max_drop, side=side, alpha=alpha, horizon=horizon), axis=1)[:, looks]
        >= threshold
        for side in ("upper", "lower")
    }
    up, low = first_look(shown["upper"]), first_look(shown["lower"])
    verdict = np.where(up < low, 1, np.where(low < up, -1, 0))
    used = np.where(verdict != 0, looks[np.minimum(np.minimum(up, low), looks.size - 1)] + 1, budget)
    return verdict, used


def rate_upper(hits: int, runs: int) -> float:
    return wilson_bounds(hits, runs, Z95)[1]


def rate_lower(hits: int, runs: int) -> float:
    return wilson_bounds(hits, runs, Z95)[0]


# --- boundaries of decide ----------------------------------------------------------------------------------


def test_all_agree_small_n_is_inconclusive_and_says_how_many_items_would_do() -> None:
    ref, cand = arms([0] * 8)
    v = decide(ref, cand, max_drop=0.10)
    assert v.verdict == "inconclusive" and v.n == 8 and v.drop == 0.0
    assert v.lower < 0.10 < v.upper < 1.0  # 8 agreeing items already rule out big drops
    assert v.n_needed is not None and 30 <= v.n_needed <= 60  # variance-adaptive: not hundreds
    assert f"n=8 bounds the drop at {v.upper:.3f}" in v.message
    assert f"about {v.n_needed} items ({v.n_needed - 8} more)" in v.message
    assert "0 losses and 0 wins in 8 items" in v.message and "bound it at 0.100" in v.message
    # the projection is exact here: the first n at which all-agree passes is n_needed
    first_pass = next(n for n in range(1, 200) if decide(*arms([0] * n), max_drop=0.10).verdict == "pass")
    assert first_pass == v.n_needed


def test_all_agree_large_n_passes() -> None:
    v = decide(*arms([0] * 200, concordant=0), max_drop=0.05)
    assert v.verdict == "pass" and v.n_needed is None
    assert v.upper <= 0.05 and v.lower < 0.0
    assert v.message.startswith(f"pass: n=200 bounds the drop at {v.upper:.3f} <= max_drop 0.050")
    assert "one-sided 95% anytime-valid upper bound" in v.message


def test_a_clear_big_regression_fails() -> None:
    rng = np.random.default_rng(3)
    diffs = (rng.random(80) < 0.4).astype(int)  # the candidate loses ~40% of items, wins none
    v = decide(*arms(diffs), max_drop=0.05)
    assert v.verdict == "fail" and v.losses == int(diffs.sum()) and v.wins == 0
    assert v.lower > 0.05 and v.lower <= v.drop <= v.upper
    assert v.message.startswith(
        f"fail: regression shown: n=80 bounds the drop from below at {v.lower:.3f} > max_drop 0.050"
    )


def test_observed_drop_just_under_the_margin_at_small_n_is_inconclusive() -> None:
    diffs = [0] * 40
    for i in (5, 18, 31):  # 3 losses in 40: observed drop 0.075 under a 0.10 margin
        diffs[i] = 1
    ref, cand = arms(diffs)
    v = decide(ref, cand, max_drop=0.10)
    assert v.verdict == "inconclusive" and v.drop == pytest.approx(0.075)
    assert v.upper > 0.10 and v.lower < 0.10
    assert v.n_needed is not None and v.n_needed > 40
    assert "3 losses and 0 wins in 40 items" in v.message and f"about {v.n_needed} items" in v.message
    # what the projection promises: the observed items, continued at the observed rates, pass at n_needed
    path = np.concatenate([np.asarray(diffs, float), seq._continuation(np.asarray(diffs, float), v.n_needed)])
    assert decide(*arms(path[: v.n_needed].astype(int)), max_drop=0.10).verdict == "pass"
    assert decide(*arms(path[: v.n_needed - 1].astype(int)), max_drop=0.10).verdict == "inconclusive"


def test_observed_drop_above_the_margin_projects_a_regression() -> None:
    v = decide(*arms([1, 0, 0, 1, 0, 0, 0, 1, 0, 0]), max_drop=0.05)  # 3 losses in 10
    assert v.verdict == "inconclusive" and v.n_needed is not None and v.n_needed > 10
    assert "show it above 0.050" in v.message


def test_observed_drop_at_the_margin_needs_no_n() -> None:
    v = decide(*arms([0] * 50), max_drop=0.0)  # an exact lever cannot show it is no worse at margin 0
    assert v.verdict == "inconclusive" and v.n_needed is None
    assert "sits at the margin" in v.message


def test_a_drop_exactly_at_a_nonzero_margin_sits_there_and_its_mirror_is_projected() -> None:
    """One loss in 10 at max_drop 0.10 is at the margin (no n would settle it); one win in 10 is a drop
    of -0.10, well under the margin, and is projected like any other."""
    at = decide(*arms([1] + [0] * 9), max_drop=0.10)
    assert at.drop == 0.10 and at.verdict == "inconclusive" and at.n_needed is None
    assert "sits at the margin" in at.message
    under = decide(*arms([-1] + [0] * 9), max_drop=0.10)
    assert under.drop == -0.10 and under.verdict == "inconclusive" and under.n_needed is not None
    assert "sits at the margin" not in under.message and "would bound it at 0.100" in under.message


def test_a_projected_regression_is_projected_at_the_fail_alpha_level() -> None:
    """With every item a loss the continuation repeats it, so the projection is exact: n_needed is the
    first n at which the gate fails at its own (stricter) lower level, later than at alpha."""
    v = decide(*arms([1] * 4), max_drop=0.30, alpha=0.05, fail_alpha=0.005)
    assert v.verdict == "inconclusive" and "would show it above 0.300" in v.message

    def first_fail(**kw: float) -> int:
        return next(n for n in range(1, 500) if decide(*arms([1] * n), max_drop=0.30, **kw).verdict == "fail")

    assert v.n_needed == first_fail(alpha=0.05, fail_alpha=0.005) > first_fail(alpha=0.05)


def test_a_drop_a_hair_under_the_margin_needs_more_than_the_cap() -> None:
    diffs = [1] * 524 + [-1] * 475 + [0]  # drop 0.049, almost every item discordant
    order = np.random.default_rng(0).permutation(len(diffs))
    v = decide(*arms(np.asarray(diffs)[order]), max_drop=0.05)
    assert v.verdict == "inconclusive" and v.n_needed is None
    assert f"even {N_CAP} items at the observed discordance" in v.message


def test_graded_scores_are_accepted() -> None:
    rng = np.random.default_rng(5)
    ref = rng.uniform(0.3, 1.0, 150)
    v = decide(ref, ref - 0.01, max_drop=0.05)  # a steady 0.01 drop on graded scores
    assert v.verdict == "pass" and v.drop == pytest.approx(0.01) and v.upper <= 0.05
    noisy = decide(ref, np.clip(ref - rng.uniform(-0.2, 0.3, 150), 0, 1), max_drop=0.02)
    assert noisy.verdict in ("fail", "inconclusive") and -1.0 <= noisy.lower <= noisy.upper <= 1.0
    small = decide(ref[:10], ref[:10] - 0.01, max_drop=0.05)
    assert small.verdict == "inconclusive" and "spread of the per-item differences" in small.message


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ref": [1, 0, 1], "cand": [1, 0]}, "same items: 3 ref vs 2 cand"),
        ({"ref": [1, 0, 1.5], "cand": [1, 0, 1]}, r"ref scores must lie in \[0, 1\]"),
        ({"ref": [1, 0, 1], "cand": [1, -0.1, 1]}, r"cand scores must lie in \[0, 1\]"),
        ({"ref": [1, math.nan], "cand": [1, 1]}, "non-finite"),
        ({"ref": [[1, 0]], "cand": [[1, 0]]}, "flat sequence"),
        ({"ref": [], "cand": []}, "no items"),
        ({"max_drop": -0.01}, r"max_drop must be in \[0, 1\]"),
        ({"max_drop": 1.5}, r"max_drop must be in \[0, 1\]"),
        ({"alpha": 0.0}, r"alpha must be in \(0, 0.5\)"),
        ({"alpha": 0.5}, r"alpha must be in \(0, 0.5\)"),
        ({"alpha": 0.9}, r"alpha must be in \(0, 0.5\)"),
        ({"horizon": 0}, "horizon must be a positive"),
    ],
)
def test_bad_input_is_refused_clearly(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"ref": [1, 0, 1], "cand": [1, 0, 1], "max_drop": 0.05, "alpha": 0.05}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        decide(args.pop("ref"), args.pop("cand"), **args)  # type: ignore[arg-type]


def test_items_whose_drop_drifts_are_reported_not_decided() -> None:
    v = decide(*arms([-1] * 60 + [1] * 120), max_drop=0.05)  # wins first, then losses: sorted, not shuffled
    assert v.lower > v.upper
    assert v.verdict == "inconclusive" and "the bounds cross" in v.message and "shuffled" in v.message


def test_the_verdict_is_json_ready() -> None:
    v = decide(*arms([0] * 8), max_drop=0.10)
    out = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert out["verdict"] == "inconclusive" and out["n"] == 8 and out["n_needed"] == v.n_needed
    assert "Waudby-Smith" in out["method"]


# --- properties ---------------------------------------------------------------------------------------------

diff_lists = st.lists(st.sampled_from([-1, 0, 1]), min_size=1, max_size=60)
graded = st.lists(st.tuples(st.integers(0, 16), st.integers(0, 16)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(losses=st.integers(0, 30), wins=st.integers(0, 30), ties=st.integers(0, 60), seed=st.integers(0, 2**32 - 1))
def test_upper_is_at_least_lower_in_a_random_order(losses: int, wins: int, ties: int, seed: int) -> None:
    diffs = np.array([1] * losses + [-1] * wins + [0] * ties, dtype=float)
    if diffs.size == 0:
        return
    lower, upper = bounds_from_diffs(np.random.default_rng(seed).permutation(diffs))
    assert -1.0 <= lower <= upper <= 1.0


@settings(max_examples=60, deadline=None)
@given(diffs=diff_lists, data=st.data())
def test_turning_an_agreement_into_a_loss_never_lowers_the_upper_bound(diffs: list[int], data: st.DataObject) -> None:
    zeros = [i for i, d in enumerate(diffs) if d == 0]
    if not zeros:
        return
    j = data.draw(st.sampled_from(zeros))
    worse = list(diffs)
    worse[j] = 1
    assert drop_bounds(*arms(worse))[1] >= drop_bounds(*arms(diffs))[1]


@settings(max_examples=60, deadline=None)
@given(diffs=diff_lists)
def test_a_loss_as_the_latest_item_moves_both_bounds_up(diffs: list[int]) -> None:
    """Exactly (an earlier one need not lift the LOWER bound: module docs, variance adaptivity)."""
    agree, lose = bounds_from_diffs(np.array(diffs + [0], float)), bounds_from_diffs(np.array(diffs + [1], float))
    assert lose[0] >= agree[0] and lose[1] >= agree[1]


@settings(max_examples=60, deadline=None)
@given(pairs=graded)
def test_swapping_the_arms_mirrors_the_bounds(pairs: list[tuple[int, int]]) -> None:
    ref, cand = (np.array([p[k] for p in pairs], float) / 16.0 for k in (0, 1))
    lower, upper = drop_bounds(ref, cand)
    m_lower, m_upper = drop_bounds(cand, ref)
    assert lower == -m_upper and upper == -m_lower


@settings(max_examples=60, deadline=None)
@given(pairs=graded, shift=st.integers(-16, 16))
def test_only_the_per_item_differences_matter(pairs: list[tuple[int, int]], shift: int) -> None:
    """Both arms shifted alike (both-right vs both-wrong, or any common level): the same bounds."""
    ref, cand = (np.array([p[k] for p in pairs], float) for k in (0, 1))
    s = np.clip(shift, -np.minimum(ref, cand), 16 - np.maximum(ref, cand))  # per item, stays in [0, 16]
    assert drop_bounds((ref + s) / 16, (cand + s) / 16) == drop_bounds(ref / 16, cand / 16)


@settings(max_examples=40, deadline=None)
@given(diffs=diff_lists, cut=st.integers(1, 60))
def test_bounds_only_tighten_as_items_arrive(diffs: list[int], cut: int) -> None:
    x = np.array(diffs, float)
    lower, upper = bounds_from_diffs(x)
    p_lower, p_upper = bounds_from_diffs(x[: min(cut, x.size)])
    assert p_lower <= lower + 1e-11 and upper <= p_upper + 1e-11


@settings(max_examples=60, deadline=None)
@given(diffs=diff_lists, max_drop=st.sampled_from([0.0, 0.02, 0.05, 0.1, 0.3]))
def test_the_verdict_agrees_with_its_bounds(diffs: list[int], max_drop: float) -> None:
    v = decide(*arms(diffs), max_drop=max_drop)
    if v.lower > v.upper:
        assert v.verdict == "inconclusive" and "cross" in v.message
    elif v.verdict == "pass":
        assert v.upper <= max_drop < v.upper + 1.0 and v.n_needed is None
    elif v.verdict == "fail":
        assert v.lower >= max_drop and v.n_needed is None
    else:
        assert v.lower < max_drop < v.upper
        assert v.n_needed is None or v.n_needed > v.n


# --- predictability: the bet at item t is fixed before item t is seen -------------------------------------
# Anytime validity rests on it: the capital is a martingale only if lambda_t depends on x_1..x_{t-1}.

graded_diffs = st.lists(st.sampled_from([-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0]), min_size=0, max_size=40)


@settings(max_examples=80, deadline=None)
@given(
    past=graded_diffs,
    now=st.tuples(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0])),
    later=graded_diffs,
    horizon=st.sampled_from([None, 10_000]),
)
def test_changing_x_t_does_not_change_the_bet_at_t(
    past: list[float], now: tuple[float, float], later: list[float], horizon: int | None
) -> None:
    """Read back from the public capital: the increment at t is log(1 + beta_t * edge(x_t)), so
    beta_t = expm1(increment) / edge. Two sequences that share x_1..x_{t-1} and differ from t on
    must bet the same at t (and alike before it), on both sides, truncated or not (horizon 10k: the
    bets stay under the truncation, so the plug-in variance is what is read)."""
    a, b = now
    if a == b:
        return
    t = len(past)
    xa, xb = np.array([*past, a, *later]), np.array([*past, b, *reversed(later)])
    sides: tuple[tuple[Literal["upper", "lower"], float], ...] = (("upper", 0.3), ("lower", -0.3))
    for side, drop in sides:  # edges drop - x / x - drop are never 0 here
        ka = log_capital(xa, drop, side=side, horizon=horizon)
        kb = log_capital(xb, drop, side=side, horizon=horizon)
        np.testing.assert_array_equal(ka[:t], kb[:t])
        step_a, step_b = np.diff(ka, prepend=0.0)[t], np.diff(kb, prepend=0.0)[t]
        edge_a, edge_b = (drop - a, drop - b) if side == "upper" else (a - drop, b - drop)
        assert math.expm1(step_a) / edge_a == pytest.approx(math.expm1(step_b) / edge_b, rel=1e-9, abs=1e-12), side
    bets_a, bets_b = seq._plugin_bets(xa, ALPHA, horizon), seq._plugin_bets(xb, ALPHA, horizon)
    np.testing.assert_array_equal(bets_a[: t + 1], bets_b[: t + 1])


def _wsr_log_capital(x: list[float], drop: float, side: str, alpha: float, horizon: int | None) -> list[float]:
    """log K_t written as Waudby-Smith & Ramdas write it, on the [0, 1] scale and item by item:
    Y = (X + 1) / 2, m = (drop + 1) / 2, mu_t = (1/2 + sum Y) / (t + 1), sigma2_t = (1/4 + sum (Y_i -
    mu_i)^2) / (t + 1), sigma2_0 = 1/4, lambda_t = sqrt(2 log(1/alpha) / (sigma2_{t-1} h_t)), h_t = t log(1 + t)
    (or the horizon), truncated at 3/4 / (1 - m) (upper) or 3/4 / m (lower); the factor 1 + lambda (m - Y)
    or 1 + lambda (Y - m)."""
    m = (drop + 1.0) / 2.0
    total, spread, sigma2_prev, log_k, out = 0.0, 0.0, 0.25, 0.0, []
    for t, xi in enumerate(x, start=1):
        y = (xi + 1.0) / 2.0
        h = t * math.log1p(t) if horizon is None else float(horizon)
        lam = math.sqrt(2.0 * math.log(1.0 / alpha) / (sigma2_prev * h))
        room = 1.0 - m if side == "upper" else m
        if room > 0:
            lam = min(lam, 0.75 / room)
        log_k += math.log1p(lam * ((m - y) if side == "upper" else (y - m)))
        out.append(log_k)
        total += y
        mu = (0.5 + total) / (t + 1.0)
        spread += (y - mu) ** 2
        sigma2_prev = (0.25 + spread) / (t + 1.0)
    return out


@settings(max_examples=60, deadline=None)
@given(
    x=graded_diffs.filter(bool),
    drop=st.sampled_from([-0.3, 0.0, 0.05, 0.2]),
    horizon=st.sampled_from([None, 400]),
    alpha=st.sampled_from([0.05, 0.01]),
)
def test_the_capital_is_the_papers_prpl_eb_bet(x: list[float], drop: float, horizon: int | None, alpha: float) -> None:
    """The vectorized X-scale capital equals the paper's [0, 1]-scale one, recomputed by hand."""
    sides: tuple[Literal["upper", "lower"], ...] = ("upper", "lower")
    for side in sides:
        ours = log_capital(np.array(x), drop, side=side, alpha=alpha, horizon=horizon)
        np.testing.assert_allclose(ours, _wsr_log_capital(x, drop, side, alpha, horizon), rtol=1e-10, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(past=graded_diffs, drop=st.sampled_from([-0.4, -0.1, 0.0, 0.05, 0.2, 0.5]), horizon=st.sampled_from([None, 400]))
def test_the_capital_is_a_fair_game_at_the_true_drop(past: list[float], drop: float, horizon: int | None) -> None:
    """The martingale property itself, exactly: whatever came before, the next item's capital factor
    averages to 1 over any distribution of x_t whose mean is the drop bet against (here a loss, a win
    or a tie, with P(loss) - P(win) = drop). A bet that peeked at x_t would tilt that average."""
    p_win = 0.2
    p_loss = p_win + drop
    dist = {1.0: p_loss, -1.0: p_win, 0.0: 1.0 - p_loss - p_win}
    t = len(past)
    for side in ("upper", "lower"):
        average = 0.0
        for value, p in dist.items():
            k = log_capital(np.array([*past, value]), drop, side=side, horizon=horizon)
            before = k[t - 1] if t else 0.0
            average += p * math.exp(k[t] - before)
        assert average == pytest.approx(1.0, abs=1e-12), side


# --- run_sequential ----------------------------------------------------------------------------------------


def feeder(diffs: list[int] | np.ndarray) -> tuple[Callable[[int], list[tuple[float, float]]], list[int]]:
    ref, cand = arms(diffs)
    pairs = list(zip(ref.tolist(), cand.tolist(), strict=True))
    asked: list[int] = []

    def next_batch(k: int) -> list[tuple[float, float]]:
        done = min(len(pairs), sum(asked))
        asked.append(k)
        return pairs[done : done + k]

    return next_batch, asked


def test_run_sequential_stops_at_the_first_shown_verdict() -> None:
    next_batch, asked = feeder([0] * 400)
    v = run_sequential(next_batch, max_drop=0.10, alpha=0.05, batch_size=8, max_items=400)
    first = decide(*arms([0] * 400), max_drop=0.10)  # passes at any n >= 38, the first look after 38: 40
    assert first.verdict == "pass"
    assert v.verdict == "pass" and v.n == 40 and v.batches == 5 and v.stopped_by == "verdict"
    assert asked == [8] * 5
    assert v.message.endswith("[after 5 batches of up to 8: shown]")


def test_run_sequential_spends_the_item_budget_and_cuts_the_last_batch() -> None:
    next_batch, asked = feeder([1, -1] * 50)
    v = run_sequential(next_batch, max_drop=0.0, alpha=0.05, batch_size=8, max_items=20)
    assert asked == [8, 8, 4]
    assert v.verdict == "inconclusive" and v.n == 20 and v.batches == 3 and v.stopped_by == "max_items"
    assert "the item budget (20) spent" in v.message and "n=20 bounds" in v.message


def test_a_time_budget_running_out_with_the_last_item_is_the_item_budget_spent() -> None:
    """Both budgets end at the same batch: the items were all asked for, so that is what the record
    says (not the clock); one batch earlier, it is the time budget."""
    for max_items, stopped in ((16, "max_items"), (24, "max_seconds")):
        ticks = iter(range(100))
        next_batch, _ = feeder([1, -1] * 50)
        v = run_sequential(
            next_batch, max_drop=0.0, batch_size=8, max_items=max_items, max_seconds=2, clock=ticks.__next__
        )
        assert v.n == 16 and v.stopped_by == stopped, (max_items, v.stopped_by)


def test_a_run_under_a_horizon_ends_in_that_horizon_s_verdict() -> None:
    """The last verdict (the one recorded, with its n needed) uses the same tuned bets as every look before it."""
    items = [0, 0, 0, 1, 0, 0, -1, 0, 1, 0] * 6
    for horizon in (None, 30):
        next_batch, _ = feeder(items)
        v = run_sequential(next_batch, max_drop=0.05, batch_size=20, max_items=60, horizon=horizon)
        alone = decide(*arms(items), max_drop=0.05, horizon=horizon)
        assert (v.verdict, v.lower, v.upper, v.n_needed, v.horizon) == (
            alone.verdict,
            alone.lower,
            alone.upper,
            alone.n_needed,
            horizon,
        )


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_items": 0}, "^max_items must be a positive integer, got 0$"),
        ({"batch_size": 2.5}, "^batch_size must be a positive integer, got 2.5$"),
        ({"max_seconds": 0}, "^max_seconds must be > 0 or None, got 0$"),
    ],
)
def test_run_sequential_refuses_a_budget_by_name(kwargs: dict[str, object], says: str) -> None:
    args: dict[str, object] = {"max_drop": 0.05, "batch_size": 8, "max_items": 40, **kwargs}
    with pytest.raises(ValueError, match=says):
        run_sequential(lambda k: [], **args)  # type: ignore[arg-type]


def test_run_sequential_takes_one_item_at_a_time_and_a_budget_of_one_item() -> None:
    """The smallest batch and the smallest budget are both 1 (positive integers, as the refusals say)."""
    next_batch, asked = feeder([0] * 400)
    v = run_sequential(next_batch, max_drop=0.10, batch_size=1, max_items=400)
    assert v.verdict == "pass" and v.n == 38 and v.batches == 38 and asked == [1] * 38  # the first n that passes
    next_batch, asked = feeder([0] * 400)
    one = run_sequential(next_batch, max_drop=0.10, batch_size=8, max_items=1)
    assert one.n == 1 and one.batches == 1 and one.stopped_by == "max_items" and asked == [1]
    assert "the item budget (1) spent" in one.message


def test_run_sequential_decides_at_its_fail_alpha_and_checks_it() -> None:
    """fail_alpha reaches every look and the returned verdict: the same bounds as `decide` at that
    level, recorded and named; a level above alpha is refused as `decide` refuses it."""
    items = [1, 0, 0, 0] * 10
    next_batch, _ = feeder(items)
    v = run_sequential(next_batch, max_drop=0.10, alpha=0.05, batch_size=8, max_items=40, fail_alpha=0.01)
    alone = decide(*arms(items), max_drop=0.10, alpha=0.05, fail_alpha=0.01)
    assert (v.verdict, v.lower, v.upper, v.n_needed, v.fail_alpha) == (
        alone.verdict,
        alone.lower,
        alone.upper,
        alone.n_needed,
        0.01,
    )
    assert "lower 99% anytime-valid bounds" in v.message
    with pytest.raises(ValueError, match=r"fail_alpha must be in \(0, alpha=0.05\], got 0.1"):
        run_sequential(lambda k: [], max_drop=0.10, alpha=0.05, batch_size=8, max_items=40, fail_alpha=0.1)


def test_run_sequential_stops_when_the_items_run_out() -> None:
    next_batch, asked = feeder([0] * 12)
    v = run_sequential(next_batch, max_drop=0.05, batch_size=8, max_items=400)
    assert v.n == 12 and v.batches == 2 and v.stopped_by == "exhausted" and asked == [8, 8]
    empty = run_sequential(lambda k: [], max_drop=0.05, batch_size=8, max_items=400)
    assert empty.n == 0 and empty.batches == 0 and empty.verdict == "inconclusive"
    assert "no items" in empty.message and json.dumps(empty.to_json(), allow_nan=False)
    assert run_sequential(lambda k: None, max_drop=0.05, batch_size=8, max_items=400).n == 0


def test_run_sequential_stops_on_the_time_budget() -> None:
    ticks = iter(range(100))
    next_batch, _asked = feeder([1, -1] * 100)
    v = run_sequential(
        next_batch, max_drop=0.0, batch_size=4, max_items=200, max_seconds=3.0, clock=lambda: float(next(ticks))
    )
    assert v.stopped_by == "max_seconds" and v.batches == 3 and v.n == 12
    assert "the time budget (3 s) spent" in v.message


def test_run_sequential_takes_arrays_and_refuses_bad_batches() -> None:
    v = run_sequential(lambda k: np.ones((k, 2)), max_drop=0.10, batch_size=10, max_items=100)
    assert v.verdict == "pass" and v.n == 40
    with pytest.raises(ValueError, match="returned 9 pairs"):
        run_sequential(lambda k: [(1.0, 1.0)] * 9, max_drop=0.1, batch_size=8, max_items=100)
    with pytest.raises(ValueError, match=r"\(ref, cand\) pairs"):
        run_sequential(lambda k: np.ones((k, 3)), max_drop=0.1, batch_size=8, max_items=100)
    for bad in ({"batch_size": 0}, {"max_items": 0}, {"max_seconds": 0.0}, {"alpha": 0.6}, {"max_drop": 2.0}):
        args: dict[str, float] = {"max_drop": 0.1, "batch_size": 8, "max_items": 100}
        args.update(bad)
        with pytest.raises(ValueError):
            run_sequential(lambda k: [], **args)  # type: ignore[arg-type]


def test_simulate_matches_run_sequential() -> None:
    """The vectorized harness below is run_sequential: same verdict and items, run by run."""
    for p_loss, p_win, max_drop, seed in [
        (0.01, 0.01, 0.05, 1),
        (0.3, 0.0, 0.05, 2),
        (0.075, 0.025, 0.05, 3),
        (0.5, 0.45, 0.1, 4),
    ]:
        x = draws(p_loss, p_win, 3, 400, seed)
        verdict, used = simulate(x, max_drop)
        for row, want, n in zip(x, verdict, used, strict=True):
            next_batch, _ = feeder(row.astype(int))
            got = run_sequential(next_batch, max_drop=max_drop, alpha=ALPHA, batch_size=8, max_items=400)
            assert ({"pass": 1, "fail": -1, "inconclusive": 0}[got.verdict], got.n) == (want, n)


# --- simulation: error rates and power ------------------------------------------------------------------------


def null_rates(p_loss: float, p_win: float, max_drop: float, runs: int, seed: int) -> tuple[int, int]:
    verdict, _ = simulate(draws(p_loss, p_win, runs, 400, seed), max_drop)
    return int(np.sum(verdict == 1)), int(np.sum(verdict == -1))


def test_at_the_margin_false_pass_and_false_fail_stay_under_alpha() -> None:
    """True drop = max_drop = 0.05, 10% discordant, a look every 8 items up to 400, 2000 runs."""
    runs = 2000
    passes, fails = null_rates(0.075, 0.025, 0.05, runs, seed=11)
    assert rate_upper(passes, runs) <= ALPHA, passes / runs
    assert rate_upper(fails, runs) <= ALPHA, fails / runs


def test_the_harness_catches_a_fixed_n_bound_rechecked_after_every_batch() -> None:
    """The same null with a naive one-sided 95% normal bound (mean + z sd/sqrt(n)), looked at after every
    batch from n = 80 on (so its small-n degeneracy is not what shows): false pass ~22%, against ~5.6%
    when it looks once, at n = 400. Optional stopping inflates a fixed-n bound; this harness sees it."""
    runs, x = 2000, draws(0.075, 0.025, 2000, 400, seed=11)
    n = np.arange(1, 401, dtype=float)
    mean = np.cumsum(x, axis=1) / n
    sd = np.sqrt(np.maximum(np.cumsum(x * x, axis=1) / n - mean**2, 0.0) * n / np.maximum(n - 1, 1))
    upper, lower = mean + Z95 * sd / np.sqrt(n), mean - Z95 * sd / np.sqrt(n)
    looks = np.arange(79, 400, 8)
    up, low = first_look(upper[:, looks] <= 0.05), first_look(lower[:, looks] > 0.05)
    false_pass = int(np.sum(up < low))
    once = int(np.sum(upper[:, -1] <= 0.05))
    assert rate_lower(false_pass, runs) > ALPHA and false_pass > 2 * once, (false_pass / runs, once / runs)


@pytest.mark.parametrize("discordance, max_items", [(0.0, 90), (0.01, 110), (0.02, 140)])
def test_a_near_exact_lever_passes_early(discordance: float, max_items: int) -> None:
    """Margin 0.05, no drop, budget 400: >= 97% of runs pass (measured 100%, 100%, 99.3%), on average
    within `max_items` items (measured 80, 93, 114)."""
    runs = 1000
    verdict, used = simulate(draws(discordance / 2, discordance / 2, runs, 400, seed=21), 0.05)
    assert rate_lower(int(np.sum(verdict == 1)), runs) >= 0.97
    assert used.mean() <= max_items and not np.any(verdict == -1)


def test_power_to_show_a_three_point_excess_and_what_the_horizon_buys() -> None:
    """Margin 0.02, true drop 0.05, 10% discordant, budget 400: 28% shown (anytime bets), 42% with the
    bets tuned to the budget; it never passes (a false pass here is an error of <= alpha)."""
    runs = 1000
    x = draws(0.075, 0.025, runs, 400, seed=31)
    anytime, _ = simulate(x, 0.02)
    tuned, _ = simulate(x, 0.02, horizon=400)
    power, power_tuned = float(np.mean(anytime == -1)), float(np.mean(tuned == -1))
    assert rate_lower(int(np.sum(anytime == -1)), runs) >= 0.2, power
    assert power_tuned >= power + 0.1, (power, power_tuned)
    assert rate_upper(int(np.sum(anytime == 1)), runs) <= ALPHA


def test_power_at_margin_zero() -> None:
    """Margin 0, true drop 0.03, 5% discordant (4% losses, 1% wins): 83% shown within 800 items."""
    runs = 1000
    verdict, _ = simulate(draws(0.04, 0.01, runs, 800, seed=41), 0.0)
    assert rate_lower(int(np.sum(verdict == -1)), runs) >= 0.75


@pytest.mark.slow
@pytest.mark.parametrize(
    "p_loss, p_win, max_drop",
    [(0.075, 0.025, 0.05), (0.05, 0.0, 0.05), (0.275, 0.225, 0.05), (0.05, 0.05, 0.0), (0.11, 0.01, 0.10)],
)
def test_nulls_at_the_margin_many_runs(p_loss: float, p_win: float, max_drop: float) -> None:
    """20000 runs each (10% discordant; 5% all losses; 50% discordant; margin 0 with no drop; 12%
    discordant at margin 0.10): false pass and false fail both <= alpha (Wilson upper bound)."""
    runs = 20000
    passes, fails = null_rates(p_loss, p_win, max_drop, runs, seed=51)
    assert rate_upper(passes, runs) <= ALPHA, passes / runs
    assert rate_upper(fails, runs) <= ALPHA, fails / runs


@pytest.mark.slow
def test_power_curve_for_a_three_point_excess() -> None:
    """Margin 0.02, true drop 0.05, 10% discordant, 4000 runs to 2000 items: shown as a regression in
    27% within 400, 53% within 1000, 79% within 2000; power only grows with the budget."""
    runs = 4000
    x = draws(0.075, 0.025, runs, 2000, seed=61)
    powers = {budget: float(np.mean(simulate(x[:, :budget], 0.02)[0] == -1)) for budget in (400, 1000, 2000)}
    assert powers[400] < powers[1000] < powers[2000]
    assert rate_lower(int(powers[2000] * runs), runs) >= 0.75, powers
    assert rate_lower(int(powers[1000] * runs), runs) >= 0.45, powers


def test_the_bounds_sit_where_the_capital_reaches_one_over_alpha() -> None:
    """Each end of `bounds_from_diffs` is the value the gambler's wealth just reaches 1/alpha against:
    a bound from any other threshold (log 2/alpha, say: valid, but wider than the test it reports) misses."""
    rng = np.random.default_rng(7)
    x = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0, 1.0], size=300)
    for alpha, horizon in ((0.05, None), (0.01, None), (0.05, 300)):  # a horizon tunes the bets: its own bounds
        lower, upper = bounds_from_diffs(x, alpha=alpha, horizon=horizon)
        assert -1.0 < lower < float(x.mean()) < upper < 1.0
        for value, side in ((upper, "upper"), (lower, "lower")):
            capital = log_capital(x, value, side=side, alpha=alpha, horizon=horizon)  # type: ignore[arg-type]
            assert float(np.max(capital)) == pytest.approx(math.log(1.0 / alpha), abs=1e-6), (side, alpha, horizon)
    assert bounds_from_diffs(x, horizon=300) != bounds_from_diffs(x)
    ref = np.where(x < 0, 0.0, 1.0)  # diffs ref - cand: -1 -> (0, 1), 0 -> (1, 1), 1 -> (1, 0)
    cand = np.where(x > 0, 0.0, 1.0)
    assert drop_bounds(ref, cand, horizon=300) == bounds_from_diffs(x, horizon=300)


def test_a_separate_fail_alpha_is_recorded_and_checked() -> None:
    ref, cand = [1.0] * 40 + [0.0] * 10, [1.0] * 30 + [0.0] * 20
    assert decide(ref, cand, max_drop=0.05, alpha=0.05, fail_alpha=0.01).fail_alpha == 0.01
    spread = decide([1.0] * 50, [1.0, 1.0, 1.0, 1.0, 0.0] * 10, max_drop=0.20, alpha=0.05, fail_alpha=0.01)
    assert spread.verdict == "inconclusive"  # a drop of 0.2 at the margin: the message names both levels
    assert "(one-sided upper 95%, lower 99% anytime-valid bounds" in spread.message
    assert decide(ref, cand, max_drop=0.05, alpha=0.05, fail_alpha=0.05).fail_alpha is None  # the same level
    with pytest.raises(ValueError, match=r"fail_alpha must be in \(0, alpha=0.05\], got 0.1"):
        decide(ref, cand, max_drop=0.05, alpha=0.05, fail_alpha=0.1)


def test_log_capital_refuses_bad_differences_by_name() -> None:
    with pytest.raises(ValueError, match="diffs needs an item axis"):
        log_capital(np.float64(0.5), 0.1, side="upper")
    with pytest.raises(ValueError, match=r"paired differences must lie in \[-1, 1\]"):
        log_capital(np.array([0.5, 1.5]), 0.1, side="upper")
    with pytest.raises(ValueError, match=r"^drop must be in \[-1, 1\], got 1.5$"):
        log_capital(np.array([0.5]), 1.5, side="upper")


def test_the_capital_is_taken_in_float64_whatever_the_differences_dtype() -> None:
    x = np.random.default_rng(3).choice([-0.7, -0.1, 0.0, 0.3, 0.9], size=60).astype(np.float32)
    for side in ("upper", "lower"):
        narrow = log_capital(x, 0.05, side=side)  # type: ignore[arg-type]
        np.testing.assert_array_equal(narrow, log_capital(x.astype(np.float64), 0.05, side=side))  # type: ignore[arg-type]


def test_the_shortest_horizon_is_one_item() -> None:
    """horizon=1 tunes the bets for a single look: allowed (the smallest positive count), and valid."""
    v = decide([1.0] * 30, [1.0] * 30, max_drop=0.5, horizon=1)
    assert v.horizon == 1 and v.verdict in ("pass", "inconclusive")
    with pytest.raises(ValueError, match="horizon must be a positive"):
        decide([1.0], [1.0], max_drop=0.5, horizon=0)


def test_a_margin_of_the_whole_scale_passes_at_once() -> None:
    """max_drop = 1: no drop can exceed it, so one item (even a lost one) shows it; the bound is the margin."""
    v = decide([1.0], [0.0], max_drop=1.0)
    assert v.verdict == "pass" and v.upper <= 1.0 and v.n == 1


def test_no_items_is_refused_in_these_words() -> None:
    """The whole message, not a fragment of it: what a caller with an empty task reads."""
    with pytest.raises(ValueError, match=r"^no items to compare$"):
        decide([], [], max_drop=0.05)


@settings(max_examples=60, deadline=None)
@given(
    inside=st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=8),
    bad=st.none()
    | st.floats(1.0, 2.0, exclude_min=True)  # just past an end
    | st.floats(-2.0, -1.0, exclude_max=True)
    | st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not -1.0 <= v <= 1.0),
    at=st.integers(0, 8),
)
def test_differences_are_taken_exactly_when_every_one_lies_in_minus_one_to_one(
    inside: list[float], bad: float | None, at: int
) -> None:
    """A paired difference of two [0, 1] scores lies in [-1, 1]: one outside (or not finite) anywhere in
    the sequence is refused by both entry points, and a sequence all inside is taken."""
    diffs = list(inside)
    if bad is not None:
        diffs.insert(at % (len(diffs) + 1), bad)
    x = np.array(diffs, dtype=np.float64)
    if bad is None:
        lower, upper = bounds_from_diffs(x)
        assert -1.0 <= lower <= upper <= 1.0
        assert log_capital(x, 0.1, side="upper").shape == x.shape
        return
    with pytest.raises(ValueError, match=r"^paired differences must lie in \[-1, 1\]$"):
        bounds_from_diffs(x)
    with pytest.raises(ValueError, match=r"^paired differences must lie in \[-1, 1\]$"):
        log_capital(x, 0.1, side="upper")
