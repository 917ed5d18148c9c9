"""The verdict words, in one place: a check's three, a record's others, which are worse, which fail.

*pass*: the bound was shown inside every limit. *fail*: a limit was shown crossed (a regression).
*inconclusive*: neither; it never passes. It fails the test by default; `--mlx-inconclusive=warn`
or `xfail` lets exploratory runs go on, with the record still saying "inconclusive".

A record has more words: *error* (the gate raised before it decided: a setup error, NaN logits, a
lever that raised; worse than fail), *floor* (A/A: every limit above the noise floor), *measured*
(measured, nothing asserted) and the Capability Score's *complete* / *partial*. A word not listed
here (or none) is no pass: it counts as a failure wherever a verdict decides. Standard library only
(the summary reads the words on the controller); pytest is imported when acting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ERROR", "INCONCLUSIVE_POLICIES", "NOT_FAILING", "RECORD_VERDICTS", "VERDICTS", "check_verdict",
           "is_failing", "overall_verdict", "run_verdict", "settle_inconclusive", "verdict_rank", "worst_verdict"]

VERDICTS = ("pass", "fail", "inconclusive")
INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")
#: A gate that raised before it decided (setup error, non-finite logits, a lever that raised, a model
#: that cannot load, a timeout): its record says so, with the error's message. Never a pass.
ERROR = "error"
#: Every word a record's verdict may hold.
RECORD_VERDICTS = (*VERDICTS, ERROR, "floor", "measured", "complete", "partial")
#: The record verdicts that are no failure ("inconclusive" depends on the run's policy: `is_failing`).
NOT_FAILING = frozenset({"pass", "floor", "measured", "complete", "partial"})
#: Worse verdicts rank higher: error > fail > inconclusive > a word this list lacks > measured (nothing
#: asserted) > the others. An unknown word never beats a failure and never hides behind a pass (and
#: `is_failing` fails it).
_RANK = {ERROR: 5, "fail": 4, "inconclusive": 3, "measured": 1, "pass": 0, "floor": 0, "complete": 0, "partial": 0}
_UNKNOWN_RANK = 2


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


def verdict_rank(verdict: Any) -> int:
    """How bad a record's verdict is: error 5, fail 4, inconclusive 3, unknown (or none) 2, measured 1, the others 0."""
    return _RANK.get(str(verdict), _UNKNOWN_RANK) if verdict is not None else _UNKNOWN_RANK


def worst_verdict(verdicts: Iterable[Any]) -> str | None:
    """The worst of the words (the first of equals); None for none."""
    worst: Any = None
    seen = False
    for verdict in verdicts:
        if not seen or verdict_rank(verdict) > verdict_rank(worst):
            worst, seen = verdict, True
    return None if not seen else str(worst) if worst is not None else "none"


def is_failing(verdict: Any, inconclusive_policy: str = "fail") -> bool:
    """Whether a record's verdict fails a run: error, fail, an unknown word or none do; inconclusive
    does under the default policy (`--mlx-inconclusive fail`), not under warn or xfail."""
    if verdict == "inconclusive":
        return inconclusive_policy not in ("warn", "xfail")
    return not (isinstance(verdict, str) and verdict in NOT_FAILING)


def run_verdict(verdicts: Iterable[Any], *, interrupted: bool = False) -> str:
    """A whole run's word (the JSON report's `verdict`): error when it was interrupted (gates did not
    run), "none" without a gate record (nothing was tested), else its worst record's verdict, with the
    passing words (floor, measured) read as pass and an unknown word as error."""
    if interrupted:
        return ERROR
    worst = worst_verdict(verdicts)
    if worst is None:
        return "none"
    if worst in NOT_FAILING:
        return "pass"
    return worst if worst in (ERROR, "fail", "inconclusive") else ERROR
