"""Commit ids: a resolved revision is 40 lowercase hex digits (git's sha1), never a branch name."""

from __future__ import annotations

import re

__all__ = ["COMMIT_RE", "GIT_SHA1_RE", "is_commit"]

#: A git object id (sha1): a commit, or the blob id of a non-LFS file.
GIT_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
COMMIT_RE = GIT_SHA1_RE


def is_commit(value: object) -> bool:
    """True for a full commit sha, the only revision that pins a snapshot."""
    return isinstance(value, str) and COMMIT_RE.match(value) is not None
