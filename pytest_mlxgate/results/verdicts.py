"""The verdict words, in one place: a check's three, a record's others, which are worse, which fail.

*pass*: the bound was shown inside every limit. *fail*: a limit was shown crossed (a regression).
*inconclusive*: neither; it never passes. It fails the test by default; `--mlx-inconclusive=warn`
or `xfail` lets exploratory runs go on, with the record still saying "inconclusive".

A record has more words: *error* (the gate raised before it decided: a setup error, NaN logits, a
lever that raised; worse than fail), *floor* (A/A: every limit above the noise floor), *measured*
(measured, nothing asserted) and the Capability Score's *complete* / *partial*. A word not listed
here (or none) is no pass: it counts as a failure wherever a verdict decides (a capability gate whose
every task was skipped records *skipped*, `SKIPPED`, which this list lacks on purpose: nothing was
tested). Standard library only (the summary reads the words on the controller); pytest is imported
when acting.

This is the one vocabulary: the statistics (`stats/verdicts.py`, `stats/sequential.py`), the
assertions' pipeline (`verdicts/conclude.py`) and every reader take their words and rules from here.
A check's verdict is read off its interval by `bounds_verdict`, the one rule of every limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

__all__ = [
    "ERROR",
    "INCONCLUSIVE_POLICIES",
    "NOT_FAILING",
    "RECORD_VERDICTS",
    "SKIPPED",
    "VERDICTS",
    "Direction",
    "Verdict",
    "bounds_verdict",
    "check_verdict",
    "is_failing",
    "overall_verdict",
    "run_verdict",
    "settle_inconclusive",
    "three_way",
    "verdict_rank",
    "worst_verdict",
]

#: A check's verdict (and a gate's, once its checks are in).
Verdict = Literal["pass", "fail", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = ("pass", "fail", "inconclusive")
#: Which side of its limit a value must stay on: "max" at or below it, "min" at or above it.
Direction = Literal["max", "min"]
INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")
#: A gate that raised before it decided (setup error, non-finite logits, a lever that raised, a model
#: that cannot load, a timeout): its record says so, with the error's message. Never a pass.
ERROR = "error"
#: Every word a record's verdict may hold.
RECORD_VERDICTS = (*VERDICTS, ERROR, "floor", "measured", "complete", "partial")
#: The record verdicts that are no failure ("inconclusive" depends on the run's policy: `is_failing`).
NOT_FAILING = frozenset({"pass", "floor", "measured", "complete", "partial"})
#: A capability gate none of whose tasks could run here: recorded, then the test skips. Not a record
#: verdict of RECORD_VERDICTS: it never reads as pass.
SKIPPED = "skipped"
#: Worse verdicts rank higher: error > fail > inconclusive > a word this list lacks > measured (nothing
#: asserted) > the others. An unknown word never beats a failure and never hides behind a pass (and
#: `is_failing` fails it).
_RANK = {ERROR: 5, "fail": 4, "inconclusive": 3, "measured": 1, "pass": 0, "floor": 0, "complete": 0, "partial": 0}
_UNKNOWN_RANK = 2


def three_way(*, within: bool, beyond: bool) -> Verdict:
    """`within`: the bound on the good side clears the limit; `beyond`: the other side was shown."""
    if within and beyond:  # only when the bounds cross: nothing consistent was shown
        return "inconclusive"
    return "pass" if within else "fail" if beyond else "inconclusive"


def bounds_verdict(lower: float | None, upper: float | None, limit: float, direction: Direction) -> Verdict:
    """The rule of every limit, read off the value's interval [lower, upper] (None: no such end).

    "max" (stay at or below the limit): pass iff upper <= limit, fail iff lower > limit; "min" (at or
    above it): pass iff lower >= limit, fail iff upper < limit; otherwise inconclusive. A missing end
    shows nothing on its side."""
    if direction == "max":
        return three_way(within=upper is not None and upper <= limit, beyond=lower is not None and lower > limit)
    return three_way(within=lower is not None and lower >= limit, beyond=upper is not None and upper < limit)


def check_verdict(check: Mapping[str, Any]) -> str:
    """A check's verdict; a word that is not one of ours reads as fail, never as a pass (older records'
    `passed` is converted once, by `records.migrate_check`)."""
    verdict = check.get("verdict")
    return str(verdict) if verdict in VERDICTS else "fail"


def overall_verdict(checks: Iterable[Mapping[str, Any]]) -> str:
    """fail if any check failed, else inconclusive if any could not tell, else pass."""
    verdicts = {check_verdict(c) for c in checks}
    if "fail" in verdicts:
        return "fail"
    return "inconclusive" if "inconclusive" in verdicts else "pass"


def settle_inconclusive(message: str, policy: str, *, stacklevel: int = 3) -> None:
    """Act on an inconclusive verdict: fail the test (default), warn, or xfail; never pass silently.
    `stacklevel`: the warning's, so it names the gate's line (the assertion's caller)."""
    __tracebackhide__ = True
    if policy == "warn":
        import warnings

        from ..errors import InconclusiveGateWarning

        warnings.warn(InconclusiveGateWarning(message), stacklevel=stacklevel)
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
