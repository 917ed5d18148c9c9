"""One blob through `fetch_blob` against the fake hub on loopback: what its retry loop promises.

`snapshot_download` repairs most mistakes of the loop by fetching again (the final hash), so these
tests read what one fetch reports (`FetchStats`) and how it gives up: a restart after a failed check
is counted as one, the ground after it starts at byte 0, a clean answer that brings nothing counts
against the retry budget, the error names the 416 it last saw, and a slow but steady body is no stall.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path

import pytest
from fakehub import Fault

from pytest_mlxgate.hub.cache import RepoCache, RepoFile
from pytest_mlxgate.hub.errors import HubAuthError, HubError, HubNotFoundError, HubRetryError
from pytest_mlxgate.hub.fetch import FetchStats, fetch_blob
from pytest_mlxgate.hub.transport import HubClient, RetryPolicy

BIG = "model.safetensors"


def _repo(hub, name: str, size: int = 200_000) -> tuple[RepoFile, bytes]:
    content = random.Random(name).randbytes(size)
    hub.add_repo(name, {BIG: content})
    return RepoFile(path=BIG, size=size, etag=hashlib.sha256(content).hexdigest(), algo="sha256"), content


def _fetch(hub, cache_dir: Path, name: str, file: RepoFile, policy: RetryPolicy) -> FetchStats:
    cache = RepoCache(cache_dir, name, "model")
    with HubClient(hub.endpoint, None, policy) as client:
        return fetch_blob(client, cache, file, hub.file_url(name, BIG))


def _gets(hub, name: str) -> list[tuple[str | None, int, int]]:
    return [
        (r.headers.get("range"), r.status, r.body_bytes)
        for r in hub.log
        if r.file == ("model", name, BIG) and r.method == "GET" and r.status != 302
    ]


def test_a_failed_check_then_a_good_body_is_one_restart(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    file, content = _repo(hub, "org/contract-one-restart")
    hub.inject("org/contract-one-restart", BIG, Fault.corrupt(777))
    stats = _fetch(hub, cache_dir, "org/contract-one-restart", file, fast_policy)
    assert (stats.checksum_failures, stats.restarts, stats.requests) == (1, 1, 2)
    assert stats.bytes_received == 2 * file.size and stats.resumed_from == 0
    assert (cache_dir / "models--org--contract-one-restart" / "blobs" / file.etag).read_bytes() == content


def test_a_range_answered_with_the_whole_file_is_one_restart(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    """The partial is thrown away for the 200's body, and the stats say so: one restart, two requests."""
    file, content = _repo(hub, "org/contract-ignored-range")
    hub.inject("org/contract-ignored-range", BIG, Fault.truncate(100_000), Fault.ignore_range())
    stats = _fetch(hub, cache_dir, "org/contract-ignored-range", file, fast_policy)
    assert (stats.checksum_failures, stats.restarts, stats.requests) == (0, 1, 2)
    assert stats.bytes_received == 100_000 + file.size and stats.resumed_from == 0
    assert (cache_dir / "models--org--contract-ignored-range" / "blobs" / file.etag).read_bytes() == content


