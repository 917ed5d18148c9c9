"""Building a `Lever` from a gate module's `mlx_lever` marker or from `--mlx-lever NAME
--mlx-ref-value V --mlx-cand-value V`, with errors that say which form was meant."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from ..errors import LeverError
from ..serving.kv_plan import parse_kv_value
from .lever import LEVER_PATHS, Lever, LeverKind, LeverPath
from .naming import IDENT, object_name
from .patching import OBJECT_NAME
from .weights import parse_weights_value

__all__ = ["check_override_targets", "lever_from_marker", "lever_from_options", "override_applies"]

_KIND_KWARGS: tuple[LeverKind, ...] = ("env", "patch", "kv", "context", "weights")
_MARKER_KWARGS = frozenset({*_KIND_KWARGS, "ref", "cand", "path", "snapshot_plan"})
_BARE_NAME = re.compile(IDENT)
_ORIGINAL = frozenset({"original", "none"})
_CLI_FORMS = (
    "give a declared lever's name, a bare environment variable NAME or 'env:NAME', "
    "'patch:package.module.attr', 'context:package.module:factory', 'kv', 'weights' or 'model'"
)


def lever_from_marker(mark: pytest.Mark, *, base_dir: Path | None = None) -> Lever:
    """The lever a `pytest.mark.mlx_lever(...)` marker declares; LeverError names the marker and the fix.

    A relative kv_config.json path is taken from `base_dir` (the gate module's directory), else
    the working directory.
    """
    where = f"marker {mark.name}{_marker_args(mark)}"
    if len(mark.args) != 1 or not isinstance(mark.args[0], str) or not mark.args[0].strip():
        raise LeverError(
            f"{where}: give the lever's name as its one positional argument, e.g. mlx_lever('attention', ...)"
        )
    name: str = mark.args[0]
    kwargs = dict(mark.kwargs)
    unknown = sorted(set(kwargs) - _MARKER_KWARGS)
    if unknown:
        raise LeverError(f"{where}: unknown keyword {', '.join(unknown)}; allowed: {', '.join(sorted(_MARKER_KWARGS))}")
    kinds = [k for k in _KIND_KWARGS if k in kwargs]
    path = kwargs.get("path")
    if path is not None and path not in LEVER_PATHS:
        raise LeverError(f"{where}: path={path!r} is not one of {list(LEVER_PATHS)}; use 'prefill' or 'serving'")
    if name == "model":
        if kinds or "ref" in kwargs or "cand" in kwargs:
            raise LeverError(
                f"{where}: the name 'model' is two-model mode (--mlx-reference against the candidate) and "
                f"takes no {', '.join(kinds + [k for k in ('ref', 'cand') if k in kwargs])}; "
                "name the lever otherwise, or drop those arguments and pass the models on the command line"
            )
        return _build(where, name, "model", None, None, None, path or "prefill", base_dir)
    if len(kinds) != 1:
        got = f"{' and '.join(f'{k}=' for k in kinds)} together" if kinds else "none of them"
        raise LeverError(
            f"{where}: give exactly one of env=, patch=, kv=True, context=, weights=True (or name the lever 'model'); "
            f"got {got}"
        )
    kind = kinds[0]
    missing = [k for k in ("ref", "cand") if k not in kwargs]
    if missing:
        raise LeverError(f"{where}: missing {' and '.join(f'{k}=' for k in missing)}; a lever needs both arms' values")
    if kind == "kv":
        if kwargs["kv"] is not True:
            raise LeverError(f"{where}: kv={kwargs['kv']!r}; write kv=True and put the KV settings in ref=/cand=")
        if path == "prefill":
            raise LeverError(
                f"{where}: a KV lever on path='prefill' compares nothing: a teacher-forced prefill never "
                "reads a KV cache back; drop path= (KV levers run on 'serving')"
            )
        path = "serving"
    if kind == "weights" and kwargs["weights"] is not True:
        raise LeverError(
            f"{where}: weights={kwargs['weights']!r}; write weights=True and put the quantization "
            "in ref=/cand= (None: as loaded; {'bits': 4, 'group_size': 64})"
        )
    lever = _build(where, name, kind, kwargs[kind], kwargs["ref"], kwargs["cand"], path or "prefill", base_dir)
    if "snapshot_plan" not in kwargs:
        return lever
    try:
        return replace(lever, snapshot_plan=kwargs["snapshot_plan"])
    except LeverError as e:
        raise LeverError(f"{where}: {e}") from None


_EXPLICIT_PREFIXES = ("env:", "patch:", "context:")
_KIND_NAMES = frozenset({"model", "kv", "weights"})


def override_applies(name: str, declared: str | None) -> bool:
    """Whether `--mlx-lever NAME` is meant for a module whose declared lever is named `declared`.

    A bare NAME addresses the module whose lever has that name, or defines an environment-variable
    lever for a module that declares none; a module declaring another lever keeps its own (a bare
    NAME never turns a KV lever into an environment variable). An explicit form (`env:VAR`,
    `patch:...`, `context:...`, `kv`, `weights`, `model`) replaces every module's lever: asked for.
    """
    if name.startswith(_EXPLICIT_PREFIXES) or name in _KIND_NAMES:
        return True
    return declared is None or declared == name


def check_override_targets(name: str, declared: dict[str, str | None]) -> None:
    """Refuse a bare `--mlx-lever NAME` that addresses none of the collected gate modules
    ({module: its declared lever's name, None when it declares none}): it would test nothing."""
    if not declared or any(override_applies(name, n) for n in declared.values()):
        return
    names = sorted({n for n in declared.values() if n is not None})
    raise LeverError(
        f"--mlx-lever {name}: no collected gate module declares a lever named {name!r} (they declare "
        f"{', '.join(repr(n) for n in names)}), so the override would apply to nothing and every gate would run "
        f"its own lever. Fix: --mlx-lever with one of those names, select the module you mean, or say what "
        f"{name!r} switches explicitly (env:{name}, patch:package.module.attr, context:package.module:factory)"
    )


def lever_from_options(
    name: str | None,
    ref: str | None,
    cand: str | None,
    declared: Lever | None,
    *,
    base_dir: Path | None = None,
) -> Lever:
    """The lever `--mlx-lever NAME --mlx-ref-value V --mlx-cand-value V` asks for.

    NAME equal to the declared lever's name replaces its values (converted for its kind);
    otherwise NAME defines a new lever: `env:VAR` or a bare `VAR` (environment variable),
    `patch:pkg.mod.attr`, `context:pkg.mod:factory`, `kv`, `model`. A new lever runs on the
    declared lever's path (the gate module's), else prefill; a kv lever always on serving.
    Without NAME the declared lever stands.
    """
    if not name:
        if ref is not None or cand is not None:
            raise LeverError(
                "--mlx-ref-value/--mlx-cand-value given without --mlx-lever; name the lever they set "
                "(e.g. --mlx-lever MLX_BUN_PERF_KERNEL --mlx-ref-value 0 --mlx-cand-value 1)"
            )
        if declared is None:
            raise LeverError(
                "no lever: declare one with pytestmark = pytest.mark.mlx_lever(...) in the gate module, "
                "or pass --mlx-lever NAME --mlx-ref-value V --mlx-cand-value V"
            )
        return declared
    where = f"--mlx-lever {name}"
    if declared is not None and name == declared.name:
        kind: LeverKind = declared.kind
        _check_cli_values(where, kind, ref, cand)
        if kind == "model":
            return declared
        return replace(
            declared,
            ref=_convert_value(where, kind, ref, base_dir, from_cli=True),
            cand=_convert_value(where, kind, cand, base_dir, from_cli=True),
        )
    target: str | None
    if name in ("model", "kv", "weights"):
        kind, target = cast(LeverKind, name), None
    elif name.startswith("env:"):
        kind, target = "env", name[4:]
    elif name.startswith("patch:"):
        kind, target = "patch", name[6:]
    elif name.startswith("context:"):
        kind, target = "context", name[8:]
    elif _BARE_NAME.fullmatch(name):
        kind, target = "env", name
    else:
        raise LeverError(f"{where}: cannot tell what {name!r} switches; {_CLI_FORMS}")
    _check_cli_values(where, kind, ref, cand)
    path = "serving" if kind == "kv" else (declared.path if declared is not None else "prefill")
    lever_name = target or name
    return _build(
        where, lever_name, kind, True if kind in ("kv", "weights") else target, ref, cand, path, base_dir, from_cli=True
    )


def _check_cli_values(where: str, kind: LeverKind, ref: str | None, cand: str | None) -> None:
    if kind == "model":
        if ref is not None or cand is not None:
            raise LeverError(
                f"{where}: the model lever compares --mlx-reference against the candidate model and takes "
                "no values; drop --mlx-ref-value/--mlx-cand-value"
            )
        return
    missing = [opt for opt, v in (("--mlx-ref-value", ref), ("--mlx-cand-value", cand)) if v is None]
    if missing:
        raise LeverError(
            f"{where}: missing {' and '.join(missing)}; pass --mlx-ref-value and --mlx-cand-value "
            "(for an env lever 'unset' unsets the variable; for a patch lever 'original' keeps the original)"
        )


def _build(
    where: str,
    name: str,
    kind: LeverKind,
    what: object,
    ref: object,
    cand: object,
    path: str,
    base_dir: Path | None,
    *,
    from_cli: bool = False,
) -> Lever:
    target: str | None = None
    factory: Callable[[Any], AbstractContextManager[Any]] | None = None
    if kind == "env":
        if not isinstance(what, str) or not what or "=" in what or "\0" in what:
            raise LeverError(f"{where}: env={what!r} is not an environment variable name; give e.g. env='MLX_FLAG'")
        target = what
    elif kind == "patch":
        if not isinstance(what, str) or not OBJECT_NAME.fullmatch(what) or ("." not in what and ":" not in what):
            raise LeverError(
                f"{where}: patch={what!r} is not an attribute to patch; give 'package.module.attr' "
                "or 'package.module:attr'"
            )
        target = what
    elif kind == "context":
        if isinstance(what, str):
            if not OBJECT_NAME.fullmatch(what) or ("." not in what and ":" not in what):
                raise LeverError(f"{where}: context={what!r} is not a factory name; give 'package.module:factory'")
            target = what
        elif callable(what):
            factory = what
            target = object_name(what)
        else:
            raise LeverError(f"{where}: context={what!r} is neither a callable nor 'package.module:factory'")
    ref = _convert_value(where, kind, ref, base_dir, from_cli=from_cli)
    cand = _convert_value(where, kind, cand, base_dir, from_cli=from_cli)
    try:
        return Lever(
            name=name,
            kind=kind,
            target=target,
            ref=ref,
            cand=cand,
            path=cast(LeverPath, path),  # Lever checks it
            factory=factory,
        )
    except LeverError as e:
        raise LeverError(f"{where}: {e}") from None


def _convert_value(where: str, kind: LeverKind, value: object, base_dir: Path | None, *, from_cli: bool) -> object:
    """Normalize one arm's value for `kind`; LeverError if it cannot work."""
    if kind == "model":
        return None
    if kind == "env":
        if value is None or (isinstance(value, str) and value.lower() == "unset"):
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str) or "\0" in value:
            raise LeverError(f"{where}: env value {value!r} must be a string (or None/'unset' to unset the variable)")
        return value
    if kind == "patch":
        if value is None or (isinstance(value, str) and value.lower() in _ORIGINAL):
            return None
        if isinstance(value, str):
            if not OBJECT_NAME.fullmatch(value) or ("." not in value and ":" not in value):
                raise LeverError(
                    f"{where}: patch value {value!r} is not an object name; give 'package.module:attr', "
                    "'package.module.attr', or 'original' to keep the original"
                )
            return value
        if from_cli or not callable(value):
            raise LeverError(f"{where}: patch value {value!r} must be a callable, 'package.module:attr' or None")
        return value
    if kind in ("kv", "weights") and isinstance(value, (str, Path)) and str(value).lower().endswith(".json"):
        path = Path(value)  # a plan file: beside the gate module that names it
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        value = str(path) if isinstance(value, str) else path
    if kind == "kv":
        try:
            parse_kv_value(value)  # fail at collection, not halfway through a run
        except LeverError as e:
            raise LeverError(f"{where}: {e}") from None
        return value
    if kind == "weights":
        try:
            parse_weights_value(value)  # fail at collection, not after loading a model
        except LeverError as e:
            raise LeverError(f"{where}: {e}") from None
        return None if isinstance(value, str) and value.strip().lower() in ("none", "float") else value
    return value  # context: whatever the factory takes


def _marker_args(mark: pytest.Mark) -> str:
    parts = [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
    text = ", ".join(parts)
    return f"({text if len(text) <= 160 else text[:157] + '...'})"
