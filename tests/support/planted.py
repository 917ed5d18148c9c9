"""Planted single-layer breaks, shared by the attribution tests and `benchmarks/explain.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def halved_scale(attention: Any) -> Callable[..., Any]:
    """A patch of `type(attention).__call__` that halves the attention scale of that one module: every
    other layer's attention runs the original."""
    cls = type(attention)
    original = cls.__call__

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is not attention:
            return original(self, *args, **kwargs)
        before = self.scale
        self.scale = before * 0.5
        try:
            return original(self, *args, **kwargs)
        finally:
            self.scale = before

    return call


def patch_target(attention: Any) -> str:
    """The patch target naming `attention`'s class `__call__` (`module:Class.__call__`)."""
    cls = type(attention)
    return f"{cls.__module__}:{cls.__qualname__}.__call__"
