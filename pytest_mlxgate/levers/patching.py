"""Resolving `package.module:attr` names, and switching an environment variable or an attribute for
the length of one arm, restored exactly afterwards (also when the forward raises)."""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import LeverError
from .naming import IDENT, describe_value

__all__ = ["OBJECT_NAME", "counted", "env_set", "patched", "resolve_object"]

OBJECT_NAME = re.compile(rf"{IDENT}(?:\.{IDENT})*(?::{IDENT}(?:\.{IDENT})*)?")


#: Values whose identity says nothing (interned, shared): never hunted for as alias copies.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def resolve_object(text: str, *, what: str) -> tuple[object, str, object]:
    """Resolve `pkg.mod.attr` or `pkg.mod:attr.sub` to (owner, attribute name, object).

    Without a colon the longest importable module prefix is imported and the rest looked up as
    attributes (`mlx.core.fast.scaled_dot_product_attention`: `mlx.core.fast` is a submodule the
    extension registers, not a package). LeverError names the module that would not import.
    """
    if not OBJECT_NAME.fullmatch(text) or ("." not in text and ":" not in text):
        raise LeverError(f"{what} {text!r} is not an object name; give 'package.module:attr' or 'package.module.attr'")
    module_name, colon, attr_text = text.partition(":")
    module: object
    if colon:
        module = _import(module_name, what, text)
        prefix = module_name
        attrs = attr_text.split(".")
    else:
        parts = text.split(".")
        module, attrs, prefix = None, [], ""
        for i in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:i])
            try:
                module = importlib.import_module(prefix)
            except ModuleNotFoundError as e:
                if e.name and (prefix == e.name or prefix.startswith(e.name + ".")):
                    continue  # this prefix (or a parent of it) is no module: try a shorter one
                raise _import_error(prefix, what, text, e) from None
            except Exception as e:  # a module that exists but fails while importing
                raise _import_error(prefix, what, text, e) from None
            attrs = parts[i:]
            break
        if module is None:
            raise LeverError(
                f"{what} {text!r}: module {parts[0]!r} cannot be imported (no module of that name); "
                "check the spelling and that the package is installed in this environment"
            )
    owner = module
    for depth, attr in enumerate(attrs):
        try:
            obj = getattr(owner, attr)
        except AttributeError:
            have = ".".join([prefix, *attrs[:depth]])
            raise LeverError(
                f"{what} {text!r}: {have} has no attribute {attr!r}; check the name against that module"
            ) from None
        if depth == len(attrs) - 1:
            return owner, attr, obj
        owner = obj
    raise AssertionError("unreachable: an object name has at least one attribute")


def _import(module_name: str, what: str, text: str) -> object:
    try:
        return importlib.import_module(module_name)
    except Exception as e:
        raise _import_error(module_name, what, text, e) from None


def _import_error(module_name: str, what: str, text: str, e: BaseException) -> LeverError:
    return LeverError(
        f"{what} {text!r}: importing module {module_name!r} failed ({type(e).__name__}: {e}); "
        "check the spelling and that the package and its dependencies are installed"
    )


@contextmanager
def env_set(var: str, value: str | None) -> Iterator[None]:
    present, before = var in os.environ, os.environ.get(var)
    try:
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
        yield
    finally:
        if present:
            assert before is not None
            os.environ[var] = before
        else:
            os.environ.pop(var, None)


@contextmanager
def patched(lever_name: str, target: str, value: object) -> Iterator[None]:
    """Install `value` at `target` and at every module-level copy of the original under that name."""
    what = f"lever {lever_name!r} patch target"
    owner, attr, original = resolve_object(target, what=what)
    new = resolve_object(value, what=f"lever {lever_name!r} patch value")[2] if isinstance(value, str) else value
    if callable(original) and not callable(new):
        raise LeverError(
            f"lever {lever_name!r}: {target} is callable but the patch value {describe_value(value)} is "
            f"{type(new).__name__}; patch it with a function of the same signature"
        )
    sites = [owner]
    if not isinstance(original, _SCALARS):
        sites += [m for m in _modules_holding(attr, original) if m is not owner]
    # the value's own module (and its importers) bind it under this name already: not copies
    track_copies = new is not original and not isinstance(new, _SCALARS)
    had_value = {id(m) for m in _modules_holding(attr, new)} if track_copies else set()
    done: list[object] = []
    try:
        for site in sites:
            try:
                setattr(site, attr, new)
            except (AttributeError, TypeError) as e:
                raise LeverError(
                    f"lever {lever_name!r}: cannot set {attr!r} on {describe_value(site)} ({e}); patch a "
                    "module-level function or a class attribute that can be assigned"
                ) from None
            done.append(site)
        yield
    finally:
        for site in reversed(done):
            setattr(site, attr, original)
        if track_copies:
            for module in _modules_holding(attr, new):  # bound by name while the patch was in force
                if id(module) not in had_value:
                    setattr(module, attr, original)


def _modules_holding(attr: str, obj: object) -> list[object]:
    """Every loaded module whose own namespace binds `attr` to this very object."""
    found: list[object] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(attr, None) is obj:
            found.append(module)
    return found


def counted(value: object, on_call: Callable[[], None], lever_name: str) -> object:
    """`value` (a callable, or the name of one) wrapped so each call first calls `on_call`."""
    fn = resolve_object(value, what=f"lever {lever_name!r} patch value")[2] if isinstance(value, str) else value
    if not callable(fn):
        return fn  # not a function: `patched` explains what is wrong with it

    @functools.wraps(fn)
    def counting(*args: Any, **kwargs: Any) -> Any:
        on_call()
        return fn(*args, **kwargs)

    return counting
