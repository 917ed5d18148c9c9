"""HTTP to the hub: redirects followed by hand so the token only ever goes to the hub's own origin,
retries with backoff that honours Retry-After, and the mapping of statuses to errors users can act on."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from .environment import token_source_hint
from .errors import HubAuthError, HubError, HubNotFoundError, HubProtocolError, HubRetryError

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. The budgets are separate so that every failure mode ends in bounded time."""

    max_retries: int = 5  # transient failures in a row that made no new progress
    max_checksum_failures: int = 2  # complete downloads that failed their hash (per file)
    max_attempts: int = 200  # requests per file, whatever happens: the last guarantee of termination
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    max_retry_after: float = 60.0
    stall_window: float = 30.0  # no-progress watchdog: at least min_bytes_per_window per window
    min_bytes_per_window: int = 64 * 1024
    connect_timeout: float = 10.0
    max_redirects: int = 5
    workers: int = 8

    def backoff(self, failures: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        delay = min(self.backoff_max, self.backoff_base * 2.0 ** max(failures - 1, 0))
        return delay * (0.5 + random.random() / 2)


class TransientError(Exception):
    """A failure worth retrying: 5xx/429/408, a reset, a timeout, a stall. Never leaves this package."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def redact(url: str) -> str:
    """A URL fit for a message: presigned query strings are credentials, so they are dropped, and so
    is the userinfo of `http://user:pass@host` (shown as `***@`)."""
    parts = urlsplit(url)
    _, at, host = parts.netloc.rpartition("@")
    return f"{parts.scheme}://{'***@' if at else ''}{host}{parts.path}"


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class HubClient:
    """One httpx client per snapshot call; knows the hub's origin and the token."""

    def __init__(self, endpoint: str, token: str | None, policy: RetryPolicy) -> None:
        self.endpoint = endpoint
        self.token = token
        self.policy = policy
        self._origin = origin(endpoint)
        # Userinfo in the endpoint (`http://user:pass@proxy`) is Basic auth, sent like the token: on every
        # request to the hub's origin (also a next page or a redirect whose URL lost the userinfo), never
        # elsewhere. As before, Basic then takes the place of the Bearer token.
        url = httpx.URL(endpoint)
        self._basic = httpx.BasicAuth(url.username, url.password) if url.username or url.password else None
        timeout = httpx.Timeout(policy.stall_window, connect=policy.connect_timeout)
        limits = httpx.Limits(max_connections=policy.workers + 2, max_keepalive_connections=policy.workers + 2)
        # follow_redirects=False: we follow them ourselves, deciding per hop whether the token goes along.
        self.http = httpx.Client(timeout=timeout, limits=limits, follow_redirects=False, trust_env=True)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, url: str, headers: dict[str, str] | None = None, method: str = "GET") -> httpx.Response:
        """Send a request and follow redirects; returns the final response, body not yet read.

        Authorization is attached only while the URL is on the hub's own origin; an https→http
        downgrade or a redirect loop is refused. Transport failures become TransientError.
        """
        seen: list[str] = []
        for _ in range(self.policy.max_redirects + 1):
            hdrs = {"Accept-Encoding": "identity", "User-Agent": "pytest-mlxgate"}
            hdrs.update(headers or {})
            if self.token and origin(url) == self._origin:
                hdrs["Authorization"] = f"Bearer {self.token}"
            request = self.http.build_request(method, url, headers=hdrs)
            basic = self._basic if self._basic is not None and origin(url) == self._origin else None
            try:
                response = self.http.send(request, stream=True, auth=basic or httpx.USE_CLIENT_DEFAULT)
            except httpx.TransportError as exc:  # connect errors, resets, timeouts
                raise TransientError(f"{type(exc).__name__} for {redact(url)}") from exc
            if response.status_code not in REDIRECT_STATUSES:
                return response
            location = response.headers.get("location")
            response.close()
            if not location:
                raise HubProtocolError(f"{redact(url)} answered {response.status_code} without a Location")
            target = urljoin(url, location)
            scheme = urlsplit(target).scheme
            if scheme not in ("http", "https"):
                raise HubProtocolError(f"refusing a redirect from {redact(url)} to a {scheme!r} URL")
            if urlsplit(url).scheme == "https" and scheme == "http":
                raise HubProtocolError(
                    f"refusing a redirect from {redact(url)} to plain http ({redact(target)}): "
                    "it would expose the download to tampering"
                )
            seen.append(url)
            url = target
        raise HubProtocolError(
            f"too many redirects (more than {self.policy.max_redirects}) starting at {redact(seen[0])}: "
            "the server is in a redirect loop; try again later or check HF_ENDPOINT"
        )

    def get_json(self, url: str, what: str) -> tuple[Any, httpx.Response]:
        """GET an API URL with retries; returns the decoded JSON and the response (for its headers)."""
        failures = 0
        while True:
            try:
                response = self.open(url, {"Accept": "application/json"})
                try:
                    check_status(response, what, self)
                    response.read()
                finally:
                    response.close()
                try:
                    return response.json(), response
                except ValueError as exc:
                    raise HubProtocolError(f"{what}: {redact(url)} did not answer JSON") from exc
            except TransientError as exc:
                failures += 1
                if failures > self.policy.max_retries:
                    raise HubRetryError(
                        f"{what}: gave up after {failures} failed tries ({exc}); the hub or the network "
                        "is failing, try again later"
                    ) from exc
                time.sleep(self.policy.backoff(failures, exc.retry_after))


def check_status(response: httpx.Response, what: str, client: HubClient) -> None:
    """Raise the error a user can act on for a non-2xx status (or TransientError to retry)."""
    status = response.status_code
    if status < 400:
        return
    url = redact(str(response.request.url))
    code = response.headers.get("x-error-code", "")
    if status in TRANSIENT_STATUSES or status >= 500:
        raise TransientError(f"{what}: {url} answered {status}", parse_retry_after(response.headers.get("retry-after")))
    on_hub = origin(url) == origin(client.endpoint)
    if status == 403 and not on_hub:
        # A CDN refusing a presigned URL (expired, say): the next try asks the hub for a fresh one.
        raise TransientError(f"{what}: {url} answered 403")
    if status in (401, 403):
        sent = "the token was rejected" if client.token else "no token was sent"
        if status == 403 or code == "GatedRepo":
            fix = (
                f"if the repo is gated, accept its terms on {redact(client.endpoint)}; "
                f"make sure your token has access: {token_source_hint()}"
            )
        else:
            fix = token_source_hint()
        raise HubAuthError(f"{what}: {url} answered {status} ({code or 'unauthorized'}; {sent}). To fix: {fix}")
    if status == 404:
        raise HubNotFoundError(
            f"{what}: {url} answered 404 ({code or 'not found'}). Check the repo id, the revision and "
            "whether it is a model or a dataset repo; a private repo also answers 404 without a token "
            "(set HF_TOKEN)"
        )
    raise HubError(f"{what}: {url} answered {status} {response.reason_phrase}")
