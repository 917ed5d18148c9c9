"""Checks of the fake hub itself (tests/fakehub.py), with plain httpx and with the real huggingface_hub.

Why: every downloader test trusts this server. Each fault must do exactly what it claims (a fault that
silently does nothing makes a retry test pass vacuously), and the real ``huggingface_hub`` client must
be able to download from it, which shows the protocol is faithful.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fakehub import FOREVER, FakeHub, Fault, git_blob_oid, lfs_pointer  # tests/support/, on pytest's pythonpath
from hfenv import HfEnv

REPO = "org/model"
DATASET = "org/data"
TOKEN = "hf_fakehub_test_token"


def _rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# Small files (< 1024 B: plain git) and LFS files, some in nested folders, one with a space in its path.
FILES: dict[str, bytes] = {
    "config.json": b'{"model_type": "fake", "hidden_size": 8}\n',
    "README.md": b"# fake model\n",
    "tokenizer/vocab.txt": b"\n".join(b"tok%d" % i for i in range(100)),  # 589 bytes: small, nested
    "weights/model.safetensors": _rand(300_000, 1),
    "weights/shards/part 00001.bin": _rand(5_000, 2),
    "weights/exactly-1024.bin": _rand(1024, 3),  # the LFS threshold itself
}
DATA_FILES: dict[str, bytes] = {
    "data/train/shard-0.parquet": _rand(70_000, 4),
    "data/train/shard-1.parquet": _rand(2_000, 5),
    "data/dev.jsonl": b'{"x": 1}\n{"x": 2}\n',
    "README.md": b"# data\n",
}
SMALL = "config.json"
LFS = "weights/model.safetensors"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub(tree_page_size=3) as h:
        h.add_repo(REPO, FILES)
        h.add_repo(DATASET, DATA_FILES, repo_type="dataset")
        yield h


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def _cdn_url(client: httpx.Client, hub: FakeHub, path: str = LFS, **kw: Any) -> str:
    r = client.get(hub.file_url(REPO, path, **kw))
    assert r.status_code == 302, r.text
    return r.headers["location"]


# --------------------------------------------------------------------------------------------- API


def test_revision_info_blobs_and_oid_rules(hub: FakeHub, client: httpx.Client) -> None:
    """siblings carry the git oid of the blob (small) or of the LFS *pointer* (LFS), sha256 in lfs."""
    r = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main")
    assert r.status_code == 200
    info = r.json()
    assert info["id"] == REPO and len(info["sha"]) == 40
    assert sorted(s["rfilename"] for s in info["siblings"]) == sorted(FILES)
    assert "size" not in info["siblings"][0]

    blobs = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/{info['sha']}", params={"blobs": "true"})
    sib = {s["rfilename"]: s for s in blobs.json()["siblings"]}
    small = FILES[SMALL]
    assert sib[SMALL] == {
        "rfilename": SMALL,
        "size": len(small),
        "blobId": hashlib.sha1(b"blob %d\0" % len(small) + small).hexdigest(),
    }
    big = FILES[LFS]
    sha = hashlib.sha256(big).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(big)}\n".encode()
    assert pointer == lfs_pointer(sha, len(big))
    assert sib[LFS]["blobId"] == git_blob_oid(pointer) != git_blob_oid(big)
    assert sib[LFS]["lfs"] == {"sha256": sha, "size": len(big), "pointerSize": len(pointer)}
    assert sib[LFS]["size"] == len(big)
    assert "lfs" in sib["weights/exactly-1024.bin"] and "lfs" not in sib["tokenizer/vocab.txt"]

    d = client.get(f"{hub.endpoint}/api/datasets/{DATASET}/revision/main").json()
    assert d["id"] == DATASET and sorted(s["rfilename"] for s in d["siblings"]) == sorted(DATA_FILES)


def test_not_found_errors_carry_error_codes(hub: FakeHub, client: httpx.Client) -> None:
    """Clients map X-Error-Code to exception types (RepoNotFound, RevisionNotFound, EntryNotFound)."""
    r = client.get(f"{hub.endpoint}/api/models/org/nope/revision/main")
    assert (r.status_code, r.headers["x-error-code"]) == (404, "RepoNotFound") and "error" in r.json()
    r = client.get(f"{hub.endpoint}/api/models/{DATASET}/revision/main")  # a dataset is not a model
    assert r.headers["x-error-code"] == "RepoNotFound"
    r = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/nobranch")
    assert (r.status_code, r.headers["x-error-code"]) == (404, "RevisionNotFound")
    r = client.get(f"{hub.endpoint}/api/models/{REPO}/tree/{'0' * 40}")
    assert r.headers["x-error-code"] == "RevisionNotFound"
    r = client.head(hub.file_url(REPO, "missing.txt"))
    assert (r.status_code, r.headers["x-error-code"]) == (404, "EntryNotFound")
    assert len(r.headers["x-repo-commit"]) == 40
    r = client.get(hub.file_url(REPO, SMALL, revision="nobranch"))
    assert r.headers["x-error-code"] == "RevisionNotFound"


def test_tree_is_paginated_with_absolute_link_and_lists_directories(hub: FakeHub, client: httpx.Client) -> None:
    """Pages of tree_page_size entries, absolute Link rel=next, directory entries mixed in."""
    url: str | None = f"{hub.endpoint}/api/models/{REPO}/tree/main?recursive=true"
    entries: list[dict[str, Any]] = []
    pages = 0
    while url is not None:
        r = client.get(url)
        assert r.status_code == 200
        assert len(r.json()) <= 3
        entries += r.json()
        pages += 1
        url = r.links.get("next", {}).get("url")
        if url is not None:
            assert url.startswith(f"{hub.endpoint}/api/models/{REPO}/tree/main?") and "recursive=true" in url
    assert pages == 3  # 6 files + 3 directories
    files = {e["path"]: e for e in entries if e["type"] == "file"}
    dirs = {e["path"] for e in entries if e["type"] == "directory"}
    assert sorted(files) == sorted(FILES)
    assert dirs == {"tokenizer", "weights", "weights/shards"}
    assert files[SMALL]["oid"] == git_blob_oid(FILES[SMALL]) and "lfs" not in files[SMALL]
    sha = hashlib.sha256(FILES[LFS]).hexdigest()
    assert files[LFS]["oid"] == git_blob_oid(lfs_pointer(sha, len(FILES[LFS])))
    assert files[LFS]["lfs"]["oid"] == sha and files[LFS]["size"] == len(FILES[LFS])

    top = client.get(f"{hub.endpoint}/api/models/{REPO}/tree/main").json()  # non-recursive, first page
    assert all("/" not in e["path"] for e in top)
    sub = client.get(f"{hub.endpoint}/api/models/{REPO}/tree/main/weights%2Fshards?recursive=true").json()
    assert [e["path"] for e in sub] == ["weights/shards/part 00001.bin"]
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/tree/main/nodir").headers["x-error-code"] == "EntryNotFound"
    assert client.get(f"{hub.endpoint}/api/datasets/{DATASET}/tree/main?recursive=true").status_code == 200


def test_listed_sizes_change_only_what_the_listings_claim(hub: FakeHub, client: httpx.Client) -> None:
    """listed_sizes lets a test state a size it could never serve; the bytes served stay the real ones."""
    claimed = 10**15
    hub.add_repo("org/claims", {SMALL: b"{}", LFS: FILES[LFS]}, listed_sizes={LFS: claimed})
    tree = client.get(f"{hub.endpoint}/api/models/org/claims/tree/main?recursive=true").json()
    entry = next(e for e in tree if e["path"] == LFS)
    assert entry["size"] == entry["lfs"]["size"] == claimed
    info = client.get(f"{hub.endpoint}/api/models/org/claims/revision/main", params={"blobs": "true"}).json()
    sib = {s["rfilename"]: s for s in info["siblings"]}
    assert sib[LFS]["size"] == sib[LFS]["lfs"]["size"] == claimed and sib[SMALL]["size"] == 2
    cdn = client.get(hub.file_url("org/claims", LFS)).headers["location"]
    assert client.get(cdn).content == FILES[LFS]
    with pytest.raises(ValueError, match="not in files"):
        hub.add_repo("org/claims", {SMALL: b"{}"}, listed_sizes={"nope.bin": 1})


def test_new_commit_moves_branch_and_old_commit_stays_resolvable(hub: FakeHub, client: httpx.Client) -> None:
    """add_repo on an existing repo is a new commit: main moves, the old sha still serves old bytes."""
    old = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main").json()["sha"]
    new = hub.add_repo(REPO, {**FILES, SMALL: b'{"v": 2}'})
    assert new != old and len(new) == 40 and int(new, 16) >= 0
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main").json()["sha"] == new
    assert client.get(hub.file_url(REPO, SMALL)).content == b'{"v": 2}'
    r = client.get(hub.file_url(REPO, SMALL, revision=old))
    assert r.content == FILES[SMALL] and r.headers["x-repo-commit"] == old
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/revision/{old}").json()["sha"] == old
    other = hub.add_repo(REPO, {"x.txt": b"x"}, branch="dev")
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/revision/dev").json()["sha"] == other
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main").json()["sha"] == new


# ------------------------------------------------------------------------------------- resolve


def test_small_file_resolve_headers_ranges_and_quoting(hub: FakeHub, client: httpx.Client) -> None:
    """Small files: 200/206/416 with the hub's headers, never compressed; HEAD has no body."""
    body = FILES["tokenizer/vocab.txt"]
    url = hub.file_url(REPO, "tokenizer/vocab.txt")
    commit = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main").json()["sha"]
    r = client.get(url, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.content == body
    assert "content-encoding" not in r.headers
    assert r.headers["etag"] == f'"{git_blob_oid(body)}"'
    assert r.headers["x-repo-commit"] == commit
    assert r.headers["content-length"] == str(len(body)) and r.headers["accept-ranges"] == "bytes"
    h = client.head(url)
    assert h.status_code == 200 and h.content == b"" and h.headers["content-length"] == str(len(body))

    r = client.get(url, headers={"Range": "bytes=10-19"})
    assert (r.status_code, r.content, r.headers["content-range"]) == (206, body[10:20], f"bytes 10-19/{len(body)}")
    r = client.get(url, headers={"Range": "bytes=100-"})
    assert r.content == body[100:] and r.headers["content-length"] == str(len(body) - 100)
    r = client.get(url, headers={"Range": "bytes=-5"})
    assert r.content == body[-5:]
    r = client.get(url, headers={"Range": f"bytes={len(body)}-"})
    assert (r.status_code, r.headers["content-range"]) == (416, f"bytes */{len(body)}")

    quoted = hub.file_url(REPO, "weights/shards/part 00001.bin")
    assert "part%2000001.bin" in quoted
    assert client.get(quoted).status_code == 302
    assert client.get(hub.file_url(REPO, SMALL, revision=commit)).content == FILES[SMALL]


def test_lfs_redirects_to_a_cdn_origin_that_rejects_authorization(hub: FakeHub, client: httpx.Client) -> None:
    """LFS: 302 with linked etag/size to another origin; the CDN refuses (and logs) a leaked token."""
    big = FILES[LFS]
    sha = hashlib.sha256(big).hexdigest()
    r = client.get(hub.file_url(REPO, LFS))
    assert r.status_code == 302
    assert r.headers["x-linked-etag"] == f'"{sha}"' and r.headers["x-linked-size"] == str(len(big))
    assert r.headers["etag"] == f'"{git_blob_oid(lfs_pointer(sha, len(big)))}"'
    assert len(r.headers["x-repo-commit"]) == 40
    loc = r.headers["location"]
    hub_o, cdn_o = urlsplit(hub.endpoint), urlsplit(loc)
    assert loc.startswith(hub.cdn_endpoint + f"/lfs/{sha}?") and "sig=" in loc and "expires=" in loc
    assert hub_o.hostname != cdn_o.hostname and hub_o.port != cdn_o.port
    h = client.head(hub.file_url(REPO, LFS))
    assert h.status_code == 302 and h.headers["location"].startswith(hub.cdn_endpoint)
    assert not any(k.lower().startswith("x-xet") for k in h.headers) and "xet" not in h.headers.get("link", "")

    got = client.get(loc)
    assert got.status_code == 200 and got.content == big and got.headers["etag"] == f'"{sha}"'
    part = client.get(loc, headers={"Range": "bytes=1000-1999"})
    assert part.status_code == 206 and part.content == big[1000:2000]
    assert client.get(hub.file_url(REPO, LFS), follow_redirects=True).content == big

    hub.reset_log()
    bad = client.get(loc, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 400 and b"Authorization" in bad.content
    assert [(e.origin, e.status, e.headers.get("authorization")) for e in hub.log] == [("cdn", 400, f"Bearer {TOKEN}")]
    assert hub.bytes_served() == 0
    assert client.get(f"{hub.cdn_endpoint}/lfs/{sha}?sig=forged").status_code == 403


def test_gated_repo_needs_the_right_bearer_token(client: httpx.Client) -> None:
    """Missing token → 401, wrong token → 403, both X-Error-Code GatedRepo; the CDN is presigned."""
    with FakeHub() as hub:
        hub.add_repo(REPO, FILES, gated_token=TOKEN)
        urls = [
            f"{hub.endpoint}/api/models/{REPO}/revision/main",
            f"{hub.endpoint}/api/models/{REPO}/tree/main",
            hub.file_url(REPO, SMALL),
            hub.file_url(REPO, LFS),
        ]
        for url in urls:
            r = client.get(url)
            assert (r.status_code, r.headers["x-error-code"]) == (401, "GatedRepo") and "error" in r.json()
            r = client.head(url, headers={"Authorization": "Bearer wrong"})
            assert (r.status_code, r.headers["x-error-code"]) == (403, "GatedRepo")
            r = client.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code in (200, 302)
        assert client.get(r.headers["location"]).content == FILES[LFS]  # no token needed at the CDN
        hub.add_repo(REPO, {SMALL: b"{}"})  # gated_token=None keeps the gate
        assert client.get(hub.file_url(REPO, SMALL)).status_code == 401


def test_connections_are_kept_alive(hub: FakeHub, client: httpx.Client) -> None:
    """HTTP/1.1 keep-alive: pooled clients reuse one connection per origin."""
    for _ in range(3):
        client.get(hub.file_url(REPO, SMALL))
        client.get(hub.file_url(REPO, LFS), follow_redirects=True)
    hub_conns = {e.conn_id for e in hub.log if e.origin == "hub"}
    cdn_conns = {e.conn_id for e in hub.log if e.origin == "cdn"}
    assert len(hub_conns) == 1 and len(cdn_conns) == 1 and hub_conns != cdn_conns


# -------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("path", [SMALL, LFS])
def test_truncate_closes_after_exactly_at_bytes(hub: FakeHub, client: httpx.Client, path: str) -> None:
    """Full Content-Length then a clean close after `at` bytes: a premature EOF, counted exactly."""
    at = 7 if path == SMALL else 100_000
    hub.inject(REPO, path, Fault.truncate(at))
    with pytest.raises(httpx.RemoteProtocolError):
        client.get(hub.file_url(REPO, path), follow_redirects=True)
    hub.wait_idle()
    content_req = [e for e in hub.log if e.fault is not None]
    assert [(e.fault, e.status, e.body_bytes) for e in content_req] == [("truncate", 200, at)]
    assert content_req[0].origin == ("hub" if path == SMALL else "cdn")
    assert hub.bytes_served(REPO, path) == at
    assert client.get(hub.file_url(REPO, path), follow_redirects=True).content == FILES[path]  # consumed


def test_reset_sends_a_tcp_rst(hub: FakeHub, client: httpx.Client) -> None:
    """SO_LINGER 0 close: the client sees a connection reset, not a clean EOF."""
    hub.inject(REPO, LFS, Fault.reset(50_000))
    received = 0
    with pytest.raises(httpx.ReadError) as err:
        with client.stream("GET", _cdn_url(client, hub)) as r:
            for chunk in r.iter_raw(4096):
                received += len(chunk)
    assert "reset by peer" in str(err.value)
    hub.wait_idle()
    assert received <= 50_000 and hub.bytes_served(REPO, LFS) == 50_000
    assert [e.fault for e in hub.log if e.origin == "cdn"] == ["reset"]


def test_status_fault_with_retry_after_and_times(hub: FakeHub, client: httpx.Client) -> None:
    """status(code, retry_after) answers that code `times` times, then the file is served."""
    hub.inject(REPO, SMALL, Fault.status(503, retry_after="7", times=2), Fault.status(429))
    r1, r2, r3, r4 = (client.get(hub.file_url(REPO, SMALL)) for _ in range(4))
    assert (r1.status_code, r1.headers["retry-after"]) == (503, "7") and "error" in r1.json()
    assert r2.status_code == 503
    assert r3.status_code == 429 and "retry-after" not in r3.headers
    assert r4.status_code == 200 and r4.content == FILES[SMALL]
    assert hub.bytes_served(REPO, SMALL) == len(FILES[SMALL])
    h = client.head(hub.file_url(REPO, SMALL))  # HEAD never consumes
    hub.inject(REPO, SMALL, Fault.status(500))
    assert client.head(hub.file_url(REPO, SMALL)).status_code == h.status_code == 200
    assert hub.pending_faults(REPO, SMALL) == 1


def test_content_encoding_labels_the_body_and_gzips_it_unless_identity(hub: FakeHub, client: httpx.Client) -> None:
    """content_encoding(value) sends the header whatever was accepted; a gzip body whole (Range not
    honoured), an identity one as usual; one request each, then the file is served plain again."""
    import gzip

    hub.inject(REPO, LFS, Fault.content_encoding("gzip"), Fault.content_encoding("Identity"))
    with client.stream("GET", hub.file_url(REPO, LFS), headers={"Range": "bytes=10-"}, follow_redirects=True) as r:
        raw = b"".join(r.iter_raw())
        assert (r.status_code, r.headers["content-encoding"]) == (200, "gzip")
    assert gzip.decompress(raw) == FILES[LFS]
    r = client.get(hub.file_url(REPO, LFS), headers={"Range": "bytes=10-"}, follow_redirects=True)
    assert (r.status_code, r.headers["content-encoding"], r.content) == (206, "Identity", FILES[LFS][10:])
    r = client.get(hub.file_url(REPO, LFS), follow_redirects=True)
    assert "content-encoding" not in r.headers and r.content == FILES[LFS]


def test_corrupt_flips_one_byte_only_when_sent(hub: FakeHub, client: httpx.Client) -> None:
    """corrupt(offset) flips the byte at a *file* offset, also inside a range, never outside it."""
    big = FILES[LFS]
    hub.inject(REPO, LFS, Fault.corrupt(123_456, times=3))
    whole = client.get(_cdn_url(client, hub)).content
    diff = [i for i in range(len(big)) if whole[i] != big[i]]
    assert diff == [123_456] and whole[123_456] == big[123_456] ^ 0xFF
    part = client.get(_cdn_url(client, hub), headers={"Range": "bytes=123000-124000"}).content
    assert part != big[123000:124001] and part[456] == big[123_456] ^ 0xFF
    outside = client.get(_cdn_url(client, hub), headers={"Range": "bytes=0-999"}).content
    assert outside == big[:1000]
    assert hub.pending_faults() == 0


def test_short_length_is_a_clean_short_response(hub: FakeHub, client: httpx.Client) -> None:
    """Content-Length n and n bytes: the client sees a complete response; the connection stays open."""
    hub.inject(REPO, LFS, Fault.short_length(1000), Fault.short_length(10))
    r = client.get(_cdn_url(client, hub))
    assert (r.status_code, r.headers["content-length"], r.content) == (200, "1000", FILES[LFS][:1000])
    r = client.get(_cdn_url(client, hub), headers={"Range": "bytes=500-"})
    assert r.status_code == 206 and r.content == FILES[LFS][500:510]
    assert r.headers["content-range"] == f"bytes 500-{len(FILES[LFS]) - 1}/{len(FILES[LFS])}"
    assert client.get(_cdn_url(client, hub)).content == FILES[LFS]
    cdn = [e for e in hub.log if e.origin == "cdn"]
    assert len({e.conn_id for e in cdn}) == 1
    assert hub.bytes_served(REPO, LFS) == 1010 + len(FILES[LFS])


def test_ignore_range_wrong_content_range_and_416(hub: FakeHub, client: httpx.Client) -> None:
    """Range protocol bugs: 200 instead of 206, a shifted 206, a spurious 416."""
    big = FILES[LFS]
    hub.inject(
        REPO, LFS, Fault.ignore_range(), Fault.wrong_content_range(10), Fault.wrong_content_range(-7), Fault.range_416()
    )
    r = client.get(_cdn_url(client, hub), headers={"Range": "bytes=100-"})
    assert r.status_code == 200 and r.content == big and "content-range" not in r.headers
    r = client.get(_cdn_url(client, hub), headers={"Range": "bytes=100-"})
    assert r.status_code == 206 and r.headers["content-range"] == f"bytes 110-{len(big) - 1}/{len(big)}"
    assert r.content == big[110:]
    r = client.get(_cdn_url(client, hub), headers={"Range": "bytes=100-199"})
    assert r.headers["content-range"] == f"bytes 93-192/{len(big)}" and r.content == big[93:193]
    r = client.get(_cdn_url(client, hub), headers={"Range": "bytes=0-"})
    assert (r.status_code, r.headers["content-range"]) == (416, f"bytes */{len(big)}")
    assert [e.fault for e in hub.log if e.origin == "cdn"] == [
        "ignore_range",
        "wrong_content_range",
        "wrong_content_range",
        "range_416",
    ]


def test_trickle_is_slow_and_stops_when_the_client_leaves(hub: FakeHub, client: httpx.Client) -> None:
    """trickle sends nbytes per every_s; a client hanging up ends it early, with exact accounting."""
    hub.inject(REPO, SMALL, Fault.trickle(10, 0.05))
    t0 = time.monotonic()
    assert client.get(hub.file_url(REPO, SMALL)).content == FILES[SMALL]
    n_pieces = -(-len(FILES[SMALL]) // 10)
    assert time.monotonic() - t0 >= 0.05 * (n_pieces - 1) * 0.9

    hub.inject(REPO, LFS, Fault.trickle(1000, 0.02))
    url = _cdn_url(client, hub)
    with httpx.Client(timeout=10) as c2, c2.stream("GET", url) as r:
        first = next(r.iter_raw(1000))
        assert first == FILES[LFS][: len(first)]
    # the stream context closed the connection: the server must notice within a few pieces
    assert hub.wait_idle(5)
    served = hub.bytes_served(REPO, LFS)
    assert 1000 <= served <= 20_000
    assert [e.body_bytes for e in hub.log if e.origin == "cdn"] == [served]


def test_close_is_prompt_mid_trickle() -> None:
    """close() must not wait for a slow body (or an idle keep-alive connection)."""
    hub = FakeHub().start()
    hub.add_repo(REPO, FILES)
    hub.inject(REPO, SMALL, Fault.trickle(1, 10.0))
    errors: list[BaseException] = []
    started = threading.Event()

    def fetch() -> None:
        try:
            with httpx.Client(timeout=30) as c, c.stream("GET", hub.file_url(REPO, SMALL)) as r:
                started.set()
                r.read()
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion below
            errors.append(e)

    idle = httpx.Client(timeout=30)
    idle.get(hub.file_url(REPO, "README.md"))  # leaves an idle keep-alive connection open
    t = threading.Thread(target=fetch)
    t.start()
    assert started.wait(5)
    t0 = time.monotonic()
    hub.close()
    assert time.monotonic() - t0 < 2.0
    t.join(5)
    idle.close()
    assert not t.is_alive() and errors and isinstance(errors[0], httpx.TransportError)


def test_redirect_loop(hub: FakeHub, client: httpx.Client) -> None:
    """redirect_loop: the resolve GET enters a self-redirect; a following client gives up."""
    hub.inject(REPO, SMALL, Fault.redirect_loop())
    hub.inject(REPO, LFS, Fault.redirect_loop())
    for path in (SMALL, LFS):
        with pytest.raises(httpx.TooManyRedirects):
            client.get(hub.file_url(REPO, path), follow_redirects=True)
    loops = [e for e in hub.log if e.fault == "redirect_loop"]
    assert len(loops) > 20 and all(e.status == 302 and e.origin == "hub" for e in loops)
    r = client.get(hub.file_url(REPO, SMALL) + "?_fakehub_loop=1")
    assert r.status_code == 302 and r.headers["location"] == hub.file_url(REPO, SMALL) + "?_fakehub_loop=1"
    assert client.get(hub.file_url(REPO, LFS), follow_redirects=True).content == FILES[LFS]


def test_lfs_content_faults_hit_the_cdn_not_the_resolve(hub: FakeHub, client: httpx.Client) -> None:
    """For LFS files the CDN GET consumes content faults; the hub 302 (and any HEAD) does not."""
    hub.inject(REPO, LFS, Fault.status(503), Fault.redirect_loop())
    client.head(hub.file_url(REPO, LFS))
    url = _cdn_url(client, hub)  # resolve GET: head fault is a CDN fault, so not consumed
    assert hub.pending_faults(REPO, LFS) == 2
    client.head(url)
    assert hub.pending_faults(REPO, LFS) == 2
    assert client.get(url).status_code == 503
    # head is now redirect_loop: the CDN leaves it for the next resolve
    assert client.get(url).content == FILES[LFS]
    assert client.get(hub.file_url(REPO, LFS)).headers["location"].startswith(hub.endpoint)


def test_forever_and_fifo(hub: FakeHub, client: httpx.Client) -> None:
    """times=FOREVER applies to every request; faults are consumed in order, per file."""
    hub.inject(REPO, SMALL, Fault.status(500), Fault.corrupt(0).forever())
    assert Fault.corrupt(0).forever().times == FOREVER
    assert client.get(hub.file_url(REPO, SMALL)).status_code == 500
    for _ in range(3):
        c = client.get(hub.file_url(REPO, SMALL)).content
        assert c[0] == FILES[SMALL][0] ^ 0xFF and c[1:] == FILES[SMALL][1:]
    assert client.get(hub.file_url(REPO, "README.md")).content == FILES["README.md"]  # other files untouched
    hub.clear_faults()
    assert client.get(hub.file_url(REPO, SMALL)).content == FILES[SMALL]
    with pytest.raises(ValueError):
        Fault.status(503, times=0)


def test_dataset_faults_are_keyed_by_repo_type(hub: FakeHub, client: httpx.Client) -> None:
    """inject(..., repo_type="dataset") targets /datasets/ URLs only."""
    path = "data/train/shard-0.parquet"
    hub.inject(DATASET, path, Fault.truncate(10), repo_type="dataset")
    with pytest.raises(httpx.RemoteProtocolError):
        client.get(hub.file_url(DATASET, path, repo_type="dataset"), follow_redirects=True)
    assert (
        client.get(hub.file_url(DATASET, path, repo_type="dataset"), follow_redirects=True).content == DATA_FILES[path]
    )


def test_api_faults(hub: FakeHub, client: httpx.Client) -> None:
    """inject_api: one fault per /api/ request, whatever the repo; range/redirect faults are refused."""
    hub.inject_api(Fault.status(503, retry_after="1"), Fault.truncate(5))
    r = client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main")
    assert (r.status_code, r.headers["retry-after"]) == (503, "1")
    with pytest.raises(httpx.RemoteProtocolError):
        client.get(f"{hub.endpoint}/api/models/{REPO}/tree/main")
    assert client.get(f"{hub.endpoint}/api/models/{REPO}/tree/main").status_code == 200
    assert client.get(hub.file_url(REPO, SMALL)).status_code == 200
    with pytest.raises(ValueError):
        hub.inject_api(Fault.redirect_loop())


def test_bytes_served_filters_and_reset_log(hub: FakeHub, client: httpx.Client) -> None:
    """bytes_served counts only file content (not JSON/redirect bodies), per repo and path."""
    client.get(f"{hub.endpoint}/api/models/{REPO}/revision/main")
    client.get(hub.file_url(REPO, SMALL))
    client.get(hub.file_url(REPO, LFS), follow_redirects=True)
    client.get(hub.file_url(REPO, LFS), headers={"Range": "bytes=0-99"}, follow_redirects=True)
    path = "data/dev.jsonl"
    client.get(hub.file_url(DATASET, path, repo_type="dataset"))
    assert hub.bytes_served(REPO, SMALL) == len(FILES[SMALL])
    assert hub.bytes_served(REPO, LFS) == len(FILES[LFS]) + 100
    assert hub.bytes_served(REPO) == len(FILES[SMALL]) + len(FILES[LFS]) + 100
    assert hub.bytes_served(path=path) == len(DATA_FILES[path])
    assert hub.bytes_served() == hub.bytes_served(REPO) + len(DATA_FILES[path])
    assert len(hub.log) == 7 and hub.log[0].status == 200 and hub.log[0].body_bytes > 0
    hub.reset_log()
    assert hub.log == [] and hub.bytes_served() == 0


def test_serves_hundreds_of_megabytes_quickly(client: httpx.Client) -> None:
    """The server must not be the bottleneck of download tests (1 MiB memoryview slices)."""
    size = 200 << 20
    with FakeHub() as hub:
        hub.add_repo("org/big", {"big.bin": bytes(size)})
        t0 = time.monotonic()
        n = 0
        with client.stream("GET", hub.file_url("org/big", "big.bin"), follow_redirects=True) as r:
            for chunk in r.iter_raw(1 << 20):
                n += len(chunk)
        elapsed = time.monotonic() - t0
        assert n == size == hub.bytes_served()
    assert elapsed < 10.0, f"{elapsed:.2f}s for 200 MiB"  # ~0.3 s idle; generous for loaded CI


# ------------------------------------------------------------------------- real huggingface_hub


@pytest.fixture
def hf_env(hf_env: HfEnv) -> Any:
    """The shared isolated HF_* environment (tests/conftest.py), as the real huggingface_hub (returned)
    sees it, xet left on: the fake hub must not lure it into xet."""
    return hf_env.huggingface_hub(xet=True)


def _check_snapshot(root: Path, files: dict[str, bytes]) -> None:
    got = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert got.keys() == files.keys()
    for k, v in files.items():
        assert got[k] == v, k
        assert (root / k).is_symlink()


def test_real_huggingface_hub_snapshot_download(hf_env: Any, tmp_path: Path) -> None:
    """huggingface_hub's snapshot_download gets exact bytes from the fake hub (gated model + dataset)."""
    cache = tmp_path / "cache"
    with FakeHub(tree_page_size=3) as hub:
        commit = hub.add_repo(REPO, FILES, gated_token=TOKEN)
        dcommit = hub.add_repo(DATASET, DATA_FILES, repo_type="dataset")

        snap = Path(hf_env.snapshot_download(REPO, endpoint=hub.endpoint, cache_dir=cache, token=TOKEN))
        assert snap == cache / "models--org--model" / "snapshots" / commit
        _check_snapshot(snap, FILES)
        assert (cache / "models--org--model" / "refs" / "main").read_text() == commit
        blobs = {p.name for p in (cache / "models--org--model" / "blobs").iterdir()}
        assert hashlib.sha256(FILES[LFS]).hexdigest() in blobs  # LFS blobs are named by sha256
        assert git_blob_oid(FILES[SMALL]) in blobs  # small ones by git sha1
        assert not [p for p in blobs if p.endswith(".incomplete")]

        dsnap = Path(
            hf_env.snapshot_download(DATASET, repo_type="dataset", endpoint=hub.endpoint, cache_dir=cache, token=False)
        )
        assert dsnap == cache / "datasets--org--data" / "snapshots" / dcommit
        _check_snapshot(dsnap, DATA_FILES)

        log = list(hub.log)
        cdn = [e for e in log if e.origin == "cdn"]
        assert cdn and all("authorization" not in e.headers and e.status == 200 for e in cdn)
        # no Xet route asked for: the path's own segments, not the CDN's random signature (a sig held
        # "xet" once by chance and failed a CI run)
        assert not [e for e in log if "xet" in e.path.split("?", 1)[0].lower()]
        assert all(e.status in (200, 302) for e in log)
        n_lfs = sum(len(v) >= 1024 for v in FILES.values()) + sum(len(v) >= 1024 for v in DATA_FILES.values())
        assert len(cdn) == n_lfs
        assert len([e for e in log if "/tree/" in e.path]) >= 3  # it followed the pagination
        assert hub.bytes_served() == sum(map(len, FILES.values())) + sum(map(len, DATA_FILES.values()))

        hub.reset_log()  # a second run is served from the cache: only the revision lookup
        hf_env.snapshot_download(REPO, endpoint=hub.endpoint, cache_dir=cache, token=TOKEN)
        assert [e.path.split("?")[0] for e in hub.log] == [f"/api/models/{REPO}/revision/main"]
        assert hub.bytes_served() == 0


def test_real_huggingface_hub_errors_map_to_its_exceptions(hf_env: Any, tmp_path: Path) -> None:
    """Our X-Error-Code headers make huggingface_hub raise its own typed errors."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    with FakeHub() as hub:
        hub.add_repo(REPO, FILES, gated_token=TOKEN)
        kw: dict[str, Any] = {"endpoint": hub.endpoint, "cache_dir": tmp_path}
        with pytest.raises(GatedRepoError):
            hf_env.hf_hub_download(REPO, SMALL, token=False, **kw)
        with pytest.raises(RepositoryNotFoundError):
            hf_env.hf_hub_download("org/nope", SMALL, token=False, **kw)
        with pytest.raises(RevisionNotFoundError):
            hf_env.snapshot_download(REPO, revision="nobranch", token=TOKEN, **kw)
        got = hf_env.hf_hub_download(REPO, "weights/shards/part 00001.bin", token=TOKEN, **kw)
        assert Path(got).read_bytes() == FILES["weights/shards/part 00001.bin"]
        assert os.path.islink(got)
