"""The reference cache's files: a damaged entry (any byte flipped, a zip directory that makes numpy
raise, a directory, fifo or dangling symlink at its name) is a miss reported once and replaced,
never a crash and never another reference; the size cap evicts the least recently used entries,
never the one just written, never a file that is not an entry, and never crashes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.common.refstore import (
    DEFAULT_CACHE_MAX_BYTES,
    EntryStore,
    parse_cache_max,
    seal,
    unseal,
)
from pytest_mlxgate.kl.refcache import ReferenceCache
from pytest_mlxgate.stats.divergence import RefDistributions

KEY = {"model": "org/tiny@" + "0" * 40, "lever": "ref", "tokens": 4}


def _ref(seed: int, positions: int = 4, kept: int = 6, vocab: int = 100) -> RefDistributions:
    """A small but valid reference (the same checks a real one passes on load)."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(kept + 3), positions)[:, :kept]
    logprobs = -np.sort(-np.log(probs), axis=1).astype(np.float32)  # each row descending
    return RefDistributions.from_arrays(
        {
            "offsets": np.arange(0, positions * kept + 1, kept, dtype=np.int64),
            "ids": np.concatenate([rng.permutation(vocab)[:kept] for _ in range(positions)]).astype(np.int32),
            "logprobs": np.ascontiguousarray(logprobs.reshape(-1)),
            "tail_logmass": np.log(1 - probs.sum(axis=1)).astype(np.float32),
            "next_logprob": logprobs[:, 0].copy(),
            "near_tie": rng.random(positions) < 0.3,
            "vocab_size": np.asarray(vocab),
        }
    )


REFS = [_ref(0), _ref(1)]


def _same(got: list[RefDistributions] | None, want: list[RefDistributions]) -> bool:
    if got is None or len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        ga, wa = g.to_arrays(), w.to_arrays()
        if ga.keys() != wa.keys():
            return False
        for name in wa:
            if ga[name].dtype != wa[name].dtype or not np.array_equal(ga[name], wa[name]):
                return False
    return True


def _cache(directory: Path, **kw: Any) -> tuple[ReferenceCache, list[str]]:
    lines: list[str] = []
    return ReferenceCache(directory, report=lines.append, **kw), lines


def test_an_entry_round_trips_exactly_and_is_sealed(tmp_path: Path) -> None:
    cache, lines = _cache(tmp_path)
    path = cache.store(KEY, REFS)
    assert path.read_bytes().startswith(b"mlxgate-entry 1 bytes=")
    assert _same(cache.load(KEY, 2), REFS) and not lines
    assert cache.load({**KEY, "lever": "other"}, 2) is None and not lines  # absent: a plain miss, nothing said
    assert cache.load(KEY, 3) is None and not lines  # another sequence count: a miss, not damage


#: How the seal words what it finds (`refstore.unseal`); a parser's exception reads otherwise.
_SEAL_WORDS = ("checksum mismatch", " were written)", "header", "no checksum")


class _Flipper:
    """Damages a file in place, one byte at a time (an open descriptor: thousands of flips stay fast)."""

    def __init__(self, path: Path, data: bytes) -> None:
        path.write_bytes(data)
        self.data, self.fd = data, os.open(path, os.O_WRONLY)

    def flip(self, i: int, mask: int, *, header: bytes = b"") -> None:
        if header:
            os.pwrite(self.fd, header, 0)
        os.pwrite(self.fd, bytes([self.data[i] ^ mask]), i)

    def restore(self, i: int) -> None:
        os.pwrite(self.fd, self.data[i : i + 1], i)

    def close(self) -> None:
        os.close(self.fd)


