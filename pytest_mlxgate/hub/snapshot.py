"""snapshot_download: a whole repo at one commit, verified, in huggingface_hub's cache layout."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..common.commits import COMMIT_RE
from .cache import RepoCache, RepoFile
from .environment import REPO_TYPES, resolve_cache_dir, resolve_endpoint, resolve_offline, resolve_token
from .errors import HubError, HubOfflineError, HubVerifyError
from .fetch import FetchStats, fetch_blob, resumable_bytes
from .integrity import BlobCheck
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
    the ones the cache lacks or holds damaged (resuming partial ones, setting damaged blobs aside);
    a pinned commit whose snapshot is complete touches no network at all. Offline it returns the
    cached snapshot or says what is missing or damaged. Either way every cached blob is checked
    against its verified stamp, and hashed again when its stat no longer matches (`integrity`).
    """
    if repo_type not in REPO_TYPES:
        raise HubError(f"repo_type must be one of {', '.join(REPO_TYPES)}, not {repo_type!r}")
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or any(p in ("", ".", "..") for p in repo_id.split("/")):
        raise HubError(f"{repo_id!r} is not a repo id: write it as org/name (e.g. mlx-community/gemma-4-e4b-it-4bit)")
    cache = RepoCache(resolve_cache_dir(cache_dir), repo_id, repo_type)
    policy = policy or RetryPolicy()

    if resolve_offline(offline):
        return _offline_snapshot(cache, revision)
    if COMMIT_RE.match(revision):
        done = cache.complete_snapshot(revision)
        if done is not None:
            return done

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
        _refuse_damaged(cache, commit, _linked_problems(cache, commit))
        return cache.snapshot_dir(commit)
    missing = cache.missing_files(commit, files)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise HubOfflineError(
            f"offline, and the cached {what} (commit {commit}) is incomplete: missing {shown}. "
            "Run once with network to finish it; it resumes where it stopped"
        )
    _refuse_damaged(cache, commit, cache.snapshot_problems(commit, files))
    return cache.snapshot_dir(commit)


def _linked_problems(cache: RepoCache, commit: str) -> dict[str, BlobCheck]:
    """A huggingface_hub snapshot's files checked through their links: each blob is named by its hash."""
    snap = cache.snapshot_dir(commit)
    problems = {}
    for entry in sorted(snap.rglob("*")):
        if entry.is_dir():
            continue
        rel = entry.relative_to(snap).as_posix()
        blob = Path(os.path.realpath(entry))
        if not entry.is_symlink() or blob.parent != Path(os.path.realpath(cache.blobs)):
            problems[rel] = BlobCheck(
                blob.name, "unnamed", why="it is not a link to a hash-named blob, so it can't be checked"
            )
            continue
        check = cache.check_blob(blob.name)
        if not check.ok:
            problems[rel] = check
    return problems


def _refuse_damaged(cache: RepoCache, commit: str, problems: dict[str, BlobCheck]) -> None:
    """Offline, a file that is not what was verified is an error: the model read would not be the hub's."""
    if not problems:
        return
    shown = "; ".join(f"{path}: {check.why}" for path, check in list(problems.items())[:5])
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    name = cache.repo_id + ("" if cache.read_ref("main") == commit else f"@{commit}")
    flags = (" --dataset" if cache.repo_type == "dataset" else "") + f" --cache-dir {cache.cache_dir}"
    raise HubVerifyError(
        f"offline, and files of the cached {cache.repo_type} {cache.repo_id}@{commit[:7]} are not the bytes "
        f"that were verified: {shown}{more}. They are not used: a model read from them would not be the one the "
        f"hub's hashes name. Fix: run `mlxgate get {name}{flags}` with network (it fetches them again and "
        f"keeps the damaged blobs aside as *.corrupt-*), or `mlxgate verify {name}{flags}` to list every "
        "damaged file"
    )


def _missing_blobs(cache: RepoCache, files: list[RepoFile]) -> list[RepoFile]:
    """The blobs to fetch: absent, short or long, or no longer the bytes that were verified (set aside)."""
    by_etag: dict[str, RepoFile] = {}
    for f in files:
        by_etag.setdefault(f.etag, f)  # identical content under two names is fetched once
    todo = []
    for f in by_etag.values():
        check = cache.check_blob(f.etag, f.size)
        if check.state == "damaged":
            with contextlib.suppress(FileNotFoundError):  # another process set it aside first
                cache.set_aside(f.etag)
        if not check.ok:
            todo.append(f)
    return todo


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
