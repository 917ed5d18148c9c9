"""The plugin's settings: parse-time validators and one precedence rule, env < ini < command line.

The environment layer is the hub's own (HF_HUB_OFFLINE, HF_ENDPOINT, HF_HUB_CACHE): a setting left
unset here stays None and the hub reads its variable, so the three layers never disagree.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .errors import MlxgateUsageError, ModelNameError
from .names import DEFAULT_CANDIDATE, check_name_syntax, read_tool_table

__all__ = [
    "OPTION_NAMES",
    "Settings",
    "cache_dir_arg",
    "check_endpoint",
    "endpoint_arg",
    "name_arg",
    "read_settings",
]

#: dest/ini name -> command-line flag. A run that sets any of them uses mlxgate.
OPTION_NAMES: dict[str, str] = {
    "mlx_candidate": "--mlx-candidate",
    "mlx_reference": "--mlx-reference",
    "mlx_cache_dir": "--mlx-cache-dir",
    "mlx_offline": "--mlx-offline",
    "mlx_endpoint": "--mlx-endpoint",
}


@dataclass(frozen=True)
class Settings:
    """Merged settings; None means 'not set here: let the hub read its environment variable'."""

    candidate: str
    reference: str | None
    names_dir: dict[str, Path]  # role -> where a relative path in that role's name is relative to
    cache_dir: Path | None
    offline: bool | None
    endpoint: str | None
    pyproject: Path  # the rootdir's pyproject.toml: aliases live there (it may not exist)
    tool_table: dict[str, object] | None  # its [tool.mlxgate], None when absent
    in_use: bool  # any mlxgate option/ini set, or a [tool.mlxgate] table exists


def name_arg(value: str) -> str:
    """argparse `type=` for model names: reject malformed repo ids before pytest starts."""
    try:
        return check_name_syntax(value)
    except ModelNameError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_endpoint(value: str) -> str:
    """An endpoint is an http(s) origin, optionally with a path prefix; returned without a trailing '/'."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise MlxgateUsageError(
            f"'{value}' is not a hub endpoint; expected http(s)://host[:port], e.g. https://huggingface.co"
        )
    return value.strip().rstrip("/")


def endpoint_arg(value: str) -> str:
    """argparse `type=` for --mlx-endpoint."""
    try:
        return check_endpoint(value)
    except MlxgateUsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cache_dir_arg(value: str) -> str:
    """argparse `type=` for --mlx-cache-dir: kept a string, but not empty and not a file."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the cache directory must not be empty")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"'{value}' exists and is not a directory")
    return value


def read_settings(config: pytest.Config) -> Settings:
    """Merge command line over ini; relative paths are relative to where each was written."""
    cli = {name: config.getoption(name) for name in OPTION_NAMES}
    ini = {name: config.getini(name) for name in OPTION_NAMES}
    pyproject = config.rootpath / "pyproject.toml"
    try:
        tool_table = read_tool_table(pyproject)
        ini_cand, ini_ref, ini_endpoint = (
            _ini(config, "mlx_candidate", check_name_syntax),
            _ini(config, "mlx_reference", check_name_syntax),
            _ini(config, "mlx_endpoint", check_endpoint),
        )
    except MlxgateUsageError as e:
        raise pytest.UsageError(str(e)) from None
    inidir = config.inipath.parent if config.inipath else config.invocation_params.dir
    cache_dir = (
        config.invocation_params.dir / Path(cli["mlx_cache_dir"]).expanduser()
        if cli["mlx_cache_dir"]
        else inidir / Path(ini["mlx_cache_dir"]).expanduser()
        if ini["mlx_cache_dir"]
        else None
    )
    in_use = (
        any(v not in (None, "") for v in cli.values())
        or any(v not in (None, "") for v in ini.values())
        or tool_table is not None
    )
    return Settings(
        candidate=cli["mlx_candidate"] or ini_cand or DEFAULT_CANDIDATE,
        reference=cli["mlx_reference"] or ini_ref,
        names_dir={
            role: config.invocation_params.dir if cli[f"mlx_{role}"] else inidir
            for role in ("candidate", "reference")
        },
        cache_dir=cache_dir,
        offline=True if cli["mlx_offline"] else ini["mlx_offline"],
        endpoint=cli["mlx_endpoint"] or ini_endpoint,
        pyproject=pyproject,
        tool_table=tool_table,
        in_use=in_use,
    )


def _ini(config: pytest.Config, name: str, check: Callable[[str], str]) -> str | None:
    """An ini string value checked like its command-line twin (argparse never sees ini values)."""
    value = config.getini(name)
    if not value:
        return None
    try:
        return check(str(value))
    except MlxgateUsageError as e:
        where = config.inipath or "the ini file"
        raise MlxgateUsageError(f"{name} in {where}: {e}") from None
