"""KL from what a server says: each position's top-k log-probabilities, the rest merged into one tail bin.

A server (mlx_lm.server, any OpenAI-compatible endpoint) gives at most its top-k tokens' log-probabilities
per generated position, not the whole distribution. Grouping the vocabulary into the tokens both sides give
and one bin for the rest is a coarse-graining, and coarse-graining never raises KL (the data-processing
inequality): the figure here is a *lower bound* of the full KL(reference || candidate). A fail measured on
it is sound; a pass rests on the top-k, so its k and tail masses travel with it. Top-1 agreement is exact:
each side's most likely token is at the head of its list.

The lists are checked, never believed (`TopK.read`): ids unique whole numbers, log-probabilities finite and
at most 0, their mass at most 1; and sorted here (mlx_lm.server sends an unsorted argpartition). A tail the
float rounding of a server's log-probabilities cannot resolve (`TAIL_RESOLUTION`) on the candidate's side,
where the reference's holds mass, is merged with the least likely shared tokens' bins until it can: a coarser
grouping, still a lower bound, never a division by a rounded zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .divergence import RefDistributions, TokenScores

__all__ = ["MASS_SLACK", "TAIL_RESOLUTION", "CoarseKL", "TopK", "TopKError", "TopKScores", "compare_topk", "topk_kl"]

#: A tail mass below this is not told from zero by a server's float32 log-probabilities (their sum is off by
#: about 1e-7 of the mass): such a tail is merged into the least likely shared token's bin.
TAIL_RESOLUTION = 1e-6
#: A reference tail this small is the float64 rounding of 1 - (the listed mass): no mass at all.
FLOAT_NOISE = 1e-12
#: How far past 1 a list's mass may add up (float32 rounding of each entry) before it is no distribution.
MASS_SLACK = 1e-4


class TopKError(ValueError):
    """A server's per-position list that is no part of a distribution: the message names what and where."""


