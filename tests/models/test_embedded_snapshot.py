"""The embedded model is published into the hub cache like a download: hash-named blobs, a
manifest, refs/main — so verify, offline lookup and huggingface_hub all treat it alike."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_mlxgate.hub import hashing, snapshot_download, verify_snapshot
from pytest_mlxgate.models.embedded import EMBEDDED_REPO_ID, ensure_embedded_snapshot
from pytest_mlxgate.models.gguf import find_embedded_gguf

pytestmark = pytest.mark.slow  # every test here builds the embedded model (0.5 GB) into a fresh cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("embedded-cache")
    yield path
    shutil.rmtree(path, ignore_errors=True)  # 0.5 GB


@pytest.fixture(scope="module")
def snapshot(cache: Path) -> Path:
    return ensure_embedded_snapshot(cache)


def test_published_in_the_hub_layout_and_verified(cache: Path, snapshot: Path) -> None:
    assert snapshot.parent.parent == cache / "models--mlxgate--SmolLM2-135M-Instruct-f32"
    names = sorted(p.name for p in snapshot.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "config.json" in names
    for p in snapshot.iterdir():
        assert p.is_symlink() and not os.path.isabs(os.readlink(p))
    report = verify_snapshot(EMBEDDED_REPO_ID, cache_dir=cache)
    assert report.ok and report.files_checked == len(names)
    assert snapshot_download(EMBEDDED_REPO_ID, cache_dir=cache, offline=True) == snapshot


def test_built_once(cache: Path, snapshot: Path) -> None:
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    before = blob.stat().st_mtime_ns
    assert ensure_embedded_snapshot(cache) == snapshot
    assert blob.stat().st_mtime_ns == before


def test_a_corrupted_blob_is_caught_and_rebuilt(cache: Path, snapshot: Path) -> None:
    blob = Path(os.path.realpath(snapshot / "config.json"))
    original = blob.read_bytes()
    blob.write_bytes(original.replace(b"llama", b"LLAMA"))
    report = verify_snapshot(EMBEDDED_REPO_ID, cache_dir=cache, repair=True)
    assert not report.ok and "config.json" in report.problems[0]
    assert ensure_embedded_snapshot(cache) == snapshot  # the missing blob makes it rebuild
    assert blob.read_bytes() == original
    assert verify_snapshot(EMBEDDED_REPO_ID, cache_dir=cache).ok


def test_an_edit_in_place_is_caught_on_reuse_and_rebuilt_without_verify(cache: Path, snapshot: Path) -> None:
    blob = Path(os.path.realpath(snapshot / "config.json"))
    original = blob.read_bytes()
    at = original.index(b"rope_theta") + len(b'rope_theta": ')
    earlier = set(blob.parent.glob(f"{blob.name}.corrupt-*"))
    with open(blob, "r+b") as f:  # same inode, same size: only the content says it changed
        f.seek(at)
        f.write(b"9")
    assert blob.stat().st_size == len(original)
    assert ensure_embedded_snapshot(cache) == snapshot
    assert blob.read_bytes() == original
    [aside] = set(blob.parent.glob(f"{blob.name}.corrupt-*")) - earlier  # the edit is kept aside, not lost
    assert aside.read_bytes()[at : at + 1] == b"9"


def test_reuse_hashes_no_blob_while_its_stamp_matches(
    cache: Path, snapshot: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ensure_embedded_snapshot(cache) == snapshot  # any earlier test's damage repaired, stamps fresh
    fed: list[int] = []
    real = hashing.new_hasher

    def counting(algo: hashing.Algo, size: int) -> hashing.Hasher:
        fed.append(size)  # the size each hash is started for: one per file hashed
        return real(algo, size)

    monkeypatch.setattr(hashing, "new_hasher", counting)
    assert ensure_embedded_snapshot(cache) == snapshot
    assert fed == [find_embedded_gguf().stat().st_size]  # the GGUF's identity alone, no blob of the snapshot


def test_huggingface_hub_reads_it(cache: Path, snapshot: Path) -> None:
    hf = pytest.importorskip("huggingface_hub")
    info = hf.scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = [r for r in info.repos if r.repo_id == EMBEDDED_REPO_ID]
    assert {rev.commit_hash for rev in repo.revisions} == {snapshot.name}
    path = hf.snapshot_download(EMBEDDED_REPO_ID, cache_dir=cache, local_files_only=True)
    assert Path(path) == snapshot
