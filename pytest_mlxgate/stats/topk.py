"""KL from what a server says: each position's top-k log-probabilities, and a sound bound for the rest.

A server (mlx_lm.server, any OpenAI-compatible endpoint) gives at most its top-k tokens' log-probabilities
per generated position, not the whole distribution. The tokens both sides give are bins of their own; the
server's mass outside its list is spread over the rest as favourably to it as the facts allow (a token its
top k leaves out has at most its k-th probability, and together no more than the mass it left unlisted),
and the least KL over every such spread is taken (`topk_kl`). Grouping never raises KL (the data-processing
inequality) and the true spread is one of those considered, so the figure is a *lower bound* of the full
KL(reference || candidate): a fail on it is sound; a pass rests on the top-k, so its k and tail masses travel
with it. Top-1 agreement is exact: each side's most likely token is at the head of its list.

The lists are checked, never believed (`TopK.read`): ids unique whole numbers, log-probabilities finite and
at most 0, their mass at most 1; and sorted here (mlx_lm.server sends an unsorted argpartition). The rounding
of a server's log-probabilities is room given to it (`MASS_SLACK`): more room only lowers the bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from .divergence import RefDistributions, TokenScores, dtype_resolution

__all__ = [
    "MASS_SLACK",
    "CoarseKL",
    "TopK",
    "TopKError",
    "TopKScores",
    "compare_topk",
    "finite_number",
    "kept_scores",
    "served_reference",
    "topk_kl",
]

#: A reference tail this small is the float64 rounding of 1 - (the listed mass): no mass at all.
FLOAT_NOISE = 1e-12
#: How far past 1 a list's mass may add up (float32 rounding of each entry) before it is no distribution; also
#: the room given to the candidate's mass outside its list (a larger room only lowers the bound).
MASS_SLACK = 1e-4


#: Token ids are int32 in every array here.
MAX_TOKEN_ID = 2**31


def finite_number(x: object) -> bool:
    """A finite real number (an integer too large for a float is not one)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _short(x: object) -> str:
    """`repr(x)`, cut to 40 characters: a server's value quoted in a message."""
    text = repr(x)
    return text if len(text) <= 40 else text[:39] + "…"


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
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < MAX_TOKEN_ID:
                raise TopKError(f"{where}: token id {_short(token)} is not a whole number in [0, 2**31)")
            if not finite_number(logprob):
                raise TopKError(f"{where}: token {token}'s log-probability {_short(logprob)} is not a finite number")
            value = float(logprob)  # type: ignore[arg-type]  # a finite int or float (`_finite`)
            if value > MASS_SLACK:
                raise TopKError(f"{where}: token {token}'s log-probability {value} is above 0 (a probability > 1)")
            ids.append(token)
            logprobs.append(min(value, 0.0))
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


def topk_kl(reference: TopK | np.ndarray, candidate: TopK | np.ndarray, *, slack: float = MASS_SLACK) -> CoarseKL:
    """A lower bound of KL(reference || candidate) at one position. Either side is a `TopK` (a server's) or a
    full row of log-probabilities over the vocabulary (an arm in process).

    The tokens both sides give are bins of their own. The candidate's mass outside them (`q_out`, widened by
    `slack` for the rounding of a server's log-probabilities: more room only lowers the bound) is spread over
    the rest as favourably to the candidate as the facts allow: a token the reference knows but the
    candidate's top k leaves out has at most the candidate's k-th probability (it is not in its top k), and
    whatever else the reference holds is one bin. The least KL over every such spread (water-filling, exact)
    is at most the KL of the true spread, which is at most the full KL (grouping never raises it)."""
    ids = _shared(reference, candidate)
    lp, lq = _logprobs_at(reference, ids), _logprobs_at(candidate, ids)
    p_shared = float(np.exp(lp).sum()) if len(lp) else 0.0
    q_shared = float(np.exp(lq).sum()) if len(lq) else 0.0
    q_out = min(1.0, max(0.0, 1.0 - q_shared) + 2 * slack)  # the candidate's mass outside the shared tokens
    capped = np.zeros(0)
    cap, tail = None, q_out
    if isinstance(candidate, TopK):
        capped = _known_outside(reference, ids)
        cap = candidate.logprobs[-1] + math.log1p(slack)  # log of the k-th probability, rounding allowed
        # what the candidate left unlisted: the most the reference's tokens outside its list can share
        tail = min(q_out, max(0.0, 1.0 - float(np.exp(np.array(candidate.logprobs)).sum())) + slack)
    p_capped = float(np.exp(capped).sum()) if len(capped) else 0.0
    p_rest = max(0.0, 1.0 - p_shared - p_capped)
    if p_rest <= FLOAT_NOISE:
        p_rest = 0.0  # the reference's remainder is rounding: no mass there
    live = lp > -np.inf
    kl = float(np.sum(np.exp(lp[live]) * (lp[live] - lq[live])))
    kl += _least(capped, p_rest, q_out, tail, cap)
    same_top = _top(reference) == _top(candidate)
    return CoarseKL(max(kl, 0.0), len(ids), p_rest + p_capped, max(q_out - 2 * slack, 0.0), same_top)


