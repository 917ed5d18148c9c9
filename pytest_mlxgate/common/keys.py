"""Cache keys: one canonical JSON text per key, so equal keys hash and compare equal everywhere."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "key_digest"]


def canonical_json(key: Mapping[str, Any]) -> str:
    """Sorted keys, no spaces; values JSON cannot hold become their `str`."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


def key_digest(key: Mapping[str, Any]) -> str:
    """The file-name part of a cache entry: 40 hex of the key's sha256."""
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()[:40]
