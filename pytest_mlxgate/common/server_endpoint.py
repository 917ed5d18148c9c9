"""Where a server arm lives and how it may be asked: its URL (checked), and its key, bound to its origin.

A key comes from an environment variable the gate names, is sent as a bearer header to that server's own
origin (scheme, host and port) and nowhere else: redirects are not followed (a redirect to another origin
would carry the key there, one to the same origin is a misconfigured URL worth fixing). A URL with a
password in it is refused: it would land in records, logs and the history DB with every gate's lever.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..errors import MlxgateUsageError

__all__ = ["Endpoint"]


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: its base URL (no `/v1`) and the environment variable holding its key."""

    url: str
    key_env: str | None = None

    @classmethod
    def parse(cls, text: str, *, key_env: str | None = None) -> Endpoint:
        """`http(s)://host:port[/prefix]` as given, or MlxgateUsageError saying what and how to fix it."""
        try:
            parts = urlsplit(text.strip())
            parts.port  # noqa: B018 - raises ValueError on a port that is no number in 0-65535
        except ValueError as e:
            raise MlxgateUsageError(
                f"server URL {text!r} cannot be read ({e}): give it as http://HOST:PORT, e.g. http://127.0.0.1:8080"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MlxgateUsageError(
                f"server URL {text!r} is not an http(s) URL with a host: give it as http://HOST:PORT "
                "(e.g. http://127.0.0.1:8080, the address mlx_lm.server prints)"
            )
        if parts.password is not None or parts.username is not None:
            shown = urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""), "", "", ""))
            raise MlxgateUsageError(
                f"server URL {shown} carries a user name or password: it would be written into every record, log "
                "and report that names the arm. Put the key in an environment variable and name it "
                "(key_env='MY_SERVER_KEY', or --mlx-server-key-env MY_SERVER_KEY): it is sent as a bearer "
                "header to that server alone"
            )
        if parts.query or parts.fragment:
            raise MlxgateUsageError(f"server URL {text!r} has a query or fragment: give the base URL alone")
        if key_env is not None and (not key_env or not key_env.replace("_", "").isalnum()):
            raise MlxgateUsageError(f"key_env {key_env!r} is not an environment variable's name")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return cls(urlunsplit((parts.scheme, parts.netloc, path, "", "")), key_env)

    @property
    def origin(self) -> tuple[str, str, int | None]:
        parts = urlsplit(self.url)
        default = {"http": 80, "https": 443}[parts.scheme]
        return parts.scheme, (parts.hostname or "").lower(), parts.port or default

    def api(self, path: str) -> str:
        """The URL of an OpenAI-style route (`completions` → BASE/v1/completions)."""
        return f"{self.url}/v1/{path.lstrip('/')}"

    def scrub(self, text: str) -> str:
        """`text` with this server's key (where one is set) replaced by ***: a server may echo what it got."""
        key = os.environ.get(self.key_env) if self.key_env else None
        return text.replace(key, "***") if key else text

    def headers_for(self, url: str) -> dict[str, str]:
        """The headers a request to `url` carries: the key only where `url` is on this server's origin."""
        if self.key_env is None or Endpoint.parse(url).origin != self.origin:
            return {}
        key = os.environ.get(self.key_env)
        if not key:
            raise MlxgateUsageError(
                f"the server at {self.url} needs the key in ${self.key_env}, which is not set: export it "
                "(its value is sent to that server alone and written nowhere)"
            )
        return {"Authorization": f"Bearer {key}"}
