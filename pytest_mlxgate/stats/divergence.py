"""Per-token vocabulary math: compact reference distributions, and the candidate's KL against them.

numpy, not MLX: on MLX's CPU backend elementwise exp/logsumexp over a (T, vocab) array is ~25x
slower. Rows are worked in blocks through reused buffers (the logits are read about twice), and
chunks of rows run on a few threads (numpy drops the GIL in its loops and sorts).

The reference keeps, per position, a set S of its most probable tokens (their log-probs) and the
log of the mass outside S (the tail). KL is taken between both distributions coarsened to S's
tokens plus one tail bin: a lower bound of the exact KL (data-processing inequality) that equals it
when the tail is empty. Both arms go through the same float32 code, so identical logits give 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .row_blocks import block_buffers, blocks_of, map_rows

__all__ = [
    "INITIAL_TAU",
    "LOG_FLOOR",
    "MAX_KEEP",
    "MIN_KEEP",
    "TAIL_MASS_TARGET",
    "RefDistributions",
    "TokenScores",
    "compact_reference",
    "compare",
    "dtype_resolution",
    "exact_kl",
    "first_nonfinite_row",
]

# Measured on the embedded model (`./dev bench kl_gate`): real next-token distributions are
# heavy-tailed; holding 99.9% of the mass takes ~1,200-1,700 ids per position (3.4 MB per
# 256-token sequence on disk), 99% takes ~60-70 (150 KB) and biases the mean KL low by ~2%,
# far inside the gates' margins (8-bit KV: 4e-4 vs a 2e-3 limit).
#: Every token within this many nats of the row's top token is kept...
INITIAL_TAU = 4.0
#: ...and at least this many tokens per row (so a top-2 always exists)...
MIN_KEEP = 8
#: ...and rows whose tail still holds more than this probability mass are widened...
TAIL_MASS_TARGET = 1e-2
#: ...up to this many tokens.
MAX_KEEP = 1024
#: A candidate log-prob below this (float32's smallest normal) counts as this, unless the reference's
#: own is lower: a candidate that zeroes a token the reference gives mass to gets a large, finite KL.
LOG_FLOOR = float(np.log(np.finfo(np.float32).tiny))

# Widening ladder (nats below the top) for rows whose INITIAL_TAU set leaves too much tail: fine
# rungs, so a widened row rarely drags in many more tokens than it needs.
_WIDER_TAUS = tuple(INITIAL_TAU * 1.25**j for j in range(1, 11))  # 12.5 ... 93
_THR0 = np.float32(math.exp(-INITIAL_TAU))
_WIDER_THRS = tuple(np.float32(math.exp(-tau)) for tau in _WIDER_TAUS)
# A row with more than MAX_KEEP candidates guesses the threshold of its top MAX_KEEP from every
# _SUBSAMPLE-th entry, _SIGMAS standard deviations on the safe side (it sorts ~20% extra).
_SUBSAMPLE = 16
_SIGMAS = 3.5

_EPSILON = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}


@dataclass(frozen=True)
class RefDistributions:
    """One sequence's reference distributions, compact enough to cache (CSR rows)."""

    offsets: np.ndarray  # (T+1,) int64 row starts into ids/logprobs
    ids: np.ndarray  # (nnz,) int32, each row sorted by logprob descending
    logprobs: np.ndarray  # (nnz,) float32, log-softmax over the FULL vocabulary
    tail_logmass: np.ndarray  # (T,) float32 log of mass outside the row's set (-inf if none)
    next_logprob: np.ndarray  # (T,) float32 log p_ref(next token of the text)
    near_tie: np.ndarray  # (T,) bool: top1-top2 logit gap below the logits' dtype resolution
    vocab_size: int

    def __len__(self) -> int:
        return int(self.tail_logmass.shape[0])

    @property
    def top1(self) -> np.ndarray:
        """(T,) int32: each row's most probable token (the first of equal maxima, like argmax)."""
        out: np.ndarray = self.ids[self.offsets[:-1]]
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays for `np.savez` (no pickles)."""
        return {
            "offsets": self.offsets,
            "ids": self.ids,
            "logprobs": self.logprobs,
            "tail_logmass": self.tail_logmass,
            "next_logprob": self.next_logprob,
            "near_tie": self.near_tie,
            "vocab_size": np.asarray(self.vocab_size, dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> RefDistributions:
        """Rebuild from `to_arrays` output (e.g. an npz from disk); ValueError if anything is off."""
        try:
            vocab = np.asarray(arrays["vocab_size"])
            offsets = _typed(arrays["offsets"], "offsets", np.int64, "i")
            ids = _typed(arrays["ids"], "ids", np.int32, "i")
            logprobs = _typed(arrays["logprobs"], "logprobs", np.float32, "f")
            tail = _typed(arrays["tail_logmass"], "tail_logmass", np.float32, "f")
            next_lp = _typed(arrays["next_logprob"], "next_logprob", np.float32, "f")
            near_tie = _typed(arrays["near_tie"], "near_tie", np.bool_, "b")
        except KeyError as e:
            raise ValueError(f"reference arrays lack {e.args[0]!r}") from None
        if vocab.shape != () or vocab.dtype.kind not in "iu" or int(vocab) < 1:
            raise ValueError(f"vocab_size must be a positive integer scalar, got {vocab!r}")
        v = int(vocab)
        t = offsets.shape[0] - 1
        if t < 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 1):
            raise ValueError("offsets must start at 0 and give every row at least one token")
        if offsets[-1] != ids.shape[0] or ids.shape != logprobs.shape:
            raise ValueError(
                f"offsets end at {offsets[-1]} but there are {ids.shape[0]} ids and {logprobs.shape[0]} logprobs"
            )
        for name, a in (("tail_logmass", tail), ("next_logprob", next_lp), ("near_tie", near_tie)):
            if a.shape != (t,):
                raise ValueError(f"{name} has shape {a.shape}, expected ({t},)")
        if ids.size and (ids.min() < 0 or ids.max() >= v):
            raise ValueError(f"token ids outside the vocabulary [0, {v})")
        if np.isnan(logprobs).any() or np.isnan(tail).any() or np.isnan(next_lp).any():
            raise ValueError("NaN in reference log-probabilities")
        if (logprobs > 0).any() or (tail > 0).any():
            raise ValueError("reference log-probabilities above 0")
        return cls(offsets, ids, logprobs, tail, next_lp, near_tie, v)


@dataclass(frozen=True)
class TokenScores:
    """Per-token comparison of one sequence (what the statistics are computed from)."""

    kl: np.ndarray  # (T,) float64 >= 0
    ref_top1: np.ndarray  # (T,) int32
    cand_top1: np.ndarray  # (T,) int32
    near_tie: np.ndarray  # (T,) bool
    ref_next_logprob: np.ndarray  # (T,) float32
    cand_next_logprob: np.ndarray  # (T,) float32
    next_tokens: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32 position in the sequence of each scored distribution

    def __len__(self) -> int:
        return int(self.kl.shape[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays for `np.savez`."""
        return {name: getattr(self, name) for name, _, _ in _SCORE_FIELDS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> TokenScores:
        """Rebuild from `to_arrays` output; ValueError if a field is missing or mis-shaped."""
        try:
            fields = {name: _typed(arrays[name], name, dtype, kind) for name, dtype, kind in _SCORE_FIELDS}
        except KeyError as e:
            raise ValueError(f"score arrays lack {e.args[0]!r}") from None
        t = fields["kl"].shape[0]
        for name, a in fields.items():
            if a.shape != (t,):
                raise ValueError(f"{name} has shape {a.shape}, expected ({t},)")
        if np.isnan(fields["kl"]).any() or (fields["kl"] < 0).any():
            raise ValueError("KL values must be >= 0")
        return cls(**fields)


_SCORE_FIELDS: tuple[tuple[str, type[np.generic], str], ...] = (
    ("kl", np.float64, "f"),
    ("ref_top1", np.int32, "i"),
    ("cand_top1", np.int32, "i"),
    ("near_tie", np.bool_, "b"),
    ("ref_next_logprob", np.float32, "f"),
    ("cand_next_logprob", np.float32, "f"),
    ("next_tokens", np.int32, "i"),
    ("positions", np.int32, "i"),
)


def dtype_resolution(dtype_name: str) -> float:
    """Machine epsilon of the logits' native dtype ('bfloat16', 'mlx.core.float16', ...).

    Unknown names get float32's: the arms were cast to float32 before they reached us.
    """
    return _EPSILON.get(str(dtype_name).rsplit(".", 1)[-1].lower(), _EPSILON["float32"])


def first_nonfinite_row(logits: np.ndarray) -> int | None:
    """The first row holding NaN or +inf, or only -inf; None if every row is usable.

    One pass: NaN and +inf both show in the row max, and -inf entries (masked tokens) are legal.
    """
    x = np.asarray(logits)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"logits must be (T, vocab), got shape {x.shape}")
    bad = np.flatnonzero(~np.isfinite(x.max(axis=1)))
    return int(bad[0]) if bad.size else None


