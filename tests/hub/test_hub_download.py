"""snapshot_download against the fake hub on loopback: layout, auth, offline, and every fault."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from fakehub import Fault, Request

from pytest_mlxgate.hub import (
    HubAuthError,
    HubChecksumError,
    HubNotFoundError,
    HubOfflineError,
    HubProtocolError,
    HubRetryError,
    HubUnsafePathError,
    snapshot_download,
    verify_snapshot,
)
from pytest_mlxgate.hub.fetch import PARTIAL_SUFFIX
from pytest_mlxgate.hub.transport import RetryPolicy

TOKEN = "hf_secret_token_do_not_leak_1234"


def _files(seed: int = 0) -> dict[str, bytes]:
    # Random, not a repeated pattern: in a periodic file, bytes written at the wrong offset can be the
    # right bytes, and a client that appends a whole-file answer to its partial would pass unnoticed.
    big = random.Random(seed).randbytes(300_000)
    return {
        "config.json": b'{"model_type": "llama"}\n',
        "README.md": b"# a model\n",
        "weights/model-00001.safetensors": big,
        "weights/model-00002.safetensors": big[::-1] + b"tail",
        "tokenizer/tokenizer.json": b'{"version": "1.0"}' * 100,
        "empty.txt": b"",
        "one.bin": b"\x00",
    }


def _read_snapshot(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_snapshot_layout_and_bytes(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    files = _files(1)
    commit = hub.add_repo("org/layout", files)
    path = snapshot_download("org/layout", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert path == cache_dir / "models--org--layout" / "snapshots" / commit
    assert _read_snapshot(path) == files
    for p in path.rglob("*"):
        if p.is_file():
            target = os.readlink(p)
            assert not os.path.isabs(target) and target.startswith("../")
            blob = Path(os.path.realpath(p))
            assert blob.parent == cache_dir / "models--org--layout" / "blobs"
    assert (cache_dir / "models--org--layout" / "refs" / "main").read_text() == commit
    lfs_blob = hashlib.sha256(files["weights/model-00001.safetensors"]).hexdigest()
    assert (cache_dir / "models--org--layout" / "blobs" / lfs_blob).is_file()
    assert verify_snapshot("org/layout", cache_dir=cache_dir).ok
    for r in hub.log:
        assert r.headers.get("accept-encoding") == "identity"
    # The big files went through the CDN; small files straight from the hub.
    assert any(r.origin == "cdn" for r in hub.log)
    # Identical bytes are fetched once per file, no more.
    assert hub.bytes_served("org/layout") == sum(len(v) for v in files.values())


def test_dataset_repo_and_pagination(hub, cache_dir: Path, fast_policy: RetryPolicy) -> None:
    files = {f"data/part-{i}.jsonl": f'{{"i": {i}}}\n'.encode() * (i + 1) for i in range(8)}
    commit = hub.add_repo("org/ds", files, repo_type="dataset")
    path = snapshot_download(
        "org/ds", repo_type="dataset", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy
    )
    assert path == cache_dir / "datasets--org--ds" / "snapshots" / commit
    assert _read_snapshot(path) == files
    tree_pages = [r for r in hub.log if "/api/datasets/org/ds/tree/" in r.path]
    assert len(tree_pages) >= 3  # 8 files + folders at 3 per page


def test_a_pinned_complete_snapshot_touches_no_network(hub, cache_dir: Path, fast_policy) -> None:
    commit = hub.add_repo("org/pinned", _files(2))
    snapshot_download("org/pinned", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    hub.reset_log()
    again = snapshot_download(
        "org/pinned", revision=commit, cache_dir=cache_dir, endpoint="http://127.0.0.1:1", policy=fast_policy
    )
    assert again.name == commit and hub.log == []


def test_a_second_call_fetches_nothing(hub, cache_dir: Path, fast_policy) -> None:
    hub.add_repo("org/twice", _files(3))
    snapshot_download("org/twice", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    hub.reset_log()
    snapshot_download("org/twice", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert hub.bytes_served("org/twice") == 0


def test_a_new_commit_on_the_branch_is_picked_up(hub, cache_dir: Path, fast_policy) -> None:
    files = _files(4)
    first = hub.add_repo("org/moving", files)
    snapshot_download("org/moving", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    files2 = {**files, "config.json": b'{"model_type": "gemma"}\n'}
    second = hub.add_repo("org/moving", files2)
    hub.reset_log()
    path = snapshot_download("org/moving", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert path.name == second != first
    assert _read_snapshot(path) == files2
    assert hub.bytes_served("org/moving") == len(files2["config.json"])  # only what changed


def test_offline_complete_incomplete_and_missing(hub, cache_dir: Path, fast_policy) -> None:
    files = _files(5)
    commit = hub.add_repo("org/off", files)
    snapshot_download("org/off", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    hub.reset_log()
    path = snapshot_download("org/off", cache_dir=cache_dir, endpoint=hub.endpoint, offline=True)
    assert path.name == commit and hub.log == []
    with pytest.raises(HubOfflineError, match="not in the cache") as info:
        snapshot_download("org/never", cache_dir=cache_dir, offline=True)
    assert "mlxgate get org/never" in str(info.value)
    blob = Path(os.path.realpath(path / "weights" / "model-00002.safetensors"))
    blob.unlink()
    with pytest.raises(HubOfflineError, match="incomplete: missing weights/model-00002.safetensors"):
        snapshot_download("org/off", cache_dir=cache_dir, offline=True)
    # Online again, only the missing blob is fetched.
    snapshot_download("org/off", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert hub.bytes_served("org/off") == len(files["weights/model-00002.safetensors"])


def test_env_defaults(hub, tmp_path: Path, monkeypatch, fast_policy, hf_env) -> None:
    hub.add_repo("org/env", {"a.txt": b"a"}, gated_token=TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "envcache"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = snapshot_download("org/env", policy=fast_policy)
    assert path.is_relative_to(tmp_path / "envcache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.reset_log()
    assert snapshot_download("org/env") == path and hub.log == []


def test_gated_repo_errors_name_the_fix_and_never_the_token(hub, cache_dir: Path, fast_policy, caplog, hf_env) -> None:
    caplog.set_level(logging.DEBUG)
    hub.add_repo("org/gated", _files(6), gated_token=TOKEN)
    with pytest.raises(HubAuthError) as no_token:
        snapshot_download("org/gated", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert "HF_TOKEN" in str(no_token.value) and "no token was sent" in str(no_token.value)
    with pytest.raises(HubAuthError) as wrong:
        snapshot_download(
            "org/gated", cache_dir=cache_dir, endpoint=hub.endpoint, token="hf_wrong_one", policy=fast_policy
        )
    assert "rejected" in str(wrong.value) and "hf_wrong_one" not in str(wrong.value)
    hub.reset_log()
    path = snapshot_download("org/gated", cache_dir=cache_dir, endpoint=hub.endpoint, token=TOKEN, policy=fast_policy)
    assert _read_snapshot(path) == _files(6)
    cdn = [r for r in hub.log if r.origin == "cdn"]
    assert cdn and all("authorization" not in r.headers for r in cdn)
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in hub.log if r.origin == "hub")
    assert TOKEN not in caplog.text


def test_token_from_file(hub, cache_dir: Path, fast_policy, hf_env) -> None:
    hf_env.home.mkdir()
    (hf_env.home / "token").write_text(TOKEN + "\n")
    hub.add_repo("org/gated-file", {"x": b"x"}, gated_token=TOKEN)
    snapshot_download("org/gated-file", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)


def test_not_found(hub, cache_dir: Path, fast_policy) -> None:
    with pytest.raises(HubNotFoundError, match="404"):
        snapshot_download("org/nope", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    hub.add_repo("org/exists", {"a": b"a"})
    with pytest.raises(HubNotFoundError, match="revision"):
        snapshot_download(
            "org/exists", revision="no-such-branch", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy
        )


@pytest.mark.parametrize("name", ["../escape.txt", "a/../../escape.txt", "/abs.txt", "a//b.txt"])
def test_unsafe_names_write_nothing(hub, cache_dir: Path, fast_policy, name: str) -> None:
    hub.add_repo("org/evil", {"ok.txt": b"fine", name: b"evil"}, hostile_paths=True)
    with pytest.raises(HubUnsafePathError):
        snapshot_download("org/evil", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    written = [p for p in cache_dir.rglob("*") if p.is_file()] if cache_dir.exists() else []
    assert written == []
    assert not (cache_dir.parent / "escape.txt").exists()


# ------------------------------------------------------------------------------------------ faults
BIG = "weights/model-00001.safetensors"


def _fault_repo(hub, name: str) -> tuple[str, dict[str, bytes]]:
    files = _files(hash(name) % 1000)
    hub.add_repo(name, files)
    return name, files


@pytest.mark.parametrize(
    "fault",
    [
        Fault.truncate(100_000),
        Fault.reset(50_000),
        Fault.status(503, retry_after="0"),
        Fault.status(429, retry_after="0"),
        Fault.status(500),
        Fault.corrupt(12_345),
        Fault.short_length(70_000),
        Fault.range_416(),
    ],
    ids=lambda f: repr(f)[:40],
)
def test_a_single_fault_is_survived(hub, cache_dir: Path, fast_policy, fault) -> None:
    repo, files = _fault_repo(hub, f"org/fault-{abs(hash(repr(fault))) % 10**8}")
    hub.inject(repo, BIG, fault)
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(path) == files
    assert verify_snapshot(repo, cache_dir=cache_dir).ok


# The final hash repairs any resume bug by downloading again, so these tests look at the traffic: what
# the hub was asked, what it sent, and what the client wrote.


class _Written:
    """Bytes the client wrote, read off snapshot_download's progress (its count drops on a restart)."""

    def __init__(self) -> None:
        self.done = self.written = self.peak = 0

    def __call__(self, done: int, total: int) -> None:
        self.written += max(done - self.done, 0)
        self.done, self.peak = done, max(self.peak, done)


