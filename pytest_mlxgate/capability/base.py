"""What every capability task is made of: items, per-item results, run options and the task protocol.

A task turns its dataset into `Item`s, renders each as the model's input, and scores the model's
output into an `ItemResult`. Results keep the item id, a hash of the exact prompt and the raw output,
so a run can be rescored later and two arms joined item by item (a paired test needs the pairs).
Tasks never run the model themselves: the runner generates (batched, greedy, with the arm's lever)
or, for `kind == "choice"`, hands the task the log-probabilities of each choice's continuation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..errors import MlxgateError
from ..results.tasks import TASK_NAMES

__all__ = [
    "EXTRA_TASK_NAMES",
    "TASK_NAMES",
    "Item",
    "ItemResult",
    "RunOptions",
    "Task",
    "TaskDataMissing",
    "TaskSkipped",
    "Tier",
    "prompt_hash",
]

#: Built-in tasks outside the Capability Score (one module each in `tasks/`): cloze-scored choice
#: tasks on which a small model is well above chance (see `cloze.py`), so a lever's drop can show.
EXTRA_TASK_NAMES = ("arc_easy", "piqa", "sciq")

Tier = Literal["smoke", "full"]
Kind = Literal["generate", "choice"]


class TaskDataMissing(MlxgateError):
    """A task's dataset is not available offline; the message says exactly how to get it."""


class TaskSkipped(MlxgateError):
    """A task cannot run here (no data, no sandbox); the message says how to make it run."""


@dataclass(frozen=True)
class Item:
    """One question of a task, with what scoring needs (JSON-able)."""

    id: str  # stable across runs and machines: the dataset's own id, or a hash of its content
    messages: tuple[Mapping[str, Any], ...] | None = None  # chat input (rendered via the chat template)
    text: str | None = None  # raw text input (no chat template), e.g. MMLU's few-shot prompt
    kind: Kind = "generate"
    choices: tuple[str, ...] = ()  # kind "choice": continuations to compare (e.g. " A", " B", " C", " D")
    target: Any = None  # the gold answer / test code / constraints: whatever `score` needs
    tools: tuple[Mapping[str, Any], ...] | None = None  # function schemas offered to the model (BFCL)
    meta: Mapping[str, Any] = field(default_factory=dict)  # e.g. subject, category, hops


@dataclass(frozen=True)
class ItemResult:
    """One item's outcome. `score` is 0/1 for pass/fail tasks, in [0, 1] for graded ones."""

    item_id: str
    prompt_hash: str
    output: str
    score: float
    verdict: str  # short machine-readable reason: "correct", "wrong", "no_answer", "timeout", "syntax_error", ...
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.score >= 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "prompt_hash": self.prompt_hash,
            "output": self.output,
            "score": self.score,
            "verdict": self.verdict,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ItemResult:
        return cls(
            item_id=d["item_id"],
            prompt_hash=d["prompt_hash"],
            output=d["output"],
            score=float(d["score"]),
            verdict=d["verdict"],
            detail=d.get("detail", {}),
        )


@dataclass(frozen=True)
class Budget:
    """`n=Budget(...)`: size a capability gate by what it shows, not by a count fixed in advance.

    Items are drawn in a seeded shuffled order, `batch` at a time, both arms on each batch, and the
    gate looks after every batch (an anytime-valid bound, `stats/sequential.py`), stopping as soon as
    the drop is shown inside the margin or beyond it, or when `items` or `seconds` run out
    (then: inconclusive, with the n it would need). A near-exact lever stops early; a drifting one
    keeps sampling.
    """

    items: int = 400
    seconds: float | None = None
    batch: int = 16

    def __post_init__(self) -> None:
        if not (isinstance(self.items, int) and self.items >= 1):
            raise ValueError(f"Budget(items={self.items!r}): the most items per task, a positive whole number")
        if not (isinstance(self.batch, int) and 1 <= self.batch):
            raise ValueError(f"Budget(batch={self.batch!r}): items per look, a positive whole number")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"Budget(seconds={self.seconds!r}): a time budget in seconds > 0, or None")

    def describe(self) -> str:
        secs = f", {self.seconds:g} s" if self.seconds is not None else ""
        return f"budget {self.items} items{secs}, batches of {self.batch}"

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "seconds": self.seconds, "batch": self.batch}


@dataclass(frozen=True)
class RunOptions:
    """Settings of one run that a task may need beyond (tier, n, seed), from the gate's options."""

    allow_unsandboxed: bool = False  # --mlx-allow-unsandboxed: HumanEval may run code with rlimits only


class Task(Protocol):
    """A capability task. Implementations live in `pytest_mlxgate/capability/tasks/<name>.py` as `TASK`."""

    name: str  # one of TASK_NAMES or EXTRA_TASK_NAMES, or a user task's own name
    graded: bool  # False: per-item pass/fail (exact McNemar); True: scores in [0, 1] (paired bootstrap)
    max_new_tokens: int  # default generation budget (the runner may lower it: --mlx-max-new-tokens)

    def configured(self, options: RunOptions) -> Task:
        """This task set up for one run: `self` when no option applies to it, else a new object.
        The module's shared `TASK` is never changed, so one run's options cannot leak into another's."""
        ...

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """The tier's items, deterministic for (tier, n, seed). Raises TaskDataMissing with the fix."""
        ...

    def render(self, item: Item, tokenizer: Any) -> str:
        """The exact model input text for `item` (chat template applied where the item has messages)."""
        ...

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """Score one output (kind "generate") or the choices' log-probabilities (kind "choice")."""
        ...


def prompt_hash(rendered: str) -> str:
    """sha256 of the exact model input, first 16 hex: joins arms and runs item by item."""
    return hashlib.sha256(rendered.encode()).hexdigest()[:16]


def chat_render(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """Messages through the tokenizer's chat template, ready for the assistant to answer."""
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
    if tools:
        kwargs["tools"] = list(tools)
    return str(tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs))


def stable_id(*parts: Any) -> str:
    """An id from content when the dataset has none (sha256 of the JSON of `parts`, 12 hex)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
