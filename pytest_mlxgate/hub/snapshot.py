"""snapshot_download: a whole repo at one commit, verified, in huggingface_hub's cache layout."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..common.commits import COMMIT_RE
from .cache import RepoCache, RepoFile
from .environment import REPO_TYPES, resolve_cache_dir, resolve_endpoint, resolve_offline, resolve_token
from .errors import HubError, HubOfflineError
from .fetch import FetchStats, fetch_blob, resumable_bytes
from .listing import list_files, resolve_commit, resolve_url
from .space import NO_ROOM_ERRNOS, disk_filled_up, ensure_room
from .transport import HubClient, RetryPolicy

SnapshotProgress = Callable[[int, int], None]  # (bytes done, bytes to fetch in all)


def snapshot_download(
    repo_id: str,
    *,
    revision: str = "main",
    repo_type: str = "model",
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    offline: bool | None = None,
    progress: SnapshotProgress | None = None,
    policy: RetryPolicy | None = None,
) -> Path:
    """Return the path of a complete, verified snapshot of `repo_id` at `revision`.

    Online, it asks the hub which commit `revision` is, lists that commit's files and fetches
    the ones the cache lacks (resuming partial ones); a pinned commit whose snapshot is complete
    touches no network at all. Offline it returns the cached snapshot or says what is missing.
    """
    if repo_type not in REPO_TYPES:
        raise HubError(f"repo_type must be one of {', '.join(REPO_TYPES)}, not {repo_type!r}")
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or any(p in ("", ".", "..") for p in repo_id.split("/")):
        raise HubError(f"{repo_id!r} is not a repo id: write it as org/name (e.g. mlx-community/gemma-4-e4b-it-4bit)")
    cache = RepoCache(resolve_cache_dir(cache_dir), repo_id, repo_type)
    policy = policy or RetryPolicy()

    if COMMIT_RE.match(revision):
        done = cache.complete_snapshot(revision)
        if done is not None:
            return done
    if resolve_offline(offline):
        return _offline_snapshot(cache, revision)

    with HubClient(resolve_endpoint(endpoint), resolve_token(token), policy) as client:
        commit = resolve_commit(client, repo_id, repo_type, revision)
        files = list_files(client, repo_id, repo_type, commit)
        for f in files:
            cache.snapshot_file(commit, f.path)  # refuse unsafe names before a single byte is written
        what = f"{repo_type} {repo_id}@{commit[:7]}"
        todo = _missing_blobs(cache, files)
        ensure_room(cache.cache_dir, cache.blobs, _bytes_to_fetch(cache, todo), what)
        try:
            _fetch_all(client, cache, commit, todo, policy, progress)
            for f in files:
                cache.link(commit, f)
            cache.write_manifest(commit, files)
            cache.write_ref(revision, commit)
        except OSError as exc:
            if exc.errno not in NO_ROOM_ERRNOS:
                raise
            needed = _bytes_to_fetch(cache, _missing_blobs(cache, files))
            raise disk_filled_up(cache.cache_dir, cache.blobs, needed, what, exc) from exc
    return cache.snapshot_dir(commit)


def _offline_snapshot(cache: RepoCache, revision: str) -> Path:
    what = f"{cache.repo_type} {cache.repo_id}@{revision}"
    commit = cache.read_ref(revision)
    if commit is None or not cache.snapshot_dir(commit).is_dir():
        raise HubOfflineError(
            f"offline, and {what} is not in the cache {cache.cache_dir}. Download it once with network "
            f"(mlxgate get {cache.repo_id}{'' if revision == 'main' else '@' + revision}"
            f"{' --dataset' if cache.repo_type == 'dataset' else ''} --cache-dir {cache.cache_dir}), or go "
            "online: unset HF_HUB_OFFLINE and drop the offline option"
        )
    files = cache.read_manifest(commit)
    if files is None:
        # Written by huggingface_hub itself: no file list to check against, but every link must resolve.
        broken = [p for p in cache.snapshot_dir(commit).rglob("*") if p.is_symlink() and not p.exists()]
        if broken:
            raise HubOfflineError(f"offline, and {what} is incomplete: {len(broken)} files lack their blob")
        return cache.snapshot_dir(commit)
    missing = cache.missing_files(commit, files)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise HubOfflineError(
            f"offline, and the cached {what} (commit {commit}) is incomplete: missing {shown}. "
            "Run once with network to finish it; it resumes where it stopped"
        )
    return cache.snapshot_dir(commit)


def _missing_blobs(cache: RepoCache, files: list[RepoFile]) -> list[RepoFile]:
    by_etag: dict[str, RepoFile] = {}
    for f in files:
        by_etag.setdefault(f.etag, f)  # identical content under two names is fetched once
    return [f for f in by_etag.values() if not _blob_ready(cache, f)]


def _bytes_to_fetch(cache: RepoCache, todo: list[RepoFile]) -> int:
    """What the disk must still take: each missing blob less what its partial already holds."""
    return sum(f.size - resumable_bytes(cache.blobs, f) for f in todo)


def _fetch_all(
    client: HubClient,
    cache: RepoCache,
    commit: str,
    todo: list[RepoFile],
    policy: RetryPolicy,
    progress: SnapshotProgress | None,
) -> list[FetchStats]:
    total = sum(f.size for f in todo)
    lock = threading.Lock()
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            now = done
        if progress:
            progress(now, total)

    def one(f: RepoFile) -> FetchStats:
        url = resolve_url(client.endpoint, cache.repo_id, cache.repo_type, commit, f.path)
        return fetch_blob(client, cache, f, url, progress=advance)

    if progress:
        progress(0, total)
    if not todo:
        return []
    # Largest first keeps the threads busy to the end.
    todo.sort(key=lambda f: f.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, min(policy.workers, len(todo)))) as pool:
        futures = [pool.submit(one, f) for f in todo]
        results = []
        error: BaseException | None = None
        for fut in futures:
            try:
                results.append(fut.result())
            except BaseException as exc:  # keep the first error, let the others finish their files
                error = error or exc
        if error is not None:
            raise error
    return results


def _blob_ready(cache: RepoCache, f: RepoFile) -> bool:
    try:
        return cache.blob_path(f.etag).stat().st_size == f.size
    except OSError:
        return False