def test_each_failure_is_recorded_once_in_the_order_it_came(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    """Two bodies cut short, then a 206 from the wrong offset: three errors, the refused range once
    (it was recorded twice), then the whole file without Range."""
    file, content = _repo(hub, "org/contract-errors")
    hub.inject(
        "org/contract-errors", BIG, Fault.truncate(50_000), Fault.truncate(20_000), Fault.wrong_content_range(1000)
    )
    stats = _fetch(hub, cache_dir, "org/contract-errors", file, fast_policy)
    assert len(stats.errors) == 3, stats.errors
    assert stats.errors[2] == f"{BIG}: asked bytes=70000- but got Content-Range 'bytes 71000-199999/200000'"
    assert [asked for asked, _, _ in _gets(hub, "org/contract-errors")] == [None, "bytes=50000-", "bytes=70000-", None]
    assert (cache_dir / "models--org--contract-errors" / "blobs" / file.etag).read_bytes() == content


def test_a_body_longer_than_the_file_is_cut_at_its_size_and_said(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """The listing says 10 bytes fewer than the server sends: the bytes past the size are never
    written, the error says so, and the file's own bytes (their hash) decide."""
    file, content = _repo(hub, "org/contract-long-body")
    size = file.size - 10
    short = dataclasses.replace(file, size=size, etag=hashlib.sha256(content[:size]).hexdigest())
    stats = _fetch(hub, cache_dir, "org/contract-long-body", short, fast_policy)
    assert stats.errors == [f"{BIG}: the server sent more than {size} bytes"]
    assert (cache_dir / "models--org--contract-long-body" / "blobs" / short.etag).read_bytes() == content[:size]


def test_after_a_restart_the_first_bytes_are_new_ground(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    """With no retry in a row allowed, a body cut short after a restart still counts as progress (the
    restart threw every byte away), so the next request resumes instead of giving up."""
    file, content = _repo(hub, "org/contract-new-ground")
    hub.inject("org/contract-new-ground", BIG, Fault.corrupt(777), Fault.truncate(1))
    stats = _fetch(hub, cache_dir, "org/contract-new-ground", file, dataclasses.replace(fast_policy, max_retries=0))
    assert (stats.checksum_failures, stats.restarts, stats.requests) == (1, 1, 3)
    assert _gets(hub, "org/contract-new-ground")[1:] == [(None, 200, 1), ("bytes=1-", 206, file.size - 1)]
    assert (cache_dir / "models--org--contract-new-ground" / "blobs" / file.etag).read_bytes() == content


def test_clean_answers_that_bring_nothing_use_up_the_retries(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    """An empty 200, again and again, is no progress: it ends after max_retries + 1 such answers, not
    at the last-resort request cap, and says the bytes kept are the ones to resume from."""
    file, _ = _repo(hub, "org/contract-empty-answers")
    hub.inject("org/contract-empty-answers", BIG, Fault.short_length(0).forever())
    policy = dataclasses.replace(fast_policy, max_retries=2)
    with pytest.raises(HubRetryError, match=r"gave up after 3 tries in a row without progress") as info:
        _fetch(hub, cache_dir, "org/contract-empty-answers", file, policy)
    assert f"0 of {file.size} bytes are kept" in str(info.value)
    assert len(_gets(hub, "org/contract-empty-answers")) == 3 < policy.max_attempts


def test_giving_up_on_416_names_the_range_refused(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    file, _ = _repo(hub, "org/contract-416")
    hub.inject("org/contract-416", BIG, Fault.truncate(50_000), Fault.range_416().forever())
    with pytest.raises(HubRetryError, match="without progress") as info:
        _fetch(hub, cache_dir, "org/contract-416", file, dataclasses.replace(fast_policy, max_retries=1))
    # the Range was dropped after the first 416: the last request asked from byte 0, and was refused too
    assert str(info.value).endswith(
        f"({BIG}: 416 for bytes=0-); 0 of {file.size} bytes are kept and the next run resumes there"
    )
    assert [asked for asked, _, _ in _gets(hub, "org/contract-416")] == [None, "bytes=50000-", None]


def test_a_slow_but_steady_body_outlasts_many_watchdog_windows(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    """The watchdog judges each window afresh: a body that takes several windows but brings enough
    bytes in every one of them is fetched in one request."""
    file, content = _repo(hub, "org/contract-steady")
    hub.inject("org/contract-steady", BIG, Fault.trickle(16_384, 0.03))
    policy = dataclasses.replace(fast_policy, stall_window=0.2, min_bytes_per_window=1)
    stats = _fetch(hub, cache_dir, "org/contract-steady", file, policy)
    assert (stats.requests, stats.errors) == (1, [])
    assert (cache_dir / "models--org--contract-steady" / "blobs" / file.etag).read_bytes() == content


def test_a_body_completed_by_a_stalled_request_is_checked_not_given_up(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """The watchdog may trip on the very piece that completes the file (three pieces 1.1 s apart: the
    third ends a slow 2 s window): every byte is in, so the fetch checks them and keeps the file, even
    with no retry in a row left to spend. Sleeps never end early, so the third piece always ends the
    window; only a piece delayed by more than 0.9 s (the window, also the read timeout, less the gap)
    would trip it sooner."""
    file, content = _repo(hub, "org/contract-stalled-complete", size=3_000)
    hub.inject("org/contract-stalled-complete", BIG, Fault.trickle(1_000, 1.1))
    policy = dataclasses.replace(fast_policy, stall_window=2.0, min_bytes_per_window=1 << 20, max_retries=0)
    stats = _fetch(hub, cache_dir, "org/contract-stalled-complete", file, policy)
    assert stats.requests == 1 and stats.bytes_received == file.size
    assert [e for e in stats.errors if "no-progress watchdog" in e] == [stats.errors[0]] == stats.errors
    assert (cache_dir / "models--org--contract-stalled-complete" / "blobs" / file.etag).read_bytes() == content


def test_the_watchdog_counts_exactly_the_bytes_its_first_window_brought(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """Three 1,000-byte pieces 0.6 s apart trip a 1 s window that asks for 1 MiB: the stall names the
    bytes that window brought, a whole number of pieces (3,000; 2,000 only if a piece came 0.4 s late),
    not one more, and the fetch keeps the file it completed."""
    file, content = _repo(hub, "org/contract-window-count", size=3_000)
    hub.inject("org/contract-window-count", BIG, Fault.trickle(1_000, 0.6))
    policy = dataclasses.replace(fast_policy, stall_window=1.0, min_bytes_per_window=1 << 20, max_retries=0)
    stats = _fetch(hub, cache_dir, "org/contract-window-count", file, policy)
    stalls = [e for e in stats.errors if "no-progress watchdog" in e]
    assert len(stalls) == 1, stats.errors
    counted = int(stalls[0].removeprefix(f"{BIG}: only ").split(" bytes in ")[0])
    assert counted in (2_000, 3_000), stalls
    assert (cache_dir / "models--org--contract-window-count" / "blobs" / file.etag).read_bytes() == content


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        (401, HubAuthError, "unauthorized; no token was sent"),
        (403, HubAuthError, "if the repo is gated"),
        (404, HubNotFoundError, "Check the repo id"),
        (400, HubError, "answered 400 Bad Request"),
    ],
)
def test_a_download_refused_for_good_raises_the_error_of_its_status(
    hub, cache_dir: Path, fast_policy: RetryPolicy, code: int, error: type[HubError], words: str
) -> None:
    """A 4xx the hub will not change its mind about ends the fetch at once, in the words of its status."""
    name = f"org/contract-refused-{code}"
    file, _ = _repo(hub, name, size=1_000)
    hub.inject(name, BIG, Fault.status(code))
    with pytest.raises(error) as info:
        _fetch(hub, cache_dir, name, file, fast_policy)
    assert type(info.value) is error
    assert str(info.value).startswith(f"downloading {BIG}: ") and words in str(info.value)
    assert len(_gets(hub, name)) == 1


def test_an_encoded_body_is_refused_naming_the_file_the_redacted_url_and_the_encoding(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """A server that gzips whatever was asked sends bytes the hub's hash does not describe: refused at
    once, not retried, and the message says where from (the CDN's URL, its presigned query dropped)."""
    from pytest_mlxgate.hub.errors import HubProtocolError

    name = "org/contract-gzip"
    file, _ = _repo(hub, name, size=20_000)
    hub.inject(name, BIG, Fault.content_encoding("GZip"))
    with pytest.raises(HubProtocolError) as info:
        _fetch(hub, cache_dir, name, file, fast_policy)
    sent = next(r for r in hub.log if r.file == ("model", name, BIG) and r.method == "GET" and r.status == 200)
    assert sent.origin == "cdn" and "?sig=" in sent.path  # an LFS file: a presigned URL on another origin
    where = f"{hub.cdn_endpoint}{sent.path.split('?')[0]}"
    assert str(info.value) == (
        f"{BIG}: {where} sent Content-Encoding 'gzip' although identity was asked; the bytes can't be "
        "checked against the hub's hash"
    )
    assert "sig=" not in str(info.value) and len(_gets(hub, name)) == 1
    assert not (cache_dir / "models--org--contract-gzip" / "blobs" / file.etag).exists()


@pytest.mark.parametrize("value", ["", "identity", "IDENTITY"])
def test_an_identity_encoding_however_spelled_is_the_plain_body(
    hub, cache_dir: Path, fast_policy: RetryPolicy, value: str
) -> None:
    name = f"org/contract-identity-{len(value)}{value[:1]}"
    file, content = _repo(hub, name, size=20_000)
    hub.inject(name, BIG, Fault.content_encoding(value))
    stats = _fetch(hub, cache_dir, name, file, fast_policy)
    assert (stats.requests, stats.restarts, stats.errors) == (1, 0, [])
    assert (cache_dir / f"models--{name.replace('/', '--')}" / "blobs" / file.etag).read_bytes() == content


def test_a_single_byte_received_before_a_refusal_is_kept_and_resumed(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """Any byte a fetch got is worth keeping: the partial outlives the 404 under a left-over name,
    and the next fetch asks for the rest from byte 1."""
    from pytest_mlxgate.hub.fetch import PARTIAL_SUFFIX

    name = "org/contract-one-byte"
    file, content = _repo(hub, name, size=20_000)
    hub.inject(name, BIG, Fault.truncate(1), Fault.status(404))
    with pytest.raises(HubNotFoundError):
        _fetch(hub, cache_dir, name, file, fast_policy)
    blobs = cache_dir / "models--org--contract-one-byte" / "blobs"
    left = sorted(blobs.glob(f"{file.etag}.left-*{PARTIAL_SUFFIX}"))
    assert [p.read_bytes() for p in left] == [content[:1]]
    stats = _fetch(hub, cache_dir, name, file, fast_policy)
    assert (stats.resumed_from, stats.requests, stats.bytes_received) == (1, 1, file.size - 1)
    assert _gets(hub, name)[-1][0] == "bytes=1-" and (blobs / file.etag).read_bytes() == content


def test_a_left_over_longer_than_the_file_is_no_prefix_of_it_and_is_fetched_whole(
    hub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    """A partial longer than the file cannot be its prefix, even when it starts with the right bytes:
    the fetch starts at byte 0, without a Range, and nothing is counted as resumed."""
    from pytest_mlxgate.hub.fetch import PARTIAL_SUFFIX

    name = "org/contract-too-long"
    file, content = _repo(hub, name, size=20_000)
    blobs = cache_dir / "models--org--contract-too-long" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{file.etag}.left-0000abcd{PARTIAL_SUFFIX}").write_bytes(content + b"tail")
    stats = _fetch(hub, cache_dir, name, file, fast_policy)
    assert (stats.resumed_from, stats.requests, stats.checksum_failures) == (0, 1, 0)
    assert _gets(hub, name) == [(None, 200, file.size)]
    assert sorted(blobs.iterdir()) == [blobs / file.etag] and (blobs / file.etag).read_bytes() == content
