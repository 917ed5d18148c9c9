"""Storing a reference arm is a by-product: a disk that refuses it must not cost the verdict."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["store_or_warn"]


class _Store(Protocol):
    directory: Any

    def store(self, key: Mapping[str, Any], value: Any, /) -> Any: ...


def store_or_warn(cache: _Store, key: Mapping[str, Any], value: Any) -> bool:
    """`cache.store(key, value)`; on an OS error (read-only checkout, full disk) a warning with the
    fix instead, and the gate goes on with the arm it just computed. True when stored."""
    from ..errors import MlxgateWarning

    try:
        cache.store(key, value)
    except OSError as e:
        warnings.warn(MlxgateWarning(
            f"reference cache {cache.directory}: entry not written ({e.strerror or e}); the next run computes "
            "the reference arm again. Fix: --mlx-reference-cache DIR (a writable directory), or "
            "--mlx-reference-cache off"), stacklevel=2)
        return False
    return True
