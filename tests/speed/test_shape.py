"""Which contexts a speed goal decides (the one it names, every one, or the longest), and when the trials
at a context stop: every goal there shown met or missed, or, with none, both ratios precise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.speed.result import ContextSpeed
from pytest_mlxgate.speed.shape import SpeedGoal, SpeedShape
from pytest_mlxgate.stats.ratios import RatioEstimate


@given(
    contexts=st.lists(st.integers(1, 65536), min_size=1, max_size=6, unique=True).map(tuple),
    pick=st.integers(0, 5),
    form=st.sampled_from(["named", "all", "longest", "elsewhere"]),
)
def test_a_goal_applies_at_the_context_it_names_every_one_or_the_longest(
    contexts: tuple[int, ...], pick: int, form: str
) -> None:
    named = contexts[pick % len(contexts)]
    at: int | str | None = {"named": named, "all": "all", "longest": None, "elsewhere": max(contexts) + 1}[form]
    goal = SpeedGoal("decode", 1.1, at)
    applies = {c for c in contexts if goal.applies_at(c, contexts)}
    expected = {"named": {named}, "all": set(contexts), "longest": {max(contexts)}, "elsewhere": set()}[form]
    assert applies == expected
    assert goal.to_json() == {"key": "decode", "limit": 1.1, "at": at}


def _est(lower: float, upper: float, *, n: int = 5, log_sd: float = 0.01) -> RatioEstimate:
    return RatioEstimate((lower + upper) / 2, lower, upper, n, log_sd)


def _at(prefill: RatioEstimate, decode: RatioEstimate, peak: RatioEstimate | None = None) -> ContextSpeed:
    return ContextSpeed(128, 8, [], [], prefill, decode, peak)


@pytest.mark.parametrize(
    ("goal", "estimate", "stopped"),
    [
        (SpeedGoal("decode", 1.05), _est(1.05, 1.2), "decided"),  # a lower end at the goal: shown met (>=)
        (SpeedGoal("decode", 1.05), _est(0.9, 1.0499), "decided"),  # the whole interval short of it
        (SpeedGoal("decode", 1.05), _est(1.0, 1.05), None),  # straddles: another pair may tell
        (SpeedGoal("memory", 0.5), _est(0.3, 0.5), "decided"),  # an upper end at the cap: shown within (<=)
        (SpeedGoal("memory", 0.5), _est(0.5001, 0.7), "decided"),  # the whole interval over it
        (SpeedGoal("memory", 0.5), _est(0.5, 0.7), None),  # a lower end at the cap is not over it
    ],
)
def test_trials_stop_once_every_goal_here_is_decided(
    goal: SpeedGoal, estimate: RatioEstimate, stopped: str | None
) -> None:
    from pytest_mlxgate.speed.measure import stop_reason

    shape = SpeedShape((128,), 8, goals=(goal,))
    speed = _at(_est(0.5, 2.0), estimate, estimate) if goal.key == "memory" else _at(_est(0.5, 2.0), estimate)
    assert stop_reason(speed, shape) == stopped
    elsewhere = SpeedShape((128, 512), 8, goals=(goal,))  # the goal decides the longest context only
    assert stop_reason(speed, elsewhere) in ("precise", None)


@pytest.mark.parametrize(("n", "log_sd", "stopped"), [(2, 0.01, "precise"), (1, 0.0, None), (9, 0.5, None)])
def test_without_a_goal_trials_stop_once_both_ratios_are_precise(n: int, log_sd: float, stopped: str | None) -> None:
    """Two pairs are the fewest with a spread; the standard error sd/sqrt(n) must be within the precision."""
    from pytest_mlxgate.speed.measure import stop_reason

    est = _est(0.99, 1.01, n=n, log_sd=log_sd)
    assert stop_reason(_at(est, est), SpeedShape((128,), 8, precision=0.04)) == stopped
    assert stop_reason(_at(_est(0.99, 1.01, n=9, log_sd=0.5), est), SpeedShape((128,), 8)) is None  # both must be
