"""Which contexts a speed goal decides: the one it names, every one ("all"), or the longest (none named)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.speed.shape import SpeedGoal


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
