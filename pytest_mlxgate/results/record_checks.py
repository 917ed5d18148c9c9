"""One limit of an assertion as the reports read it: a record's check, or a capability task's drop or
floor (the read model's part every verdict table shows). Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import Flat, absent, integer, real, rest, text

__all__ = ["CHECK_KEYS", "CheckResult", "parse_check"]


@dataclass(frozen=True)
class CheckResult(Flat):
    """One limit of an assertion (a record's check, or a capability task's drop or floor): the value, its
    interval [lower, upper] (the same meaning whatever the direction), the limit and the verdict. Its wire
    form (`to_json`, `wire.Check`) has the fields' names."""

    metric: str | None = None
    key: str | None = None
    value: float | None = None
    lower: float | None = None
    upper: float | None = None
    limit: float | None = None
    direction: str | None = None  # "max": must stay at or below the limit; "min": at or above
    verdict: str | None = None  # "pass" | "fail" | "inconclusive"; None: the check says none
    n: int | None = None
    n_needed: int | None = None  # inconclusive: about how many items would tell
    method: str | None = None
    p_value: float | None = None
    context: int | None = None  # a speed check: the context (tokens) it holds at
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def bound(self) -> float | None:
        """The end the verdict compared with the limit: the upper for "max", the lower for "min"."""
        return self.lower if self.direction == "min" else self.upper

    @property
    def label(self) -> str:
        return self.metric or self.key or "—"


#: The keys of a check's wire form the read model types.
CHECK_KEYS = (
    "metric",
    "key",
    "value",
    "lower",
    "upper",
    "limit",
    "direction",
    "verdict",
    "n",
    "n_needed",
    "method",
    "p_value",
    "context",
)


def parse_check(c: Mapping[str, Any], *, direction: str | None = None) -> CheckResult:
    """A check, tolerant; `direction`: the one its kind implies where the wire leaves it out (a task's)."""
    context = c.get("context")
    return CheckResult(
        metric=text(c.get("metric")),
        key=text(c.get("key")),
        value=real(c.get("value")),
        lower=real(c.get("lower")),
        upper=real(c.get("upper")),
        limit=real(c.get("limit")),
        direction=direction if direction is not None else text(c.get("direction")),
        verdict=text(c.get("verdict")),
        n=integer(c.get("n")),
        n_needed=integer(c.get("n_needed")),
        method=text(c.get("method")),
        p_value=real(c.get("p_value")),
        context=int(str(context)) if context is not None and str(context).strip().lstrip("-").isdigit() else None,
        left_out=absent(c, CHECK_KEYS),
        more=rest(c, CHECK_KEYS),
    )
