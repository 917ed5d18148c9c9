"""Credentials in the endpoint (`http://user:pass@host`) against the fake hub: used on every request to the
hub's origin, never sent to the CDN, and never in an error message."""

from __future__ import annotations

import base64
import dataclasses
import random
from pathlib import Path

import pytest
from fakehub import FakeHub

from pytest_mlxgate.hub import (
    HubAuthError,
    HubNotFoundError,
    HubRetryError,
    snapshot_download,
)
from pytest_mlxgate.hub.transport import RetryPolicy, redact

BASIC = "Basic " + base64.b64encode(b"user:SECRET").decode()


def _with_credentials(endpoint: str) -> str:
    return endpoint.replace("http://", "http://user:SECRET@", 1)


def _files() -> dict[str, bytes]:
    big = random.Random(7).randbytes(20_000)  # LFS: served by the CDN after a redirect
    return {"config.json": b"{}", "a.txt": b"a", "b.txt": b"b", "c.txt": b"c", "model.safetensors": big}


def test_userinfo_is_basic_auth_on_every_hub_request_and_never_reaches_the_cdn(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    files = _files()
    hub.add_repo("creds/model", files)
    path = snapshot_download(
        "creds/model", cache_dir=cache_dir, endpoint=_with_credentials(hub.endpoint), policy=fast_policy
    )
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    on_hub = [r for r in hub.log if r.origin == "hub"]
    on_cdn = [r for r in hub.log if r.origin == "cdn"]
    assert any("cursor=" in r.path for r in on_hub)  # the listing's second page (an absolute Link URL) was asked
    assert on_cdn, "the LFS file was not fetched from the CDN"
    # The pages and resolves of the hub all carry the user's credentials (the next page's URL lost them)...
    assert [r.path for r in on_hub if r.headers.get("authorization") != BASIC] == []
    # ...and the CDN, another origin, never sees an Authorization header (the fake CDN would answer 400).
    assert [r.path for r in on_cdn if "authorization" in r.headers] == []


def test_with_a_token_too_the_cdn_still_gets_no_authorization(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    hub.add_repo("creds/with-token", _files())
    snapshot_download(
        "creds/with-token",
        cache_dir=cache_dir,
        endpoint=_with_credentials(hub.endpoint),
        token="hf_TOKENabcdefghijklmnopqrstu",
        policy=fast_policy,
    )
    assert [r.path for r in hub.log if r.origin == "cdn" and "authorization" in r.headers] == []
    assert all("authorization" in r.headers for r in hub.log if r.origin == "hub")


def _chain(e: BaseException | None) -> str:
    """Every message of an exception and what caused it: a traceback would show them all."""
    text = ""
    while e is not None:
        text += f"{type(e).__name__}: {e}\n"
        e = e.__cause__ or e.__context__
    return text


def test_a_missing_repo_names_the_url_without_the_credentials(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    with pytest.raises(HubNotFoundError, match=r"http://\*\*\*@127\.0\.0\.1:\d+/api/models/creds/absent") as e:
        snapshot_download(
            "creds/absent", cache_dir=cache_dir, endpoint=_with_credentials(hub.endpoint), policy=fast_policy
        )
    assert "SECRET" not in _chain(e.value)


def test_a_gated_repo_names_the_endpoint_without_the_credentials(
    hub: FakeHub, cache_dir: Path, fast_policy: RetryPolicy
) -> None:
    hub.add_repo("creds/gated", {"config.json": b"{}"}, gated_token="hf_GATEDabcdefghijklmnopqrst")
    with pytest.raises(HubAuthError, match=r"accept its terms on http://\*\*\*@127\.0\.0\.1:\d+;") as e:
        snapshot_download(
            "creds/gated", cache_dir=cache_dir, endpoint=_with_credentials(hub.endpoint), policy=fast_policy
        )
    assert "SECRET" not in _chain(e.value)


def test_an_unreachable_endpoint_names_it_without_the_credentials(cache_dir: Path, fast_policy: RetryPolicy) -> None:
    policy = dataclasses.replace(fast_policy, max_retries=1)
    with pytest.raises(HubRetryError, match=r"ConnectError for http://\*\*\*@127\.0\.0\.1:9/api/") as e:
        snapshot_download("creds/any", cache_dir=cache_dir, endpoint="http://user:SECRET@127.0.0.1:9", policy=policy)
    assert "SECRET" not in _chain(e.value)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://user:SECRET@h:1/x?sig=S", "http://***@h:1/x"),
        ("https://u:p@ss@h/x", "https://***@h/x"),
        ("http://h:1/lfs/ab?sig=SECRET&expires=1", "http://h:1/lfs/ab"),
    ],
)
def test_a_url_in_a_message_loses_userinfo_and_query(url: str, shown: str) -> None:
    assert redact(url) == shown
