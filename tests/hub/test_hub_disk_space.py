"""Disk space against the fake hub: refused up front from the listing's sizes, and a disk that really
fills up (ENOSPC on a small filesystem of its own) keeps what it has and resumes there."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehub import Fault

from pytest_mlxgate.common.format import format_bytes
from pytest_mlxgate.hub import HubDiskFullError, HubError, HubRetryError, snapshot_download
from pytest_mlxgate.hub.fetch import PARTIAL_SUFFIX
from pytest_mlxgate.hub.hashing import CHUNK
from pytest_mlxgate.hub.space import _fix, disk_filled_up

SMALL_DISK = "8m"  # tmpfs size: room for a few MB of blobs, nothing more
IMAGE_BYTES = 10 << 20  # the loop-mounted ext4 image, when tmpfs can't be had
FIX = ("--mlx-cache-dir", "HF_HUB_CACHE", "mlxgate get --cache-dir")


def _as_root(*cmd: str) -> list[str]:
    return list(cmd) if os.geteuid() == 0 else ["sudo", "-n", *cmd]


def _run(cmd: list[str]) -> str | None:
    """None when `cmd` worked, else one line saying why not."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{' '.join(cmd)}`: {exc}"
    if done.returncode:
        return f"`{' '.join(cmd)}`: {(done.stderr or done.stdout).strip() or f'exit {done.returncode}'}"
    return None


def _mount_tmpfs(mount: Path, scratch: Path) -> str | None:
    owner = f"uid={os.getuid()},gid={os.getgid()},mode=0700"
    return _run(_as_root("mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK},{owner}", "tmpfs", str(mount)))


