"""Fetching one blob: resumable, hashed while it streams, published only when verified.

A partial download being written is blobs/<etag>.live-<pid>-<id>.mlxgate-partial: a name no
one else writes to. When its writer stops (an error, Ctrl-C) it renames the file to a left-over
name; a later run claims a left-over by renaming it to its own live name (atomic: one claimer
wins), re-hashes its prefix from disk in constant memory and asks for the rest with Range.
A live partial is never taken from its writer unless it has not changed for STALE_AFTER seconds
(its writer died without cleaning up): so even where the lock does nothing, no two writers ever
share a file, and the file that gets published was written by the one who verified it.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from filelock import FileLock

from ..common.atomic import fsync_dir
from .cache import RepoCache, RepoFile
from .errors import HubChecksumError, HubProtocolError, HubRetryError
from .hashing import CHUNK, Hasher, hash_file_prefix, new_hasher
from .integrity import write_stamp
from .transport import HubClient, RetryPolicy, TransientError, check_status, redact

PARTIAL_SUFFIX = ".mlxgate-partial"
LIVE_PREFIX = "live-"
STALE_AFTER = 600.0  # seconds unchanged before a live partial counts as abandoned (watchdog ≪ this)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")

Progress = Callable[[int], None]  # called with the number of new bytes written


@dataclass
class FetchStats:
    """What one blob fetch cost: the numbers tests and benchmarks assert on."""

    requests: int = 0
    bytes_received: int = 0
    resumed_from: int = 0
    checksum_failures: int = 0
    restarts: int = 0
    errors: list[str] = field(default_factory=list)


class _Stalled(TransientError):
    pass


class _Partial:
    """The writer's own partial file, with the hash of what it holds so far."""

    def __init__(self, path: Path, file: RepoFile) -> None:
        self.path = path
        self.file = file
        self.f = open(path, "r+b" if path.exists() else "w+b")
        self.hasher: Hasher = new_hasher(file.algo, file.size)
        self.size = 0

    def adopt_existing(self) -> int:
        """Hash what is already on disk (streaming: memory is one chunk whatever the size)."""
        on_disk = os.fstat(self.f.fileno()).st_size
        if on_disk > self.file.size:
            on_disk = 0  # longer than the file can be: not a prefix of it
        self.f.truncate(on_disk)
        self.hasher, self.size = hash_file_prefix(self.path, self.file.algo, self.file.size, on_disk)
        self.f.seek(self.size)
        return self.size

    def restart(self) -> None:
        self.f.seek(0)
        self.f.truncate(0)
        self.hasher = new_hasher(self.file.algo, self.file.size)
        self.size = 0

    def write(self, data: bytes | bytearray) -> None:
        self.f.write(data)
        self.hasher.update(data)
        self.size += len(data)

    def close(self) -> None:
        """Close even when a full disk refuses the last buffered bytes: the file stays a prefix to resume."""
        try:
            self.f.close()
        except OSError:
            pass


