"""How many positions a model serves: what a gate's sizes are checked against before any arm runs.

The number is the model's trained context, `max_position_embeddings` (or an older name for it), read
from the snapshot's config.json (a multimodal model's `text_config` first), else from the loaded
model's args. A sliding-window model serves that many positions too: its rotating caches keep the
window, the positions still count up to the trained context. A config that names none gives no
limit, and nothing is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .loaded import LoadedModel

__all__ = ["CONTEXT_KEYS", "context_limit"]

#: Config keys that hold a model's context length, most common first.
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length", "n_ctx")


def context_limit(loaded: LoadedModel) -> tuple[int, str] | None:
    """(positions the model serves, where that number was read), or None when nothing says."""
    path = loaded.snapshot.dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if isinstance(config, Mapping):
        for where, table in (
            (f"text_config.{{}} in {path.name}", config.get("text_config")),
            (f"{{}} in {path.name}", config),
        ):
            found = _limit_in(table, where)
            if found is not None:
                return found
    args = getattr(loaded.model, "args", None)
    return _limit_in(vars(args) if args is not None and hasattr(args, "__dict__") else None, "the model's args.{}")


def _limit_in(table: Any, where: str) -> tuple[int, str] | None:
    if not isinstance(table, Mapping):
        return None
    for key in CONTEXT_KEYS:
        value = table.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, where.format(key)
    return None
