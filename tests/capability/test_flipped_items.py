"""A capability record's `flipped` per task: the items whose score changed, losses first, capped, each with
the tail of its exact input and both arms' outputs, clipped (what the HTML report shows)."""

from __future__ import annotations

from pytest_mlxgate.capability.assertions import capability_checks, flipped_items
from pytest_mlxgate.capability.base import Item, ItemResult
from pytest_mlxgate.capability.result import CapabilityRun


def run(n: int, losses: int, wins: int) -> CapabilityRun:
    items = [Item(id=f"q{i}", text=f"question {i}") for i in range(n)]
    ref = [ItemResult(it.id, "h", "right", 1.0, "correct") for it in items]
    cand = list(ref)
    for i in range(losses):
        cand[i] = ItemResult(items[i].id, "h", "x" * 1000, 0.0, "wrong")
    for i in range(losses, losses + wins):
        ref[i] = ItemResult(items[i].id, "h", "wrong", 0.0, "wrong")
    rendered = {it.id: "few-shot " * 200 + it.text for it in items}
    return CapabilityRun(
        task="gsm8k", tier="smoke", graded=False, items=items, reference=ref, candidate=cand, rendered=rendered
    )


def test_the_flipped_items_come_capped_losses_first_with_prompt_tails_and_both_outputs() -> None:
    flipped = flipped_items(run(60, losses=25, wins=5))
    assert flipped["total"] == 30 and len(flipped["items"]) == 20
    first = flipped["items"][0]
    assert first["id"] == "q0" and first["reference"]["score"] == 1.0 and first["candidate"]["score"] == 0.0
    assert first["prompt"].startswith("…") and first["prompt"].endswith("question 0") and len(first["prompt"]) == 601
    assert first["candidate"]["output"] == "x" * 400 + "…" and first["reference"]["output"] == "right"
    assert all(i["candidate"]["score"] == 0.0 for i in flipped["items"])  # 20 of the 25 losses, before any win


def test_every_task_entry_of_a_record_carries_them() -> None:
    _, tasks = capability_checks({"gsm8k": run(10, losses=1, wins=1)}, floor=None, max_drop=0.1, alpha=0.05)
    assert tasks["gsm8k"]["flipped"]["total"] == 2
    assert [i["id"] for i in tasks["gsm8k"]["flipped"]["items"]] == ["q0", "q1"]
