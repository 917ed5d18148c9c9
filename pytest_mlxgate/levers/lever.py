"""Levers: a named switch with a reference value and a candidate value, applied around a forward.

A gate module declares one lever in a marker; both arms run the same model on the same tokens and
differ only by the lever, so their KL divergence is the lever's drift::

    pytestmark = pytest.mark.mlx_lever("perf_kernel", env="MLX_BUN_PERF_KERNEL", ref="0", cand="1")
    pytestmark = pytest.mark.mlx_lever("attention", patch="mlx.core.fast.scaled_dot_product_attention",
                                       ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention",
                                       cand=None)
    pytestmark = pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8})
    pytestmark = pytest.mark.mlx_lever("model")   # --mlx-reference model vs the candidate model
    pytestmark = pytest.mark.mlx_lever("flag", context=factory, ref=0, cand=1)  # factory(value) -> CM

Kinds: `env` sets (None: unsets) an environment variable; `patch` replaces an attribute (None:
leaves the original); `kv` chooses a KV cache plan (`pytest_mlxgate.levers.kvcache`), serving path only;
`context` enters `factory(value)`; `model` compares two models. `--mlx-lever NAME --mlx-ref-value V
--mlx-cand-value V` overrides the values or defines a lever from the command line
(`lever_from_options`).

This module is imported while pytest collects: it must not import mlx or mlx_lm at import time.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

import pytest

from ..errors import LeverError
from .kvcache import PLAIN, KVPlan, parse_kv_value

__all__ = [
    "ARMS",
    "LEVER_KINDS",
    "LEVER_PATHS",
    "Arm",
    "Lever",
    "LeverKind",
    "LeverPath",
    "lever_from_marker",
    "lever_from_options",
    "resolve_object",
]

Arm = Literal["reference", "candidate"]
LeverKind = Literal["env", "patch", "kv", "model", "context"]
LeverPath = Literal["prefill", "serving"]

ARMS: tuple[Arm, ...] = get_args(Arm)
LEVER_KINDS: tuple[LeverKind, ...] = get_args(LeverKind)
LEVER_PATHS: tuple[LeverPath, ...] = get_args(LeverPath)

_KIND_KWARGS: tuple[LeverKind, ...] = ("env", "patch", "kv", "context")
_MARKER_KWARGS = frozenset({*_KIND_KWARGS, "ref", "cand", "path"})
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_BARE_NAME = re.compile(_IDENT)
_OBJECT_NAME = re.compile(rf"{_IDENT}(?:\.{_IDENT})*(?::{_IDENT}(?:\.{_IDENT})*)?")
_ORIGINAL = frozenset({"original", "none"})
#: Values whose identity says nothing (interned, shared): never hunted for as alias copies.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_CLI_FORMS = (
    "give a declared lever's name, a bare environment variable NAME or 'env:NAME', "
    "'patch:package.module.attr', 'context:package.module:factory', 'kv' or 'model'"
)


@dataclass(frozen=True)
class Lever:
    """One lever: what it switches (`kind`, `target`), its two values, and the path it runs on."""

    name: str
    kind: LeverKind
    target: str | None  # env var name, dotted patch target, context factory name; None for kv/model
    ref: object  # the reference value (normalized: "unset"/"original" become None)
    cand: object
    path: LeverPath = "prefill"
    factory: Callable[[Any], AbstractContextManager[Any]] | None = None  # kind == "context"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise LeverError(f"lever name {self.name!r} must be a non-empty string; name what the lever switches")
        if self.kind not in LEVER_KINDS:
            raise LeverError(f"lever {self.name!r}: kind {self.kind!r} is not one of {list(LEVER_KINDS)}")
        if self.path not in LEVER_PATHS:
            raise LeverError(
                f"lever {self.name!r}: path={self.path!r} is not one of {list(LEVER_PATHS)}; use 'prefill' "
                "(one teacher-forced forward) or 'serving' (prefill then one-token decode through the KV cache)"
            )
        if self.kind == "kv" and self.path != "serving":
            raise LeverError(
                f"lever {self.name!r} is a KV lever on path='prefill': a teacher-forced prefill never reads "
                "a KV cache back, so both arms would be identical; drop path= or use path='serving'"
            )
        if self.kind in ("env", "patch", "context") and self.target is None and self.factory is None:
            raise LeverError(f"lever {self.name!r} ({self.kind}) needs a target; say what it switches")

    def value(self, arm: Arm) -> object:
        """The value this lever takes on `arm`."""
        return self.ref if _check_arm(arm) == "reference" else self.cand

    def describe_value(self, arm: Arm) -> str:
        """Short human text for one arm's value: `0`, `unset`, `original`, `8-bit g64 from token 0`."""
        value = self.value(arm)
        if self.kind == "model":
            return f"{arm} model"
        if self.kind == "kv":
            return self.kv_plan(arm).describe()
        if value is None:
            return {"env": "unset", "patch": "original"}.get(self.kind, "None")
        if isinstance(value, str):
            return value
        if callable(value):
            return _object_name(value)
        return repr(value)

    def describe(self) -> str:
        """One line for reports: `attention: reference_ops:sdpa → original · path=prefill`."""
        ref, cand = (self.describe_value(arm).removeprefix("pytest_mlxgate.") for arm in ARMS)
        return f"{self.name}: {ref} → {cand} · path={self.path}"

    def to_json(self) -> dict[str, str | None]:
        """The lever as JSON-able strings (values as `describe_value` writes them)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "target": self.target,
            "ref": self.describe_value("reference"),
            "cand": self.describe_value("candidate"),
            "path": self.path,
        }

    def key(self, arm: Arm) -> str:
        """Stable text identifying this arm's configuration, for a cache key.

        Kind, target, path and a canonical value: a kv_config.json by the sha256 of its bytes
        (not its path), a callable by module:qualname. The lever's name is left out (it changes
        nothing computed); a model lever's key names only the arm, so add the models' identity.
        """
        value = self.value(arm)
        canonical: object
        if self.kind == "kv":
            plan = self.kv_plan(arm)
            canonical = f"sha256:{plan.digest}" if plan.digest else plan.source
        elif self.kind == "model":
            canonical = arm
        else:
            canonical = _canonical(value)
        return json.dumps(
            {"kind": self.kind, "target": self.target, "value": canonical, "path": self.path},
            sort_keys=True,
            separators=(",", ":"),
        )

    @contextmanager
    def applied(self, arm: Arm) -> Iterator[None]:
        """Run the body with this arm's value in force; everything is restored on exit, raise or not."""
        value = self.value(arm)
        if self.kind == "env":
            assert self.target is not None
            with _env_set(self.target, value if value is None else str(value)):
                yield
        elif self.kind == "patch" and value is not None:
            assert self.target is not None
            with _patched(self, self.target, value):
                yield
        elif self.kind == "context":
            with self._enter_context(value):
                yield
        else:  # kv (the plan is read by the caller), model (two models), patch to the original
            yield

    def kv_plan(self, arm: Arm) -> KVPlan:
        """The KV cache plan for `arm`: a kv lever's parsed value, otherwise the plain plan."""
        value = self.value(arm)
        if self.kind != "kv":
            return PLAIN
        try:
            return parse_kv_value(value)
        except LeverError as e:
            raise LeverError(f"lever {self.name!r}, {arm} value: {e}") from None

    def _enter_context(self, value: object) -> AbstractContextManager[Any]:
        factory: object = self.factory
        if factory is None:
            assert self.target is not None
            factory = resolve_object(self.target, what=f"lever {self.name!r} context factory")[2]
        if not callable(factory):
            raise LeverError(
                f"lever {self.name!r}: context factory {self.target} is {type(factory).__name__}, not callable; "
                "give a function value -> context manager"
            )
        manager = factory(value)
        if not (hasattr(manager, "__enter__") and hasattr(manager, "__exit__")):
            raise LeverError(
                f"lever {self.name!r}: context factory {self.target}({value!r}) returned "
                f"{type(manager).__name__}, not a context manager; return one (e.g. use @contextlib.contextmanager)"
            )
        return manager  # type: ignore[no-any-return]


