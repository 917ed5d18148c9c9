"""Atomic writes: a temp file in the same folder, fsync, `os.replace`, then fsync the folder.

Readers see the old file or the whole new one, never half of it; a crash leaves no partial file
under the final name. Used for everything the package writes that others read (hub refs and
manifests, reports, reference-cache entries).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "atomic_write_bytes", "fsync_dir", "unwritable"]


def fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories can't be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], object], *, new_mode: int | None = None) -> None:
    """Publish what `write(file)` writes at `path`, atomically.

    A file replaced keeps its permission bits (a report stays readable by whoever could read the
    old one); a new file gets `new_mode`, else the process's default (umask) mode.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        except FileNotFoundError:
            if new_mode is not None:
                os.chmod(tmp, new_mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, *, new_mode: int | None = None) -> None:
    """`atomic_write` of a byte string."""
    atomic_write(path, lambda f: f.write(data), new_mode=new_mode)


def unwritable(path: Path, *, parents_made: bool = False) -> str | None:
    """Why a file could not be written at `path` (None: it could), asked before a long run rather than
    found after it. `parents_made`: the writer creates missing folders, so the nearest existing one is
    what must be a writable folder. Nothing is created: the question is asked of the filesystem."""
    path = Path(path)
    if path.is_dir():
        return "it is a folder"
    folder = path.parent
    while parents_made and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.exists():
        return f"the folder {path.parent} does not exist"
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} cannot be written"
    return None
