"""Parse-time checks of option values (argparse `type=`): a bad value stops pytest before anything runs,
with words that say what is wrong and what a value looks like. The option table (`options`) names one of
these for each option; settings read their ini twins through the same ones."""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit

from ..common.redact import redact
from ..errors import MlxgateUsageError, ModelNameError
from .names import check_name_syntax

__all__ = [
    "cache_dir_arg",
    "cache_max_arg",
    "check_endpoint",
    "contexts_arg",
    "count_arg",
    "dtype_arg",
    "endpoint_arg",
    "file_arg",
    "name_arg",
    "seconds_arg",
    "server_url_arg",
    "shard_arg",
    "timeout_arg",
    "times_arg",
    "top_k_arg",
]


def name_arg(value: str) -> str:
    """A model name: reject malformed repo ids before pytest starts."""
    try:
        return check_name_syntax(value)
    except ModelNameError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_endpoint(value: str) -> str:
    """An endpoint is an http(s) origin, optionally with a path prefix; returned without a trailing '/'."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise MlxgateUsageError(
            f"'{_shown(value)}' is not a hub endpoint; expected http(s)://host[:port], e.g. https://huggingface.co"
        )
    return value.strip().rstrip("/")


def _shown(value: str) -> str:
    """A rejected endpoint fit for a message: without a scheme (`user:pass@host`) `redact` would not
    know what precedes the '@' is userinfo."""
    shown = redact(value)
    return shown if "://" in shown or "@" not in shown else f"***@{shown.rpartition('@')[2]}"


def endpoint_arg(value: str) -> str:
    """argparse `type=` for an endpoint."""
    try:
        return check_endpoint(value)
    except MlxgateUsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def dtype_arg(value: str) -> str:
    """A precision (`dtypes.DTYPES`, short names like bf16 too), as its full name."""
    from .dtypes import parse_dtype

    try:
        return parse_dtype(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cache_dir_arg(value: str) -> str:
    """A cache directory: kept a string, but not empty and not a file."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the cache directory must not be empty")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"'{value}' exists and is not a directory")
    return value


def count_arg(value: str) -> int:
    """A positive count (prompts, tokens)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def contexts_arg(value: str) -> tuple[int, ...]:
    """Context lengths in tokens, comma-separated: `600,8192`."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one context length, e.g. 600,8192")
    out = tuple(count_arg(p) for p in parts)
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"'{value}' repeats a length")
    return out


def shard_arg(value: str) -> str:
    """`I/N`: checked now, kept as text (settings parse it, the ini twin too)."""
    from .shards import parse_shard

    try:
        return str(parse_shard(value))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cache_max_arg(value: str) -> str:
    """A cache size cap (`2GiB`, `500MB`, `0`, `none`): checked now, kept as text."""
    from ..common.refstore import parse_cache_max

    try:
        parse_cache_max(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def file_arg(value: str) -> str:
    """An input file that must exist now (not after an hour of model loading)."""
    path = Path(value).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"'{value}' is not a file")
    return value


def seconds_arg(value: str) -> float:
    """A duration in seconds, 0 or more (`0.5`, `30`)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {value}")
    return seconds


def server_url_arg(value: str) -> str:
    """A server arm's base URL: http(s), a host, no password in it (`common.server_endpoint`)."""
    from ..common.server_endpoint import Endpoint

    try:
        return Endpoint.parse(value).url
    except MlxgateUsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def top_k_arg(value: str) -> int:
    """A number of top log-probabilities to ask a server for: 1 to 11."""
    k = count_arg(value)
    if k > 11:
        raise argparse.ArgumentTypeError(f"must be at most 11 (mlx_lm.server's bound), got {k}")
    return k


def times_arg(value: str) -> float:
    """A multiple, 0 or more (`3`, `1.5`): how many times a cost may be spent."""
    try:
        times = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number (a multiple, e.g. 3)") from None
    if not times >= 0 or times == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite multiple, 0 or more, got {value}")
    return times


def timeout_arg(value: str) -> float:
    """A time limit in seconds; 0, `none` or `off` turn it off (returned as 0.0)."""
    if value.strip().lower() in ("none", "off"):
        return 0.0
    return seconds_arg(value)