def _one_file_repo(hub, name: str) -> tuple[str, bytes]:
    """A repo holding only BIG, so the snapshot's progress is that one file's."""
    content = _files(abs(hash(name)) % 1000)[BIG]
    hub.add_repo(name, {BIG: content})
    return name, content


def _content_gets(hub, repo: str, path: str) -> list[tuple[str | None, int, int]]:
    """(Range asked, status, body bytes sent) of each GET that answered with the file's bytes, in order."""
    gets: list[Request] = [
        r for r in hub.log if r.file == ("model", repo, path) and r.method == "GET" and r.status != 302
    ]
    return [(r.headers.get("range"), r.status, r.body_bytes) for r in gets]


def test_an_interrupted_download_asks_once_for_exactly_the_rest(hub, cache_dir: Path, fast_policy) -> None:
    repo, content = _one_file_repo(hub, "org/resume-range")
    hub.inject(repo, BIG, Fault.truncate(123_456))
    written = _Written()
    snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy, progress=written)
    size = len(content)
    assert _content_gets(hub, repo, BIG) == [(None, 200, 123_456), ("bytes=123456-", 206, size - 123_456)]
    assert hub.bytes_served(repo, BIG) == size  # not a byte sent twice
    assert written.written == written.peak == size


def test_a_200_answer_to_a_range_restarts_the_file_instead_of_appending(hub, cache_dir: Path, fast_policy) -> None:
    repo, content = _one_file_repo(hub, "org/ignore-range")
    hub.inject(repo, BIG, Fault.truncate(100_000), Fault.ignore_range())
    written = _Written()
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy, progress=written)
    assert _read_snapshot(path)[BIG] == content
    size = len(content)
    # The whole file came in the one 200 and replaced the partial: no third download after a failed hash.
    assert _content_gets(hub, repo, BIG) == [(None, 200, 100_000), ("bytes=100000-", 200, size)]
    assert hub.bytes_served(repo, BIG) == 100_000 + size
    assert written.written == 100_000 + size and written.peak == size


