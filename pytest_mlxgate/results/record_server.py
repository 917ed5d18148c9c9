"""A KL gate's candidate served over HTTP, as its record says it (`remote.arm`): where, and what its KL
rests on. A server gives each position's top-k log-probabilities, not the whole distribution, so the
record's KL figures are lower bounds (a fail is sound; a pass rests on the top-k) and it says so in the
same words in every report (`ServerArm.words`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import absent, integer, jsonable, mapping, real, rest, text, written

__all__ = ["NO_DIFFERENCE", "SERVER_KEYS", "ServerArm", "parse_server"]

SERVER_KEYS = (
    "url",
    "ref_url",
    "top_k",
    "k",
    "bound",
    "asked",
    "unaskable",
    "next_unlisted",
    "chosen_disagreed",
    "ref_tail",
    "cand_tail",
    "max_kl",
    "served",
    "ref_served",
)
#: A largest per-position KL at or below this: the server's lists match the reference arm's everywhere.
NO_DIFFERENCE = 1e-5


@dataclass(frozen=True)
class ServerArm:
    """The candidate served at `url`: `k` log-probabilities per position (of `top_k` asked), the mean mass
    outside the tokens both arms listed (`ref_tail`, `cand_tail`), positions asked and not askable."""

    url: str | None = None  # the candidate's server (None: the candidate ran in process)
    ref_url: str | None = None  # the reference's server (None: the reference ran in process)
    top_k: int | None = None
    k: int | None = None
    bound: str | None = None  # "lower": the KL figures are lower bounds of the full KL; "exact": whole rows
    asked: int | None = None
    unaskable: int | None = None  # their prompt's text encodes to other tokens: not asked, not scored
    next_unlisted: int | None = None  # scored positions whose next token the server's list did not hold
    chosen_disagreed: int | None = None  # positions whose reported "chosen" entry was not the generated token
    ref_tail: float | None = None
    cand_tail: float | None = None
    max_kl: float | None = None  # the largest per-position lower bound
    served: tuple[str, ...] | None = None  # the models it lists, checked against the candidate (None: unlisted)
    ref_served: tuple[str, ...] | None = None  # the reference server's, checked against the reference model
    left_out: frozenset[str] = frozenset()
    more: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        typed = {key: jsonable(getattr(self, key)) for key in SERVER_KEYS}
        return written(typed, self.left_out, self.more)

    @property
    def words(self) -> str:
        """One line: `candidate served at URL: KL a lower bound from its top-11 (mass left out: reference
        0.12, candidate 0.13); 2 of 96 positions not askable; its "chosen" entries disagreed at 40 (not
        believed)`; a served reference is named first (`reference served at URL; candidate served at ...`)."""
        where = "; ".join(
            f"{arm} served at {url}" for arm, url in (("reference", self.ref_url), ("candidate", self.url)) if url
        )
        if self.bound == "exact":
            text = f"{where}: whole distributions by the mlxgate protocol (KL exact)"
        else:
            tails = ", ".join(
                f"{side} {_f(value)}"
                for side, value in (("reference", self.ref_tail), ("candidate", self.cand_tail))
                if value is not None
            )
            whose = "their" if self.url and self.ref_url else "its"
            text = f"{where}: KL a lower bound from {whose} top-{self.k} (mass left out: {tails or '?'})"
        if self.max_kl is not None and self.max_kl <= NO_DIFFERENCE:
            text += (
                f"; no difference from the reference arm at any position (max {_f(self.max_kl)}): whatever the "
                "server was set to change, it changed nothing scored here"
            )
        for url, listed in ((self.ref_url, self.ref_served), (self.url, self.served)):
            if url and listed is None:
                text += f"; {url} could not list the models it serves (only its tokenizer was checked)"
        if self.unaskable:
            text += f"; {self.unaskable} of {self.asked} positions not askable (their text encodes otherwise)"
        if self.next_unlisted:
            text += f"; the next token unlisted at {self.next_unlisted} (ln PPL not measured there)"
        if self.chosen_disagreed:
            text += f'; its "chosen" entries disagreed at {self.chosen_disagreed} (not believed)'
        return text


def _f(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def parse_server(value: Any) -> ServerArm | None:
    """A record's `server` part, read (None where the record has none)."""
    part = mapping(value)
    if not part:
        return None
    return ServerArm(
        url=text(part.get("url")) or None,
        top_k=integer(part.get("top_k")),
        k=integer(part.get("k")),
        bound=text(part.get("bound")) or None,
        asked=integer(part.get("asked")),
        unaskable=integer(part.get("unaskable")),
        next_unlisted=integer(part.get("next_unlisted")),
        chosen_disagreed=integer(part.get("chosen_disagreed")),
        ref_tail=real(part.get("ref_tail")),
        cand_tail=real(part.get("cand_tail")),
        max_kl=real(part.get("max_kl")),
        ref_url=text(part.get("ref_url")) or None,
        served=tuple(str(m) for m in part["served"]) if isinstance(part.get("served"), list) else None,
        ref_served=tuple(str(m) for m in part["ref_served"]) if isinstance(part.get("ref_served"), list) else None,
        left_out=absent(part, SERVER_KEYS),
        more=rest(part, SERVER_KEYS),
    )
