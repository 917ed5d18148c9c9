"""The git state of the code under test, for every record: which commit, and whether it was dirty."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["git_state"]

_GIT_TIMEOUT_S = 5.0


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the checkout at `root`; (None, None) without git or outside a repo.

    Never raises: a report without a commit beats a run that dies at its very end. `status` runs
    with --no-optional-locks so that it never takes the index lock from a concurrent `git commit`.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "--no-optional-locks", *args],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = git("rev-parse", "--verify", "-q", "HEAD")
    commit = (head.strip() or None) if head is not None else None
    status = git("status", "--porcelain")
    dirty = bool(status.strip()) if status is not None else None
    return commit, dirty
