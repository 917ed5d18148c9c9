"""A plan file's own word that no gate verified it: `mlxgate plan --no-verify` writes `"verified": false` and
why into the plan, and the KV and weights levers read it back and say it wherever they describe the plan, so
neither the file nor a record that ran it can pass for a verified plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import LeverError

__all__ = ["MARK_KEYS", "mark_unverified", "unverified_reason"]

#: The keys of the mark, beside a plan's own: every plan reader sets them aside.
MARK_KEYS = frozenset({"verified", "verification"})


def mark_unverified(plan: Mapping[str, Any], why: str) -> dict[str, Any]:
    """`plan` with the mark first: `"verified": false` and `"verification"`: why, and how to verify it."""
    return {"verified": False, "verification": why, **plan}


def unverified_reason(config: Mapping[str, Any], where: str) -> str | None:
    """Why the plan file says it is not verified; None where it carries no mark. `"verified": true` is
    refused: a plan is verified by running its gate on it, not by its own word, so no file may claim it."""
    if not MARK_KEYS & set(config):
        return None
    verified, why = config.get("verified"), config.get("verification")
    if verified is not False or not isinstance(why, str):
        raise LeverError(
            f"{where}: 'verified' is {verified!r} and 'verification' {why!r}; a plan file carries only the mark "
            '`mlxgate plan --no-verify` writes ("verified": false, "verification": "why"), never a claim that it '
            "passed: that is its gate's run to say. Drop both keys, or restore the file as it was written"
        )
    return why