@pytest.mark.parametrize("shift", [-1000, 1000])
def test_a_206_from_another_offset_is_refused_not_appended(hub, cache_dir: Path, fast_policy, shift: int) -> None:
    repo, content = _one_file_repo(hub, f"org/wrong-cr{shift}")
    hub.inject(repo, BIG, Fault.truncate(100_000), Fault.wrong_content_range(shift))
    written = _Written()
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy, progress=written)
    assert _read_snapshot(path)[BIG] == content
    # Refused unread, then the whole file once without Range (the server's ranges can't be trusted).
    gets = _content_gets(hub, repo, BIG)
    size = len(content)
    assert [(asked, status) for asked, status, _ in gets] == [(None, 200), ("bytes=100000-", 206), (None, 200)]
    assert gets[-1][2] == size
    # Nothing of the misplaced body was written: the first 100000 bytes, then the file once.
    assert written.written == 100_000 + size and written.peak == size


def test_always_corrupt_ends_in_checksum_error_and_publishes_nothing(hub, cache_dir: Path, fast_policy) -> None:
    repo, files = _fault_repo(hub, "org/always-corrupt")
    hub.inject(repo, BIG, Fault.corrupt(1000).forever())
    t0 = time.monotonic()
    with pytest.raises(HubChecksumError, match="corrupts") as info:
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert time.monotonic() - t0 < 20
    assert "sha256" in str(info.value)
    full = [r for r in hub.log if r.file == ("model", repo, BIG) and r.origin == "cdn" and r.status == 200]
    assert len(full) == fast_policy.max_checksum_failures + 1
    bad = hashlib.sha256(files[BIG]).hexdigest()
    assert not (cache_dir / "models--org--always-corrupt" / "blobs" / bad).exists()