def test_every_single_byte_flip_is_caught_by_the_checksum(tmp_path: Path) -> None:
    """Exhaustive: each byte of a stored entry flipped (every byte inverted, every 3rd also its low
    bit) is a miss said once, found by the seal before numpy or zipfile see the payload."""
    cache, _ = _cache(tmp_path)
    path = cache.store(KEY, REFS)
    flipper = _Flipper(path, path.read_bytes())
    try:
        for i in range(len(flipper.data)):
            for mask in (0xFF, 0x01) if i % 3 == 0 else (0xFF,):
                flipper.flip(i, mask)
                lines: list[str] = []
                cache.files = EntryStore(tmp_path, report=lines.append)  # a fresh run: says it again
                assert cache.load(KEY, 2) is None, (i, mask)
                assert len(lines) == 1 and str(path) in lines[0], (i, mask, lines)
                assert any(w in lines[0] for w in _SEAL_WORDS), lines  # found by the seal, not by a parser
                flipper.restore(i)
    finally:
        flipper.close()
    assert _same(cache.load(KEY, 2), REFS)  # restored: the exact entry again


@pytest.mark.parametrize("mask", [0xFF, pytest.param(0x01, marks=pytest.mark.slow)])
def test_a_broken_zip_behind_a_valid_seal_is_a_miss_never_a_raise(tmp_path: Path, mask: int) -> None:
    """The parser layer on its own (the seal made to vouch for damaged bytes): every byte of the zip
    central directory and end record flipped, and every 13th byte before it. Before, 101 of ~6,100
    such flips raised NotImplementedError or RuntimeError out of numpy/zipfile on every run."""
    cache, lines = _cache(tmp_path)
    path = cache.store(KEY, REFS)
    sealed = path.read_bytes()
    payload = unseal(sealed)
    offset = len(sealed) - len(payload)
    start = payload.find(b"PK\x01\x02")
    assert start > 0
    flips = [*range(0, start, 13), *range(start, len(payload))]
    outcomes = {"miss": 0, "exact": 0}
    flipper = _Flipper(path, sealed)
    try:
        for i in flips:
            damaged = bytearray(payload)
            damaged[i] ^= mask
            header = seal(bytes(damaged))[:offset]
            assert len(header) == offset
            flipper.flip(offset + i, mask, header=header)
            got = cache.load(KEY, 2)  # must not raise
            if got is None:
                outcomes["miss"] += 1
            else:
                assert _same(got, REFS), (i, mask)  # a flip the zip format ignores: the very same reference
                outcomes["exact"] += 1
            flipper.restore(offset + i)
    finally:
        flipper.close()
    print(f"{len(flips)} flips: {outcomes}")
    assert outcomes["miss"] > len(flips) // 2, outcomes
    assert len(lines) == 1  # said once per entry and run, not once per load


