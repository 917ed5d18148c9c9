"""Paired capability statistics (`pytest_mlxgate.capability.stats`): known values, size, power, JSON.

Known values come from published tables (Newcombe 1998 for Wilson, Fagerland et al. 2014 for
Tango's interval) or are exact binomial sums computed here with integers. Size and power are
checked both exactly (enumerating every paired table) and by simulating item-level data through
the public API, so a wrong direction, a wrong tail or a liberal test shows up as a failure.
"""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.results.score import capability_score
from pytest_mlxgate.stats.intervals import normal_cdf, normal_quantile, wilson_interval, wilson_lower
from pytest_mlxgate.stats.paired_tests import (
    DropTest,
    PairedBinary,
    drop_exceeds,
    drop_test_binary,
    drop_test_graded,
    drop_within,
    holm,
    mcnemar_exact_p,
    mcnemar_exact_p_two_sided,
    mean_interval_bootstrap,
    paired_binary,
    score_z,
    tango_interval,
)
from pytest_mlxgate.stats.power import n_for_power, power_binary, power_binary_exact

ALPHA = 0.05


def _mc_slack(p: float, sims: int) -> float:
    """Three Monte Carlo standard errors of a rejection rate near p."""
    return 3.0 * math.sqrt(p * (1.0 - p) / sims)


# --- the normal distribution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.975, 1.959963984540054),
        (0.95, 1.6448536269514722),
        (0.8, 0.8416212335729143),
        (0.999, 3.090232306167813),
        (0.5, 0.0),
        (1e-10, -6.361340902404056),
    ],
)
def test_normal_quantile_matches_the_table(p: float, expected: float) -> None:
    assert normal_quantile(p) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    if p >= 1e-3:  # 1 - p is exact enough in floating point to test the symmetry
        assert normal_quantile(1.0 - p) == pytest.approx(-expected, rel=1e-12, abs=1e-15)


def test_normal_quantile_inverts_the_cdf_everywhere() -> None:
    ref = NormalDist()
    for p in np.concatenate([np.logspace(-300, -1, 60), np.linspace(0.01, 0.99, 99)]):
        x = normal_quantile(float(p))
        assert x == pytest.approx(ref.inv_cdf(float(p)), rel=1e-9, abs=1e-12)
        assert normal_cdf(x) == pytest.approx(float(p), rel=1e-9)
    assert normal_quantile(0.0) == -math.inf and normal_quantile(1.0) == math.inf
    with pytest.raises(ValueError):
        normal_quantile(1.5)


# --- Wilson ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, n, lo, hi",
    # Newcombe (1998), Stat Med 17:857, Table II, method 3 (Wilson score without correction).
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_matches_newcombe_1998(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=5e-5)
    assert got[1] == pytest.approx(hi, abs=5e-5)


def test_wilson_lower_is_one_sided() -> None:
    # One-sided 95% uses z = 1.645: the lower end of the two-sided 90% interval, above the 95% one.
    assert wilson_lower(81, 263) == pytest.approx(wilson_interval(81, 263, 0.90)[0], rel=1e-12)
    assert wilson_lower(81, 263) > wilson_interval(81, 263)[0]
    assert wilson_lower(0, 10) == 0.0 and wilson_lower(0, 0) == 0.0
    # Coverage: the true p is below the bound in at most ~5% of samples.
    rng = np.random.default_rng(3)
    ks = rng.binomial(200, 0.3, size=4000)
    misses = np.mean([wilson_lower(int(k), 200) > 0.3 for k in ks])
    assert misses <= ALPHA + _mc_slack(ALPHA, 4000)


# --- exact McNemar ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (7, 1, Fraction(1 + 8, 256)),
        (5, 0, Fraction(1, 32)),
        (3, 3, Fraction(20 + 15 + 6 + 1, 64)),
        (0, 4, Fraction(1)),
        (1, 0, Fraction(1, 2)),
        (10, 2, Fraction(1 + 12 + 66, 4096)),
    ],
)
def test_mcnemar_exact_by_hand(b: int, c: int, expected: Fraction) -> None:
    assert mcnemar_exact_p(b, c) == pytest.approx(float(expected), rel=1e-12)


