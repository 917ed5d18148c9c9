"""The capability parts of the read model: each task's scores, drop and flipped items, and the
Capability Score, each with its tolerant parse. Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import Flat, Interval, absent, integer, interval, mapping, real, rest, sequence, text, written
from .record_checks import CheckResult, parse_check

__all__ = ["Answer", "CapabilityScore", "Flipped", "FlippedItem", "ScoreTask", "Task", "parse_score", "parse_task"]


@dataclass(frozen=True)
class Answer(Flat):
    """One arm's answer to a capability item."""

    output: str | None = None
    score: float | None = None
    verdict: str | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class FlippedItem:
    """An item whose score changed between the arms; `prompt` (its tail) only in records that kept it."""

    id: str | None = None
    prompt: str | None = None
    reference: Answer = Answer()
    candidate: Answer = Answer()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        typed = {
            "id": self.id,
            "prompt": self.prompt,
            "reference": self.reference.to_json(),
            "candidate": self.candidate.to_json(),
        }
        return written(typed, self.left_out, self.more)


@dataclass(frozen=True)
class Flipped:
    total: int | None = None
    items: tuple[FlippedItem, ...] = ()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        return written({"total": self.total, "items": [i.to_json() for i in self.items]}, self.left_out, self.more)


@dataclass(frozen=True)
class Task:
    """One capability task of a gate: both scores with intervals, the drop's and the floor's verdicts."""

    name: str
    n: int | None = None
    ref_score: float | None = None
    cand_score: float | None = None
    ref_ci: Interval = Interval()
    cand_ci: Interval = Interval()
    drop_check: CheckResult | None = None  # max_drop=: the paired drop (reference − candidate) and its bounds
    floor_check: CheckResult | None = None  # floor=: the candidate's score and its bounds
    flipped: Flipped | None = None  # None: not recorded
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`capability/assertions.py` writes it; the paired items, tests and timings as written)."""
        typed = {
            "n": self.n,
            "ref_score": self.ref_score,
            "cand_score": self.cand_score,
            "ref_ci": list(self.ref_ci),
            "cand_ci": list(self.cand_ci),
            "drop_verdict": self.drop_check.to_json() if self.drop_check is not None else None,
            "floor_verdict": self.floor_check.to_json() if self.floor_check is not None else None,
            "flipped": self.flipped.to_json() if self.flipped is not None else None,
        }
        return written(typed, self.left_out, self.more)

    @property
    def drop(self) -> float | None:
        """Reference score − candidate score: what the candidate lost (negative: gained)."""
        if self.ref_score is None or self.cand_score is None:
            return None
        return self.ref_score - self.cand_score

    @property
    def method(self) -> str | None:
        return (self.drop_check.method if self.drop_check else None) or (
            self.floor_check.method if self.floor_check else None
        )


@dataclass(frozen=True)
class ScoreTask(Flat):
    reference: float | None = None
    candidate: float | None = None
    n: int | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class CapabilityScore:
    """The run's Capability Score: the unweighted mean over the six tasks, partial when one did not run."""

    reference: float | None = None
    candidate: float | None = None
    partial: bool | None = None
    tasks: Mapping[str, ScoreTask] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        typed = {
            "reference": self.reference,
            "candidate": self.candidate,
            "partial": self.partial,
            "tasks": {name: t.to_json() for name, t in self.tasks.items()},
            "missing": list(self.missing),
        }
        return written(typed, self.left_out, self.more)


ANSWER_KEYS = ("output", "score", "verdict")
ITEM_KEYS = ("id", "prompt", "reference", "candidate")
TASK_KEYS = ("n", "ref_score", "cand_score", "ref_ci", "cand_ci", "drop_verdict", "floor_verdict", "flipped")
SCORE_TASK_KEYS = ("reference", "candidate", "n")
SCORE_KEYS = ("reference", "candidate", "partial", "tasks", "missing")


def _answer(a: Mapping[str, Any]) -> Answer:
    return Answer(
        output=text(a.get("output")),
        score=real(a.get("score")),
        verdict=text(a.get("verdict")),
        left_out=absent(a, ANSWER_KEYS),
        more=rest(a, ANSWER_KEYS),
    )


def _item(i: Mapping[str, Any]) -> FlippedItem:
    return FlippedItem(
        id=text(i.get("id")),
        prompt=i.get("prompt") if isinstance(i.get("prompt"), str) else None,
        reference=_answer(mapping(i.get("reference"))),
        candidate=_answer(mapping(i.get("candidate"))),
        left_out=absent(i, ITEM_KEYS),
        more=rest(i, ITEM_KEYS),
    )


def parse_task(name: str, t: Mapping[str, Any]) -> Task:
    drop, floor, flipped = mapping(t.get("drop_verdict")), mapping(t.get("floor_verdict")), mapping(t.get("flipped"))
    return Task(
        name=name,
        n=integer(t.get("n")),
        ref_score=real(t.get("ref_score")),
        cand_score=real(t.get("cand_score")),
        ref_ci=interval(t.get("ref_ci")),
        cand_ci=interval(t.get("cand_ci")),
        drop_check=parse_check(drop, direction="max") if drop else None,
        floor_check=parse_check(floor, direction="min") if floor else None,
        flipped=Flipped(
            total=integer(flipped.get("total")),
            items=tuple(_item(mapping(i)) for i in sequence(flipped.get("items"))),
            left_out=absent(flipped, ("total", "items")),
            more=rest(flipped, ("total", "items")),
        )
        if flipped
        else None,
        left_out=absent(t, TASK_KEYS),
        more=rest(t, TASK_KEYS),
    )


def parse_score(s: Mapping[str, Any]) -> CapabilityScore:
    partial = s.get("partial")
    return CapabilityScore(
        reference=real(s.get("reference")),
        candidate=real(s.get("candidate")),
        partial=None if partial is None else bool(partial),
        tasks={
            str(t): ScoreTask(
                reference=real(mapping(v).get("reference")),
                candidate=real(mapping(v).get("candidate")),
                n=integer(mapping(v).get("n")),
                left_out=absent(mapping(v), SCORE_TASK_KEYS),
                more=rest(mapping(v), SCORE_TASK_KEYS),
            )
            for t, v in mapping(s.get("tasks")).items()
        },
        missing=tuple(str(m) for m in sequence(s.get("missing"))),
        left_out=absent(s, SCORE_KEYS),
        more=rest(s, SCORE_KEYS),
    )
