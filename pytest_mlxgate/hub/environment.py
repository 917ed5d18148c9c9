"""Where the defaults come from: the same environment variables huggingface_hub reads."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_TYPES = ("model", "dataset")


def _hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The hub cache: argument, else HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("HF_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    return _hf_home() / "hub"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The hub origin: argument, else HF_ENDPOINT, else https://huggingface.co (no trailing slash)."""
    value = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return value.rstrip("/")


def resolve_token(token: str | None = None) -> str | None:
    """The user's token: argument, else HF_TOKEN, else the file $HF_HOME/token; None if none."""
    if token:
        return token
    env = os.environ.get("HF_TOKEN")
    if env:
        return env.strip() or None
    path = Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token").expanduser()
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def resolve_offline(offline: bool | None = None) -> bool:
    """Offline: argument, else HF_HUB_OFFLINE set to a true value."""
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def token_source_hint() -> str:
    """Where a token would come from, for error messages (never the token itself)."""
    path = Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token").expanduser()
    return f"set HF_TOKEN or put a token in {path} (create one at <endpoint>/settings/tokens)"
