"""Our cache and huggingface_hub's cache are one and the same, in both directions, with the REAL library.

Why: users mix ``mlxgate get`` with ``transformers``/``mlx_lm``, which download through
``huggingface_hub``. A snapshot one of them wrote must be usable by the other without a byte fetched
again, and ``huggingface_hub``'s own tools (``scan_cache_dir``, ``local_files_only``) must see our
snapshots as healthy. Everything runs against the loopback fake hub (``tests/support/fakehub.py``); the
assertions are on requests and bytes served, not only on the final files.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import pytest
from fakehub import LFS_THRESHOLD, git_blob_oid  # tests/support/, on pytest's pythonpath
from hfenv import HfEnv

from pytest_mlxgate.hub import HubOfflineError, snapshot_download, verify_snapshot
from pytest_mlxgate.hub.cache import repo_folder_name

hf = pytest.importorskip("huggingface_hub")


def _rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _model_files(seed: int) -> dict[str, bytes]:
    """Nested folders, small (git) and LFS files, a name with a space, an empty file. All distinct."""
    return {
        "config.json": b'{"model_type": "fake", "seed": %d}\n' % seed,
        "README.md": b"# interop %d\n" % seed,
        "empty.txt": b"",
        "tokenizer/vocab.txt": b"\n".join(b"tok%d-%d" % (seed, i) for i in range(60)),  # small, nested
        "weights/model.safetensors": _rand(250_000, seed),
        "weights/shards/part 00001.bin": _rand(5_000, seed + 1),  # LFS, a space in its name
        "weights/shards/deep/er/tiny.bin": b"tiny %d" % seed,  # small, 4 folders deep
    }


def _dataset_files(seed: int) -> dict[str, bytes]:
    return {
        "README.md": b"# data %d\n" % seed,
        "data/dev.jsonl": b'{"x": %d}\n{"x": 2}\n' % seed,
        "data/train/shard 0.parquet": _rand(70_000, seed + 2),
        "data/train/shard-1.parquet": _rand(2_000, seed + 3),
    }


def _blob_name(content: bytes) -> str:
    """The blob name both clients must agree on: sha256 for LFS files, git sha1 for the rest."""
    return hashlib.sha256(content).hexdigest() if len(content) >= LFS_THRESHOLD else git_blob_oid(content)


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _links(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): os.readlink(p) for p in root.rglob("*") if p.is_symlink()}


def _content_requests(hub: Any) -> list[Any]:
    """Requests that are not the JSON API: resolve URLs (hub) and every CDN request."""
    return [r for r in hub.log if r.origin == "cdn" or not r.path.startswith("/api/")]


@pytest.fixture
def hf_env(hf_env: HfEnv) -> Any:
    """The shared isolated HF_* environment (tests/conftest.py), as the real huggingface_hub (returned)
    sees it: quiet, xet-free, online and token-free, whatever was imported before."""
    return hf_env.huggingface_hub(xet=False)


def _add(hub: Any, repo_type: str, name: str, seed: int) -> tuple[str, str, dict[str, bytes]]:
    repo_id = f"interop/{repo_type}-{name}"
    files = _model_files(seed) if repo_type == "model" else _dataset_files(seed)
    commit = hub.add_repo(repo_id, files, repo_type=repo_type)
    return repo_id, commit, files


# ----------------------------------------------------------- (a) huggingface_hub writes, we read


@pytest.mark.parametrize("repo_type", ["model", "dataset"])
def test_a_snapshot_written_by_huggingface_hub_is_ours_offline_and_online(
    hf_env: Any, hub: Any, tmp_path: Path, fast_policy: Any, repo_type: str
) -> None:
    repo_id, commit, files = _add(hub, repo_type, "hf-writes", seed=11 if repo_type == "model" else 12)
    cache_a = tmp_path / "cache-a"
    total = sum(map(len, files.values()))

    hf_path = Path(
        hf_env.snapshot_download(repo_id, repo_type=repo_type, endpoint=hub.endpoint, cache_dir=cache_a, token=False)
    )
    root = cache_a / repo_folder_name(repo_id, repo_type)
    assert hf_path == root / "snapshots" / commit
    assert _read_tree(hf_path) == files
    assert hub.bytes_served(repo_id) == total  # sanity: huggingface_hub really did the download
    assert not (root / ".mlxgate").exists()  # no manifest: the snapshot is huggingface_hub's alone
    hf_links = _links(hf_path)
    assert set(hf_links) == set(files)

    # Offline, we take huggingface_hub's snapshot as it is (our path checks that every link resolves).
    hub.reset_log()
    ours = snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_a, offline=True)
    assert ours == hf_path
    assert _read_tree(ours) == files
    assert hub.log == []
    report = verify_snapshot(repo_id, repo_type=repo_type, cache_dir=cache_a)
    assert report.ok, report.problems
    assert report.path == hf_path
    assert report.files_checked == len(files)
    assert report.bytes_checked == total

    # Online, we find every blob already there: the API is asked, not one content byte is fetched.
    ours = snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_a, endpoint=hub.endpoint, policy=fast_policy)
    assert ours == hf_path
    assert _read_tree(ours) == files
    assert hub.bytes_served() == 0
    assert _content_requests(hub) == []
    assert {r.path.split("?")[0] for r in hub.log} >= {f"/api/{repo_type}s/{repo_id}/revision/main"}
    # We left huggingface_hub's links as they were and wrote our manifest next to them.
    assert _links(hf_path) == hf_links
    assert (root / ".mlxgate" / f"{commit}.json").is_file()
    assert (root / "refs" / "main").read_bytes() == commit.encode()
    assert sorted(p.name for p in (root / "blobs").iterdir()) == sorted({_blob_name(c) for c in files.values()})

    # And huggingface_hub still sees a healthy cache after we touched it.
    info = hf_env.scan_cache_dir(cache_a)
    assert info.warnings == []
    (repo,) = [r for r in info.repos if r.repo_id == repo_id]
    assert repo.size_on_disk == total


def test_a_huggingface_hub_snapshot_with_a_lost_blob_is_refused_offline(hf_env: Any, hub: Any, tmp_path: Path) -> None:
    """Without a manifest, the offline path's only evidence is the links: a dangling one must fail."""
    repo_id, commit, files = _add(hub, "model", "hf-lost-blob", seed=13)
    cache_a = tmp_path / "cache-a"
    hf_path = Path(hf_env.snapshot_download(repo_id, endpoint=hub.endpoint, cache_dir=cache_a, token=False))
    os.unlink(os.path.realpath(hf_path / "weights/shards/part 00001.bin"))
    with pytest.raises(HubOfflineError, match="1 files lack their blob"):
        snapshot_download(repo_id, cache_dir=cache_a, offline=True)