def test_mcnemar_matches_integer_binomial_sums() -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        b, c = (int(x) for x in rng.integers(0, 300, size=2))
        m = b + c
        exact = Fraction(sum(math.comb(m, k) for k in range(b, m + 1)), 2**m) if b > 0 else Fraction(1)
        assert mcnemar_exact_p(b, c) == pytest.approx(float(exact), rel=1e-10)
    assert mcnemar_exact_p_two_sided(1, 7) == pytest.approx(18 / 256, rel=1e-12)
    assert mcnemar_exact_p_two_sided(4, 4) == 1.0


# --- the margin score test (Tango) ------------------------------------------------------------------------


def test_score_z_at_zero_margin_is_mcnemar() -> None:
    for b, c, n in [(7, 1, 21), (13, 9, 300), (40, 20, 160), (0, 5, 50)]:
        assert score_z(b, c, n, 0.0) == pytest.approx((b - c) / math.sqrt(b + c), rel=1e-12)


def _brute_force_z(b: int, c: int, n: int, delta: float) -> float:
    """Score statistic with the restricted MLE found by a dense grid search of the profile likelihood."""
    lo = max(0.0, -delta)
    hi = (1.0 - delta) / 2.0
    q = np.linspace(lo, hi, 400_001)[1:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ll = (b * np.log(q + delta) if b else 0.0) + (c * np.log(q) if c else 0.0)
        ll = ll + (n - b - c) * np.log(1.0 - 2.0 * q - delta)
    qt = float(q[np.nanargmax(ll)])
    return (b - c - n * delta) / math.sqrt(n * (2 * qt + delta - delta**2))


@pytest.mark.parametrize(
    "b, c, n, delta",
    [
        (13, 9, 300, 0.02),
        (1, 7, 21, -0.1),
        (40, 20, 160, 0.05),
        (5, 0, 100, 0.01),
        (0, 6, 80, 0.03),
        (30, 25, 60, -0.2),
    ],
)
def test_score_z_restricted_mle_matches_brute_force(b: int, c: int, n: int, delta: float) -> None:
    assert score_z(b, c, n, delta) == pytest.approx(_brute_force_z(b, c, n, delta), abs=1e-4)


def test_tango_interval_matches_fagerland_2014() -> None:
    # Airway hyper-responsiveness before/after stem cell transplantation (Bentur et al. 2009), as the
    # worked example of Fagerland, Lydersen & Laake (2014, Stat Med 33:2850): n12 = 1, n21 = 7, N = 21,
    # Tango asymptotic score 95% CI for the difference -0.286: (-0.517, -0.026).
    lo, hi = tango_interval(1, 7, 21)
    assert (round(lo, 3), round(hi, 3)) == (-0.517, -0.026)
    z = normal_quantile(0.975)
    assert score_z(1, 7, 21, lo) == pytest.approx(z, abs=1e-6)
    assert score_z(1, 7, 21, hi) == pytest.approx(-z, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 200).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n)).flatmap(
            lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(0, t[0] - t[1]))
        )
    )
)
def test_score_z_decreases_in_delta_and_the_interval_holds_the_estimate(t: tuple[int, int, int]) -> None:
    n, b, c = t
    zs = [score_z(b, c, n, d) for d in np.linspace(-0.99, 0.99, 41)]
    assert all(z1 >= z2 - 1e-9 for z1, z2 in itertools.pairwise(zs))
    lo, hi = tango_interval(b, c, n)
    assert -1.0 <= lo <= (b - c) / n <= hi <= 1.0


def test_score_test_size_by_exact_enumeration() -> None:
    # Worst-case places from the module docs: few discordant pairs, mostly losses, at the boundary.
    for n, max_drop, pd in [
        (300, 0.01, 0.015),
        (100, 0.02, 0.05),
        (300, 0.02, 0.03),
        (300, 0.02, 0.10),
        (1000, 0.01, 0.5),
        (50, 0.05, 0.3),
    ]:
        size = power_binary_exact(n, pd, max_drop, max_drop=max_drop)
        assert size <= ALPHA, (n, max_drop, pd, size)


