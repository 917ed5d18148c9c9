"""Fixed-n verdicts: the bounds, the three-way rule, and the projected n that would tell."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats import verdicts as V


def test_three_way_rule() -> None:
    assert V.three_way(within=True, beyond=False) == "pass"
    assert V.three_way(within=False, beyond=True) == "fail"
    assert V.three_way(within=False, beyond=False) == "inconclusive"
    assert V.three_way(within=True, beyond=True) == "inconclusive"  # crossed bounds show nothing


def test_no_discordant_pair_bounds_the_drop_at_z2_over_n_plus_z2() -> None:
    z2 = 1.6448536269514722**2
    for n in (8, 25, 100):
        lower, upper = V.binary_drop_bounds(0, 0, n, alpha=0.05)
        assert upper == pytest.approx(z2 / (n + z2), rel=1e-6) and lower == pytest.approx(-upper, rel=1e-6)


def test_a_smaller_fail_alpha_widens_only_the_lower_side() -> None:
    lo, hi = V.binary_drop_bounds(6, 1, 60, alpha=0.05)
    lo3, hi3 = V.binary_drop_bounds(6, 1, 60, alpha=0.05, fail_alpha=0.05 / 3)
    assert hi3 == hi and lo3 < lo


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 400), data=st.data())
def test_bounds_hold_the_observed_drop_and_shrink_with_n(n: int, data: st.DataObject) -> None:
    b = data.draw(st.integers(0, n))
    c = data.draw(st.integers(0, n - b))
    lo, hi = V.binary_drop_bounds(b, c, n, alpha=0.05)
    drop = (b - c) / n
    assert -1 <= lo <= drop <= hi <= 1
    lo4, hi4 = V.binary_drop_bounds(4 * b, 4 * c, 4 * n, alpha=0.05)  # same rates, four times the items
    assert hi4 - lo4 < hi - lo


@settings(max_examples=40, deadline=None)
@given(n=st.integers(4, 200), data=st.data())
def test_n_needed_is_the_first_n_at_which_the_projected_bound_clears(n: int, data: st.DataObject) -> None:
    b = data.draw(st.integers(0, n // 4))
    c = data.draw(st.integers(0, n // 4))
    margin = data.draw(st.sampled_from([0.02, 0.05, 0.1, 0.2]))
    needed = V.drop_n_needed_binary(b, c, n, max_drop=margin, alpha=0.05)
    drop = (b - c) / n
    if drop == margin:
        assert needed is None
        return
    if needed is None:
        return  # beyond the cap
    rb, rc = b / n, c / n

    def clears(m: int) -> bool:
        lo, hi = V.binary_drop_bounds(rb * m, rc * m, m, alpha=0.05)
        return hi <= margin if drop < margin else lo > margin

    assert needed > n and clears(needed) and (needed - 1 <= n or not clears(needed - 1))


def test_n_needed_for_an_exact_lever_at_a_ten_point_margin() -> None:
    assert V.drop_n_needed_binary(0, 0, 8, max_drop=0.10, alpha=0.05) == 25
    assert V.binary_drop_bounds(0, 0, 25, alpha=0.05)[1] <= 0.10 < V.binary_drop_bounds(0, 0, 24, alpha=0.05)[1]


def test_n_needed_on_the_regression_side_and_at_the_margin() -> None:
    needed = V.drop_n_needed_binary(4, 0, 20, max_drop=0.05, alpha=0.05)  # a 20-point drop, not yet shown above 5
    assert needed is not None and needed > 20
    assert V.binary_drop_bounds(4 * needed / 20, 0, needed, alpha=0.05)[0] > 0.05
    assert V.drop_n_needed_binary(2, 0, 20, max_drop=0.10, alpha=0.05) is None  # observed drop == margin


def test_graded_n_needed_follows_the_normal_approximation() -> None:
    assert V.drop_n_needed_graded(0.0, 0.2, 10, max_drop=0.05, alpha=0.05) == 44  # (1.645 * 0.2 / 0.05)^2 = 43.3
    assert V.drop_n_needed_graded(0.05, 0.2, 10, max_drop=0.05, alpha=0.05) is None
    assert V.drop_n_needed_graded(0.0, 0.0, 10, max_drop=0.05, alpha=0.05) == 11


def test_floor_bounds_and_n_needed() -> None:
    lo, hi = V.score_bounds(6, 8, alpha=0.05)
    assert lo < 0.75 < hi
    needed = V.floor_n_needed(6, 8, floor=0.6, alpha=0.05)
    assert needed is not None and V.score_bounds(0.75 * needed, needed, alpha=0.05)[0] >= 0.6
    assert V.score_bounds(0.75 * (needed - 1), needed - 1, alpha=0.05)[0] < 0.6
    below = V.floor_n_needed(2, 8, floor=0.5, alpha=0.05)  # 25% observed: how many show it below 50%
    assert below is not None and V.score_bounds(0.25 * below, below, alpha=0.05)[1] < 0.5


def test_n_needed_takes_the_direction_from_the_observed_drop() -> None:
    # 1 loss in 100 against a 5-point margin: below it, so n_needed is where the upper bound clears it.
    below = V.drop_n_needed_binary(1, 0, 100, max_drop=0.05, alpha=0.05)
    assert below is not None and V.binary_drop_bounds(below / 100, 0, below, alpha=0.05)[1] <= 0.05
    assert type(below) is int  # a count of items, found by bisecting whole numbers
    # More wins than losses: a negative drop, on the passing side too (not the size of b + c).
    wins = V.drop_n_needed_binary(0, 5, 100, max_drop=0.02, alpha=0.05)
    assert wins is not None and V.binary_drop_bounds(0, 5 * wins / 100, wins, alpha=0.05)[1] <= 0.02


def test_n_needed_on_the_regression_side_uses_the_fail_alpha() -> None:
    plain = V.drop_n_needed_binary(4, 0, 20, max_drop=0.05, alpha=0.05)
    strict = V.drop_n_needed_binary(4, 0, 20, max_drop=0.05, alpha=0.05, fail_alpha=0.05 / 3)
    assert plain is not None and strict is not None and strict > plain
    assert V.binary_drop_bounds(4 * strict / 20, 0, strict, alpha=0.05, fail_alpha=0.05 / 3)[0] > 0.05
    assert V.drop_n_needed_binary(0, 0, 8, max_drop=0.10, alpha=0.05, fail_alpha=0.01) == 25  # pass side: alpha


def test_graded_n_needed_picks_alpha_by_side_and_stops_at_the_cap() -> None:
    z95 = V.normal_quantile(0.95)
    # The passing side uses alpha, the failing side fail_alpha: (2.326 * 0.2 / 0.05)^2 = 86.6.
    assert V.drop_n_needed_graded(0.0, 0.2, 10, max_drop=0.05, alpha=0.05, fail_alpha=0.01) == 44
    assert V.drop_n_needed_graded(0.1, 0.2, 10, max_drop=0.05, alpha=0.05, fail_alpha=0.01) == 87
    assert V.drop_n_needed_graded(0.1, 0.2, 10, max_drop=0.05, alpha=0.05) == 44
    assert V.drop_n_needed_graded(0.0, 1.0, 10, max_drop=0.05, alpha=0.05) == math.ceil((z95 / 0.05) ** 2)
    assert V.drop_n_needed_graded(0.0, 0.01, 10, max_drop=0.05, alpha=0.05) == 11  # already enough: n + 1
    at_cap = 0.05 * math.sqrt(V.N_NEEDED_CAP - 0.5) / z95  # (z sd / gap)^2 just under the cap: m == cap
    assert V.drop_n_needed_graded(0.0, at_cap, 10, max_drop=0.05, alpha=0.05) == V.N_NEEDED_CAP
    assert V.drop_n_needed_graded(0.0, 1.0, 10, max_drop=0.001, alpha=0.05) is None  # 2.7 million: beyond


def test_n_needed_beyond_the_cap_is_none() -> None:
    # 50% against a floor of 50.01%: millions of items; the doubling stops at the cap and says so.
    assert V.floor_n_needed(50, 100, floor=0.5001, alpha=0.05) is None
    assert V.drop_n_needed_binary(50, 49, 100, max_drop=0.0101, alpha=0.05) is None


def test_verdict_outcome_json_has_every_field() -> None:
    out = V.VerdictOutcome(
        verdict="inconclusive", n=40, value=0.025, lower=-0.03, upper=0.08, limit=0.05, n_needed=180, method="tango"
    )
    assert out.to_json() == {
        "verdict": "inconclusive",
        "n": 40,
        "value": 0.025,
        "lower": -0.03,
        "upper": 0.08,
        "limit": 0.05,
        "n_needed": 180,
        "method": "tango",
    }
