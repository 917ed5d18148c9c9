"""Properties of the downloader over random files, random truncations and random fault sequences.

(1) nothing that doesn't hash to its name ever sits under a final blob name;
(2) a successful call returns exactly the bytes served;
(3) a resume fetches only the missing suffix;
(4) every call terminates, and within the budgets it succeeds.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from fakehub import Fault
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.hub import HubError, snapshot_download
from pytest_mlxgate.hub.cache import repo_folder_name
from pytest_mlxgate.hub.fetch import PARTIAL_SUFFIX
from pytest_mlxgate.hub.hashing import algo_for_etag, hash_file
from pytest_mlxgate.hub.transport import RetryPolicy

POLICY = RetryPolicy(
    backoff_base=0.001,
    backoff_max=0.005,
    max_retry_after=0.005,
    stall_window=2.0,
    min_bytes_per_window=1,
    connect_timeout=2.0,
    workers=3,
)
_names = itertools.count()
# Hypothesis, 40 examples a property, each a real download through faults: ~10 s a test. The same
# behaviours have example-based tests in test_hub_download.py, in the fast lane.
pytestmark = pytest.mark.slow
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

sizes = st.one_of(st.just(0), st.just(1), st.integers(2, 3000), st.integers(3000, 150_000))


@st.composite
def repos(draw: st.DrawFn) -> dict[str, bytes]:
    n = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rnd = random.Random(seed)
    return {f"d{i % 2}/f{i}.bin": rnd.randbytes(draw(sizes)) for i in range(n)}


@st.composite
def faults(draw: st.DrawFn, size: int) -> Fault:
    at = draw(st.integers(0, max(size - 1, 0)))
    return draw(
        st.sampled_from(
            [
                Fault.truncate(at),
                Fault.reset(at),
                Fault.status(503, "0"),
                Fault.status(429, "0"),
                Fault.status(500),
                Fault.corrupt(at),
                Fault.short_length(at),
                Fault.ignore_range(),
                Fault.wrong_content_range(draw(st.integers(-50, 50))),
                Fault.range_416(),
            ]
        )
    )


def _check_blobs(cache: Path, repo: str) -> None:
    """Property 1: every final blob name is the hash of what it holds."""
    blobs = cache / repo_folder_name(repo, "model") / "blobs"
    if not blobs.exists():
        return
    for blob in blobs.iterdir():
        algo = algo_for_etag(blob.name)
        if algo is None:
            assert blob.name.endswith(PARTIAL_SUFFIX), f"unexpected file in blobs/: {blob.name}"
            continue
        assert hash_file(blob, algo) == blob.name, f"corrupt bytes under a final blob name: {blob}"


def _read(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@SETTINGS
@given(data=st.data(), files=repos())
def test_random_faults_never_corrupt_and_succeed_within_budget(
    fakehub, data: st.DataObject, files: dict[str, bytes]
) -> None:
    repo = f"prop/faults-{next(_names)}"
    fakehub.add_repo(repo, files)
    target = data.draw(st.sampled_from(sorted(files)))
    plan = data.draw(st.lists(faults(len(files[target])), max_size=4))
    fakehub.clear_faults()
    fakehub.inject(repo, target, *plan)
    cache = Path(tempfile.mkdtemp())
    try:
        t0 = time.monotonic()
        try:
            path = snapshot_download(repo, cache_dir=cache, endpoint=fakehub.endpoint, policy=POLICY)
        except HubError:
            path = None
        assert time.monotonic() - t0 < 30  # property 4
        _check_blobs(cache, repo)  # property 1
        corruptions = sum(f.kind == "corrupt" for f in plan)
        if corruptions <= POLICY.max_checksum_failures:
            assert path is not None, f"failed within budget: {plan}"
        if path is not None:
            assert _read(path) == files  # property 2
    finally:
        fakehub.clear_faults()
        shutil.rmtree(cache)


@SETTINGS
@given(size=st.integers(1, 200_000), cut=st.floats(0, 1), seed=st.integers(0, 2**32 - 1), prefix_ok=st.booleans())
def test_resume_fetches_only_the_missing_suffix(fakehub, size: int, cut: float, seed: int, prefix_ok: bool) -> None:
    content = random.Random(seed).randbytes(size)
    repo = f"prop/resume-{next(_names)}"
    fakehub.add_repo(repo, {"w.bin": content}, lfs={"w.bin"})
    cache = Path(tempfile.mkdtemp())
    try:
        blobs = cache / repo_folder_name(repo, "model") / "blobs"
        blobs.mkdir(parents=True)
        keep = int(size * cut)
        prefix = bytearray(content[:keep])
        if not prefix_ok and keep:
            prefix[keep // 2] ^= 0x01  # a damaged partial from an earlier run
        etag = hashlib.sha256(content).hexdigest()
        (blobs / f"{etag}.earlier-run{PARTIAL_SUFFIX}").write_bytes(bytes(prefix))
        fakehub.reset_log()
        path = snapshot_download(repo, cache_dir=cache, endpoint=fakehub.endpoint, policy=POLICY)
        assert (path / "w.bin").read_bytes() == content
        _check_blobs(cache, repo)
        sent = fakehub.bytes_served(repo, "w.bin")
        if prefix_ok or not keep:
            assert sent == size - keep  # property 3: only the suffix
        else:
            assert sent == size - keep + size  # the suffix, then the whole file after the hash failed
        assert not list(blobs.glob(f"*{PARTIAL_SUFFIX}"))
    finally:
        shutil.rmtree(cache)


@SETTINGS
@given(files=repos(), kind=st.sampled_from(["corrupt", "status", "truncate0", "wrong_cr"]))
def test_a_server_that_always_fails_ends_in_a_hub_error(fakehub, files: dict[str, bytes], kind: str) -> None:
    repo = f"prop/forever-{next(_names)}"
    fakehub.add_repo(repo, files)
    target = max(files, key=lambda p: len(files[p]))
    assume(files[target])  # an empty file is never requested: its hash is known without bytes
    assume(kind != "wrong_cr" or len(files[target]) > 1)  # the fake hub clamps the shift to the file
    fault = {
        "corrupt": Fault.corrupt(0),
        "status": Fault.status(503, "0"),
        "truncate0": Fault.truncate(0),
        "wrong_cr": Fault.wrong_content_range(1),
    }[kind]
    fakehub.clear_faults()
    fakehub.inject(repo, target, fault.forever())
    cache = Path(tempfile.mkdtemp())
    try:
        t0 = time.monotonic()
        try:
            snapshot_download(repo, cache_dir=cache, endpoint=fakehub.endpoint, policy=POLICY)
            succeeded = True
        except HubError:
            succeeded = False
        assert time.monotonic() - t0 < 30
        # wrong_content_range(1) on a full request still serves bytes from offset 1: never the file.
        assert not succeeded
        _check_blobs(cache, repo)
        etag_dir = cache / repo_folder_name(repo, "model") / "snapshots"
        assert not etag_dir.exists() or not any(p.is_file() for p in etag_dir.rglob("*"))
    finally:
        fakehub.clear_faults()
        shutil.rmtree(cache)