def test_a_corrupt_git_file_is_fetched_again_under_its_git_hash(hub, cache_dir: Path, fast_policy) -> None:
    """A small (non-LFS) file is named by git's blob sha1, which hashes its size first: the restart after
    a failed check must start that hash afresh, header and all."""
    repo, files = _fault_repo(hub, "org/corrupt-git-file")
    hub.inject(repo, "config.json", Fault.corrupt(5))
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(path) == files
    assert len(_content_gets(hub, repo, "config.json")) == 2


def test_a_checksum_error_keeps_nothing_of_the_bad_bytes(hub, cache_dir: Path, fast_policy) -> None:
    repo, _ = _fault_repo(hub, "org/corrupt-nothing-kept")
    hub.inject(repo, BIG, Fault.corrupt(1000).forever())
    with pytest.raises(HubChecksumError, match="Nothing was kept"):
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    blobs = cache_dir / "models--org--corrupt-nothing-kept" / "blobs"
    assert [p.stat().st_size for p in blobs.glob(f"*{PARTIAL_SUFFIX}")] in ([], [0])


def test_giving_up_names_the_last_error(hub, cache_dir: Path, fast_policy) -> None:
    repo, _ = _fault_repo(hub, "org/last-error")
    hub.inject(repo, BIG, Fault.status(500), Fault.status(502), Fault.status(503, retry_after="0").forever())
    with pytest.raises(HubRetryError, match="gave up after 3 tries in a row") as info:
        snapshot_download(
            repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=dataclasses.replace(fast_policy, max_retries=2)
        )
    message = str(info.value)
    assert "answered 503)" in message and "answered 502" not in message and "answered 500" not in message


def test_persistent_503_ends_in_retry_error(hub, cache_dir: Path, fast_policy) -> None:
    repo, _ = _fault_repo(hub, "org/always-503")
    hub.inject(repo, BIG, Fault.status(503, retry_after="0").forever())
    with pytest.raises(HubRetryError, match="gave up"):
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)


def test_slow_trickle_trips_the_watchdog(hub, cache_dir: Path, fast_policy) -> None:
    repo, files = _fault_repo(hub, "org/trickle")
    hub.inject(repo, BIG, Fault.trickle(1, 0.1))
    t0 = time.monotonic()
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(path)[BIG] == files[BIG]
    assert time.monotonic() - t0 < 10


@pytest.mark.slow  # runs out the stall window
def test_endless_trickle_ends(hub, cache_dir: Path, fast_policy) -> None:
    repo, _ = _fault_repo(hub, "org/trickle-forever")
    hub.inject(repo, BIG, Fault.trickle(1, 0.1).forever())
    t0 = time.monotonic()
    with pytest.raises(HubRetryError):
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert time.monotonic() - t0 < 30