def test_power_binary_exact_agrees_with_enumerating_every_table() -> None:
    # Independent of power_binary_exact's conditioning: loop over all (b, c) and call the public test.
    n, pd, drop = 40, 0.3, 0.1
    pl, pw = (pd + drop) / 2, (pd - drop) / 2
    for max_drop in (0.0, 0.05):
        total = 0.0
        for b, c in itertools.product(range(n + 1), repeat=2):
            if b + c > n:
                continue
            prob = math.comb(n, b) * math.comb(n - b, c) * pl**b * pw**c * (1 - pd) ** (n - b - c)
            ref = [1] * b + [0] * c + [1] * (n - b - c)
            cand = [0] * b + [1] * c + [1] * (n - b - c)
            total += prob * drop_test_binary(ref, cand, max_drop=max_drop).rejected
        assert power_binary_exact(n, pd, drop, max_drop=max_drop) == pytest.approx(total, rel=1e-9)


# --- size and power by simulation -------------------------------------------------------------------------


def _simulate_items(
    rng: np.random.Generator, n: int, p_ref: float, p_loss: float, p_win: float
) -> tuple[list[bool], list[bool]]:
    """Item-level outcomes: ref correct w.p. p_ref; candidate flips right->wrong / wrong->right."""
    ref = rng.random(n) < p_ref
    u = rng.random(n)
    # Flip probabilities conditional on ref, so the unconditional cells are p_loss and p_win.
    cand = np.where(ref, u >= p_loss / p_ref, u < p_win / (1 - p_ref))
    return ref.tolist(), cand.tolist()


@pytest.mark.parametrize("max_drop", [0.0, 0.02])
def test_aa_size_end_to_end(max_drop: float) -> None:
    # Identical true accuracy (A/A), 300 items, 10% discordance: false alarms <= alpha.
    rng = np.random.default_rng(17)
    sims = 1500
    rejected = sum(
        drop_exceeds(*_simulate_items(rng, 300, 0.7, 0.05, 0.05), max_drop=max_drop).rejected for _ in range(sims)
    )
    assert rejected / sims <= ALPHA + _mc_slack(ALPHA, sims)


def test_boundary_size_simulated() -> None:
    # True drop exactly at the margin (the least favourable null): 300 items, 10% discordance.
    sims = 6000
    rate = power_binary(300, 0.10, 0.02, max_drop=0.02, sims=sims, seed=5)
    assert rate <= ALPHA + _mc_slack(ALPHA, sims)
    assert rate == pytest.approx(power_binary_exact(300, 0.10, 0.02, max_drop=0.02), abs=_mc_slack(ALPHA, sims))


def test_documented_sample_size_for_a_three_point_regression() -> None:
    # Scenario: max_drop = 0 (exact McNemar), one-sided alpha = 0.05, true drop 3 points, 5% of items
    # discordant (4% ref-right/cand-wrong, 1% the reverse). Connor's normal formula says 342 ...
    pd, drop = 0.05, 0.03
    connor = (normal_quantile(0.95) * math.sqrt(pd) + normal_quantile(0.8) * math.sqrt(pd - drop**2)) ** 2 / drop**2
    assert math.ceil(connor) == 342
    # ... but the exact test is discrete: 342 falls short, the documented 371 makes it.
    assert power_binary_exact(342, pd, drop, max_drop=0.0) < 0.80
    assert n_for_power(pd, drop, max_drop=0.0) == 371
    assert power_binary_exact(371, pd, drop, max_drop=0.0) >= 0.80
    sims = 4000
    assert power_binary(371, pd, drop, max_drop=0.0, sims=sims, seed=1) >= 0.80 - _mc_slack(0.8, sims)