# ----------------------------------------------------------- (b) we write, huggingface_hub reads


@pytest.mark.parametrize("repo_type", ["model", "dataset"])
def test_a_snapshot_we_wrote_is_read_by_huggingface_hub(
    hf_env: Any, hub: Any, tmp_path: Path, fast_policy: Any, repo_type: str
) -> None:
    repo_id, commit, files = _add(hub, repo_type, "we-write", seed=21 if repo_type == "model" else 22)
    cache_b = tmp_path / "cache-b"
    total = sum(map(len, files.values()))
    ours = snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_b, endpoint=hub.endpoint, policy=fast_policy)
    root = cache_b / repo_folder_name(repo_id, repo_type)
    assert ours == root / "snapshots" / commit
    assert hub.bytes_served(repo_id) == total

    # huggingface_hub, offline: the same snapshot path, and per file the same path and bytes.
    hub.reset_log()
    got = hf_env.snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_b, local_files_only=True)
    assert Path(got) == ours
    assert _read_tree(Path(got)) == files
    for name, content in files.items():
        path = hf_env.hf_hub_download(repo_id, name, repo_type=repo_type, cache_dir=cache_b, local_files_only=True)
        assert Path(path) == ours / name
        assert Path(path).read_bytes() == content
        assert hf_env.try_to_load_from_cache(repo_id, name, cache_dir=cache_b, repo_type=repo_type) == path
    assert hub.log == []

    # huggingface_hub's cache scanner: our repo, no warnings, the right files, sizes and refs.
    info = hf_env.scan_cache_dir(cache_b)
    assert info.warnings == []
    assert not info.incomplete_files
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type, repo.repo_path) == (repo_id, repo_type, root)
    assert repo.nb_files == len({_blob_name(c) for c in files.values()}) == len(files)
    assert repo.size_on_disk == total
    (rev,) = repo.revisions
    assert rev.commit_hash == commit
    assert rev.refs == frozenset({"main"})
    assert rev.snapshot_path == ours
    assert rev.nb_files == len(files)
    assert rev.size_on_disk == total
    by_path = {f.file_path.relative_to(ours).as_posix(): f for f in rev.files}
    assert by_path.keys() == files.keys()
    for name, f in by_path.items():
        assert f.size_on_disk == len(files[name])
        assert f.blob_path == root / "blobs" / _blob_name(files[name])
    assert info.size_on_disk == total

    # huggingface_hub, online on our cache: it asks the API, finds every file cached, fetches no content.
    got = hf_env.snapshot_download(repo_id, repo_type=repo_type, endpoint=hub.endpoint, cache_dir=cache_b, token=False)
    assert Path(got) == ours
    assert hub.bytes_served() == 0
    assert _content_requests(hub) == []
    assert f"/api/{repo_type}s/{repo_id}/revision/main" in {r.path.split("?")[0] for r in hub.log}
    assert _read_tree(ours) == files
    # Single files online too (with a branch name, it HEADs the resolve URL: metadata, no content bytes).
    hub.reset_log()
    name = next(n for n, c in files.items() if len(c) >= LFS_THRESHOLD)
    path = hf_env.hf_hub_download(
        repo_id, name, repo_type=repo_type, endpoint=hub.endpoint, cache_dir=cache_b, token=False
    )
    assert Path(path) == ours / name
    assert hub.bytes_served() == 0
    assert {r.method for r in _content_requests(hub)} <= {"HEAD"}
    assert hf_env.scan_cache_dir(cache_b).warnings == []