def _fifo(path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no fifos here")
    os.mkfifo(path)


@pytest.mark.parametrize(
    "kind", ["empty directory", "directory with files", "fifo", "dangling symlink", "symlink to a directory", "garbage"]
)
def test_anything_but_an_entry_at_its_name_is_a_miss_said_once_and_replaced(tmp_path: Path, kind: str) -> None:
    cache, lines = _cache(tmp_path / "ref")
    path = cache.path_for(KEY)
    path.parent.mkdir()
    if kind == "empty directory":
        path.mkdir()
    elif kind == "directory with files":
        (path / "inner").mkdir(parents=True)
        (path / "inner" / "x").write_bytes(b"x")
    elif kind == "fifo":
        _fifo(path)  # an open() that blocked would hang the run: it must not
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "symlink to a directory":
        (tmp_path / "d").mkdir()
        path.symlink_to(tmp_path / "d")
    else:
        path.write_bytes(os.urandom(300))
    assert cache.load(KEY, 2) is None
    assert cache.load(KEY, 2) is None  # asked again (another gate of the run): not said again
    assert len(lines) == 1 and str(path) in lines[0] and "is damaged" in lines[0], lines
    assert "recomputing the reference arm and replacing the entry" in lines[0]
    cache.store(KEY, REFS)
    assert path.is_file() and not path.is_symlink()
    assert _same(cache.load(KEY, 2), REFS) and len(lines) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # nothing left aside
    if kind == "symlink to a directory":
        assert (tmp_path / "d").is_dir()  # the link was replaced, not what it pointed at


def test_an_unreadable_entry_is_a_miss_and_is_replaced_readable(tmp_path: Path) -> None:
    cache, lines = _cache(tmp_path)
    path = cache.store(KEY, REFS)
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("permissions do not bind here (root)")
    assert cache.load(KEY, 2) is None and len(lines) == 1 and "PermissionError" in lines[0]
    cache.store(KEY, REFS)
    assert _same(cache.load(KEY, 2), REFS)


def test_without_a_report_line_a_damaged_entry_is_one_warning(tmp_path: Path) -> None:
    from pytest_mlxgate.errors import MlxgateWarning

    cache = ReferenceCache(tmp_path)
    path = cache.store(KEY, REFS)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.warns(MlxgateWarning, match=r"is damaged \(\d+ bytes where \d+ were written\)") as seen:
        loaded = [cache.load(KEY, 2) for _ in range(2)]
    assert loaded == [None, None] and len(seen) == 1


def test_a_keyboard_interrupt_while_reading_is_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, lines = _cache(tmp_path)
    cache.store(KEY, REFS)

    def interrupted(*args: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.load(KEY, 2)
    assert not lines


# -- the cap -------------------------------------------------------------------------------------


def _entries(cache: ReferenceCache, n: int, *, stamp0: float = 1_000_000.0) -> list[Path]:
    """n stored entries with last-used stamps stamp0, stamp0+1000, ... (oldest first)."""
    paths = []
    for i in range(n):
        path = cache.store({**KEY, "i": i}, REFS)
        os.utime(path, (stamp0 + 1000 * i, stamp0 + 1000 * i))
        paths.append(path)
    return paths


def test_a_store_evicts_the_least_recently_used_down_to_the_cap(tmp_path: Path) -> None:
    unlimited = ReferenceCache(tmp_path, max_bytes=None)
    a, b, c, d = _entries(unlimited, 4)
    size = a.stat().st_size  # every entry here is the same size
    cache = ReferenceCache(tmp_path, max_bytes=3 * size)
    assert _same(cache.load({**KEY, "i": 0}, 2), REFS)  # a hit: `a` becomes the most recently used
    e = cache.store({**KEY, "i": 4}, REFS)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (a, d, e))
    assert not b.exists() and not c.exists()  # the least recently used went
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * size


def test_the_entry_just_written_stays_even_above_the_cap(tmp_path: Path) -> None:
    from pytest_mlxgate.capability.base import ItemResult
    from pytest_mlxgate.capability.refcache import CapabilityCache

    _entries(ReferenceCache(tmp_path, max_bytes=None), 3)
    old_cap = CapabilityCache(tmp_path / "capability", max_bytes=None).store(
        {"task": "t"}, [ItemResult("i", "h", "out", 1.0, "correct")]
    )
    os.utime(old_cap, (1.0, 1.0))
    foreign = [
        tmp_path / "notes.txt",
        tmp_path / ".probe-1",
        tmp_path / "capability" / "mine.json",
        tmp_path / ("f" * 40 + ".npz.bak"),
    ]
    for f in foreign:
        f.write_bytes(b"not the cache's")
        os.utime(f, (1.0, 1.0))
    newest = ReferenceCache(tmp_path, max_bytes=0).store({**KEY, "i": 99}, REFS)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted([newest.name, *(str(f.relative_to(tmp_path)) for f in foreign)])


def test_a_stale_temp_file_is_swept_a_fresh_one_kept(tmp_path: Path) -> None:
    cache = ReferenceCache(tmp_path)
    stale, fresh = tmp_path / f".{'a' * 40}.npz.0123abcd.tmp", tmp_path / f".{'b' * 40}.npz.4567cdef.tmp"
    for t in (stale, fresh):
        t.write_bytes(b"half an entry")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))  # a writer killed two hours ago
    cache.store(KEY, REFS)
    assert not stale.exists() and fresh.exists()  # a concurrent writer's temp file is left alone


