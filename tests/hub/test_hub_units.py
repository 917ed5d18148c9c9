"""The downloader's pure parts: file-name safety, hashes, listing entries, Retry-After, redirects."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.hub import HubProtocolError, HubUnsafePathError
from pytest_mlxgate.hub.cache import RepoCache, RepoFile, safe_relative_path
from pytest_mlxgate.hub.hashing import algo_for_etag, hash_file, hash_file_prefix, new_hasher
from pytest_mlxgate.hub.listing import next_page, parse_tree_entry
from pytest_mlxgate.hub.transport import parse_retry_after, redact


@pytest.mark.parametrize(
    "name",
    ["../evil", "a/../../evil", "/etc/passwd", "a//b", "./a", "a/.", "", "a\\..\\b", "C:/x", "a\x00b", ".."],
)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(HubUnsafePathError, match="unsafe"):
        safe_relative_path(name)


@pytest.mark.parametrize("name", ["config.json", "a/b/c.safetensors", ".gitattributes", "dir/.hidden", "a..b"])
def test_safe_names_pass(name: str) -> None:
    assert safe_relative_path(name).as_posix() == name


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "x.y", "..."]), min_size=1, max_size=5))
def test_accepted_names_stay_inside_the_snapshot(parts: list[str]) -> None:
    name = "/".join(parts)
    try:
        rel = safe_relative_path(name)
    except HubUnsafePathError:
        return
    root = Path("/cache/snap")
    assert os.path.normpath(root.joinpath(*rel.parts)).startswith(str(root) + os.sep)


def test_snapshot_file_refuses_a_symlinked_folder_leading_out(tmp_path: Path) -> None:
    cache = RepoCache(tmp_path / "c", "org/name", "model")
    snap = cache.snapshot_dir("a" * 40)
    snap.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (snap / "sub").symlink_to(tmp_path / "outside")
    with pytest.raises(HubUnsafePathError):
        cache.snapshot_file("a" * 40, "sub/file")


def test_git_blob_sha1_matches_git() -> None:
    # `printf 'hello\n' | git hash-object --stdin`
    h = new_hasher("git-sha1", 6)
    h.update(b"hello\n")
    assert h.hexdigest() == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_prefix_hash_resumes_to_the_whole_hash(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    p = tmp_path / "f"
    p.write_bytes(data)
    h, n = hash_file_prefix(p, "sha256", len(data), 1_500_000)
    assert n == 1_500_000
    h.update(data[n:])
    assert h.hexdigest() == hashlib.sha256(data).hexdigest() == hash_file(p, "sha256")


def test_algo_from_blob_name() -> None:
    assert algo_for_etag("a" * 64) == "sha256"
    assert algo_for_etag("b" * 40) == "git-sha1"
    assert algo_for_etag("xyz") is None
    assert algo_for_etag("A" * 40) is None
    assert algo_for_etag("X" * 64) is None and algo_for_etag("0123456789abcdef" * 4) == "sha256"


def test_lfs_entry_uses_the_content_sha256_not_the_pointer_oid() -> None:
    entry = {
        "type": "file",
        "path": "w.safetensors",
        "size": 10,
        "oid": "1" * 40,
        "lfs": {"oid": "2" * 64, "size": 10, "pointerSize": 130},
    }
    assert parse_tree_entry(entry, "o/n") == RepoFile("w.safetensors", 10, "2" * 64, "sha256")
    small = {"type": "file", "path": "c.json", "size": 3, "oid": "3" * 40}
    assert parse_tree_entry(small, "o/n") == RepoFile("c.json", 3, "3" * 40, "git-sha1")
    assert parse_tree_entry({"type": "directory", "path": "d", "oid": "4" * 40}, "o/n") is None


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "file", "path": "../x", "size": 1, "oid": "1" * 40},
        {"type": "file", "path": "x", "size": -1, "oid": "1" * 40},
        {"type": "file", "path": "x", "size": 1, "oid": "zz"},
        {"type": "file", "path": "x", "size": 1, "oid": "1" * 40, "lfs": {"oid": "1" * 40, "size": 1}},
        {"type": "weird"},
    ],
)
def test_bad_listing_entries_are_refused(entry: dict) -> None:
    with pytest.raises((HubProtocolError, HubUnsafePathError)):
        parse_tree_entry(entry, "o/n")


def test_pagination_never_leaves_the_hub() -> None:
    hub = "http://127.0.0.1:9"
    assert next_page(f'<{hub}/api/x?cursor=2>; rel="next"', f"{hub}/api/x", hub) == f"{hub}/api/x?cursor=2"
    assert next_page(None, f"{hub}/api/x", hub) is None
    with pytest.raises(HubProtocolError, match="another origin"):
        next_page('<http://evil.example/api/x?cursor=2>; rel="next"', f"{hub}/api/x", hub)
    with pytest.raises(HubProtocolError, match="itself"):
        next_page(f'<{hub}/api/x>; rel="next"', f"{hub}/api/x", hub)


def test_retry_after_seconds_and_dates() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_redact_drops_presigned_query() -> None:
    assert redact("https://cdn.example/lfs/abc?X-Amz-Signature=secret&t=1") == "https://cdn.example/lfs/abc"


@pytest.mark.parametrize("algo", ["md5", "sha1", "SHA256", ""])
def test_an_unknown_hash_algorithm_is_refused_by_name(algo: str) -> None:
    with pytest.raises(ValueError, match=rf"^unknown hash algorithm {algo!r}$"):
        new_hasher(algo, 0)  # type: ignore[arg-type]
