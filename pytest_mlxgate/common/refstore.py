"""The reference caches' files: sealed entries, damage that heals, a size cap with LRU eviction.

An entry is one file: a one-line header with its payload's length and sha256, then the payload
(an npz, a JSON document). The header is checked before anything parses the payload, so a flipped
byte anywhere, a truncated file, or a directory, fifo or dangling symlink at the entry's name is a
miss: reported once, recomputed, and replaced by the store that follows. Reading catches broadly
(a parser's NotImplementedError is a miss too, never a crash). Entries are written atomically; a
hit stamps its entry's mtime, and after each store the least recently used entries go until the
cache fits its cap (never the entry just written). Storing is a by-product: a disk that refuses it
costs a warning, never a verdict.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from filelock import FileLock

from ..errors import MlxgateWarning
from .atomic import atomic_write_bytes

__all__ = [
    "CacheFolder",
    "DEFAULT_CACHE_MAX",
    "DEFAULT_CACHE_MAX_BYTES",
    "DamagedEntry",
    "EntryStore",
    "parse_cache_max",
    "seal",
    "store_or_warn",
    "unseal",
]

#: The default cap. One default-sized KL entry (64 prompts x 256 tokens) is ~59 MB on the
#: embedded model and at most ~134 MB on any vocabulary (1024 kept tokens x 8 bytes per
#: position); this project's gates are ~8 MB each. 2 GiB keeps a few configurations' worth of
#: gates and stops an unattended CI cache (every mlx upgrade is a new set of keys) from growing
#: without bound.
DEFAULT_CACHE_MAX = "2GiB"
DEFAULT_CACHE_MAX_BYTES = 2 * 1024**3

_MAGIC = b"mlxgate-entry 1"
_HEADER = re.compile(rb"mlxgate-entry 1 bytes=(0|[1-9][0-9]{0,15}) sha256=([0-9a-f]{64})\n")
_MAX_HEADER = 128
#: Files the cap counts (and may delete): the caches' own names, nothing a user could have put there.
_ENTRY_NAME = re.compile(r"(?:cap-)?[0-9a-f]{40}\.(?:npz|json)")
#: `atomic_write`'s temp files of entries; one older than this was left by a killed writer.
_TEMP_NAME = re.compile(r"\.(?:cap-)?[0-9a-f]{40}\.(?:npz|json)\.[0-9a-f]{8}\.tmp")
_STALE_TEMP_S = 3600.0
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_NO_CAP = ("none", "off", "unlimited")

T = TypeVar("T")


class DamagedEntry(Exception):
    """An entry's file is not what a store wrote; the message says how (for the report line)."""


def parse_cache_max(text: str) -> int | None:
    """`2GiB`, `500MB`, `1.5 G`, `123` (bytes), `0` (keep only the entry just written), or
    `none`/`off` (no cap) → bytes or None. ValueError with the accepted forms otherwise."""
    value = str(text).strip().lower()
    if value in _NO_CAP:
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)", value)
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(
            f"'{text}' is not a size: give a number with an optional unit (kB, MB, GB, KiB, MiB, "
            "GiB, ...), e.g. 2GiB or 500MB; 0 keeps only the entry just written; none: no cap"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def seal(payload: bytes) -> bytes:
    """The bytes of an entry's file: the header that vouches for `payload`, then `payload`."""
    digest = hashlib.sha256(payload).hexdigest()
    return b"%s bytes=%d sha256=%s\n" % (_MAGIC, len(payload), digest.encode()) + payload


def unseal(data: bytes) -> bytes:
    """The payload `seal` wrapped; DamagedEntry unless every byte is as it was written."""
    end = data.find(b"\n", 0, _MAX_HEADER)
    header = _HEADER.fullmatch(data[: end + 1]) if end >= 0 else None
    if header is None:
        if data.startswith((b"PK\x03\x04", b"{")):
            raise DamagedEntry("no checksum: written by an older mlxgate")
        raise DamagedEntry("no mlxgate entry header" if not data.startswith(_MAGIC) else "its header is damaged")
    payload = data[end + 1 :]
    if len(payload) != int(header.group(1)):
        raise DamagedEntry(f"{len(payload)} bytes where {int(header.group(1))} were written")
    if hashlib.sha256(payload).hexdigest() != header.group(2).decode():
        raise DamagedEntry("checksum mismatch")
    return payload


class EntryStore:
    """The files under one reference cache folder (`root`, its sub-folders' entries included):
    reading and writing sealed entries, reporting damage once, and keeping under `max_bytes`.

    `report` gets the one line about a damaged entry (the session's progress line); without one
    it is a warning. Shared by the KL and capability caches of a run, so a damaged entry is
    reported once whichever cache finds it."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int | None = DEFAULT_CACHE_MAX_BYTES,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.report = report
        self._reported: set[str] = set()

    def load(self, path: Path, decode: Callable[[bytes], T | None]) -> T | None:
        """`decode(payload)` of the entry at `path`, or None: absent, another key's (decode says
        None), or damaged in any way (reported once). Only KeyboardInterrupt and the like get out."""
        try:
            data = _read(path)
            if data is None:
                return None
            value = decode(unseal(data))
        except Exception as e:  # noqa: BLE001 - any way an entry can be broken is a miss, not a crash
            self.damaged(path, e)
            return None
        if value is not None:
            self._stamp(path)
        return value

    def write(self, path: Path, payload: bytes) -> None:
        """Publish `payload` at `path` atomically (replacing whatever is there), then evict down to
        the cap. OSError when the entry cannot be written (`store_or_warn` turns it into a warning)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        _clear(path)
        atomic_write_bytes(path, seal(payload))
        self.evict(keep=path)

    def damaged(self, path: Path, why: BaseException | str) -> None:
        """Say once per entry and store that `path` is damaged and is being recomputed and replaced."""
        if str(path) in self._reported:
            return
        self._reported.add(str(path))
        reason = str(why) if isinstance(why, (DamagedEntry, str)) else f"{type(why).__name__}: {why}"
        line = (
            f"reference cache entry {path} is damaged ({reason[:200]}); "
            "recomputing the reference arm and replacing the entry"
        )
        if self.report is not None:
            self.report(line)
        else:
            warnings.warn(MlxgateWarning(line), stacklevel=3)

    def evict(self, *, keep: Path | None = None) -> list[Path]:
        """Delete least recently used entries until the cache fits `max_bytes`; never `keep`.
        Never raises: files another process deletes (or that cannot be deleted) are passed over."""
        if self.max_bytes is None:
            return []
        try:
            return self._evict(keep)
        except Exception as e:  # noqa: BLE001 - a cap missed this once is better than a run crashed
            warnings.warn(
                MlxgateWarning(
                    f"reference cache {self.root}: eviction skipped ({type(e).__name__}: {e}); "
                    "the cache may exceed --mlx-reference-cache-max until the next store"
                ),
                stacklevel=3,
            )
            return []

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last used, size, path) of every entry under `root` and its immediate sub-folders; a
        temp file a killed writer left behind (over an hour old) is deleted on the way."""
        found: list[tuple[float, int, Path]] = []
        for folder in self._folders():
            try:
                listing = list(os.scandir(folder))
            except OSError:
                continue
            for e in listing:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if _ENTRY_NAME.fullmatch(e.name):
                    found.append((st.st_mtime, st.st_size, Path(e.path)))
                elif _TEMP_NAME.fullmatch(e.name) and time.time() - st.st_mtime > _STALE_TEMP_S:
                    _unlink(Path(e.path))  # a killed writer's leftover
        return found

    def _evict(self, keep: Path | None) -> list[Path]:
        assert self.max_bytes is not None
        entries = sorted(self.entries())
        total = sum(size for _, size, _ in entries)
        kept = _identity(keep) if keep is not None else None
        gone: list[Path] = []
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            if kept is not None and _identity(path) == kept:
                continue
            if _unlink(path):
                gone.append(path)
            total -= size  # deleted here, or by another process: either way it no longer counts
        return gone

    def _folders(self) -> list[Path]:
        folders = [self.root]
        try:
            folders += [Path(e.path) for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
        return folders

    @staticmethod
    def _stamp(path: Path) -> None:
        """A hit: the entry's mtime becomes its last use (atime is unreliable: noatime, relatime)."""
        try:
            os.utime(path)
        except OSError:
            pass  # a read-only cache is still read


