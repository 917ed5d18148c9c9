"""`mlxgate new-gate`: a new gate module for a patch or environment-variable lever, failing until it has limits
and a known-bad variant they catch.

The module it writes declares the lever, sizes its KL measurement, asks for speed, and carries a
docstring whose "How the limits were set" section lists what to measure. Its drift and speed tests
fail with the command that measures them (`pytest FILE --mlx-calibrate`) until the limits are pasted
in, and its `test_known_bad` fails until `KNOWN_BAD` names a broken variant that `test_drift`'s
limits then fail (`authoring.known_bad`): a gate never passes by default, nor with limits never
shown to catch anything. Plain string templates; every value is written as a Python literal (repr),
so no quoting can break the file. Imports the lever's modules to check its names resolve.
"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Literal, TypedDict, Unpack

from ..errors import MlxgateUsageError
from ..levers.lever import LeverPath
from ..levers.naming import IDENT
from ..levers.patching import resolve_object

__all__ = [
    "GateOptions",
    "GateSpec",
    "gate_spec",
    "new_gate",
    "next_steps",
    "plain_version",
    "render_gate",
    "write_gate",
]

#: The module whose plain-ops kernels are a fused op's default reference (the name gates write).
REFERENCE_OPS = "pytest_mlxgate.reference_ops"
#: `--ref`/`--cand` words for "the patch target's own, unpatched object", as the marker reads them.
ORIGINAL = ("original", "none")

_IDENT = re.compile(IDENT)

_PATHS = {
    "prefill": "Prefill path: one teacher-forced forward per prompt, so every call sees the whole causal block.",
    "serving": (
        "Serving path, what `mlx_lm.generate` runs: each prompt's prefix is prefilled through mlx_lm's KV\n"
        "cache, then its last `decode` tokens are fed one at a time."
    ),
}

_MODULE = Template('''"""Gate: ${title}

TODO: what the lever changes, and why it should be faster or smaller.

${lever}

${path}

How the limits were set (`${calibrate}` measures each of these, prints
suggested limits as code to paste into the tests below, and writes the figures to
`calibration/${stem}.json` beside this module: commit it; --mlx-aa and the calibration files' check
hold the limits to it). Keep here why each limit is where it is, not the numbers the file holds:
- A/A floor (the reference arm against itself, and with the prompt fed in chunks): TODO why every
  limit sits well above it, so noise never decides a verdict.
- This lever's drift: TODO what the lever changes, and how much room the limits leave above it.
- A known-bad variant must fail: TODO what it gets wrong. Declare it as
  KNOWN_BAD below (test_known_bad runs test_drift on it and passes only when that fails), or plant
  it once by hand with
  `${plant}
  ${plant_values}`
  (${plant_note}).
- Speed and memory (`mlx_speed`: both arms on the serving path, interleaved): TODO which goal is
  asserted and why, and the backend it was sized on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_mlxgate import Paired

pytestmark = [
    pytest.mark.mlx_lever(
${marker}
    ),
    pytest.mark.mlx_kl(prompts=16, tokens=128),
    pytest.mark.mlx_speed(),
]

#: Measures the A/A floor, this lever's drift and its speed, and prints suggested limits as code.
CALIBRATE = ${calibrate_literal}

${known_bad_comment}
KNOWN_BAD = None


def test_drift(paired: Paired) -> None:
    # No limits yet: run CALIBRATE and replace the pytest.fail below with the call it prints, of this shape
    # (with `from pytest_mlxgate import assert_kl_below` above):
    #     assert_kl_below(paired, mean=..., p99=..., top1=...)
    pytest.fail(
        f"test_drift has no limits yet, and a gate never passes without them: run `{CALIBRATE}` and put the "
        "assert_kl_below(paired, mean=..., p99=..., top1=...) call it prints in place of this pytest.fail",
        pytrace=False,
    )


def test_speed(paired: Paired) -> None:
    # No limits yet: run CALIBRATE and replace the pytest.fail below with the call it prints, of this shape
    # (with `from pytest_mlxgate import assert_faster` above; a lever that saves memory asserts it with
    # `assert_smaller(paired, kv=..., weights=..., memory=...)`, a memory gate):
    #     assert_faster(paired, decode=...)
    pytest.fail(
        f"test_speed has no limits yet, and a gate never passes without them: run `{CALIBRATE}` and put the "
        "assert_faster(paired, decode=...) call it prints in place of this pytest.fail",
        pytrace=False,
    )


