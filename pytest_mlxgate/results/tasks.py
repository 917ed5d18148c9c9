"""The tasks of the Capability Score, in report order: the runner runs them, the score and merge count
them (standard library only, so the xdist controller's side can name them too)."""

from __future__ import annotations

__all__ = ["TASK_NAMES"]

#: The six tasks of the Capability Score, in report order (one module each in `capability/tasks/`).
TASK_NAMES = ("mmlu", "gsm8k", "ifeval", "bfcl", "humaneval", "hashhop")