# ------------------------------------------------------------------ (c) a revision other than main


@pytest.mark.parametrize("branch", ["v1.0", "refs/pr/1"])
def test_refs_of_another_revision_are_written_the_way_huggingface_hub_reads_them(
    hf_env: Any, hub: Any, tmp_path: Path, fast_policy: Any, branch: str
) -> None:
    repo_id = f"interop/model-rev-{branch.replace('/', '-')}"
    main_files = _model_files(31)
    rev_files = {**_model_files(32), "only-on-the-branch.txt": b"branch\n"}
    main_commit = hub.add_repo(repo_id, main_files)
    rev_commit = hub.add_repo(repo_id, rev_files, branch=branch)
    assert main_commit != rev_commit

    # We write: refs/<branch> holds the bare sha (no newline), as huggingface_hub writes and reads it.
    cache_b = tmp_path / "cache-b"
    root = cache_b / repo_folder_name(repo_id, "model")
    ours_main = snapshot_download(repo_id, cache_dir=cache_b, endpoint=hub.endpoint, policy=fast_policy)
    ours_rev = snapshot_download(repo_id, revision=branch, cache_dir=cache_b, endpoint=hub.endpoint, policy=fast_policy)
    assert ours_rev == root / "snapshots" / rev_commit
    assert (root / "refs" / branch).read_bytes() == rev_commit.encode()
    assert (root / "refs" / "main").read_bytes() == main_commit.encode()

    hub.reset_log()
    got = hf_env.snapshot_download(repo_id, revision=branch, cache_dir=cache_b, local_files_only=True)
    assert Path(got) == ours_rev
    assert _read_tree(Path(got)) == rev_files
    got = hf_env.hf_hub_download(
        repo_id, "only-on-the-branch.txt", revision=branch, cache_dir=cache_b, local_files_only=True
    )
    assert Path(got) == ours_rev / "only-on-the-branch.txt"
    assert Path(hf_env.snapshot_download(repo_id, cache_dir=cache_b, local_files_only=True)) == ours_main
    assert hub.log == []
    info = hf_env.scan_cache_dir(cache_b)
    assert info.warnings == []
    (repo,) = info.repos
    refs = {r.commit_hash: r.refs for r in repo.revisions}
    assert refs == {main_commit: frozenset({"main"}), rev_commit: frozenset({branch})}

    # huggingface_hub writes: we read its ref for that revision, offline, and agree online.
    cache_a = tmp_path / "cache-a"
    hf_path = Path(
        hf_env.snapshot_download(repo_id, revision=branch, endpoint=hub.endpoint, cache_dir=cache_a, token=False)
    )
    assert (cache_a / repo_folder_name(repo_id, "model") / "refs" / branch).read_bytes() == rev_commit.encode()
    assert snapshot_download(repo_id, revision=branch, cache_dir=cache_a, offline=True) == hf_path
    assert verify_snapshot(repo_id, revision=branch, cache_dir=cache_a).ok
    with pytest.raises(HubOfflineError):  # main was never downloaded into cache A
        snapshot_download(repo_id, cache_dir=cache_a, offline=True)
    hub.reset_log()
    assert (
        snapshot_download(repo_id, revision=branch, cache_dir=cache_a, endpoint=hub.endpoint, policy=fast_policy)
        == hf_path
    )
    assert hub.bytes_served() == 0
    assert _read_tree(hf_path) == rev_files
