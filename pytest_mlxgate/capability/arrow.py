"""Rows out of Arrow files (IPC streams, Parquet) through pyarrow, imported only when a task loads data.

pyarrow ships no type information, so it is imported by name and its objects stay `Any` here;
callers get plain `list[dict]` rows. A missing pyarrow is a `TaskDataMissing` that says the fix.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import TaskDataMissing

__all__ = ["have_pyarrow", "read_ipc_stream", "read_parquet"]

_FIX = "pyarrow is not installed: `pip install pyarrow` (or ./dev setup)"


def have_pyarrow() -> bool:
    """Whether pyarrow can be imported (optional data paths check before trying)."""
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        return False
    return True


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise TaskDataMissing(f"{_FIX} ({exc})") from exc


def read_ipc_stream(path: Path) -> list[dict[str, Any]]:
    """All rows of an Arrow IPC *stream* file (what `datasets.save_to_disk` writes)."""
    ipc = _module("pyarrow.ipc")
    with open(path, "rb") as handle:
        table = ipc.open_stream(handle).read_all()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """All rows of a Parquet file (the hub's dataset format)."""
    pq = _module("pyarrow.parquet")
    rows: list[dict[str, Any]] = pq.read_table(str(path)).to_pylist()
    return rows
