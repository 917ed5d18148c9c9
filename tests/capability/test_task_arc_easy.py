"""ARC-Easy: the installed validation split, OLMES's zero-shot RC prompts and continuations exactly,
stable ids, the tiers, and answer keys given as letters or digits."""

from __future__ import annotations

import dataclasses
import json

from olmes import rc_requests

from pytest_mlxgate.capability.base import Task
from pytest_mlxgate.capability.tasks.arc_easy import TASK

_task: Task = TASK  # mypy checks the module object against the protocol


def test_full_tier_is_the_validation_split_with_the_datasets_ids() -> None:
    full = TASK.load("full")
    assert len(full) == 570 and len({i.id for i in full}) == 570
    assert full[0].id == "arc_easy/MCAS_2000_4_6"
    assert [i.id for i in full] == [i.id for i in TASK.load("full")]  # stable across calls
    assert all(i.kind == "choice" and i.messages is None and 3 <= len(i.choices) <= 5 for i in full)
    assert (TASK.name, TASK.graded, TASK.max_new_tokens, TASK.normalization) == ("arc_easy", False, 1, "per_char")
    json.dumps([dataclasses.asdict(i) for i in full[:50]])  # JSON-able


def test_prompts_continuations_and_gold_are_olmes_own() -> None:
    """Every question against OLMES's requests for `arc_easy:rc` (zero-shot), shipped in the package."""
    olmes = rc_requests("arc_easy/rc_0shot")
    full = TASK.load("full")
    assert len(olmes) == len(full)
    for doc_id, item in enumerate(full):
        doc = olmes[doc_id]
        assert (item.text, item.choices, item.target, item.id) == (
            doc.query,
            doc.continuations,
            doc.label,
            f"arc_easy/{doc.native_id}",
        )
        assert TASK.render(item, tokenizer=None) == doc.query
    assert full[0].text == "Question: Which technology was developed most recently?\nAnswer:"
    assert full[0].choices == (" cellular telephone", " television", " refrigerator", " airplane")


def test_digit_answer_keys_map_to_their_position() -> None:
    digits = [i for i in TASK.load("full") if i.meta["labels"][0] == "1"]
    assert digits and all(
        i.meta["labels"][: len(i.choices)] == [str(k + 1) for k in range(len(i.choices))] for i in digits
    )


def test_smoke_tier_is_a_seeded_sample_of_64() -> None:
    smoke = TASK.load("smoke")
    assert len(smoke) == 64 and smoke == TASK.load("smoke") and smoke != TASK.load("smoke", seed=1)
    assert {i.id for i in smoke} <= {i.id for i in TASK.load("full")}
    assert {i.id for i in smoke} <= {i.id for i in TASK.load("smoke", n=128)}
