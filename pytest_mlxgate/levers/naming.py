"""Stable names for lever values: what reports print and what the reference cache keys on."""

from __future__ import annotations

import hashlib
import json

__all__ = ["IDENT", "canonical", "describe_value", "object_name"]

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
