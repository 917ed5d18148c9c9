"""Verified snapshots from the Hugging Face hub, in huggingface_hub's own cache layout.

Every byte is checked against its checksum while it streams; a blob gets its final name only
verified, fsynced and atomically renamed, and a verified stamp; partial downloads resume across runs.
A cached blob is trusted while its stat matches its stamp, and hashed again otherwise (`integrity`).
"""

from __future__ import annotations

from .environment import resolve_cache_dir
from .errors import (
    HubAuthError,
    HubChecksumError,
    HubDiskFullError,
    HubError,
    HubNotFoundError,
    HubOfflineError,
    HubProtocolError,
    HubRetryError,
    HubUnsafePathError,
    HubVerifyError,
)
from .snapshot import snapshot_download
from .verify import VerifyReport, verify_snapshot

__all__ = [
    "HubAuthError",
    "HubChecksumError",
    "HubDiskFullError",
    "HubError",
    "HubNotFoundError",
    "HubOfflineError",
    "HubProtocolError",
    "HubRetryError",
    "HubUnsafePathError",
    "HubVerifyError",
    "VerifyReport",
    "resolve_cache_dir",
    "snapshot_download",
    "verify_snapshot",
]