def test_known_bad(paired: Paired) -> None:
    # Runs test_drift with KNOWN_BAD as the candidate arm (same model, prompts and reference arm): limits
    # never shown to fail a broken variant may pass one.
    from pytest_mlxgate import assert_known_bad_fails

    assert_known_bad_fails(paired, KNOWN_BAD, test_drift)
''')


@dataclass(frozen=True)
class GateSpec:
    """What a new gate switches: a patch target or an environment variable, and each arm's value.

    `ref`/`cand` are marker values: for a patch, an object name or None (the original); for an
    environment variable, the text it is set to ('unset' unsets it).
    """

    name: str
    kind: Literal["patch", "env"]
    target: str
    ref: str | None
    cand: str | None
    path: LeverPath = "prefill"


class GateOptions(TypedDict, total=False):
    """`mlxgate new-gate`'s lever options, as `gate_spec` takes them."""

    patch: str | None
    env: str | None
    ref: str | None
    cand: str | None
    path: LeverPath


def new_gate(name: str, *, directory: Path = Path("gates"), **options: Unpack[GateOptions]) -> Path:
    """Check everything, then write `directory/test_NAME.py`; returns its path. An existing file is
    refused before any module is imported."""
    _check_name(name)
    _refuse_existing(_gate_path(name, directory))
    return write_gate(gate_spec(name, search=directory, **options), directory)


def gate_spec(
    name: str,
    *,
    patch: str | None = None,
    env: str | None = None,
    ref: str | None = None,
    cand: str | None = None,
    path: LeverPath = "prefill",
    search: Path | None = None,
) -> GateSpec:
    """Check a new gate's arguments and resolve its values; MlxgateUsageError says what, why and the fix.

    A patch target and its object values are imported (from the working directory and `search`,
    the gate's folder, too: where pytest will find them). Without `ref`, a patched mlx fused op
    that `pytest_mlxgate.reference_ops` has a plain version of gets that version as its reference.
    """
    _check_name(name)
    if (patch is None) == (env is None):
        got = "both" if patch is not None else "neither"
        raise MlxgateUsageError(
            f"give exactly one of --patch module.attr (a function the lever swaps) or --env VAR (an environment "
            f"variable it sets); got {got}"
        )
    if env is not None:
        return _env_spec(name, env, ref, cand, path)
    assert patch is not None
    with _importable_from(Path.cwd(), search):
        return _patch_spec(name, patch, ref, cand, path)


def _check_name(name: str) -> None:
    """NAME becomes the lever's name and the file test_NAME.py: a Python identifier."""
    if _IDENT.fullmatch(name):
        return
    fixed = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "my_lever"
    if fixed[0].isdigit():
        fixed = f"lever_{fixed}"
    raise MlxgateUsageError(
        f"NAME {name!r} is not a Python identifier (letters, digits and _, not starting with a digit): it names "
        f"the lever and the module test_NAME.py; use e.g. {fixed!r}"
    )


def _env_spec(name: str, var: str, ref: str | None, cand: str | None, path: LeverPath) -> GateSpec:
    if not _IDENT.fullmatch(var):
        alone = var.partition("=")[0]
        hint = f"; give the name alone (--env {alone}) and its values with --ref/--cand" if "=" in var else ""
        raise MlxgateUsageError(f"--env {var!r} is not an environment variable name (letters, digits and _){hint}")
    missing = [flag for flag, value in (("--ref", ref), ("--cand", cand)) if value is None]
    if missing:
        raise MlxgateUsageError(
            f"--env {var} needs {' and '.join(missing)}: the value each arm sets it to (e.g. --ref 0 --cand 1; "
            "'unset' unsets it)"
        )
    assert ref is not None and cand is not None
    for flag, value in (("--ref", ref), ("--cand", cand)):
        if "\0" in value:
            raise MlxgateUsageError(f"{flag} {value!r}: an environment variable's value cannot hold a NUL byte")
    if _env_value(ref) == _env_value(cand):
        raise MlxgateUsageError(
            f"--ref and --cand both set {var} to {ref!r}: both arms would run the same code and the gate would "
            "measure nothing; give the candidate its own value"
        )
    return GateSpec(name, "env", var, ref, cand, path)


def _env_value(value: str) -> str | None:
    return None if value.lower() == "unset" else value


def _patch_spec(name: str, target: str, ref: str | None, cand: str | None, path: LeverPath) -> GateSpec:
    original = resolve_object(target, what="--patch")[2]
    if ref is None:
        ref = plain_version(original)
        if ref is None:
            raise MlxgateUsageError(
                f"--patch {target}: no default reference arm ({REFERENCE_OPS} has plain-ops versions of "
                f"mlx.core.fast.{{{', '.join(_plain_op_names())}}} only); give --ref package.module:function "
                "(what the reference arm runs in its place), or --ref original with --cand package.module:function "
                "to make the original the reference"
            )
    values = {flag: _patch_value(flag, value, target, original) for flag, value in (("--ref", ref), ("--cand", cand))}
    if values["--ref"] == values["--cand"]:
        both = "the original" if values["--ref"] is None else values["--ref"]
        raise MlxgateUsageError(
            f"--ref and --cand both run {both} in place of {target}: the gate would measure nothing; give the "
            "candidate (--cand, default: the original) something else to run"
        )
    return GateSpec(name, "patch", target, values["--ref"], values["--cand"], path)


def _patch_value(flag: str, value: str | None, target: str, original: object) -> str | None:
    """An arm's patch value: None (the original) or an object name that resolves, callable if the target is."""
    if value is None or value.lower() in ORIGINAL:
        return None
    obj = resolve_object(value, what=flag)[2]
    if callable(original) and not callable(obj):
        raise MlxgateUsageError(
            f"{flag} {value}: {target} is callable but {value} is {type(obj).__name__}; name a function with "
            f"the same signature as {target}"
        )
    return value


def plain_version(op: object) -> str | None:
    """`pytest_mlxgate.reference_ops:NAME` when `op` is `mlx.core.fast.NAME` and that module has NAME."""
    mlx_core = sys.modules.get("mlx.core")  # not imported: `op` cannot be one of its fused ops
    fast = getattr(mlx_core, "fast", None)
    if fast is None or not callable(op):
        return None
    for name in _reference_op_names():
        if getattr(fast, name, None) is op:
            return f"{REFERENCE_OPS}:{name}"
    return None


def _reference_op_names() -> list[str]:
    return sorted(getattr(importlib.import_module(REFERENCE_OPS), "__all__", ()))


def _plain_op_names() -> list[str]:
    """The fused ops that have a plain version (the module's other names are helpers, e.g. a lever factory)."""
    import mlx.core as mx

    return [name for name in _reference_op_names() if hasattr(mx.fast, name)]


@contextmanager
def _importable_from(*folders: Path | None) -> Iterator[None]:
    """Put `folders` first on sys.path for the body (the console script's own sys.path lacks the cwd)."""
    added = [str(f.resolve()) for f in folders if f is not None and f.is_dir()]
    added = [entry for entry in dict.fromkeys(added) if entry not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            if entry in sys.path:
                sys.path.remove(entry)


def _gate_path(name: str, directory: Path) -> Path:
    """Where the gate named `name` goes: pytest collects test_*.py."""
    return directory / f"test_{name}.py"


def render_gate(spec: GateSpec, *, shown_path: str) -> str:
    """The gate module's text; `shown_path` is how its commands name the file."""
    calibrate = f"pytest {shlex.quote(shown_path)} --mlx-calibrate"
    fields = ("name", spec.name), (spec.kind, spec.target), ("ref", spec.ref), ("cand", spec.cand), ("path", spec.path)
    marker = (
        ",\n".join(
            f"        {_literal(value)}" if key == "name" else f"        {key}={_literal(value)}"
            for key, value in fields
        )
        + ","
    )
    if spec.kind == "patch":
        title = f"`{spec.name}` (patch `{spec.target}`): {_patch_short(spec.cand)} vs {_patch_short(spec.ref)}."
        lever = (
            f"Lever `{spec.name}` patches `{spec.target}` (and every module-level copy bound by that name, as a\n"
            "model file's own import), restored after each arm:\n"
            f"- reference arm: {_patch_arm(spec.ref, spec.target, 'reference')};\n"
            f"- candidate arm: {_patch_arm(spec.cand, spec.target, 'candidate')}."
        )
        plant_values = (spec.ref or "original", "mymod:broken")
        plant_note = f"mymod:broken: a function with {spec.target}'s signature and the bug"
    else:
        title = f"`{spec.name}` (env `{spec.target}`): {_env_short(spec.cand)} vs {_env_short(spec.ref)}."
        lever = (
            f"Lever `{spec.name}` sets the environment variable `{spec.target}` for each arm (read at call time),\n"
            "restored afterwards:\n"
            f"- reference arm: {_env_arm(spec.target, spec.ref)};\n"
            f"- candidate arm: {_env_arm(spec.target, spec.cand)}, the code under test."
        )
        plant_values = (spec.ref or "unset", "BROKEN")
        plant_note = f"BROKEN: a value of {spec.target} that selects the broken variant"
    plant = f"pytest {shlex.quote(shown_path)} --mlx-lever {spec.name}"
    plant_args = f"--mlx-ref-value {shlex.quote(plant_values[0])} --mlx-cand-value {shlex.quote(plant_values[1])}"
    from ..verdicts.known_bad_step import known_bad_step

    known_bad = known_bad_step(
        shown_path, {"kind": spec.kind, "name": spec.name, "target": spec.target, "ref": spec.ref}
    )
    return _MODULE.substitute(
        title=_doc(title),
        known_bad_comment="\n".join(
            textwrap.wrap(
                f"The known-bad variant test_drift's limits must catch (test_known_bad fails until it is set, then "
                f"passes only when test_drift fails on it): {' '.join(str(known_bad['what']).split())}. On a model "
                "no calibration file covers, the run first shows the limits fail it there, or the gate is an error.",
                width=116,
                initial_indent="#: ",
                subsequent_indent="#: ",
                break_on_hyphens=False,
            )
        ),
        lever=_doc(lever),
        path=_PATHS[spec.path],
        calibrate=_doc(calibrate),
        calibrate_literal=_literal(calibrate),
        plant=_doc(plant),
        plant_values=_doc(plant_args),
        plant_note=_doc(plant_note),
        stem=_doc(Path(shown_path).stem),
        marker=marker,
    )


def write_gate(spec: GateSpec, directory: Path) -> Path:
    """Write the gate as `directory/test_NAME.py` (the folder made if missing); never over an existing file."""
    path = _gate_path(spec.name, directory)
    _refuse_existing(path)
    if directory.exists() and not directory.is_dir():
        raise MlxgateUsageError(f"--dir {directory} is a file, not a folder; give the folder the gate goes in")
    text = render_gate(spec, shown_path=_shown(path))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x", encoding="utf-8") as f:  # "x": fails rather than replace a file made meanwhile
            f.write(text)
    except FileExistsError:
        _refuse_existing(path)
        raise
    return path


def _refuse_existing(path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise MlxgateUsageError(
            f"{_shown(path)} already exists and mlxgate never overwrites a file; choose another NAME, or delete "
            f"{_shown(path)} first if you mean to start that gate over"
        )


def next_steps(path: Path) -> str:
    """What the CLI prints: the file written, then what to do next."""
    file = shlex.quote(_shown(path))
    return (
        f"wrote {_shown(path)}\n"
        f"next: pytest {file} --mlx-calibrate  (measures it and prints the limits to paste into its tests)\n"
        "then: set KNOWN_BAD in it to a broken variant (its test_known_bad checks that the limits fail it)\n"
        f"and:  pytest {file}\n"
    )


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies inside it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _patch_short(value: str | None) -> str:
    return "the original" if value is None else f"`{value}`"


def _patch_arm(value: str | None, target: str, arm: str) -> str:
    if value is None:
        return f"the original `{target}`, as it ships" + (" (the code under test)" if arm == "candidate" else "")
    if value.startswith(f"{REFERENCE_OPS}:"):
        return f"`{value}`: the same maths in plain mlx ops, in float32"
    if arm == "candidate":
        return f"`{value}`, the code under test"
    return f"`{value}` (TODO: why it is the trusted reference)"


def _env_short(value: str | None) -> str:
    return "unset" if value is None or value.lower() == "unset" else repr(value)


def _env_arm(var: str, value: str | None) -> str:
    return f"`{var}` unset" if value is None or value.lower() == "unset" else f"`{var}={value!r}`"


def _literal(value: object) -> str:
    """`value` as a Python literal: repr, in double quotes where that needs no escape (as the gates write)."""
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        text = f'"{text[1:-1]}"'
    return text


def _doc(text: str) -> str:
    """Text for inside the module docstring: backslashes and quotes escaped, so it reads back as written."""
    return text.replace("\\", "\\\\").replace('"', '\\"')
