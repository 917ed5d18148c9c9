"""A bfloat16 (or float16) record's float32 oracle, in the read model: both arms' KL from the oracle and the
kernel site check's errors per call position, with its tolerant parse. Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import integer, jsonable, mapping, real, sequence, text

__all__ = ["Oracle", "SiteErrors", "SiteRow", "parse_oracle"]


@dataclass(frozen=True)
class SiteRow:
    """One call position of a site (which layer): both errors from float32, scaled by the largest output."""

    at: int | None = None
    calls: int | None = None
    cand_max: float | None = None
    plain_max: float | None = None
    cand_mean: float | None = None
    plain_mean: float | None = None


@dataclass(frozen=True)
class SiteErrors:
    """One function the lever swaps (`kl.site`): its captured calls, row by call position."""

    target: str | None = None
    calls: int | None = None
    rows: tuple[SiteRow, ...] = ()


@dataclass(frozen=True)
class Oracle:
    """Both arms' KL from the float32 oracle (`kl.oracle`), and why no site check ran where none did (`kl.site`);
    its wire form is kept as written (the site check's calls, per position, ride there for the reports)."""

    dtype: str | None = None  # the precision the arms computed in
    same: bool = False  # the reference arm is the oracle (a float32 run)
    n: int | None = None
    plain: float | None = None  # the plain reference arm's mean KL from the oracle
    candidate: float | None = None  # the candidate's
    site_note: str | None = None
    set_aside: tuple[str, ...] = ()  # absolute limits inside the precision's rounding: the oracle's rules judged
    sites: tuple[SiteErrors, ...] = ()
    as_written: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.as_written)

    @property
    def words(self) -> str:
        """One line: both distances and their ratio, or that the reference is the oracle."""
        if self.same:
            return "the reference arm is the float32 oracle"
        ratio = f" ({self.candidate / self.plain:.2f}x)" if self.plain and self.candidate is not None else ""
        text = f"f32 oracle: plain {self.dtype} {_sci(self.plain)}, candidate {_sci(self.candidate)}{ratio}"
        if self.set_aside:
            text += f"; {', '.join(self.set_aside)} set aside (inside {self.dtype}'s own rounding)"
        return text


def _sci(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2e}"


def parse_oracle(o: Mapping[str, Any]) -> Oracle:
    """A record's `oracle` in the read model."""
    return Oracle(
        dtype=text(o.get("dtype")),
        same=o.get("same") is True,
        n=integer(o.get("n")),
        plain=real(mapping(o.get("plain")).get("mean")),
        candidate=real(mapping(o.get("candidate")).get("mean")),
        site_note=text(o.get("site_note")),
        set_aside=tuple(str(k) for k in sequence(o.get("set_aside"))),
        sites=tuple(_site(mapping(e)) for e in sequence(mapping(o.get("site")).get("sites"))),
        as_written=jsonable(dict(o)),
    )


def _site(e: Mapping[str, Any]) -> SiteErrors:
    rows = tuple(
        SiteRow(
            at=integer(r.get("at")),
            calls=integer(r.get("calls")),
            cand_max=real(r.get("cand_max")),
            plain_max=real(r.get("plain_max")),
            cand_mean=real(r.get("cand_mean")),
            plain_mean=real(r.get("plain_mean")),
        )
        for r in (mapping(x) for x in sequence(e.get("by_call")))
    )
    return SiteErrors(target=text(e.get("target")), calls=integer(e.get("calls")), rows=rows)