def _check_arm(arm: str) -> Arm:
    if arm in ARMS:
        return arm
    raise LeverError(f"arm {arm!r} is neither 'reference' nor 'candidate'")


# --- building levers --------------------------------------------------------------------------


def lever_from_marker(mark: pytest.Mark, *, base_dir: Path | None = None) -> Lever:
    """The lever a `pytest.mark.mlx_lever(...)` marker declares; LeverError names the marker and the fix.

    A relative kv_config.json path is taken from `base_dir` (the gate module's directory), else
    the working directory.
    """
    where = f"marker {mark.name}{_marker_args(mark)}"
    if len(mark.args) != 1 or not isinstance(mark.args[0], str) or not mark.args[0].strip():
        raise LeverError(f"{where}: give the lever's name as its one positional argument, e.g. mlx_lever('attention', ...)")
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
            f"{where}: give exactly one of env=, patch=, kv=True, context= (or name the lever 'model'); got {got}"
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
    return _build(where, name, kind, kwargs[kind], kwargs["ref"], kwargs["cand"], path or "prefill", base_dir)


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
    if name in ("model", "kv"):
        kind, target = ("model" if name == "model" else "kv"), None
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
    return _build(where, lever_name, kind, True if kind == "kv" else target, ref, cand, path, base_dir, from_cli=True)


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
        if not isinstance(what, str) or not _OBJECT_NAME.fullmatch(what) or ("." not in what and ":" not in what):
            raise LeverError(
                f"{where}: patch={what!r} is not an attribute to patch; give 'package.module.attr' "
                "or 'package.module:attr'"
            )
        target = what
    elif kind == "context":
        if isinstance(what, str):
            if not _OBJECT_NAME.fullmatch(what) or ("." not in what and ":" not in what):
                raise LeverError(f"{where}: context={what!r} is not a factory name; give 'package.module:factory'")
            target = what
        elif callable(what):
            factory = what
            target = _object_name(what)
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
            if not _OBJECT_NAME.fullmatch(value) or ("." not in value and ":" not in value):
                raise LeverError(
                    f"{where}: patch value {value!r} is not an object name; give 'package.module:attr', "
                    "'package.module.attr', or 'original' to keep the original"
                )
            return value
        if from_cli or not callable(value):
            raise LeverError(f"{where}: patch value {value!r} must be a callable, 'package.module:attr' or None")
        return value
    if kind == "kv":
        if isinstance(value, (str, Path)) and str(value).lower().endswith(".json"):
            path = Path(value)
            if not path.is_absolute():
                path = (base_dir or Path.cwd()) / path
            value = str(path) if isinstance(value, str) else path
        try:
            parse_kv_value(value)  # fail at collection, not halfway through a run
        except LeverError as e:
            raise LeverError(f"{where}: {e}") from None
        return value
    return value  # context: whatever the factory takes


