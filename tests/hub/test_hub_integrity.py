"""A cached snapshot is trusted for its content, not its sizes: blobs carry verified stamps, anything
changed since is hashed again, and what no longer matches is refused offline and fetched again online.

Everything runs against the fake hub on loopback; what was fetched again is read off its request log,
what was hashed off a counting hasher (the real hashing, wrapped), never off a clock.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
from fakehub import FakeHub, git_blob_oid

from pytest_mlxgate.cli import main as mlxgate
from pytest_mlxgate.hub import (
    HubVerifyError,
    hashing,
    snapshot_download,
    verify_snapshot,
)
from pytest_mlxgate.hub.cache import RepoCache
from pytest_mlxgate.hub.transport import RetryPolicy

CONFIG = b'{\n  "model_type": "llama",\n  "rope_theta": 10000.0,\n  "hidden_size": 64\n}\n'
EDITED = CONFIG.replace(b"10000.0", b"90000.0")  # the edit: same size, another model
WEIGHTS = "model.safetensors"


def _files(seed: int) -> dict[str, bytes]:
    return {
        "config.json": CONFIG,  # a git-sha1 file, far under 4 KB
        "tokenizer_config.json": b'{"eos_token": "</s>"}\n',
        WEIGHTS: random.Random(seed).randbytes(200_000),  # LFS: sha256
        "empty.txt": b"",
    }


def _download(hub: FakeHub, cache_dir: Path, policy: RetryPolicy, repo: str, files: dict[str, bytes]) -> Path:
    hub.add_repo(repo, files)
    return snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=policy)


def _blob(snap: Path, name: str) -> Path:
    return Path(os.path.realpath(snap / name))


def _edit_in_place(blob: Path, old: bytes, new: bytes) -> None:
    """Overwrite bytes inside the file (same inode, same size), the way an editor saving in place does."""
    assert len(old) == len(new)
    data = blob.read_bytes()
    at = data.index(old)
    with open(blob, "r+b") as f:
        f.seek(at)
        f.write(new)
    assert blob.stat().st_size == len(data)


def _flip_byte(blob: Path, at: int) -> None:
    """One bit changed in place: same inode, same size."""
    with open(blob, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))


def _read_snapshot(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _content_requests(hub: FakeHub, repo: str) -> dict[str, int]:
    """File → bytes the hub (or its CDN) sent of it, for every GET that carried content."""
    sent: dict[str, int] = {}
    for r in list(hub.log):
        if r.file is not None and r.file[1] == repo and r.method == "GET" and r.status in (200, 206):
            sent[r.file[2]] = sent.get(r.file[2], 0) + r.body_bytes
    return sent


class _HashedBytes:
    """The real hashing, counting every byte it is fed (hashing.new_hasher is where each hash starts)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        self.hashes = 0
        real = hashing.new_hasher

        def counting(algo: hashing.Algo, size: int) -> hashing.Hasher:
            inner = real(algo, size)
            outer = self

            class Counting:
                def update(self, data: bytes | bytearray | memoryview, /) -> None:
                    outer.bytes += len(data)
                    inner.update(data)

                def hexdigest(self) -> str:
                    return inner.hexdigest()

            self.hashes += 1
            return Counting()

        monkeypatch.setattr(hashing, "new_hasher", counting)

    def reset(self) -> None:
        self.bytes = self.hashes = 0


# ------------------------------------------------------------------------------------ verify + get