def compact_reference(
    logits: np.ndarray, next_tokens: np.ndarray, *, logits_dtype: str = "float32"
) -> RefDistributions:
    """Compact one sequence's reference logits (T, V) into the sets, tails and facts `compare` needs.

    `logits_dtype` is the model's native logits dtype (before the cast to float32): it decides
    which top-2 gaps are too small for the arms to order reliably (`near_tie`).
    """
    x = _as_logits(logits)
    t, v = x.shape
    nxt = _as_tokens(next_tokens, t, v, "next_tokens")
    _, m = _row_max(x)
    ids, counts, logprobs, tail_log, next_lp = _joined(map_rows(lambda r0, r1: _compact_rows(x, m, nxt, r0, r1), t, v))
    offsets = np.zeros(t + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return RefDistributions(
        offsets=offsets,
        ids=ids,
        logprobs=logprobs,
        tail_logmass=tail_log,
        next_logprob=next_lp,
        near_tie=_near_tie(x, ids, offsets, logits_dtype),
        vocab_size=v,
    )


def compare(ref: RefDistributions, logits: np.ndarray, next_tokens: np.ndarray, positions: np.ndarray) -> TokenScores:
    """Score the candidate's logits (T, V) against the reference, token by token."""
    x = _as_logits(logits)
    t, v = x.shape
    if (t, v) != (len(ref), ref.vocab_size):
        raise ValueError(
            f"candidate logits {x.shape} do not match the reference ({len(ref)} positions, vocabulary {ref.vocab_size})"
        )
    nxt = _as_tokens(next_tokens, t, v, "next_tokens")
    pos = np.asarray(positions)
    if pos.shape != (t,) or (pos.size and pos.dtype.kind not in "iu"):
        raise ValueError(f"positions must be ({t},) integers, got {pos.dtype} {pos.shape}")
    top, m = _row_max(x)
    kl = np.empty(t, dtype=np.float64)
    next_lp = np.empty(t, dtype=np.float32)
    map_rows(lambda r0, r1: _compare_rows(ref, x, m, nxt, r0, r1, kl, next_lp), t, v)
    return TokenScores(
        kl=kl,
        ref_top1=ref.top1.astype(np.int32, copy=False),
        cand_top1=top.astype(np.int32),
        near_tie=ref.near_tie,
        ref_next_logprob=ref.next_logprob,
        cand_next_logprob=next_lp,
        next_tokens=nxt.astype(np.int32, copy=False),
        positions=pos.astype(np.int32, copy=False),
    )


def exact_kl(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """Full-vocabulary KL(ref || cand) per row, in float64: the yardstick for the compaction's error."""
    a = np.asarray(ref_logits, dtype=np.float64)
    b = np.asarray(cand_logits, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"logits shapes differ or are not (T, vocab): {a.shape} vs {b.shape}")
    lp, lq = _log_softmax64(a), _log_softmax64(b)
    with np.errstate(invalid="ignore"):
        terms = np.where(lp > -np.inf, np.exp(lp) * (lp - lq), 0.0)
    out: np.ndarray = np.maximum(terms.sum(axis=1), 0.0)
    return out


# --- the shared float32 pipeline (both arms run exactly this, so identical logits give 0) --------
# Every step is per row: a row's results do not depend on how rows are grouped into blocks/chunks.


def _row_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """argmax (first of equal maxima) and its value per row; ValueError on an unusable row."""
    top = np.argmax(x, axis=1)
    m = x[np.arange(x.shape[0]), top]
    if not np.isfinite(m).all():
        row = int(np.flatnonzero(~np.isfinite(m))[0])
        raise ValueError(f"row {row} of the logits is NaN, +inf or all -inf (see first_nonfinite_row)")
    return top, m


def _exp_block(xb: np.ndarray, mb: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """exp(x - rowmax) for a block of rows, in `buf` (each row's max entry is exactly 1)."""
    e = buf[: xb.shape[0]]
    np.subtract(xb, mb[:, None], out=e)
    np.exp(e, out=e)
    return e


def _project_block(e: np.ndarray, flat: np.ndarray, sel_out: np.ndarray, tail_out: np.ndarray) -> None:
    """Gather the set's exp values, then sum what is left: the tail without 1 - sum cancellation."""
    flat_e = e.reshape(-1)
    np.take(flat_e, flat, out=sel_out)
    flat_e[flat] = 0.0
    e.sum(axis=1, out=tail_out)


def _finish(
    z_sel: np.ndarray, counts: np.ndarray, sel_e: np.ndarray, tail: np.ndarray, z_next: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-vocabulary log-probs of the sets, the tails and the next tokens, for consecutive rows.

    `z_sel`/`z_next` are x - rowmax (float32); `sel_e` the set's exp values, `tail` the rest's sum.
    Sums are per row on float64 copies (no buffered casts), so a row's result never depends on
    which other rows were computed with it.
    """
    starts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    total = np.add.reduceat(sel_e.astype(np.float64), starts) + tail
    log_total = np.log(total)
    logprobs = (z_sel - np.repeat(log_total, counts)).astype(np.float32)
    with np.errstate(divide="ignore"):
        tail_log = (np.log(tail.astype(np.float64)) - log_total).astype(np.float32)
    next_lp = (z_next - log_total).astype(np.float32)
    return logprobs, tail_log, next_lp


def _compare_rows(
    ref: RefDistributions,
    x: np.ndarray,
    m: np.ndarray,
    nxt: np.ndarray,
    r0: int,
    r1: int,
    kl_out: np.ndarray,
    next_out: np.ndarray,
) -> None:
    """The candidate's side of rows r0..r1: its mass on the reference's sets, then the KL."""
    v = x.shape[1]
    lo, hi = int(ref.offsets[r0]), int(ref.offsets[r1])
    counts = np.diff(ref.offsets[r0 : r1 + 1])
    ids = ref.ids[lo:hi]
    flat = np.repeat(np.arange(r0, r1, dtype=np.int64) * v, counts) + ids
    sel_e = np.empty(hi - lo, dtype=np.float32)
    tail = np.empty(r1 - r0, dtype=np.float32)
    buf = block_buffers(v)[0]
    for b0, b1 in blocks_of(r0, r1, v):
        e = _exp_block(x[b0:b1], m[b0:b1], buf)
        s0, s1 = int(ref.offsets[b0]) - lo, int(ref.offsets[b1]) - lo
        _project_block(e, flat[s0:s1] - b0 * v, sel_e[s0:s1], tail[b0 - r0 : b1 - r0])
    xf = x.reshape(-1)
    z_sel = np.take(xf, flat) - np.repeat(m[r0:r1], counts)
    z_next = np.take(xf, np.arange(r0, r1) * v + nxt[r0:r1]) - m[r0:r1]
    lq, tq, next_lp = _finish(z_sel, counts, sel_e, tail, z_next)
    kl = _coarse_kl(ref.logprobs[lo:hi], lq, counts, ref.tail_logmass[r0:r1], tq)
    kl_out[r0:r1] = kl
    next_out[r0:r1] = next_lp


def _coarse_kl(
    ref_lp: np.ndarray, cand_lp: np.ndarray, counts: np.ndarray, ref_tail: np.ndarray, cand_tail: np.ndarray
) -> np.ndarray:
    """KL(ref || cand) over each row's set plus its tail bin, float64, clipped at 0."""
    lp = ref_lp.astype(np.float64)
    lq = cand_lp.astype(np.float64)
    np.maximum(lq, np.minimum(lp, LOG_FLOOR), out=lq)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both arms have no mass; zeroed below
        np.subtract(lp, lq, out=lq)
        np.multiply(p, lq, out=p)
    if np.isneginf(ref_lp).any():  # p = 0 there, and 0 * -inf would be NaN
        p[np.isneginf(ref_lp)] = 0.0
    starts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    kl = np.add.reduceat(p, starts)
    tp = ref_tail.astype(np.float64)
    tq = np.maximum(cand_tail.astype(np.float64), np.minimum(tp, LOG_FLOOR))
    with np.errstate(invalid="ignore"):
        kl += np.where(tp > -np.inf, np.exp(tp) * (tp - tq), 0.0)
    out: np.ndarray = np.maximum(kl, 0.0)
    return out


# --- choosing each reference row's set ------------------------------------------------------------


_Parts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _compact_rows(x: np.ndarray, m: np.ndarray, nxt: np.ndarray, r0: int, r1: int) -> _Parts:
    """Rows r0..r1 of the reference: (ids, counts, logprobs, tail_logmass, next_logprob)."""
    v = x.shape[1]
    buf, mask, scratch = block_buffers(v)
    parts: list[_Parts] = []
    for b0, b1 in blocks_of(r0, r1, v):
        n = b1 - b0
        e = _exp_block(x[b0:b1], m[b0:b1], buf)
        ids, z_sel, counts = _select_block(e, x[b0:b1], m[b0:b1], mask[:n], scratch)
        sel_e = np.empty(ids.shape[0], dtype=np.float32)
        tail = np.empty(n, dtype=np.float32)
        _project_block(e, np.repeat(np.arange(n, dtype=np.int64) * v, counts) + ids, sel_e, tail)
        z_next = x[np.arange(b0, b1), nxt[b0:b1]] - m[b0:b1]
        parts.append((ids, counts, *_finish(z_sel, counts, sel_e, tail, z_next)))
    return _joined(parts)


def _joined(parts: list[_Parts]) -> _Parts:
    if len(parts) == 1:
        return parts[0]
    if not parts:  # no rows
        f32 = np.empty(0, np.float32)
        return np.empty(0, np.int32), np.empty(0, np.int64), f32, f32, f32
    a, b, c, d, e = (np.concatenate([p[i] for p in parts]) for i in range(5))
    return a, b, c, d, e


def _select_block(
    e: np.ndarray, xb: np.ndarray, mb: np.ndarray, mask: np.ndarray, scratch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sets of a block of rows: int32 ids (each row by logit descending, equal logits by id, so
    the argmax comes first), their x - max (float32), and each row's count.

    Per row: all tokens within INITIAL_TAU nats of the top, at least MIN_KEEP, more while the tail
    holds over TAIL_MASS_TARGET, at most MAX_KEEP. `e` is exp(x - max) for the block; each row
    ends up as one threshold on e, so the block needs one extraction (then each row one sort).
    """
    n, v = e.shape
    need = min(MIN_KEEP, v)
    totals = e.sum(axis=1)
    goal = totals.astype(np.float64) * (1.0 - TAIL_MASS_TARGET)  # the mass a set must hold
    mk = np.greater_equal(e, _THR0, out=mask)
    n_tau = np.array([np.count_nonzero(row) for row in mk], dtype=np.int64)
    capped = n_tau >= MAX_KEEP
    thr = np.full(n, _THR0, dtype=np.float32)
    if capped.any():
        mk[capped] = False  # their INITIAL_TAU sets are too big to list; they take the top MAX_KEEP
    flat = np.flatnonzero(mk)
    inside = np.bincount(flat // v, weights=np.take(e.reshape(-1), flat), minlength=n)
    widened = ~capped & ((n_tau < need) | (inside < goal))
    for r in np.flatnonzero(widened):
        thr[r], capped[r] = _widen(e[r], float(goal[r]), need, scratch)
    if capped.any():
        tight = _tightened(e, capped, thr)
        flat, counts = _extract(e, tight, mask)
        short = capped & (counts < MAX_KEEP)
        if short.any():  # the subsample's guess kept too few: those rows use their own threshold
            flat, counts = _extract(e, np.where(short, thr, tight), mask)
    elif widened.any():
        flat, counts = _extract(e, thr, mask)
    else:  # every row keeps its INITIAL_TAU set, already extracted
        counts = n_tau
    ids, d = _sorted_rows(flat, counts, xb, mb)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    pos = np.arange(ids.shape[0]) - np.repeat(starts, counts)
    k = np.where(capped, MAX_KEEP, n_tau)
    for w in np.flatnonzero(widened).tolist():  # the smallest prefix holding `goal`, on sorted candidates
        s0 = int(starts[w])
        cum = np.cumsum(e[w][ids[s0 : s0 + counts[w]]], dtype=np.float64)
        k_tail = int(np.searchsorted(cum, goal[w])) + 1
        k[w] = min(max(int(n_tau[w]), need, k_tail), MAX_KEEP)
    k = np.minimum(k, counts)
    keep = pos < np.repeat(k, counts)
    return ids[keep], -d[keep], k  # -(max - x) is exactly x - max in float32


def _widen(e: np.ndarray, goal: float, need: int, scratch: np.ndarray) -> tuple[np.float32, bool]:
    """A row's threshold on e once its INITIAL_TAU set falls short, and whether it caps at MAX_KEEP.

    Rungs of _WIDER_THRS until the set holds `goal` mass and `need` tokens, or reaches MAX_KEEP.
    Past the last rung (under `need` tokens within ~93 nats: the rest masked or vanishing) the row
    takes everything, which the caller trims to its top `need`.
    """
    for thr in _WIDER_THRS:
        n = int(np.count_nonzero(e >= thr))
        if n >= MAX_KEEP:
            return thr, True
        # The mass at or above thr, cheaply: sum(max(e, thr)) counts thr once for each entry below.
        inside = float(np.maximum(e, thr, out=scratch).sum()) - float(thr) * (e.shape[0] - n)
        if n >= need and inside >= goal:
            return thr, False
    return np.float32(0.0), False


def _tightened(e: np.ndarray, capped: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """Thresholds with each capped row's raised to keep a little over MAX_KEEP (never lowered).

    The guess comes from every _SUBSAMPLE-th entry, _SIGMAS sigma past the expected rank; the caller
    checks that it kept at least MAX_KEEP.
    """
    c = np.flatnonzero(capped)
    sub = e[c, ::_SUBSAMPLE]
    width = sub.shape[1]
    expected = MAX_KEEP / _SUBSAMPLE
    j = int(expected + _SIGMAS * math.sqrt(expected)) + 1
    out = thr.copy()
    if j < width:
        theta = np.partition(sub, width - j, axis=1)[:, width - j]
        out[c] = np.maximum(theta, thr[c])
    return out


def _extract(e: np.ndarray, thr: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block-flat indices of e >= each row's threshold, and each row's count."""
    np.greater_equal(e, thr[:, None], out=mask)
    flat = np.flatnonzero(mask)
    bounds = np.searchsorted(flat, np.arange(e.shape[0] + 1) * e.shape[1])
    return flat, np.diff(bounds)


def _sorted_rows(flat: np.ndarray, counts: np.ndarray, xb: np.ndarray, mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's candidates ordered by logit descending, equal logits by id: int32 ids, max - x.

    A float32's bits, sign-folded, sort like its value, so one uint64 sort per row of
    (~folded logit << id_bits | id) gives exact logit order with ties by id (the argmax first).
    """
    n, v = xb.shape
    id_bits = max(1, (v - 1).bit_length())
    if 32 + id_bits > 64:
        raise ValueError(f"a vocabulary of {v} does not fit a 64-bit sort key")
    xs = np.take(xb.reshape(-1), flat)
    xs += np.float32(0.0)  # -0.0 -> +0.0: equal logits must tie
    bits = xs.view(np.uint32)
    folded = np.where(bits >> np.uint32(31), bits, ~bits & np.uint32(0x7FFFFFFF))  # ~(monotone bits)
    keys = folded.astype(np.uint64)
    keys <<= np.uint64(id_bits)
    rowl = np.repeat(np.arange(n, dtype=np.int64), counts)
    rowl *= v
    np.subtract(flat, rowl, out=rowl)  # the token ids
    keys |= rowl.view(np.uint64)
    end = 0
    for c in counts.tolist():
        keys[end : end + c].sort()
        end += c
    ids_sorted = (keys & np.uint64((1 << id_bits) - 1)).astype(np.int32)
    keys >>= np.uint64(id_bits)
    folded = keys.astype(np.uint32)
    bits = np.where(folded >> np.uint32(31), folded, ~folded & np.uint32(0x7FFFFFFF))  # its own inverse
    return ids_sorted, np.repeat(mb, counts) - bits.view(np.float32)


def _near_tie(x: np.ndarray, ids: np.ndarray, offsets: np.ndarray, dtype_name: str) -> np.ndarray:
    """top1 - top2 raw logit gap within 2 ulp of the native dtype: the arms may order them either way."""
    t = x.shape[0]
    starts = offsets[:-1]
    has_two = np.diff(offsets) >= 2
    second = np.where(has_two, starts + 1, starts)
    r = np.arange(t)
    l1 = x[r, ids[starts]].astype(np.float64)
    l2 = x[r, ids[second]].astype(np.float64)
    eps = dtype_resolution(dtype_name)
    out: np.ndarray = has_two & ((l1 - l2) <= 2.0 * eps * np.maximum(1.0, np.abs(l1)))
    return out


# --- blocks and threads -------------------------------------------------------------------------------


# --- input checks and float64 helpers ---------------------------------------------------------------


def _as_logits(logits: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(logits, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"logits must be a (T, vocab) array with a vocabulary, got shape {x.shape}")
    return x


def _as_tokens(tokens: np.ndarray, t: int, v: int, name: str) -> np.ndarray:
    a = np.asarray(tokens)
    if a.shape != (t,) or a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be ({t},) integers, got {a.dtype} {a.shape}")
    if t and (a.min() < 0 or a.max() >= v):
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {v})")
    return a.astype(np.int64, copy=False)


def _typed(value: np.ndarray, name: str, dtype: type[np.generic], kind: str) -> np.ndarray:
    """A 1-D array of `dtype`, accepting only arrays of the same kind (no float ids, no int masks)."""
    a = np.asarray(value)
    kinds = "iu" if kind == "i" else kind
    if a.ndim != 1 or (a.size and a.dtype.kind not in kinds):
        raise ValueError(f"{name} must be a 1-D {np.dtype(dtype).name} array, got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


def _log_softmax64(a: np.ndarray) -> np.ndarray:
    m = a.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        out: np.ndarray = a - m - np.log(np.exp(a - m).sum(axis=1, keepdims=True))
    return out