@dataclass(frozen=True)
class TopK:
    """One position's most likely tokens and their log-probabilities, most likely first."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    @classmethod
    def read(cls, entries: Iterable[tuple[object, object]], *, where: str) -> TopK:
        """The list as (id, logprob) pairs, checked and sorted; TopKError naming `where` otherwise."""
        pairs = list(entries)
        if not pairs:
            raise TopKError(f"{where}: an empty top-k list")
        ids, logprobs = [], []
        for token, logprob in pairs:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise TopKError(f"{where}: token id {token!r} is not a whole number >= 0")
            if isinstance(logprob, bool) or not isinstance(logprob, (int, float)) or not math.isfinite(logprob):
                raise TopKError(f"{where}: token {token}'s log-probability {logprob!r} is not a finite number")
            if logprob > MASS_SLACK:
                raise TopKError(f"{where}: token {token}'s log-probability {logprob} is above 0 (a probability > 1)")
            ids.append(token)
            logprobs.append(min(float(logprob), 0.0))
        if len(set(ids)) != len(ids):
            raise TopKError(f"{where}: a token id appears twice in one list ({sorted(ids)})")
        mass = float(np.exp(np.array(logprobs)).sum())
        if mass > 1 + MASS_SLACK:
            raise TopKError(f"{where}: the listed probabilities add up to {mass:.6f}, more than 1")
        order = sorted(range(len(ids)), key=lambda i: (-logprobs[i], ids[i]))
        return cls(tuple(ids[i] for i in order), tuple(logprobs[i] for i in order))

    @property
    def top(self) -> int:
        """The most likely token."""
        return self.ids[0]

    def logprob_of(self) -> Mapping[int, float]:
        return dict(zip(self.ids, self.logprobs, strict=True))


@dataclass(frozen=True)
class CoarseKL:
    """KL(reference || candidate) over the shared tokens and one tail bin, with what it rests on."""

    kl: float  # a lower bound of the full KL (exact where both tails are empty)
    shared: int  # the tokens both sides gave, each its own bin
    ref_tail: float  # each side's mass outside them
    cand_tail: float
    same_top: bool  # the two sides' most likely tokens agree (exact: read from the heads of the lists)


def topk_kl(
    reference: TopK | np.ndarray, candidate: TopK | np.ndarray, *, resolution: float = TAIL_RESOLUTION
) -> CoarseKL:
    """The coarse KL of one position. Either side is a `TopK` (a server's) or a full row of log-probabilities
    over the vocabulary (an arm in process): the bins are the tokens both give (a full row gives every one),
    plus the tail. Where the candidate's tail is at most `resolution` and the reference's holds mass, the least
    likely shared bins join the tail until it is resolved: a coarser grouping, so still a lower bound."""
    ids = _shared(reference, candidate)
    p = np.exp(_logprobs_at(reference, ids))
    q = np.exp(_logprobs_at(candidate, ids))
    p_tail, q_tail = max(0.0, 1.0 - float(p.sum())), max(0.0, 1.0 - float(q.sum()))
    same_top = _top(reference) == _top(candidate)
    order = np.argsort(-p, kind="stable")
    p, q = p[order], q[order]
    if p_tail <= FLOAT_NOISE:
        p_tail = 0.0  # the reference's tail is rounding: its term is 0 whatever the candidate's
    while len(p) and p_tail > 0 and q_tail <= resolution:
        p_tail, q_tail = p_tail + float(p[-1]), q_tail + float(q[-1])  # the least likely bin joins the tail
        p, q = p[:-1], q[:-1]
    kl = float(np.sum(_terms(p, q))) + float(_terms(np.array([p_tail]), np.array([q_tail]))[0])
    return CoarseKL(max(kl, 0.0), len(p), p_tail, q_tail, same_top)


def _terms(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """p log(p / q) per bin: 0 where p is 0; +inf where q is 0 and p is not (the candidate rules it out)."""
    out = np.zeros_like(p, dtype=np.float64)
    live = p > 0
    with np.errstate(divide="ignore"):
        out[live] = p[live] * (np.log(p[live]) - np.log(q[live]))
    return out


def _shared(reference: TopK | np.ndarray, candidate: TopK | np.ndarray) -> np.ndarray:
    if isinstance(reference, TopK) and isinstance(candidate, TopK):
        theirs = set(candidate.ids)
        return np.array([t for t in reference.ids if t in theirs], dtype=np.int64)
    if isinstance(reference, TopK):
        return np.array(reference.ids, dtype=np.int64)
    if isinstance(candidate, TopK):
        return np.array(candidate.ids, dtype=np.int64)
    return np.arange(len(reference), dtype=np.int64)


def _logprobs_at(side: TopK | np.ndarray, ids: np.ndarray) -> np.ndarray:
    if isinstance(side, TopK):
        known = side.logprob_of()
        return np.array([known[int(t)] for t in ids], dtype=np.float64)
    row = np.asarray(side, dtype=np.float64)
    return row[ids] if len(ids) else np.zeros(0)


def _top(side: TopK | np.ndarray) -> int:
    return side.top if isinstance(side, TopK) else int(np.argmax(np.asarray(side)))


@dataclass(frozen=True)
class TopKScores:
    """A sequence scored against a server's top-k: the scores of the positions it could ask, and what they
    rest on. `scores.kl` holds lower bounds; `scores.cand_next_logprob` is NaN where the text's next token
    was not in the server's list (its log-probability is not known, only that it is below the list's)."""

    scores: TokenScores
    k: int  # the fewest tokens a list gave
    ref_tail: np.ndarray  # (T,) each scored position's reference mass outside the shared tokens
    cand_tail: np.ndarray  # (T,) the candidate's
    unaskable: int  # positions not asked: their prompt's text encodes to other tokens
    next_unlisted: int  # scored positions whose next token the candidate's list does not hold


def compare_topk(
    ref: RefDistributions,
    lists: Sequence[TopK | None],
    next_tokens: np.ndarray,
    positions: np.ndarray,
    *,
    resolution: float = TAIL_RESOLUTION,
) -> TopKScores:
    """Score a server's lists (one a reference row; None: not asked) against the reference's compact rows
    (each its most likely tokens and a tail): `topk_kl` over the tokens both hold, top-1 exact, rows not
    asked left out and counted."""
    if len(lists) != len(ref):
        raise ValueError(f"{len(lists)} lists for {len(ref)} reference rows")
    kept = [i for i, top in enumerate(lists) if top is not None]
    kl = np.zeros(len(kept), dtype=np.float64)
    cand_top1 = np.zeros(len(kept), dtype=np.int32)
    cand_next = np.full(len(kept), np.nan, dtype=np.float32)
    ref_tail, cand_tail = np.zeros(len(kept)), np.zeros(len(kept))
    for j, i in enumerate(kept):
        top = lists[i]
        assert top is not None
        start, end = int(ref.offsets[i]), int(ref.offsets[i + 1])
        row = TopK(tuple(int(t) for t in ref.ids[start:end]), tuple(float(v) for v in ref.logprobs[start:end]))
        got = topk_kl(row, top, resolution=resolution)
        kl[j], ref_tail[j], cand_tail[j] = got.kl, got.ref_tail, got.cand_tail
        cand_top1[j] = top.top
        listed = top.logprob_of().get(int(next_tokens[i]))
        if listed is not None:
            cand_next[j] = listed
    index = np.array(kept, dtype=np.int64)
    scores = TokenScores(
        kl=kl,
        ref_top1=ref.top1[index].astype(np.int32),
        cand_top1=cand_top1,
        near_tie=ref.near_tie[index],
        ref_next_logprob=ref.next_logprob[index],
        cand_next_logprob=cand_next,
        next_tokens=np.asarray(next_tokens)[index].astype(np.int32),
        positions=np.asarray(positions)[index].astype(np.int32),
    )
    k = min((len(top.ids) for top in lists if top is not None), default=0)
    return TopKScores(scores, k, ref_tail, cand_tail, len(lists) - len(kept), int(np.isnan(cand_next).sum()))
