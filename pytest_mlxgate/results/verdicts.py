"""The three verdict words every gate uses, and what an inconclusive one does to the test.

*pass*: the bound was shown inside every limit. *fail*: a limit was shown crossed (a regression).
*inconclusive*: neither; it never passes. It fails the test by default; `--mlx-inconclusive=warn`
or `xfail` lets exploratory runs go on, with the record still saying "inconclusive". Standard
library only (the summary reads the words on the controller); pytest is imported when acting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["INCONCLUSIVE_POLICIES", "VERDICTS", "check_verdict", "overall_verdict", "settle_inconclusive"]

VERDICTS = ("pass", "fail", "inconclusive")
INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")


def check_verdict(check: Mapping[str, Any]) -> str:
    """A check's verdict; records written before there were three words carry only `passed`."""
    verdict = check.get("verdict")
    if verdict in VERDICTS:
        return str(verdict)
    return "pass" if check.get("passed") is True else "fail"


def overall_verdict(checks: Iterable[Mapping[str, Any]]) -> str:
    """fail if any check failed, else inconclusive if any could not tell, else pass."""
    verdicts = {check_verdict(c) for c in checks}
    if "fail" in verdicts:
        return "fail"
    return "inconclusive" if "inconclusive" in verdicts else "pass"


def settle_inconclusive(message: str, policy: str) -> None:
    """Act on an inconclusive verdict: fail the test (default), warn, or xfail; never pass silently."""
    __tracebackhide__ = True
    if policy == "warn":
        import warnings

        from ..errors import InconclusiveGateWarning

        warnings.warn(InconclusiveGateWarning(message), stacklevel=3)
        return
    if policy == "xfail":
        import pytest

        pytest.xfail(message)
    raise AssertionError(message)