def _marker_args(mark: pytest.Mark) -> str:
    parts = [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
    text = ", ".join(parts)
    return f"({text if len(text) <= 160 else text[:157] + '...'})"


# --- resolving and patching objects -----------------------------------------------------------


def resolve_object(text: str, *, what: str) -> tuple[object, str, object]:
    """Resolve `pkg.mod.attr` or `pkg.mod:attr.sub` to (owner, attribute name, object).

    Without a colon the longest importable module prefix is imported and the rest looked up as
    attributes (`mlx.core.fast.scaled_dot_product_attention`: `mlx.core.fast` is a submodule the
    extension registers, not a package). LeverError names the module that would not import.
    """
    if not _OBJECT_NAME.fullmatch(text) or ("." not in text and ":" not in text):
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
def _env_set(var: str, value: str | None) -> Iterator[None]:
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
def _patched(lever: Lever, target: str, value: object) -> Iterator[None]:
    """Install `value` at `target` and at every module-level copy of the original under that name."""
    what = f"lever {lever.name!r} patch target"
    owner, attr, original = resolve_object(target, what=what)
    new = resolve_object(value, what=f"lever {lever.name!r} patch value")[2] if isinstance(value, str) else value
    if callable(original) and not callable(new):
        raise LeverError(
            f"lever {lever.name!r}: {target} is callable but the patch value {_describe(value)} is "
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
                    f"lever {lever.name!r}: cannot set {attr!r} on {_describe(site)} ({e}); patch a "
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


# --- naming values ----------------------------------------------------------------------------


def _object_name(obj: object) -> str:
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


def _describe(value: object) -> str:
    return value if isinstance(value, str) else _object_name(value) if callable(value) else repr(value)


def _canonical(value: object) -> object:
    """A JSON-able, stable form of a lever value for `Lever.key`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):
        return {"callable": _object_name(value)}
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):
        return {"repr": repr(value)}
