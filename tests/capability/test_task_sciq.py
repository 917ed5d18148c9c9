"""SciQ: the installed validation split, OLMES's zero-shot RC prompts (no support paragraph) and
continuations exactly, position ids, and the tiers."""

from __future__ import annotations

from olmes import rc_requests

from pytest_mlxgate.capability.base import Task
from pytest_mlxgate.capability.tasks.sciq import TASK

_task: Task = TASK  # mypy checks the module object against the protocol


def test_full_tier_is_the_validation_split() -> None:
    full = TASK.load("full")
    assert len(full) == 1000 and [i.id for i in full] == [f"sciq/{k}" for k in range(1000)]
    assert all(i.kind == "choice" and len(i.choices) == 4 and i.target == 3 for i in full)
    assert (TASK.name, TASK.graded, TASK.max_new_tokens, TASK.normalization) == ("sciq", False, 1, "per_char")


def test_prompts_continuations_and_gold_are_olmes_own() -> None:
    """Every question against OLMES's requests for `sciq:rc::olmo3` (the query of its 5-shot
    requests; the zero-shot one in the package is an older format with the support paragraph)."""
    olmes = rc_requests("sciq/rc_5shot")
    full = TASK.load("full")
    assert len(olmes) == len(full)
    for doc_id, item in enumerate(full):
        doc = olmes[doc_id]
        assert (item.text, item.choices, item.target, item.id) == (
            doc.query,
            doc.continuations,
            doc.label,
            f"sciq/{doc.native_id}",
        )
        assert "\n" not in (item.text or "").removesuffix("\nAnswer:")  # no support paragraph
    assert full[0].text == "Question: Who proposed the theory of evolution by natural selection?\nAnswer:"
    assert full[0].choices == (" Linnaeus", " shaw", " Scopes", " darwin")


def test_smoke_tier_is_a_seeded_sample_of_64() -> None:
    smoke = TASK.load("smoke")
    assert len(smoke) == 64 and smoke == TASK.load("smoke") and smoke != TASK.load("smoke", seed=1)
    assert TASK.load("full", n=64) == smoke
