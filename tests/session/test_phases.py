"""A module's time per phase, charged record by record: what the records of a module carry sums to what
the module spent, each second charged once, to the record after which it was spent."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.session.phases import PHASES, PhaseClock

_steps = st.lists(
    st.one_of(st.tuples(st.sampled_from(PHASES), st.floats(0, 100, allow_nan=False)), st.just("take")),
    max_size=40,
)


@given(_steps)
def test_every_second_is_charged_to_exactly_one_record(steps: list[object]) -> None:
    clock, charged = PhaseClock(), dict.fromkeys(PHASES, 0.0)
    for step in [*steps, "take"]:
        if step == "take":
            for phase, seconds in clock.take().items():
                assert seconds > 0
                charged[phase] += seconds
        else:
            phase, seconds = step  # type: ignore[misc]
            clock.add(phase, seconds)
    for phase in PHASES:
        spent = clock.spent.get(phase, 0.0)
        assert abs(charged[phase] - spent) <= 0.0005 + 1e-9 * spent, phase  # rounding, never lost
    assert clock.take() == {}  # nothing left to charge


def test_a_phase_that_raises_is_still_charged_and_an_unknown_phase_is_refused() -> None:
    clock = PhaseClock()
    with pytest.raises(RuntimeError), clock.timing("candidate"):
        time.sleep(0.01)
        raise RuntimeError("an arm that failed half way spent its time")
    assert clock.take()["candidate"] >= 0.01
    with pytest.raises(ValueError, match="unknown phase 'warmup'"):
        clock.add("warmup", 1.0)  # type: ignore[arg-type]
