"""From a parsed name to a snapshot on disk, pinned to a commit, described by plain JSON-able data.

The plugin and the CLI both go through `materialize`. Its result, `ResolvedSnapshot`, is what the
xdist controller ships to workers, so it holds only strings and numbers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from ..common.commits import is_commit
from ..config.names import BUILT_MODELS, CandidateSpec
from ..hub import snapshot_download
from .embedded import ensure_builtin_snapshot

__all__ = ["ProgressFn", "ResolvedSnapshot", "materialize"]

ProgressFn = Callable[[int, int], None]
Source = Literal["cached", "downloaded", "built", "local"]
LOCAL_COMMIT = "local"


@dataclass(frozen=True)
class ResolvedSnapshot:
    """A snapshot on disk: which name asked for it, which repo and commit it is, where it lies."""

    name: str  # as the user wrote it
    kind: Literal["embedded", "hub", "local"]
    repo_id: str | None  # None for a local directory
    commit: str  # 40-hex commit, or "local"
    path: str  # absolute
    repo_type: str = "model"
    source: Source = "cached"  # what materialize had to do to produce it
    fetched_bytes: int = 0
    seconds: float = 0.0

    @property
    def dir(self) -> Path:
        return Path(self.path)

    @property
    def pinned(self) -> str:
        """`repo@commit7`, or the directory for a local snapshot: how reports name the model."""
        if self.repo_id is None:
            return self.path
        return f"{self.repo_id}@{self.commit[:7]}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ResolvedSnapshot:
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def materialize(
    spec: CandidateSpec,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
    progress: ProgressFn | None = None,
    repo_type: str = "model",
) -> ResolvedSnapshot:
    """Put `spec` on disk (download, build or just look) and pin it to its commit.

    Hub errors propagate as `pytest_mlxgate.hub.HubError`; callers own their wording.
    """
    start = time.monotonic()
    seen = _ProgressTap(progress)
    if spec.kind == "local":
        assert spec.path is not None
        path, repo_id, source = spec.path, None, "local"
    elif spec.kind == "embedded":
        path = ensure_builtin_snapshot(spec.name, cache_dir, progress=seen)
        repo_id = BUILT_MODELS[spec.name]
        source = "built" if seen.done else "cached"
    else:
        assert spec.repo_id is not None
        path = snapshot_download(
            spec.repo_id,
            revision=spec.revision or "main",
            repo_type=repo_type,
            cache_dir=cache_dir,
            endpoint=endpoint,
            offline=offline,
            progress=seen,
        )
        repo_id = spec.repo_id
        source = "downloaded" if seen.done else "cached"
    path = Path(path)
    return ResolvedSnapshot(
        name=spec.name,
        kind=spec.kind,
        repo_id=repo_id,
        commit=LOCAL_COMMIT if spec.kind == "local" else _commit_of(path),
        path=str(path),
        repo_type=repo_type,
        source=source,  # type: ignore[arg-type]
        fetched_bytes=seen.done if spec.kind == "hub" else 0,  # the builder counts files
        seconds=round(time.monotonic() - start, 3),
    )


def _commit_of(snapshot_dir: Path) -> str:
    """The hub cache names snapshot folders by their commit; that is the pin workers receive."""
    commit = snapshot_dir.name
    if not is_commit(commit):
        raise ValueError(f"snapshot folder {snapshot_dir} is not named by a 40-hex commit")
    return commit


class _ProgressTap:
    """Forwards progress and remembers whether any bytes moved (downloaded vs cached)."""

    def __init__(self, inner: ProgressFn | None) -> None:
        self._inner = inner
        self.done = 0

    def __call__(self, done: int, total: int) -> None:
        self.done = max(self.done, done)  # called from threads; max() keeps it monotonic enough
        if self._inner is not None:
            self._inner(done, total)
