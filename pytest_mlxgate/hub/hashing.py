"""Content hashes the hub names files by: sha256 for LFS files, git's blob sha1 for the rest."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal, Protocol

Algo = Literal["sha256", "git-sha1"]
CHUNK = 1 << 20


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


def new_hasher(algo: Algo, size: int) -> Hasher:
    """A streaming hasher; git's blob sha1 hashes a `blob <size>\\0` header before the bytes."""
    if algo == "sha256":
        return hashlib.sha256()
    if algo == "git-sha1":
        h = hashlib.sha1()
        h.update(b"blob %d\0" % size)
        return h
    raise ValueError(f"unknown hash algorithm {algo!r}")


def algo_for_etag(etag: str) -> Algo | None:
    """Tell the algorithm from a blob's name: 64 hex is sha256, 40 hex is git sha1."""
    if not all(c in "0123456789abcdef" for c in etag):
        return None
    return {64: "sha256", 40: "git-sha1"}.get(len(etag))  # type: ignore[return-value]


def hash_file_prefix(path: Path, algo: Algo, size: int, length: int | None = None) -> tuple[Hasher, int]:
    """Stream `length` bytes (default: all) of `path` into a fresh hasher; memory stays one chunk."""
    hasher = new_hasher(algo, size)
    done = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while length is None or done < length:
            want = CHUNK if length is None else min(CHUNK, length - done)
            n = f.readinto(view[:want])
            if not n:
                break
            hasher.update(view[:n])
            done += n
    return hasher, done


def hash_file(path: Path, algo: Algo) -> str:
    """The hub-style hash of a whole file."""
    size = path.stat().st_size
    hasher, _ = hash_file_prefix(path, algo, size)
    return hasher.hexdigest()
