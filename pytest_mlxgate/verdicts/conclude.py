"""The one verdict pipeline of every assertion: validate → checks → verdict → publish → message → raise.

`assert_kl_below`, `assert_faster`, `assert_smaller` and `assert_capability_at_least` each say what
their limits are and how a check of theirs reads (their own module); everything after that is here,
once: the checks are built by `check` (one shape: value, the two ends of its interval, limit,
direction, verdict), the gate's verdict is the worst of them, the `Conclusion` goes to the `paired`
fixture's one `publish` (which makes the record), and a fail raises one AssertionError whose message
is the assertion's report while an inconclusive verdict is settled by --mlx-inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..results.model import limits_from_words
from ..results.verdicts import ERROR, Direction, Verdict, bounds_verdict, overall_verdict, settle_inconclusive
from ..results.wire import Check, Mode

__all__ = ["Conclusion", "MessageFn", "Target", "check", "conclude", "given_limits"]


def _end(x: float | None) -> float | None:
    """A number a check can carry: None for a missing or undefined one (NaN, ±inf, None)."""
    return None if x is None or not math.isfinite(x) else float(x)


def check(
    *,
    metric: str,
    key: str,
    value: float | None,
    lower: float | None,
    upper: float | None,
    limit: float,
    direction: Direction,
    n: int,
    method: str,
    n_needed: int | None = None,
    verdict: Verdict | None = None,
    p_value: float | None = None,
    context: int | None = None,
) -> Check:
    """The one constructor of a check: one limit of an assertion.

    `lower`/`upper` are the two ends of the confidence interval of `value`, in the metric's own units,
    whatever the direction (None or non-finite: no such end; an exact figure has lower == upper ==
    value). `verdict` defaults to the one rule (`results.verdicts.bounds_verdict`); a caller passes its
    own only where a test decides instead (the capability drop's Holm-corrected rejection, the
    sequential procedure's verdict, an A/A floor's strict margin). `context`: a speed check's context."""
    lo, hi = _end(lower), _end(upper)
    if verdict is None:
        verdict = bounds_verdict(lo, hi, limit, direction)
    made = Check(
        metric=metric,
        key=key,
        value=_end(value),
        lower=lo,
        upper=hi,
        limit=float(limit),
        direction=direction,
        verdict=verdict,
        n=int(n),
        n_needed=n_needed,
        method=method,
    )
    if p_value is not None:
        made["p_value"] = float(p_value)
    if context is not None:
        made["context"] = int(context)
    return made


@dataclass(frozen=True)
class Conclusion:
    """What one assertion decided and what its record carries beside the checks.

    `fields` are the measurement's own record fields (`results.records.gate_record`'s keywords: a KL
    gate's statistics, a capability gate's tasks, a speed gate's measurement); the `paired` fixture adds
    the arms (model, lever, path) and the re-run command where they are not given."""

    mode: Mode
    checks: Sequence[Check]
    bounds: Mapping[str, Any]
    verdict: str = ""  # "" until decided: the worst of the checks' (`overall_verdict`)
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", overall_verdict(self.checks))


class Target(Protocol):
    """Where an assertion's conclusion goes: the `paired` fixture (`session.paired.Paired`)."""

    @property
    def nodeid(self) -> str: ...

    @property
    def rerun(self) -> str: ...

    @property
    def inconclusive(self) -> str: ...  # --mlx-inconclusive: fail, warn or xfail

    def vouch(self, conclusion: Conclusion) -> Conclusion: ...  # where its limits come from (`authoring.proof`)

    def publish(self, conclusion: Conclusion) -> None: ...


class MessageFn(Protocol):
    """An assertion's report for a verdict that did not pass, on the checks as vouched for."""

    def __call__(self, *, verdict: str, nodeid: str, rerun: str, checks: Sequence[Check]) -> str: ...


def given_limits(
    assertion: str,
    given: Mapping[str, float | None],
    *,
    example: str,
    usable: Callable[[str, float], bool],
    what: str = "is not a usable limit",
) -> dict[str, float]:
    """The limits an assertion was given (None: not asked), each checked: TypeError for none at all
    (saying `example`), ValueError naming the first unusable one (a limit is a finite number: NaN and
    ±inf are refused for every assertion, before its own `usable`)."""
    limits = {k: float(v) for k, v in given.items() if v is not None}
    if not limits:
        raise TypeError(f"{assertion} needs {example}")
    for key, value in limits.items():
        if not math.isfinite(value):  # inf clears every bound: a limit that cannot fail is no limit
            raise ValueError(
                f"{assertion}: {key}={value} is not a finite number, so nothing could cross it; give the "
                "largest (or, for a rate, the smallest) value you accept"
            )
        if not usable(key, value):
            raise ValueError(f"{assertion}: {key}={value} {what}")
    return limits


def conclude(target: Target | None, conclusion: Conclusion, message: MessageFn) -> None:
    """Vouch for the conclusion's limits on the judged model and publish it (when there is a `paired`),
    then act on its verdict: an error (limits that do not catch the known-bad here) or a fail raises
    AssertionError with the report, an inconclusive one fails, warns or xfails as --mlx-inconclusive says
    (never a pass); any other verdict returns."""
    __tracebackhide__ = True
    if target is not None:
        conclusion = target.vouch(conclusion)
        target.publish(conclusion)
    limits_from = limits_from_words(conclusion.fields.get("limits_from"))
    if conclusion.verdict == ERROR:
        error = conclusion.fields.get("error")
        raise AssertionError(str(error.get("message") if isinstance(error, Mapping) else error))
    if conclusion.verdict not in ("fail", "inconclusive"):
        return
    text = message(
        verdict=conclusion.verdict,
        nodeid=target.nodeid if target is not None else "",
        rerun=target.rerun if target is not None else "",
        checks=conclusion.checks,
    )
    if limits_from is not None:
        text += f"\n  {limits_from}"
    if conclusion.verdict == "fail":
        raise AssertionError(text)
    # the warning names the line that called the assertion: settle_inconclusive <- conclude <- assert_...
    settle_inconclusive(text, target.inconclusive if target is not None else "fail", stacklevel=4)