def _mount_loop_image(mount: Path, scratch: Path) -> str | None:
    image = scratch / "small-disk.img"
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    why = _run(
        [mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", f"root_owner={os.getuid()}:{os.getgid()}", str(image)]
    )
    return why or _run(_as_root("mount", "-o", "loop", str(image), str(mount)))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a filesystem of a few MB of its own, so a full disk is a real ENOSPC, not a fake one.

    Mounting needs root (or passwordless sudo): tried are a size-limited tmpfs, then a loop-mounted
    ext4 image; where neither works the test is skipped, saying why."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    why = []
    for attempt in (_mount_tmpfs, _mount_loop_image):
        failure = attempt(mount, tmp_path)
        if failure is None:
            break
        why.append(failure)
    else:
        pytest.skip("no small filesystem can be mounted here (needs root or passwordless sudo): " + "; ".join(why))
    try:
        yield mount
    finally:
        if _run(_as_root("umount", str(mount))):
            _run(_as_root("umount", "-l", str(mount)))


def _free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _partials(cache_dir: Path, repo_id: str, content: bytes) -> list[Path]:
    blobs = cache_dir / f"models--{repo_id.replace('/', '--')}" / "blobs"
    return sorted(blobs.glob(f"{hashlib.sha256(content).hexdigest()}.*{PARTIAL_SUFFIX}"))


def _content_gets(hub, repo_id: str, path: str) -> list[tuple[str | None, int]]:
    return [
        (r.headers.get("range"), r.status)
        for r in hub.log
        if r.file == ("model", repo_id, path) and r.method == "GET" and r.status != 302
    ]


def test_the_fix_says_how_much_to_free_or_some_space_when_the_listing_fits() -> None:
    point = (
        "there, or point the cache at a disk with room: --mlx-cache-dir DIR (ini mlx_cache_dir), "
        "HF_HUB_CACHE=DIR, or `mlxgate get --cache-dir DIR`."
    )
    assert _fix(5_000_001, 1_000_000) == f"To fix: free at least 4.0 MB {point}"
    # The listed bytes fit, or just fit (another writer took the room): how much to free is not known.
    assert _fix(1_000_000, 1_000_000) == _fix(1_000, 1_000_000) == f"To fix: free some space {point}"


def test_a_full_disk_error_names_what_is_left_to_fetch_what_is_free_and_how_much_to_free(small_disk: Path) -> None:
    cache_dir = small_disk / "hub-cache"
    free = _free(small_disk)  # a filesystem of its own: nobody else writes there
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    message = str(disk_filled_up(cache_dir, cache_dir / "blobs", 3 * free, "org/full", full))
    assert message.startswith(
        f"org/full: the disk of the hub cache {cache_dir} filled up while downloading "
        f"({os.strerror(errno.ENOSPC)}): {format_bytes(3 * free)} are still to fetch and "
        f"{format_bytes(free)} free. "
    )
    assert message.endswith(f"the next run resumes where this one stopped. {_fix(3 * free, free)}")
    assert f"free at least {format_bytes(2 * free)} there" in message


def test_a_listing_bigger_than_any_disk_is_refused_before_a_byte_is_fetched(hub, cache_dir: Path, fast_policy) -> None:
    """Runs everywhere: the listing claims a petabyte, which no test machine has free."""
    config = b'{"model_type": "gemma4"}\n'
    hub.add_repo(
        "org/petabyte",
        {"config.json": config, "model.safetensors": random.Random(1).randbytes(4096)},
        listed_sizes={"model.safetensors": 10**15},
    )
    with pytest.raises(HubDiskFullError) as info:
        snapshot_download("org/petabyte", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    message = str(info.value)
    assert isinstance(info.value, HubError)
    assert f"needs {format_bytes(10**15 + len(config))} more in the hub cache {cache_dir}" in message
    assert "free, so nothing was downloaded" in message and all(fix in message for fix in FIX)
    assert all(r.path.startswith("/api/") for r in hub.log)  # the revision and the listing, no file
    assert not cache_dir.exists()


def test_a_snapshot_bigger_than_the_free_space_is_refused_up_front(hub, small_disk: Path, fast_policy) -> None:
    cache_dir = small_disk / "hub-cache"
    free = _free(small_disk)
    files = {"config.json": b"{}", "model.safetensors": random.Random(2).randbytes(free + 1)}
    hub.add_repo("org/too-big", files)
    with pytest.raises(HubDiskFullError) as info:
        snapshot_download("org/too-big", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    needed = free + 1 + 2
    message = str(info.value)
    assert f"needs {format_bytes(needed)} more" in message and f"only {format_bytes(free)} free" in message
    assert f"free at least {format_bytes(needed - free)} there" in message
    assert all(r.path.startswith("/api/") for r in hub.log)
    assert _free(small_disk) == free and not cache_dir.exists()


def test_the_check_counts_only_what_a_left_over_partial_still_lacks(hub, small_disk: Path, fast_policy) -> None:
    """The file needs 80% of the disk; after a first run kept 40% of it as a partial, the whole file no
    longer fits in what is free, but the rest does: the resume must be allowed, and fetch only the rest."""
    cache_dir = small_disk / "hub-cache"
    size = int(0.8 * _free(small_disk))
    kept = size // 2
    content = random.Random(3).randbytes(size)
    hub.add_repo("org/resume-room", {"model.safetensors": content})
    hub.inject("org/resume-room", "model.safetensors", Fault.truncate(kept), Fault.status(503).forever())
    one_try = dataclasses.replace(fast_policy, max_retries=1)
    with pytest.raises(HubRetryError):
        snapshot_download("org/resume-room", cache_dir=cache_dir, endpoint=hub.endpoint, policy=one_try)
    assert [p.stat().st_size for p in _partials(cache_dir, "org/resume-room", content)] == [kept]
    assert size > _free(small_disk) >= size - kept  # the whole file would not fit any more; the rest does
    hub.clear_faults()
    hub.reset_log()
    path = snapshot_download("org/resume-room", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert (path / "model.safetensors").read_bytes() == content
    assert _content_gets(hub, "org/resume-room", "model.safetensors") == [(f"bytes={kept}-", 206)]
    assert hub.bytes_served("org/resume-room") == size - kept


# The client writes in CHUNK batches, then a short tail that sits in the file's buffer until flushed.
@pytest.mark.parametrize("room", [3 * CHUNK // 2, 2 * CHUNK], ids=["in-a-batch", "on-the-buffered-tail"])
def test_a_disk_that_fills_up_mid_download_keeps_what_was_verified_and_resumes(
    hub, small_disk: Path, fast_policy, room: int
) -> None:
    """Another writer takes the space after the up-front check passed: the write meets a real ENOSPC."""
    cache_dir = small_disk / "hub-cache"
    first, second = "weights/first.safetensors", "weights/second.safetensors"
    files = {first: random.Random(4).randbytes(5 * CHUNK // 2), second: random.Random(5).randbytes(2 * CHUNK + 100)}
    assert sum(map(len, files.values())) < _free(small_disk)  # the up-front check lets it start
    hub.add_repo("org/fills-up", files)
    filler = small_disk / "someone-else.bin"

    def fill_the_disk(done: int, total: int) -> None:
        # Called once, before the first byte: leave room for the first file and `room` bytes of the second
        # (ext4 refuses a whole batch that does not fit; tmpfs writes what fits, page by page).
        if not filler.exists():
            filler.write_bytes(bytes(_free(small_disk) - len(files[first]) - room))

    one_at_a_time = dataclasses.replace(fast_policy, workers=1)  # largest first: `first` is done before `second`
    with pytest.raises(HubDiskFullError) as info:
        snapshot_download(
            "org/fills-up", cache_dir=cache_dir, endpoint=hub.endpoint, policy=one_at_a_time, progress=fill_the_disk
        )
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC

    # The verified blob stays; the partial stays too, a true prefix, named for the next run to claim.
    blob = cache_dir / "models--org--fills-up" / "blobs" / hashlib.sha256(files[first]).hexdigest()
    assert blob.read_bytes() == files[first]
    [partial] = _partials(cache_dir, "org/fills-up", files[second])
    kept = partial.stat().st_size
    assert 0 < kept < len(files[second]) and partial.read_bytes() == files[second][:kept]
    assert ".left-" in partial.name
    message = str(info.value)
    assert f"{format_bytes(len(files[second]) - kept)} are still to fetch" in message
    assert f"and {format_bytes(_free(small_disk))} free" in message
    assert "already verified and the partial download are kept" in message and all(fix in message for fix in FIX)

    filler.unlink()
    hub.reset_log()
    path = snapshot_download("org/fills-up", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert {p: (path / p).read_bytes() for p in files} == files
    assert _content_gets(hub, "org/fills-up", first) == []
    assert _content_gets(hub, "org/fills-up", second) == [(f"bytes={kept}-", 206)]
    assert hub.bytes_served("org/fills-up") == len(files[second]) - kept
