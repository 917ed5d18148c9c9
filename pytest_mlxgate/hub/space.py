"""Disk space: a snapshot that cannot fit is refused before its first byte, and a disk that fills up
anyway (another writer, a quota) ends in an error that names the bytes needed, the bytes free and the fix."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..common.format import format_bytes
from .errors import HubDiskFullError

#: What a write that found no room raises: a full disk, or a full quota (the same fix).
NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk that holds `path`, or will (its nearest folder that exists); None if unknown."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def ensure_room(cache_dir: Path, where: Path, needed: int, what: str) -> None:
    """Refuse now what the listing says cannot fit, rather than fail gigabytes later."""
    free = free_bytes(where)
    if free is not None and needed > free:
        raise HubDiskFullError(
            f"{what} needs {format_bytes(needed)} more in the hub cache {cache_dir}, but its disk has only "
            f"{format_bytes(free)} free, so nothing was downloaded. {_fix(needed, free)}"
        )


def disk_filled_up(cache_dir: Path, where: Path, needed: int, what: str, exc: OSError) -> HubDiskFullError:
    """The error for a write that found the disk full (`exc`), `needed` bytes short of a complete snapshot."""
    free = free_bytes(where)
    shown = "an unknown amount" if free is None else format_bytes(free)
    return HubDiskFullError(
        f"{what}: the disk of the hub cache {cache_dir} filled up while downloading ({exc.strerror}): "
        f"{format_bytes(needed)} are still to fetch and {shown} free. The files already verified and the "
        f"partial download are kept; the next run resumes where this one stopped. {_fix(needed, free or 0)}"
    )


def _fix(needed: int, free: int) -> str:
    # Only the blobs are counted: a full disk can still refuse the few kB of links and manifest.
    amount = f"at least {format_bytes(needed - free)}" if needed > free else "some space"
    return (
        f"To fix: free {amount} there, or point the cache at a disk with room: "
        "--mlx-cache-dir DIR (ini mlx_cache_dir), HF_HUB_CACHE=DIR, or `mlxgate get --cache-dir DIR`."
    )
