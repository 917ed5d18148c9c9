"""The known-bad step beside every calibration's limits: what to plant so the limits are shown to catch a
broken variant of the lever, the gate's `KNOWN_BAD = ...` line and a one-off command that must fail; and a
KNOWN_BAD value in the words messages and the terminal use. Only the standard library: the xdist controller
renders it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

__all__ = ["known_bad_step", "known_bad_text"]


def known_bad_step(module: str | None, lever: Mapping[str, Any] | None) -> dict[str, Any]:
    """What to plant so the limits are shown to catch a broken variant, and the commands that show it:
    `what` (the variant), `declare` (the gate's `KNOWN_BAD = ...`, which its `test_known_bad` runs;
    None for a model lever) and `command` (a one-off run that must fail; None where the reference
    value has no command-line form)."""
    file = shlex.quote(module) if module else "gates/test_NAME.py"
    lever = lever or {}
    kind, name, target, ref = lever.get("kind"), lever.get("name") or "NAME", lever.get("target"), lever.get("ref")
    cli_ref: str | None = None
    if kind == "patch":
        example, what = "mymod:broken", f"a function with {target}'s signature and the bug (e.g. mymod:broken)"
        cli_ref = str(ref) if ref else "original"
    elif kind == "env":
        example, what = "BROKEN", f"a value of {target} that selects a broken variant (e.g. BROKEN)"
        cli_ref = str(ref) if ref else "unset"
    elif kind == "kv":
        example, what = "2", "a KV setting that loses far more (e.g. 2: a 2-bit cache)"
        cli_ref = "plain" if ref in (None, "plain") else None
    elif kind == "weights":
        example, what = "2", "a quantization that loses far more (e.g. 2: 2-bit weights)"
        cli_ref = "none" if ref in (None, "weights as loaded") else None
    elif kind == "model":
        return {
            "what": "a broken candidate model (e.g. a bad conversion of the same weights)",
            "declare": None,
            "command": f"pytest {file} --mlx-candidate BROKEN_MODEL",
        }
    elif kind == "context":  # a switch with no broken value: the known-bad is a whole lever with the bug
        path = lever.get("path") or "prefill"
        return {
            "what": f"a whole lever on the gate's path whose candidate has the bug, as {target or 'a context'} "
            "has no broken value (e.g. a patch of a function it switches with mymod:broken)",
            "declare": 'KNOWN_BAD = pytest.mark.mlx_lever("broken", patch="package.module.attr", ref=None, '
            f'cand="mymod:broken", path="{path}")',
            "command": f"pytest {file} --mlx-lever patch:package.module.attr --mlx-ref-value original "
            "--mlx-cand-value mymod:broken",
        }
    else:
        example = "BROKEN"
        what = f"a value {target or 'the lever'} takes that selects a broken variant (e.g. BROKEN)"
    command = (
        (
            f"pytest {file} --mlx-lever {shlex.quote(str(name))} --mlx-ref-value {shlex.quote(cli_ref)} "
            f"--mlx-cand-value {shlex.quote(example)}"
        )
        if cli_ref is not None
        else None
    )
    declare = f"KNOWN_BAD = {example}" if kind in ("kv", "weights") else f'KNOWN_BAD = "{example}"'
    return {"what": what, "declare": declare, "command": command}


def known_bad_text(value: object) -> str:
    """KNOWN_BAD as messages and the terminal show it: a value by its repr (`'mymod:broken'`, `{'bits':
    4}`); a whole lever, as the calibration file keeps it (`Lever.to_json()`), by what it switches:
    `mlx_lever 'name' (patch mlx.core.fast.rope: original → mymod:broken, path=serving)`."""
    if isinstance(value, Mapping) and {"name", "kind", "ref", "cand"} <= set(value):
        target = f" {value['target']}" if value.get("target") else ""
        return (
            f"mlx_lever {value['name']!r} ({value['kind']}{target}: {value['ref']} → {value['cand']}, "
            f"path={value.get('path')})"
        )
    return repr(value)
