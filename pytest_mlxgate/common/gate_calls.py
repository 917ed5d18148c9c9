"""The limits a gate module's source declares, read without importing it: every call of the named
assertions (`assert_kl_below(paired, mean=...)`, `assert_faster(paired, decode=..., at=...)`) in its
top-level functions, with literal keyword values. The calibration check compares them with the
calibration file; the speed measurement reads the module's speed goals, to stop timing once they
are decided. Only the standard library."""

from __future__ import annotations

import ast
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

__all__ = ["NOT_LITERAL", "DeclaredLimit", "call_name", "declared_limits", "literal"]

#: What `literal` gives for an expression that is not a literal.
NOT_LITERAL = object()


@dataclass(frozen=True)
class DeclaredLimit:
    """One limit a gate's source declares: `assertion(paired, key=value, at=at)` in `test`."""

    test: str
    assertion: str
    key: str
    value: float
    at: object = None  # assert_faster's and assert_smaller's `at`: a context, "all", or None (the longest)
    model: str | None = None  # a limit of `models={model: {...}}`: it replaces the one of its key on that model


def declared_limits(source: ast.Module | Path, assertions: Collection[str]) -> tuple[list[DeclaredLimit], list[str]]:
    """(the numeric limits, the keyword arguments given as expressions the reader cannot evaluate:
    `test: assertion(key=expression)`) of every call of `assertions` in `source`'s top-level functions.
    A `models={"gemma3-270m": {"p99": 0.5}}` table gives one limit per entry, marked with its model."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source.read_text(), filename=str(source))
    limits: list[DeclaredLimit] = []
    not_literal: list[str] = []
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            name = call_name(node)
            if name not in assertions:
                continue
            assert isinstance(node, ast.Call) and name is not None
            keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
            at = literal(keywords.pop("at")) if "at" in keywords else None
            models = keywords.pop("models", None)
            for key, value_node in keywords.items():
                value = literal(value_node)
                if _number(value):
                    limits.append(DeclaredLimit(fn.name, name, key, float(value), at))
                else:
                    not_literal.append(f"{fn.name}: {name}({key}={ast.unparse(value_node)})")
            if models is None:
                continue
            table = literal(models)
            if not isinstance(table, dict) or not all(isinstance(t, dict) for t in table.values()):
                not_literal.append(f"{fn.name}: {name}(models={ast.unparse(models)})")
                continue
            for model, overrides in table.items():
                for key, value in overrides.items():
                    if _number(value):
                        limits.append(DeclaredLimit(fn.name, name, str(key), float(value), at, model=str(model)))
                    else:
                        not_literal.append(f"{fn.name}: {name}(models={{{model!r}: {{{key!r}: {value!r}}}}})")
    return limits, not_literal


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def call_name(node: ast.AST) -> str | None:
    """The called name of a call (`f(...)`, `module.f(...)`), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def literal(node: ast.expr) -> object:
    """The value of a literal expression, `NOT_LITERAL` for anything else."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return NOT_LITERAL
