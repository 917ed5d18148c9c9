"""A stand-in for `pytest_mlxgate.hub` in the plugin's and the CLI's wiring tests.

It keeps the hub's contract (signatures, cache layout, commit-named snapshot folders, HubError
subclasses) without network or httpx, and logs every call as a JSON line to $STANDIN_HUB_LOG so
tests can count resolutions and see the arguments the wiring passed. The real downloader has its
own tests against the fake hub.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

COMMIT = "c0ffee" + "0" * 34
PAYLOAD = b'{"model_type": "standin"}'


class HubError(Exception):
    pass


class HubNotFoundError(HubError):
    pass


class HubOfflineError(HubError):
    pass


@dataclass
class VerifyReport:
    ok: bool
    path: Path
    files_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)


def _log(call: str, **kwargs: object) -> None:
    log = os.environ.get("STANDIN_HUB_LOG")
    if not log:
        return
    entry = {"call": call, "worker": os.environ.get("PYTEST_XDIST_WORKER", "controller"), **kwargs}
    with open(log, "a") as f:
        f.write(json.dumps(entry, default=str) + "\n")


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ["HF_HUB_CACHE"])


def _snapshot_dir(repo_id: str, repo_type: str, commit: str, cache_dir: object) -> Path:
    folder = f"{repo_type}s--{repo_id.replace('/', '--')}"
    return resolve_cache_dir(cache_dir) / folder / "snapshots" / commit  # type: ignore[arg-type]


def snapshot_download(
    repo_id: str,
    *,
    revision: str = "main",
    repo_type: str = "model",
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    offline: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    _log("snapshot_download", repo_id=repo_id, revision=revision, repo_type=repo_type,
         cache_dir=cache_dir, endpoint=endpoint, offline=offline)
    if repo_id.startswith("missing/"):
        raise HubNotFoundError(f"{repo_id} does not exist on the hub (404); check the name")
    commit = revision if len(revision) == 40 else COMMIT
    snap = _snapshot_dir(repo_id, repo_type, commit, cache_dir)
    if (snap / "config.json").exists():
        return snap
    if offline:
        raise HubOfflineError(f"{repo_id} is not in the cache and we are offline")
    snap.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(0, len(PAYLOAD))
    (snap / "config.json").write_bytes(PAYLOAD)
    if progress:
        progress(len(PAYLOAD), len(PAYLOAD))
    return snap


def verify_snapshot(
    repo_id: str,
    *,
    revision: str = "main",
    repo_type: str = "model",
    cache_dir: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    _log("verify_snapshot", repo_id=repo_id, revision=revision, repo_type=repo_type)
    commit = revision if len(revision) == 40 else COMMIT
    snap = _snapshot_dir(repo_id, repo_type, commit, cache_dir)
    if not snap.is_dir():
        raise HubNotFoundError(f"{repo_id}@{revision} is not in the cache; fetch it first")
    files = sorted(p for p in snap.iterdir() if p.is_file())
    problems = [f"{p.name}: sha256 mismatch" for p in files if p.name.startswith("corrupt")]
    return VerifyReport(
        ok=not problems, path=snap, files_checked=len(files),
        bytes_checked=sum(p.stat().st_size for p in files), problems=problems,
    )


def install() -> ModuleType:
    """Make `pytest_mlxgate.hub` this module (for a subprocess that will not outlive the test)."""
    import pytest_mlxgate

    module = sys.modules[__name__]
    sys.modules["pytest_mlxgate.hub"] = module
    pytest_mlxgate.hub = module  # type: ignore[attr-defined]
    return module
