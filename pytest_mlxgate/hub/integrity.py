"""Whether a cached blob still holds the bytes that were verified: a stamp beside it, a re-hash when it moved.

A blob's bytes are hashed when it is published (a download, the embedded build) or re-verified. Its
stamp then records the file's size, mtime, ctime, inode and device with the hash that matched. A later
use compares the blob's stat with its stamp: unchanged, the blob is trusted without reading a byte;
changed (an edit in place moves mtime and ctime even at the same size) or unstamped, it is hashed
again and, if it still matches, stamped again. A stamp that cannot be written (a read-only cache)
costs a re-hash next time, never a wrong answer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..common.atomic import atomic_write_bytes
from .hashing import algo_for_etag, hash_file

__all__ = ["BlobCheck", "check_blob", "drop_stamp", "set_aside", "write_stamp"]

STAMP_VERSION = 1
#: "replaced": the snapshot's entry is not a link to its blob any more (whatever the blob holds).
BlobState = Literal["ok", "missing", "wrong-size", "damaged", "unnamed", "replaced"]


@dataclass(frozen=True)
class BlobCheck:
    """One blob's state, what it cost to tell, and why it is not ok."""

    etag: str
    state: BlobState
    hashed_bytes: int = 0  # 0 when its stamp vouched for it
    why: str = ""
    actual: str | None = None  # what its bytes hash to, when they were hashed

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def _fingerprint(st: os.stat_result) -> dict[str, int]:
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
        "dev": st.st_dev,
    }


def write_stamp(stamp: Path, etag: str, st: os.stat_result) -> None:
    """Record that the file whose stat is `st` hashed to `etag` (best effort: a failure costs a re-hash)."""
    doc = {"version": STAMP_VERSION, "etag": etag, **_fingerprint(st)}
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(stamp, json.dumps(doc, sort_keys=True).encode())
    except OSError:
        pass


def drop_stamp(stamp: Path) -> None:
    try:
        stamp.unlink(missing_ok=True)
    except OSError:
        pass


def _stamp_vouches(stamp: Path, etag: str, st: os.stat_result) -> bool:
    try:
        doc = json.loads(stamp.read_bytes())
    except (OSError, ValueError):
        return False
    return (
        isinstance(doc, dict)
        and doc.get("version") == STAMP_VERSION
        and doc.get("etag") == etag
        and all(doc.get(k) == v for k, v in _fingerprint(st).items())
    )


def check_blob(blob: Path, stamp: Path, etag: str, *, size: int | None = None, rehash: bool = False) -> BlobCheck:
    """Is `blob` (named `etag`) whole and the bytes that hash to its name?

    Its stamp vouches for it while the blob's stat is unchanged; otherwise (or with `rehash`) the
    blob is hashed, and stamped when it matches. `size`: what the manifest says it must be.
    """
    try:
        before = os.stat(blob)
    except OSError:
        return BlobCheck(etag, "missing", why="its blob is missing")
    if size is not None and before.st_size != size:
        return BlobCheck(etag, "wrong-size", why=f"its blob holds {before.st_size} bytes, not {size}")
    algo = algo_for_etag(etag)
    if algo is None:
        return BlobCheck(etag, "unnamed", why=f"its blob {etag} is not named by a hash, so it can't be checked")
    if not rehash and _stamp_vouches(stamp, etag, before):
        return BlobCheck(etag, "ok")
    try:
        actual = hash_file(blob, algo)
        after = os.stat(blob)
    except OSError as e:
        return BlobCheck(etag, "damaged", before.st_size, why=f"its blob cannot be read ({e.strerror or e})")
    if actual != etag:
        drop_stamp(stamp)
        return BlobCheck(
            etag,
            "damaged",
            before.st_size,
            actual=actual,
            why=f"its content changed since it was verified: it hashes to {actual}, not {etag}",
        )
    if _fingerprint(after) == _fingerprint(before):  # not rewritten while we read it
        write_stamp(stamp, etag, after)
    return BlobCheck(etag, "ok", before.st_size, actual=actual)


def set_aside(blob: Path, stamp: Path) -> Path:
    """Rename a damaged blob aside (never delete what may be someone's edit); a fetch then starts afresh."""
    aside = blob.with_name(f"{blob.name}.corrupt-{time.time_ns()}")
    drop_stamp(stamp)
    os.replace(blob, aside)
    return aside
