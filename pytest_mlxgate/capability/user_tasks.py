"""Tasks a gate author brings: registered by name from code, or read from a JSONL data file.

- In code: any object implementing `base.Task`, registered with `register_task(task)` from a gate
  module or a conftest.py (both are imported on every xdist worker, so every process knows it),
  or published by an installed package under the entry-point group `pytest_mlxgate.tasks`
  (`name = "package.module:TASK"`).
- As data: `jsonl_task("name", path, scoring=...)` turns a JSONL file into a task, one item per
  line: `{"prompt": "..."}` (raw text) or `{"messages": [...]}` (chat template), a `"target"`, and
  optionally an `"id"` (default: a hash of the line's content) and, for choice scoring, `"choices"`.
  Scoring: "exact" (the output, stripped, equals the target), "regex" (`re.search(target, output)`)
  or "choice" (the target — an index or one of the choices — has the highest log-probability).

User tasks get the same pairing, statistics and reports as the built-in ones; the Capability
Score stays the mean of the six.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from ..errors import MlxgateUsageError
from .base import (
    EXTRA_TASK_NAMES,
    TASK_NAMES,
    Item,
    ItemResult,
    RunOptions,
    Task,
    TaskDataMissing,
    Tier,
    chat_render,
    stable_id,
)

__all__ = ["ENTRY_POINT_GROUP", "JsonlTask", "find_user_task", "jsonl_task", "register_task", "registered_names"]

#: Installed packages publish tasks here: `[project.entry-points."pytest_mlxgate.tasks"] name = "mod:TASK"`.
ENTRY_POINT_GROUP = "pytest_mlxgate.tasks"

Scoring = Literal["exact", "regex", "choice"]
_SCORINGS: tuple[Scoring, ...] = ("exact", "regex", "choice")
_NAME = re.compile(r"[a-z][a-z0-9_.-]*")

_REGISTRY: dict[str, Task] = {}


def register_task(task: Task, *, name: str | None = None, replace: bool = False) -> Task:
    """Make `task` available to `assert_capability_at_least(paired, name)`; returns it (usable as a
    decorator-free one-liner at module level). Re-registering the same object is a no-op."""
    name = name or getattr(task, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise MlxgateUsageError(f"a capability task needs a lowercase name (letters, digits, _ . -), got {name!r}")
    if name in TASK_NAMES or name in EXTRA_TASK_NAMES:
        raise MlxgateUsageError(f"'{name}' is a built-in capability task; give yours another name")
    missing = [m for m in ("load", "render", "score", "configured") if not callable(getattr(task, m, None))]
    missing += [a for a in ("graded", "max_new_tokens") if not hasattr(task, a)]
    if missing:
        raise MlxgateUsageError(
            f"capability task '{name}' lacks {', '.join(missing)} (see pytest_mlxgate.capability.base.Task)"
        )
    known = _REGISTRY.get(name)
    if known is not None and known is not task and not replace:
        raise MlxgateUsageError(
            f"a capability task named '{name}' is registered already; pass replace=True "
            "to replace it, or pick another name"
        )
    _REGISTRY[name] = task
    return task


def registered_names() -> list[str]:
    """Names of the tasks registered in this process and those installed packages publish."""
    return sorted(set(_REGISTRY) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def find_user_task(name: str) -> Task | None:
    """A registered task, else one an installed package publishes under the entry-point group."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                task = ep.load()
            except Exception as e:  # a broken plugin package: say which one and why
                raise MlxgateUsageError(
                    f"capability task '{name}' from entry point {ep.value!r} did not load ({type(e).__name__}: {e})"
                ) from None
            return register_task(task, name=name)
    return None


