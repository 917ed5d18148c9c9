"""Stable names for lever values: what reports print and what the reference cache keys on."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

__all__ = ["IDENT", "canonical", "describe_value", "object_name", "source_digest"]

#: A Python identifier, the building block of object names (`package.module:attr`).
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def object_name(obj: object) -> str:
    """module:qualname for a function or class; a hash of the code for lambdas and local functions."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return repr(obj)  # e.g. a functools.partial: its repr names the function and the arguments
    name = f"{module}:{qualname}"
    code = getattr(obj, "__code__", None)
    if "<" in qualname and code is not None:  # <lambda>, <locals>: the name alone is ambiguous
        body = code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()
        name += f"#{hashlib.sha256(body).hexdigest()[:12]}"
    return name


def describe_value(value: object) -> str:
    return value if isinstance(value, str) else object_name(value) if callable(value) else repr(value)


def canonical(value: object) -> object:
    """A JSON-able, stable form of a lever value for `Lever.key`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):
        return {"callable": object_name(value)}
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):
        return {"repr": repr(value)}


def source_digest(obj: object) -> str | None:
    """sha256 of the Python source file that defines `obj` (a function, class, partial or bound
    method); None for what has no such file (builtins, C extensions: their library versions are
    keyed elsewhere). A reference cache keys on it, so editing the code behind a lever's value under
    the same module:qualname is a miss, not a stale reference."""
    target = obj
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)  # a bound method: its function
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = Path(file)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str | None:
    """Hashed once per file version and process (size and mtime are part of the cache's key)."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None