def fetch_blob(
    client: HubClient,
    cache: RepoCache,
    file: RepoFile,
    url: str,
    *,
    progress: Progress | None = None,
) -> FetchStats:
    """Make blobs/<etag> exist, verified. Safe across threads and processes; idempotent."""
    stats = FetchStats()
    blob = cache.blob_path(file.etag)
    if _is_published(cache, file):
        return stats
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = cache.lock_path(file.etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    # The lock saves bandwidth (one fetch per blob across processes); correctness comes from
    # hashing and atomic publishing, so a lock that silently does nothing (NFS) costs only bytes.
    with FileLock(str(lock)):
        if _is_published(cache, file):
            return stats
        partial = _Partial(_claim_partial(cache.blobs, file.etag), file)
        try:
            _download(client, file, url, partial, stats, progress)
            _publish(partial, blob, cache.stamp_path(file.etag))
        finally:
            partial.close()
            _leave(partial.path)
    return stats


def resumable_bytes(blobs: Path, file: RepoFile) -> int:
    """What the largest partial of `file` already holds: bytes a resume will not fetch again."""
    sizes = [_size(p) for p in blobs.glob(f"{file.etag}.*{PARTIAL_SUFFIX}")]
    return max([n for n in sizes if n <= file.size], default=0)


def _is_published(cache: RepoCache, file: RepoFile) -> bool:
    """The blob is there, whole, and the bytes that hash to its name (a short or empty one is not)."""
    return cache.check_blob(file.etag, file.size).ok


def _claim_partial(blobs: Path, etag: str) -> Path:
    """Take over the largest left-over partial (atomic rename), or name a fresh one.

    Other left-overs of the same blob are deleted: they have no writer, and we keep the best.
    """
    mine = blobs / f"{etag}.{LIVE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}"
    now = time.time()
    candidates = [p for p in blobs.glob(f"{etag}.*{PARTIAL_SUFFIX}") if _abandoned(p, now)]
    claimed = False
    for old in sorted(candidates, key=_size, reverse=True):
        try:
            if not claimed:
                os.rename(old, mine)
                claimed = True
            else:
                old.unlink()
        except OSError:
            continue  # another process got to it first
    return mine


def _abandoned(path: Path, now: float) -> bool:
    """A left-over, or a live partial whose writer has not touched it for STALE_AFTER seconds."""
    if not path.name.split(".", 2)[1].startswith(LIVE_PREFIX):
        return True
    try:
        return now - path.stat().st_mtime > STALE_AFTER
    except OSError:
        return False


def _leave(path: Path) -> None:
    """Our partial outlived the fetch (an error): give it a left-over name so the next run resumes it."""
    if not path.exists():
        return  # published, or nothing written
    if _size(path) <= 0:
        path.unlink(missing_ok=True)
        return
    etag = path.name.split(".", 1)[0]
    try:
        os.replace(path, path.with_name(f"{etag}.left-{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}"))
    except OSError:
        pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _download(
    client: HubClient,
    file: RepoFile,
    url: str,
    partial: _Partial,
    stats: FetchStats,
    progress: Progress | None,
) -> None:
    policy = client.policy
    stats.resumed_from = partial.adopt_existing()
    if progress and partial.size:
        progress(partial.size)
    high_water = partial.size
    failures = 0
    use_range = True
    while True:
        if partial.size == file.size:
            if partial.hasher.hexdigest() == file.etag:
                return
            stats.checksum_failures += 1
            stats.errors.append(f"checksum mismatch (try {stats.checksum_failures})")
            if stats.checksum_failures > policy.max_checksum_failures:
                partial.restart()
                raise HubChecksumError(
                    f"{file.path}: the bytes served failed their {file.algo} check "
                    f"{stats.checksum_failures} times (expected {file.etag}); the server or a proxy "
                    f"corrupts them. Nothing was kept. Try again later or another endpoint."
                )
            if progress:
                progress(-partial.size)
            partial.restart()
            stats.restarts += 1
            high_water = 0
            continue
        if stats.requests >= policy.max_attempts:
            raise HubRetryError(f"{file.path}: gave up after {stats.requests} requests ({_last(stats)})")
        stats.requests += 1
        try:
            failure = _one_request(client, url, partial, stats, progress, use_range)
        except TransientError as exc:
            failure = exc
        if failure is not None:
            stats.errors.append(str(failure))
            if isinstance(failure, _RangeRefused):
                use_range = False
        progressed = partial.size > high_water
        high_water = max(high_water, partial.size)
        if progressed and not isinstance(failure, _Stalled):
            failures = 0  # new ground: the retry budget starts afresh (a trickle earns no reset)
            continue
        if partial.size == file.size:
            continue  # every byte is in, however the request ended (a watchdog on its last piece): check them
        failures += 1  # a failure, or a clean answer that brought nothing new
        if failures > policy.max_retries:
            raise HubRetryError(
                f"{file.path}: gave up after {failures} tries in a row without progress "
                f"({_last(stats)}); {partial.size} of {file.size} bytes are kept and the next run resumes there"
            )
        time.sleep(policy.backoff(failures, failure.retry_after if failure else None))


class _RangeRefused(TransientError):
    """The server answered a Range with the wrong part: ask for the whole file next time."""


def _last(stats: FetchStats) -> str:
    return stats.errors[-1] if stats.errors else "no error recorded"


def _one_request(
    client: HubClient,
    url: str,
    partial: _Partial,
    stats: FetchStats,
    progress: Progress | None,
    use_range: bool,
) -> TransientError | None:
    """One GET of `partial`'s file; returns None when it made the attempt cleanly (full or short body),
    else the failure."""
    file = partial.file
    headers = {}
    start = partial.size if use_range else 0
    if start:
        headers["Range"] = f"bytes={start}-"
    response = client.open(url, headers)
    try:
        if response.status_code == 416:
            # The server says we asked past the end: whatever we hold is wrong or complete.
            if partial.size != file.size:
                if progress:
                    progress(-partial.size)
                partial.restart()
                return _RangeRefused(f"{file.path}: 416 for bytes={start}-")
            return None
        check_status(response, f"downloading {file.path}", client)
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            raise HubProtocolError(
                f"{file.path}: {redact(str(response.url))} sent Content-Encoding {encoding!r} although "
                "identity was asked; the bytes can't be checked against the hub's hash"
            )
        if response.status_code == 206:
            match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
            if not match or int(match.group(1)) != start:  # recorded once, by the caller, like every failure
                return _RangeRefused(
                    f"{file.path}: asked bytes={start}- but got Content-Range {response.headers.get('content-range')!r}"
                )
        elif response.status_code == 200:
            if partial.size:
                # Range ignored: the body is the whole file, so start over with it.
                if progress:
                    progress(-partial.size)
                partial.restart()
                stats.restarts += 1
        else:
            raise HubProtocolError(f"{file.path}: unexpected status {response.status_code} for a download")
        _stream_body(response, partial, stats, progress, client.policy)
    finally:
        response.close()
    return None


def _stream_body(
    response: httpx.Response,
    partial: _Partial,
    stats: FetchStats,
    progress: Progress | None,
    policy: RetryPolicy,
) -> None:
    file = partial.file
    window_start = time.monotonic()
    window_bytes = 0
    # Pieces arrive 64 KiB at a time; writing, hashing and reporting them in 1 MiB batches keeps
    # the per-piece Python work (and GIL traffic between download threads) small. The watchdog
    # still looks at every piece; whatever arrived is kept, even when the connection then fails.
    pending = bytearray()

    def drain() -> None:
        if not pending:
            return
        n = len(pending)
        try:
            partial.write(pending)
        finally:
            # Offered once: a write a full disk cut short, offered again, would land after its own prefix.
            del pending[:]
        if progress:
            progress(n)

    try:
        for chunk in response.iter_raw():
            room = file.size - partial.size - len(pending)
            stats.bytes_received += len(chunk)
            if len(chunk) > room:
                # More bytes than the file has: whatever this is, it is not our file.
                pending += chunk[:room]
                raise TransientError(f"{file.path}: the server sent more than {file.size} bytes")
            pending += chunk
            if len(pending) >= CHUNK:
                drain()
            window_bytes += len(chunk)
            now = time.monotonic()
            if now - window_start >= policy.stall_window:
                if window_bytes < policy.min_bytes_per_window:
                    raise _Stalled(
                        f"{file.path}: only {window_bytes} bytes in {now - window_start:.1f}s (no-progress watchdog)"
                    )
                window_start, window_bytes = now, 0
    except httpx.TransportError as exc:
        raise TransientError(f"{file.path}: {type(exc).__name__} after {partial.size + len(pending)} bytes") from exc
    finally:
        drain()
    partial.f.flush()


def _publish(partial: _Partial, blob: Path, stamp: Path) -> None:
    """fsync, check the size on disk, then give the verified bytes their final name atomically and stamp them."""
    partial.f.flush()
    os.fsync(partial.f.fileno())
    if os.fstat(partial.f.fileno()).st_size != partial.file.size:
        raise HubProtocolError(f"{partial.file.path}: the partial file changed size under us; not published")
    try:
        os.chmod(partial.path, 0o644)
        os.replace(partial.path, blob)
    except FileNotFoundError as exc:
        raise HubProtocolError(
            f"{partial.file.path}: our partial file vanished before publishing (another process removed "
            f"it); nothing was published, run again"
        ) from exc
    fsync_dir(blob.parent)
    write_stamp(stamp, partial.file.etag, os.fstat(partial.f.fileno()))  # the inode we wrote and hashed
