"""The command that re-runs just one gate: its node id, from where the user typed theirs, with the
run's mlxgate options (those the option table marks as carried), credentials masked: the command
is stored in every record and report."""

from __future__ import annotations

import os
import shlex

import pytest

from ..common.redact import redact_argv
from .options import OPTIONS

__all__ = ["rerun_command"]

_VALUED = frozenset(o.flag for o in OPTIONS if o.in_rerun and o.takes_value)
_FLAGS = frozenset(o.flag for o in OPTIONS if o.in_rerun and not o.takes_value)
_DROPPED_VALUED = frozenset(o.flag for o in OPTIONS if not o.in_rerun and o.takes_value)


def rerun_command(config: pytest.Config, nodeid: str) -> str:
    """`pytest 'nodeid' <the run's --mlx-* options>`: what re-runs just this gate."""
    args = redact_argv(config.invocation_params.args)  # one for one: flags still pair with their values
    kept: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in _VALUED | _DROPPED_VALUED and "=" not in a and i + 1 < len(args):
            if name in _VALUED:
                kept += [a, args[i + 1]]
            i += 2
            continue
        if name in _VALUED or name in _FLAGS:
            kept.append(a)
        i += 1
    return " ".join(["pytest", shlex.quote(_from_invocation_dir(config, nodeid)), *(shlex.quote(k) for k in kept)])


def _from_invocation_dir(config: pytest.Config, nodeid: str) -> str:
    """Node ids are relative to the rootdir; the command must work where the user typed theirs."""
    path, sep, rest = nodeid.partition("::")
    try:
        rel = os.path.relpath(config.rootpath / path, config.invocation_params.dir)
    except ValueError:  # another drive (Windows)
        return nodeid
    return rel + sep + rest