def test_verify_reports_a_truncated_blob_and_a_small_git_file_edited_in_place_and_get_fetches_both(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    repo = "integrity/verify-both"
    files = _files(1)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    weights, config = _blob(snap, WEIGHTS), _blob(snap, "config.json")
    assert config.name == git_blob_oid(CONFIG)  # the small file is named by git's sha1, not by sha256
    with open(weights, "r+b") as f:
        f.truncate(150_000)
    _edit_in_place(config, b"10000.0", b"90000.0")

    report = verify_snapshot(repo, cache_dir=cache_dir)
    assert report.files_checked == len(files)  # every file, the 0-byte and the 70-byte ones included
    assert sorted(report.problems) == sorted(
        [
            f"config.json: content hashes to {git_blob_oid(EDITED)}, not {config.name} (corrupt blob {config})",
            (
                f"{WEIGHTS}: content hashes to {hashlib.sha256(files[WEIGHTS][:150_000]).hexdigest()}, "
                f"not {weights.name} (corrupt blob {weights})"
            ),
        ]
    )

    hub.reset_log()
    again = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(again) == files
    # Exactly the two damaged files were asked for again, whole; the intact ones were not.
    assert _content_requests(hub, repo) == {"config.json": len(CONFIG), WEIGHTS: len(files[WEIGHTS])}
    # The edited blob was kept aside, not destroyed; the short one was simply written over.
    [aside] = config.parent.glob(f"{config.name}.corrupt-*")
    assert aside.read_bytes() == EDITED
    assert verify_snapshot(repo, cache_dir=cache_dir).ok


@pytest.mark.parametrize("content", [b"", b"{}"], ids=["empty", "short"])
def test_an_existing_short_or_empty_blob_is_never_counted_as_published(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy, content: bytes
) -> None:
    repo = f"integrity/short-{len(content)}"
    files = _files(2)
    hub.add_repo(repo, files)
    blobs = RepoCache(cache_dir, repo, "model").blobs
    blobs.mkdir(parents=True)
    lfs = hashlib.sha256(files[WEIGHTS]).hexdigest()
    (blobs / lfs).write_bytes(content)  # a blob under its final name, but not its bytes
    (blobs / git_blob_oid(CONFIG)).write_bytes(content)
    snap = snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(snap) == files
    sent = _content_requests(hub, repo)
    assert sent["config.json"] == len(CONFIG) and sent[WEIGHTS] == len(files[WEIGHTS])


# --------------------------------------------------------------------------------- offline, CLI


def test_an_in_place_edit_at_the_same_size_fails_offline_get_and_online_get_fetches_it_again(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy, hf_env: object, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "integrity/same-size-edit"
    files = _files(3)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    assert mlxgate(["get", repo, "--offline", "--cache-dir", str(cache_dir)]) == 0
    capsys.readouterr()
    _edit_in_place(_blob(snap, "config.json"), b"10000.0", b"90000.0")

    assert mlxgate(["get", repo, "--offline", "--cache-dir", str(cache_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no path printed: nothing to use
    assert err.startswith(
        f"mlxgate: offline, and files of the cached model {repo}@{snap.name[:7]} are not the "
        "bytes that were verified: config.json: its content changed since it was verified: it "
        f"hashes to {git_blob_oid(EDITED)}, not {git_blob_oid(CONFIG)}"
    )
    assert f"Fix: run `mlxgate get {repo} --cache-dir {cache_dir}` with network" in err
    assert "Traceback" not in err
    # The pinned form too: a commit's complete-looking snapshot is not taken on its sizes.
    with pytest.raises(HubVerifyError, match="config.json: its content changed"):
        snapshot_download(repo, revision=snap.name, cache_dir=cache_dir, offline=True)

    hub.reset_log()
    assert mlxgate(["get", repo, "--cache-dir", str(cache_dir), "--endpoint", hub.endpoint]) == 0
    assert capsys.readouterr().out == f"{snap}\n"
    assert _content_requests(hub, repo) == {"config.json": len(CONFIG)}
    assert (snap / "config.json").read_bytes() == CONFIG
    assert mlxgate(["get", repo, "--offline", "--cache-dir", str(cache_dir)]) == 0


def test_a_pinned_commit_with_an_edited_blob_is_fetched_again_online(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    repo = "integrity/pinned-edit"
    files = _files(4)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    _flip_byte(_blob(snap, WEIGHTS), 5000)
    hub.reset_log()
    again = snapshot_download(repo, revision=snap.name, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert _read_snapshot(again) == files
    assert _content_requests(hub, repo) == {WEIGHTS: len(files[WEIGHTS])}


def test_a_snapshot_file_replaced_by_an_edited_copy_is_refused_offline_and_relinked_online(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    repo = "integrity/replaced-link"
    files = _files(5)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    link = snap / "config.json"
    link.unlink()  # what `sed -i` does: a new file in the link's place, the blob untouched
    link.write_bytes(EDITED)
    with pytest.raises(HubVerifyError, match="config.json: it is no longer a link to its verified blob"):
        snapshot_download(repo, cache_dir=cache_dir, offline=True)
    hub.reset_log()
    snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert link.is_symlink() and link.read_bytes() == CONFIG
    assert _content_requests(hub, repo) == {}  # its blob was intact: only the link was written again


def test_a_huggingface_hub_style_snapshot_is_checked_through_its_hash_named_blobs(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    repo = "integrity/no-manifest"
    snap = _download(hub, cache_dir, fast_policy, repo, _files(6))
    cache = RepoCache(cache_dir, repo, "model")
    cache.manifest_path(snap.name).unlink()  # as huggingface_hub leaves it: links and blobs, no file list
    assert snapshot_download(repo, cache_dir=cache_dir, offline=True) == snap
    _flip_byte(_blob(snap, WEIGHTS), 1234)
    with pytest.raises(HubVerifyError, match=f"{WEIGHTS}: its content changed since it was verified"):
        snapshot_download(repo, cache_dir=cache_dir, offline=True)


# ----------------------------------------------------------------------------------------- cost


def test_a_blob_whose_stamp_still_matches_is_not_hashed_again(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = "integrity/stamps"
    files = _files(7)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    hashed = _HashedBytes(monkeypatch)
    total = sum(len(v) for v in files.values())

    assert snapshot_download(repo, cache_dir=cache_dir, offline=True) == snap
    assert snapshot_download(repo, revision=snap.name, cache_dir=cache_dir, offline=True) == snap
    snapshot_download(repo, cache_dir=cache_dir, endpoint=hub.endpoint, policy=fast_policy)
    assert (hashed.hashes, hashed.bytes) == (0, 0)  # offline, pinned and online: the stamps vouched for all

    # A touch keeps the bytes but moves the stat: that one blob alone is hashed again, then stamped again.
    weights = _blob(snap, WEIGHTS)
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert snapshot_download(repo, cache_dir=cache_dir, offline=True) == snap
    assert (hashed.hashes, hashed.bytes) == (1, len(files[WEIGHTS]))
    hashed.reset()
    snapshot_download(repo, cache_dir=cache_dir, offline=True)
    assert hashed.bytes == 0

    # No stamps at all (a cache from before stamps, or huggingface_hub's): every blob is hashed once.
    for stamp in (cache_dir / "models--integrity--stamps" / ".mlxgate" / "verified").iterdir():
        stamp.unlink()
    snapshot_download(repo, cache_dir=cache_dir, offline=True)
    assert (hashed.hashes, hashed.bytes) == (len(files), total)
    hashed.reset()
    snapshot_download(repo, cache_dir=cache_dir, offline=True)
    assert hashed.bytes == 0

    # verify hashes everything whatever the stamps say.
    report = verify_snapshot(repo, cache_dir=cache_dir)
    assert report.ok and hashed.bytes == report.bytes_checked == total


def test_verify_hashes_blobs_a_snapshot_links_outside_its_cache_by_their_own_algorithm(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy, tmp_path: Path
) -> None:
    """A snapshot whose links lead to blobs kept elsewhere (a shared store): each is hashed as its name
    says (git sha1 for the small file, sha256 for the LFS one), the intact one passes, the edited one is named."""
    repo = "integrity/outside"
    files = _files(5)
    snap = _download(hub, cache_dir, fast_policy, repo, files)
    store = tmp_path / "store"
    store.mkdir()
    for name in ("config.json", WEIGHTS):
        blob = _blob(snap, name)
        outside = store / blob.name
        blob.rename(outside)
        (snap / name).unlink()
        (snap / name).symlink_to(outside)
    assert verify_snapshot(repo, cache_dir=cache_dir).ok
    _edit_in_place(store / git_blob_oid(CONFIG), b"10000.0", b"90000.0")
    report = verify_snapshot(repo, cache_dir=cache_dir)
    assert report.files_checked == len(files) and report.bytes_checked == sum(len(v) for v in files.values())
    assert report.problems == [
        f"config.json: content hashes to {git_blob_oid(EDITED)}, not {git_blob_oid(CONFIG)} "
        f"(corrupt blob {store / git_blob_oid(CONFIG)})"
    ]
    assert (store / hashlib.sha256(files[WEIGHTS]).hexdigest()).is_file()