def _least(capped: np.ndarray, p_rest: float, q_out: float, tail: float, cap: float | None) -> float:
    """The least KL of the reference's mass outside the shared tokens (`capped`: log p of the tokens it knows
    there, each at most exp(cap) on the candidate's side; `p_rest` the rest) against the candidate's `q_out`,
    of which the candidate's own unlisted `tail` is all the capped tokens can have (its other listed tokens
    are in the reference's rest)."""
    capped = capped[capped > -np.inf]
    value, given = _spread(capped, p_rest, q_out, cap)
    if given <= tail or p_rest <= 0:
        return value
    # the capped tokens may hold no more than the tail: they share it, the rest keeps what is left
    alone, _ = _spread(capped, 0.0, tail, cap)
    return alone + p_rest * (math.log(p_rest) - math.log(max(q_out - tail, 1e-300)))


def _spread(capped: np.ndarray, p_rest: float, q_out: float, cap: float | None) -> tuple[float, float]:
    """min over q of sum_i p_i log(p_i / q_i) + p_rest log(p_rest / q_rest), with sum_i q_i + q_rest <= q_out
    (mass on tokens the reference does not hold is free), each q_i <= exp(cap): q_i = min(cap, lambda p_i),
    q_rest = lambda p_rest (KKT), lambda found on the sorted breakpoints. `capped` holds the log p_i. Returns
    the least KL and the mass the capped tokens get at it."""
    if not len(capped) and p_rest <= 0:
        return 0.0, 0.0
    if q_out <= 0:
        return math.inf, 0.0  # the candidate leaves no mass where the reference holds some
    if cap is None or not len(capped):
        return (p_rest * (math.log(p_rest) - math.log(q_out)) if p_rest > 0 else 0.0), 0.0
    lps = np.sort(capped)[::-1]  # bins reach their cap in order of p_i descending: at lambda = u / p_i
    ps = np.exp(lps)
    u = math.exp(cap)
    n = len(ps)
    uncapped = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]]) + p_rest  # mass of bins j.. not capped
    log_lambda = math.inf  # every bin at its cap with mass to spare: the rest goes to tokens it holds none of
    for j in range(n + 1):  # j: how many bins are at their cap
        room = q_out - j * u
        if room <= 0 or uncapped[j] <= 0:
            break
        lam = room / uncapped[j]
        high = u / ps[j] if j < n else math.inf
        if lam <= high:
            log_lambda = math.log(lam)
            break
    log_q = np.minimum(cap, log_lambda + lps)
    total = float(np.sum(ps * (lps - log_q)))
    if p_rest > 0:
        total += p_rest * (math.log(p_rest) - min(log_lambda + math.log(p_rest), math.log(q_out)))
    return total, float(np.exp(log_q).sum())


def _known_outside(reference: TopK | np.ndarray, shared: np.ndarray) -> np.ndarray:
    """The log-probabilities of the tokens the reference knows (its list, or its whole row) outside `shared`."""
    if isinstance(reference, TopK):
        inside = {int(t) for t in shared}
        return np.array([lp for t, lp in zip(reference.ids, reference.logprobs, strict=True) if t not in inside])
    row = np.asarray(reference, dtype=np.float64)
    mask = np.ones(len(row), dtype=bool)
    mask[shared] = False
    return row[mask]


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
    slack: float = MASS_SLACK,
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
        got = topk_kl(row, top, slack=slack)
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


def served_reference(
    lists: Sequence[TopK | None], next_tokens: np.ndarray, vocab_size: int
) -> tuple[RefDistributions, np.ndarray]:
    """A reference arm served over HTTP as the compact rows an in-process reference gives (`compare` scores a
    candidate against them exactly as against its own): each row a server's top-k, the rest one tail bin, so
    every KL scored against it is a lower bound (grouping never raises KL). A position not asked (None) gets
    a placeholder row and is False in the returned mask: its scores are dropped (`kept_scores`), never read.
    The next token's log-probability is NaN where the list lacks it (ln PPL is then not measured); near ties
    are read at float32's resolution (the strictest: a server's rounding may count a flip, never hide one)."""
    nxt = np.asarray(next_tokens, dtype=np.int32)
    if len(lists) != len(nxt):
        raise ValueError(f"{len(lists)} lists for {len(nxt)} next tokens")
    asked = np.array([top is not None for top in lists], dtype=bool)
    rows = [top if top is not None else TopK((int(n),), (0.0,)) for top, n in zip(lists, nxt, strict=True)]
    if any(max(top.ids) >= vocab_size for top in rows):
        raise ValueError(f"a listed token id is outside the vocabulary of {vocab_size}")
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(top.ids) for top in rows])
    ids = np.array([i for top in rows for i in top.ids], dtype=np.int32)
    logprobs = np.array([v for top in rows for v in top.logprobs], dtype=np.float32)
    listed = np.array([float(np.exp(np.array(top.logprobs, dtype=np.float64)).sum()) for top in rows])
    rest = 1.0 - listed
    with np.errstate(divide="ignore"):
        tail = np.where(rest > FLOAT_NOISE, np.log(np.maximum(rest, FLOAT_NOISE)), -np.inf).astype(np.float32)
    next_lp = np.array([top.logprob_of().get(int(n), np.nan) for top, n in zip(rows, nxt, strict=True)], np.float32)
    eps = dtype_resolution("float32")
    near = np.array(
        [len(t.ids) >= 2 and t.logprobs[0] - t.logprobs[1] <= 2.0 * eps * max(1.0, abs(t.logprobs[0])) for t in rows]
    )
    return RefDistributions(offsets, ids, logprobs, tail, next_lp, near, vocab_size), asked


def kept_scores(scores: TokenScores, keep: np.ndarray) -> TokenScores:
    """`scores` at the positions `keep` marks: what a served reference arm could be asked about."""
    return TokenScores(**{f.name: getattr(scores, f.name)[keep] for f in fields(scores)})