def test_redirect_loop_is_refused(hub, cache_dir: Path, fast_policy) -> None:
    repo, _ = _fault_repo(hub, "org/loop")
    hub.inject(repo, BIG, Fault.redirect_loop())
    with pytest.raises(HubProtocolError, match="redirect"):
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)


def test_partial_from_an_earlier_run_is_resumed(hub, cache_dir: Path, fast_policy) -> None:
    repo, files = _fault_repo(hub, "org/cross-run")
    stubborn = RetryPolicy(**{**fast_policy.__dict__, "max_retries": 1})
    hub.inject(repo, BIG, Fault.truncate(200_000), Fault.status(503, retry_after="0").forever())
    with pytest.raises(HubRetryError, match="next run resumes"):
        snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=stubborn)
    hub.clear_faults()
    hub.reset_log()
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(path) == files
    assert hub.bytes_served(repo, BIG) == len(files[BIG]) - 200_000


def test_api_503_is_retried(hub, cache_dir: Path, fast_policy) -> None:
    hub.add_repo("org/api-flaky", {"a": b"a"})
    hub.inject_api(Fault.status(503, retry_after="0"), Fault.status(429, retry_after="0"))
    path = snapshot_download("org/api-flaky", cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert (path / "a").read_bytes() == b"a"


def test_verify_finds_and_repairs_a_corrupt_blob(hub, cache_dir: Path, fast_policy) -> None:
    repo, files = _fault_repo(hub, "org/verify")
    path = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    blob = Path(os.path.realpath(path / BIG))
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))
    report = verify_snapshot(repo, cache_dir=cache_dir)
    assert not report.ok and BIG in report.problems[0]
    report = verify_snapshot(repo, cache_dir=cache_dir, repair=True)
    assert "moved aside" in report.problems[0]
    snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert verify_snapshot(repo, cache_dir=cache_dir).ok


def test_verify_reports_every_kind_of_damage_and_goes_on_after_each(hub, cache_dir: Path, fast_policy) -> None:
    repo, files = _fault_repo(hub, "org/verify-damage")
    snap = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    blob_of = {name: Path(os.path.realpath(snap / name)) for name in files}
    blob_of["README.md"].unlink()  # a dangling link
    (snap / "config.json").unlink()  # a link to another file's blob than the manifest names
    (snap / "config.json").symlink_to(os.path.relpath(blob_of["one.bin"], snap))
    (snap / "extra.txt").write_bytes(b"not from the hub")  # a plain file, named by no hash
    (snap / "tokenizer" / "tokenizer.json").unlink()  # gone from the snapshot
    big = blob_of[BIG]
    big.write_bytes(b"X" + big.read_bytes()[1:])  # a corrupt blob
    report = verify_snapshot(repo, cache_dir=cache_dir, repair=True)
    actual = hashlib.sha256(b"X" + files[BIG][1:]).hexdigest()
    [aside] = big.parent.glob(f"{big.name}.corrupt-*")
    assert report.problems == [
        "README.md: its blob is missing",
        f"config.json: links to blob {blob_of['one.bin'].name}, the manifest says {blob_of['config.json'].name}",
        "extra.txt: blob extra.txt is not named by a hash; can't check it",
        f"{BIG}: content hashes to {actual}, not {big.name} (corrupt blob {big}); moved aside to {aside.name}, "
        "the next download fetches it again",
        "tokenizer/tokenizer.json: missing from the snapshot",
    ]
    assert not big.exists() and aside.read_bytes()[:1] == b"X"
    assert report.files_checked == 4  # empty.txt, one.bin and both shards: the rest was refused before hashing


def test_verify_of_what_is_not_cached_says_so(hub, cache_dir: Path, fast_policy) -> None:
    with pytest.raises(HubOfflineError) as info:
        verify_snapshot("org/never-fetched", cache_dir=cache_dir)
    assert str(info.value) == f"model org/never-fetched@main is not in the cache {cache_dir}; nothing to verify"
    repo, _ = _fault_repo(hub, "org/verify-gone")
    snap = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    shutil.rmtree(snap)  # the ref still names the commit, its folder is gone
    with pytest.raises(HubOfflineError, match="is not in the cache"):
        verify_snapshot(repo, cache_dir=cache_dir)