def _read(path: Path) -> bytes | None:
    """The file's bytes; None when nothing is there; DamagedEntry for anything but a regular file.
    Opened non-blocking, so a fifo at the entry's name cannot hang the run."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if os.path.islink(path):
            raise DamagedEntry("a symlink to nowhere") from None
        return None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DamagedEntry(f"{_kind(mode)}, not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 24):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, word in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return word
    return "not a file"


def _clear(path: Path) -> None:
    """Make way for a new entry: what `os.replace` cannot replace (a directory) or should not keep
    the permissions of (an unreadable file) is removed first. The cache owns every entry name."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.damaged")
        os.rename(path, aside)  # atomic: a concurrent reader sees the old directory or nothing
        shutil.rmtree(aside, ignore_errors=True)
    elif stat.S_ISREG(st.st_mode) and not os.access(path, os.R_OK):
        _unlink(path)


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class CacheFolder:
    """A reference cache's folder: `directory`, whose entries `files` reads, writes and evicts (the
    run's shared `EntryStore`, or by default one over `directory` with `max_bytes` and `report`)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int | None = DEFAULT_CACHE_MAX_BYTES,
        report: Callable[[str], None] | None = None,
        files: EntryStore | None = None,
    ) -> None:
        self.directory = directory
        self.files = files if files is not None else EntryStore(directory, max_bytes=max_bytes, report=report)

    @contextlib.contextmanager
    def computing(self, digest: str) -> Iterator[None]:
        """Hold entry `digest`'s lock file for the block: two processes of one run (xdist workers) that need
        the same missing entry compute it once — the second waits, then finds it stored. A folder that cannot
        hold the lock (read-only, absent and not creatable) locks nothing: the block runs anyway."""
        lock = FileLock(str(self.directory / f".{digest}.lock"))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError:
            yield
            return
        try:
            yield
        finally:
            lock.release()


class _Store(Protocol):
    directory: Any

    def store(self, key: Mapping[str, Any], value: Any, /) -> Any: ...


def store_or_warn(cache: _Store, key: Mapping[str, Any], value: Any) -> bool:
    """`cache.store(key, value)`; on an OS error (read-only checkout, full disk) a warning with the
    fix instead, and the gate goes on with the arm it just computed. True when stored."""
    try:
        cache.store(key, value)
    except OSError as e:
        warnings.warn(
            MlxgateWarning(
                f"reference cache {cache.directory}: entry not written ({e.strerror or e}); the next run computes "
                "the reference arm again. Fix: --mlx-reference-cache DIR (a writable directory), or "
                "--mlx-reference-cache off"
            ),
            stacklevel=2,
        )
        return False
    return True
