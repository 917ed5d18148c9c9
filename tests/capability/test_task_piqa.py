"""PIQA: the installed validation split, OLMES's zero-shot RC prompts and continuations exactly,
position ids, and the tiers."""

from __future__ import annotations

from olmes import rc_requests

from pytest_mlxgate.capability.base import Task
from pytest_mlxgate.capability.tasks.piqa import TASK

_task: Task = TASK  # mypy checks the module object against the protocol


def test_full_tier_is_the_validation_split() -> None:
    full = TASK.load("full")
    assert len(full) == 1838 and [i.id for i in full] == [f"piqa/{k}" for k in range(1838)]
    assert all(i.kind == "choice" and len(i.choices) == 2 and i.target in (0, 1) for i in full)
    assert (TASK.name, TASK.graded, TASK.max_new_tokens, TASK.normalization) == ("piqa", False, 1, "per_char")


def test_prompts_continuations_and_gold_are_olmes_own() -> None:
    """Every goal against OLMES's requests for `piqa:rc` (zero-shot), shipped in the package."""
    olmes = rc_requests("piqa/rc_0shot")
    full = TASK.load("full")
    assert len(olmes) == len(full)
    for doc_id, item in enumerate(full):
        doc = olmes[doc_id]
        assert (item.text, item.choices, item.target, item.id) == (
            doc.query,
            doc.continuations,
            doc.label,
            f"piqa/{doc.native_id}",
        )
    assert full[0].text == "Goal: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert full[0].choices[0].startswith(" Provide the guinea pig")


def test_smoke_tier_is_a_seeded_sample_of_64() -> None:
    smoke = TASK.load("smoke")
    assert len(smoke) == 64 and smoke == TASK.load("smoke") and smoke != TASK.load("smoke", seed=1)
    assert [i.id for i in smoke] == sorted((i.id for i in smoke), key=lambda s: int(s.split("/")[1]))
    assert TASK.load("full", n=64) == smoke