def test_power_end_to_end_with_a_margin() -> None:
    # A 6-point real drop against a 2-point margin, 10% discordance, 1000 items: caught nearly always.
    rng = np.random.default_rng(23)
    sims = 300
    hits = sum(drop_exceeds(*_simulate_items(rng, 1000, 0.7, 0.08, 0.02), max_drop=0.02).rejected for _ in range(sims))
    assert hits / sims >= 0.95


# --- graded scores ------------------------------------------------------------------------------------


def _graded(rng: np.random.Generator, n: int, drop: float, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores in [0, 1]: a fraction `frac` of items change (the rest are identical greedy outputs).

    Changed items redraw the candidate's score from Beta(2, k) with mean 0.5 - drop/frac, so the
    true mean drop is exactly `drop`.
    """
    ref = rng.beta(2.0, 2.0, n)
    cand = ref.copy()
    m = 0.5 - drop / frac
    changed = rng.random(n) < frac
    cand[changed] = rng.beta(2.0, 2.0 * (1 - m) / m, int(changed.sum()))
    return ref, cand


def _skewed(rng: np.random.Generator, n: int, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """Zero true drop made of frequent small losses and rare big wins (the shift test's weak spot)."""
    d = np.zeros(n)
    changed = rng.random(n) < frac
    big = rng.random(int(changed.sum())) < 0.2
    d[changed] = np.where(big, -0.8, 0.2)
    ref = np.full(n, 0.9)
    return ref, ref - d


@pytest.mark.slow  # 1000 simulated studies x 499 resamples per case
@pytest.mark.parametrize("case, seed", [("aa-dense", 1), ("margin-boundary", 2), ("aa-sparse", 3), ("aa-skewed", 4)])
def test_graded_size(case: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sims = 1000
    rejected = 0
    for s in range(sims):
        if case == "aa-dense":
            ref, cand = _graded(rng, 200, 0.0, 0.3)
            md = 0.0
        elif case == "margin-boundary":
            ref, cand = _graded(rng, 200, 0.02, 0.3)
            md = 0.02
        elif case == "aa-sparse":
            ref, cand = _graded(rng, 300, 0.0, 0.05)
            md = 0.0
        else:
            ref, cand = _skewed(rng, 200, 0.15)
            md = 0.0
        rejected += drop_test_graded(ref, cand, max_drop=md, resamples=499, seed=s).rejected
    assert rejected / sims <= ALPHA + _mc_slack(ALPHA, sims)


def test_graded_power() -> None:
    # A 3-point mean drop, 30% of 300 items changed, margin 0: caught >= 85% of the time (measured 92%).
    rng = np.random.default_rng(2)
    sims = 400
    hits = sum(
        drop_test_graded(*_graded(rng, 300, 0.03, 0.3), max_drop=0.0, resamples=499, seed=s).rejected
        for s in range(sims)
    )
    assert hits / sims >= 0.85


def test_graded_edge_cases_and_direction() -> None:
    ref = np.linspace(0.2, 0.9, 50)
    same = drop_test_graded(ref, ref, max_drop=0.0, resamples=200)
    assert (same.drop, same.p_value, same.rejected, same.drop_ci) == (0.0, 1.0, False, (0.0, 0.0))
    worse = drop_test_graded(ref, ref - 0.1, max_drop=0.05, resamples=200)  # every item lost 0.1
    assert worse.rejected and worse.drop == pytest.approx(0.1)
    better = drop_within(ref, np.clip(ref + np.sin(np.arange(50)) * 0.05 + 0.05, 0, 1), max_drop=0.0, resamples=999)
    assert better.rejected and better.alternative == "within" and better.drop < 0
    again = drop_test_graded(ref, ref[::-1], max_drop=0.0, resamples=300, seed=9)
    assert again == drop_test_graded(ref, ref[::-1], max_drop=0.0, resamples=300, seed=9)


def test_mean_interval_bootstrap_covers() -> None:
    rng = np.random.default_rng(4)
    sims = 300
    true_mean = 2.0 / (2.0 + 5.0)
    covered = 0
    for s in range(sims):
        lo, hi = mean_interval_bootstrap(rng.beta(2.0, 5.0, 80).tolist(), resamples=1000, seed=s)
        covered += lo <= true_mean <= hi
    assert covered / sims >= 0.95 - _mc_slack(0.95, sims) - 0.01  # percentile intervals run a bit short


# --- the API around the tests ------------------------------------------------------------------------------


def test_paired_binary_counts_and_validation() -> None:
    ref = [True, True, False, False, True, 1.0]
    cand = [True, False, True, False, False, 1]
    assert paired_binary(ref, cand) == PairedBinary(n=6, ref_correct=4, cand_correct=3, b=2, c=1)
    with pytest.raises(ValueError, match="same items"):
        paired_binary([1, 0], [1])
    with pytest.raises(ValueError, match="0/1"):
        paired_binary([0.5, 1], [1, 1])
    with pytest.raises(ValueError, match="no items"):
        paired_binary([], [])


def test_binary_directions_and_methods() -> None:
    ref = [1] * 12 + [0] * 2 + [1] * 80
    cand = [0] * 12 + [1] * 2 + [1] * 80
    t = drop_test_binary(ref, cand, max_drop=0.0)
    assert (t.method, t.b, t.c) == ("exact-mcnemar", 12, 2)
    assert t.p_value == pytest.approx(mcnemar_exact_p(12, 2)) and t.rejected
    assert t.drop == pytest.approx(10 / 94) and t.drop_ci[0] < t.drop < t.drop_ci[1]
    w = drop_within(ref, cand, max_drop=0.0)
    assert w.p_value == pytest.approx(mcnemar_exact_p(2, 12)) and not w.rejected
    m = drop_exceeds(ref, cand, max_drop=0.2)
    assert m.method == "score-margin" and not m.rejected and m.p_value > 0.9
    assert drop_within(ref, cand, max_drop=0.3).rejected  # the drop is shown to be below 30 points
    assert drop_exceeds([0.5, 1.0], [0.0, 1.0], max_drop=0.0, resamples=50).method == "paired-bootstrap"


def test_drop_test_json_is_strict() -> None:
    t = drop_test_binary([1, 1, 0, 1], [0, 1, 0, 1], max_drop=0.01)
    doc = t.to_json()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert doc["b"] == 1 and doc["c"] == 0 and doc["rejected"] is False
    odd = DropTest(
        method="paired-bootstrap",
        n=3,
        ref_score=0.5,
        cand_score=0.4,
        drop=0.1,
        drop_ci=(-math.inf, math.nan),
        max_drop=0.0,
        p_value=math.nan,
        rejected=False,
        b=None,
        c=None,
    )
    doc = odd.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["drop_ci"] == [None, None] and doc["p_value"] is None and doc["b"] is None


def test_holm_textbook_example() -> None:
    # Four hypotheses, alpha 0.05 (the standard Holm-Bonferroni illustration): sorted p 0.005 < 0.0125,
    # 0.01 < 0.0167 rejected; 0.03 >= 0.025 stops, so 0.03 and 0.04 stand.
    got = holm({"h1": 0.01, "h2": 0.04, "h3": 0.03, "h4": 0.005})
    assert got == {"h1": True, "h2": False, "h3": False, "h4": True}
    assert holm({"only": 0.04}) == {"only": True}
    assert holm({"a": 0.001, "b": 0.002, "c": 0.003}) == {"a": True, "b": True, "c": True}
    assert holm({}) == {}
    with pytest.raises(ValueError):
        holm({"bad": 1.5})


def test_capability_score() -> None:
    tasks = ["mmlu", "gsm8k", "humaneval"]
    score, partial = capability_score({"mmlu": 0.6, "gsm8k": 0.4, "humaneval": 0.5}, tasks)
    assert score == pytest.approx(0.5) and not partial
    score, partial = capability_score({"mmlu": 0.6, "gsm8k": None, "extra": 0.0}, tasks)
    assert score == pytest.approx(0.6) and partial
    assert capability_score({}, tasks) == (None, True)
    assert capability_score({}, []) == (None, False)