@dataclass
class JsonlTask:
    """A task read from a JSONL file (see the module docstring for the line format)."""

    name: str
    path: Path
    scoring: Scoring = "exact"
    max_new_tokens: int = 64
    smoke_n: int | None = None  # the smoke tier's size; None: every item
    graded: bool = False  # per-item pass/fail

    def configured(self, options: RunOptions) -> JsonlTask:
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """The file's items in file order; a smaller tier (or `n`) takes a seeded sample of them."""
        if not self.path.is_file():
            raise TaskDataMissing(f"{self.name}: the data file {self.path} does not exist")
        items = [
            self._item(lineno, line)
            for lineno, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1)
            if line.strip()
        ]
        ids = [it.id for it in items]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:3]
            raise MlxgateUsageError(f"{self.path}: item ids must be unique; repeated: {', '.join(dup)}")
        limit = n if n is not None else (self.smoke_n if tier == "smoke" else None)
        if limit is not None and limit < len(items):
            keep = sorted(random.Random(seed).sample(range(len(items)), limit))
            items = [items[i] for i in keep]
        return items

    def _item(self, lineno: int, line: str) -> Item:
        where = f"{self.path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MlxgateUsageError(f"{where}: not JSON ({e.msg}); one JSON object per line") from None
        if not isinstance(record, dict) or ("prompt" in record) == ("messages" in record) or "target" not in record:
            raise MlxgateUsageError(f'{where}: needs "target" and exactly one of "prompt" (text) or "messages" (chat)')
        choices: tuple[str, ...] = ()
        target = record["target"]
        if self.scoring == "choice":
            raw = record.get("choices")
            if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(c, str) for c in raw):
                raise MlxgateUsageError(f'{where}: choice scoring needs "choices", a list of at least two strings')
            choices = tuple(raw)
            if isinstance(target, str) and target in choices:
                target = choices.index(target)
            if not isinstance(target, int) or isinstance(target, bool) or not 0 <= target < len(choices):
                raise MlxgateUsageError(f"{where}: the target must be one of the choices or its index")
        elif not isinstance(target, str):
            raise MlxgateUsageError(f"{where}: the target of {self.scoring} scoring is a string")
        elif self.scoring == "regex":
            try:
                re.compile(target)
            except re.error as e:
                raise MlxgateUsageError(f"{where}: the target is not a regular expression ({e})") from None
        messages = record.get("messages")
        return Item(
            id=str(record.get("id") or stable_id(self.name, record)),
            messages=tuple(messages) if messages is not None else None,
            text=record.get("prompt"),
            kind="choice" if self.scoring == "choice" else "generate",
            choices=choices,
            target=target,
            meta={"line": lineno},
        )

    def render(self, item: Item, tokenizer: Any) -> str:
        if item.messages is not None:
            return chat_render(tokenizer, item.messages)
        return str(item.text)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        if self.scoring == "choice":
            if choice_logprobs is None or len(choice_logprobs) != len(item.choices):
                raise ValueError(f"{item.id}: choice scoring needs one log-probability per choice")
            pred = max(range(len(choice_logprobs)), key=lambda i: choice_logprobs[i])
            ok = pred == item.target
            return ItemResult(
                item.id,
                "",
                item.choices[pred],
                float(ok),
                "correct" if ok else "wrong",
                {"logprobs": [float(v) for v in choice_logprobs]},
            )
        ok = (
            output.strip() == str(item.target).strip()
            if self.scoring == "exact"
            else re.search(str(item.target), output) is not None
        )
        return ItemResult(item.id, "", output, float(ok), "correct" if ok else "wrong", {})


def jsonl_task(
    name: str,
    path: str | Path,
    *,
    scoring: Scoring = "exact",
    max_new_tokens: int = 64,
    smoke_n: int | None = None,
    register: bool = True,
) -> JsonlTask:
    """A task from a JSONL file (relative paths: to the current directory), registered under `name`."""
    if scoring not in _SCORINGS:
        raise MlxgateUsageError(f"scoring must be one of {', '.join(_SCORINGS)}, not {scoring!r}")
    if max_new_tokens < 1 or (smoke_n is not None and smoke_n < 1):
        raise MlxgateUsageError("max_new_tokens and smoke_n must be positive")
    task = JsonlTask(
        name=name, path=Path(path).resolve(), scoring=scoring, max_new_tokens=max_new_tokens, smoke_n=smoke_n
    )
    if register:
        known = _REGISTRY.get(name)
        register_task(task, replace=isinstance(known, JsonlTask) and known == task)  # a module imported again
    return task