def test_eviction_never_crashes_when_another_process_deletes_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ReferenceCache(tmp_path, max_bytes=None)
    paths = _entries(cache, 4)
    listing = cache.files.entries()
    for p in paths[:2]:
        p.unlink()  # gone between the listing and the deletes
    paths[2].unlink()
    paths[2].mkdir()  # and something else put in its place
    store = EntryStore(tmp_path, max_bytes=0)
    monkeypatch.setattr(store, "entries", lambda: listing)
    assert store.evict(keep=paths[3]) == []  # nothing of its own to delete, and no exception
    assert paths[3].is_file()
    assert paths[2].is_dir()  # a directory is never an entry to delete

    def broken() -> Any:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(store, "entries", broken)
    with pytest.warns(UserWarning, match="eviction skipped"):
        assert store.evict(keep=paths[3]) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("500MB", 500_000_000),
        ("500 mb", 500_000_000),
        ("1.5G", 1_500_000_000),
        ("64KiB", 65536),
        ("123", 123),
        ("0", 0),
        ("none", None),
        ("None", None),
        ("off", None),
        ("1tib", 2**40),
    ],
)
def test_parse_cache_max(text: str, expected: int | None) -> None:
    assert parse_cache_max(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1", "2 GiBs", "", "GiB", "1e9", "1..2GB"])
def test_parse_cache_max_refuses_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a size: .*2GiB or 500MB.*none: no cap"):
        parse_cache_max(text)


def test_the_cap_option_and_its_ini_twin(pytester: pytest.Pytester) -> None:
    from pytest_mlxgate.config.settings import read_gate_settings
    from pytest_mlxgate.errors import MlxgateUsageError

    assert read_gate_settings(pytester.parseconfig()).reference_cache_max == DEFAULT_CACHE_MAX_BYTES
    assert read_gate_settings(pytester.parseconfig("--mlx-reference-cache-max=500MB")).reference_cache_max == 5 * 10**8
    assert read_gate_settings(pytester.parseconfig("--mlx-reference-cache-max=none")).reference_cache_max is None
    pytester.makeini("[pytest]\nmlx_reference_cache_max = 1GiB\n")
    assert read_gate_settings(pytester.parseconfig()).reference_cache_max == 2**30
    assert read_gate_settings(pytester.parseconfig("--mlx-reference-cache-max=0")).reference_cache_max == 0
    pytester.makeini("[pytest]\nmlx_reference_cache_max = lots\n")
    with pytest.raises(MlxgateUsageError, match=r"mlx_reference_cache_max in .*tox.ini: 'lots' is not a size"):
        read_gate_settings(pytester.parseconfig())
    result = pytester.runpytest("--mlx-reference-cache-max=huge")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlx-reference-cache-max: 'huge' is not a size*"])


# --- one computation per missing entry, whatever the number of workers -----------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from pytest_mlxgate.kl.refcache import ReferenceCache
cache = ReferenceCache(Path(sys.argv[1]))
with cache.computing(sys.argv[2]):
    Path(sys.argv[3]).write_text("held")
    time.sleep(1.0)
    (cache.directory / "stored-by-holder").write_text("done")
"""


def test_a_second_process_waits_for_the_first_one_s_computation_and_finds_it_stored(tmp_path: Path) -> None:
    """Two xdist workers whose gates need the same missing reference: the one that comes second blocks in
    `computing` until the first has stored the entry, then loads it (measure_kl re-reads inside the lock)."""
    import subprocess
    import sys

    cache = ReferenceCache(tmp_path / "refs")
    digest = cache.digest(KEY)
    held = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(cache.directory), digest, str(held)])
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.02)
        with cache.computing(digest):
            assert (cache.directory / "stored-by-holder").read_text() == "done"  # entered only after the holder
        with cache.computing(cache.digest({**KEY, "tokens": 5})):  # another entry's lock is another lock
            pass
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0


def test_a_folder_that_cannot_hold_a_lock_still_runs_the_computation(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = ReferenceCache(blocker / "refs")  # its parent is a file: no folder, no lock file
    ran = []
    with cache.computing(cache.digest(KEY)):
        ran.append(True)
    assert ran == [True]
