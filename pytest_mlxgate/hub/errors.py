"""The errors the downloader raises on purpose: each says what failed, why, and what to do."""

from __future__ import annotations


class HubError(Exception):
    """Base of every error the hub downloader raises on purpose."""


class HubAuthError(HubError):
    """401/403: no token, a wrong token, or a gated repo whose terms were not accepted."""


class HubNotFoundError(HubError):
    """The repo, revision or file does not exist (or is private and we sent no token)."""


class HubOfflineError(HubError):
    """Offline, and the cache lacks the snapshot or holds it incomplete."""


class HubUnsafePathError(HubError):
    """The server listed a file name that would land outside the snapshot."""


class HubChecksumError(HubError):
    """The bytes kept failing their checksum: the server (or a proxy) corrupts them."""


class HubProtocolError(HubError):
    """The server broke the protocol (bad redirect, bad Content-Range, bad listing)."""


class HubRetryError(HubError):
    """Transient failures (5xx, 429, resets, stalls) outlasted the retry budget."""


class HubDiskFullError(HubError):
    """The cache's disk has no room for the snapshot: the message says how much is needed and free."""


class HubVerifyError(HubError):
    """A cached snapshot failed re-verification: files missing or not matching their hash."""
