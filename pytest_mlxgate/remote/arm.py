"""A candidate arm served over HTTP, scored against the gate's reference arm computed in process.

Each sequence's scored positions are asked of the server teacher-forced (`teacher`), and its top-k lists
are scored against the reference's compact rows (`stats.topk.compare_topk`): per position a lower bound of
the full KL, top-1 exact. Positions follow the gate's path as the in-process arms score them: every
position on the prefill path, the last `decode` on the serving path (where a server's cache is read back,
every position asked of a server is one decode step). What the scores rest on (k, tail masses, positions
not askable, next tokens the lists do not hold, disagreeing "chosen" entries) comes with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..common.server_endpoint import Endpoint
from ..errors import ServerArmError
from ..stats.divergence import RefDistributions, compact_reference, compare
from ..stats.topk import TopKScores, compare_topk, served_reference
from .client import ServerClient
from .teacher import TeacherForced, teacher_forced

#: The share of a gate's positions that may be left unasked (their text does not encode back) before the arm
#: refuses to give a figure.
MAX_UNASKABLE = 0.1

__all__ = [
    "ServedArm",
    "ServedReference",
    "ServerScores",
    "ask_reference",
    "run_protocol_against",
    "run_server_against",
    "scored_positions",
]


@dataclass(frozen=True)
class ServedArm:
    """An arm of a run served over HTTP (`--mlx-cand-server`, `--mlx-ref-server`): where, and how many
    log-probabilities per position to ask for."""

    endpoint: Endpoint
    top_k: int = 11


@dataclass(frozen=True)
class ServerScores:
    """Every sequence's scores against one server, and what a record says they rest on."""

    sequences: tuple[TopKScores, ...]
    chosen_disagreed: int
    served: tuple[str, ...] | None = None  # the models it lists (None: it could not say)
    exact: bool = False  # whole distributions (the mlxgate protocol): the KL is the statistic itself

    @property
    def k(self) -> int:
        return min((s.k for s in self.sequences if s.k), default=0)

    @property
    def unaskable(self) -> int:
        return sum(s.unaskable for s in self.sequences)

    @property
    def next_unlisted(self) -> int:
        return sum(s.next_unlisted for s in self.sequences)

    def mean_tails(self) -> tuple[float, float]:
        """The mean mass outside the shared tokens over every scored position: the reference's, the server's."""
        ref = np.concatenate([s.ref_tail for s in self.sequences]) if self.sequences else np.zeros(0)
        cand = np.concatenate([s.cand_tail for s in self.sequences]) if self.sequences else np.zeros(0)
        return (float(ref.mean()) if ref.size else 0.0, float(cand.mean()) if cand.size else 0.0)


def scored_positions(tokens: int, path: str, decode: int) -> np.ndarray:
    """The positions the in-process arms score on `path`: all `tokens`, or the last `decode` when serving."""
    start = tokens - decode if path == "serving" else 0
    return np.arange(start, tokens, dtype=np.int32)


def run_protocol_against(
    client: ServerClient,
    sequences: Sequence[Sequence[int]],
    refs: Sequence[RefDistributions],
    positions: np.ndarray,
    *,
    vocab_size: int,
    tick: Callable[[int], None] | None = None,
) -> ServerScores:
    """Each sequence's whole distributions at `positions` by the mlxgate protocol (`remote.protocol`), one
    request a sequence, scored by `compare` exactly as an in-process arm is: the same statistic, no bound."""
    out = []
    for ids, ref in zip(sequences, refs, strict=True):
        tokens = list(ids[:-1])  # the last id is only predicted
        rows = client.logprobs_at(tokens, [int(p) for p in positions], top_k=None, vocab_size=vocab_size)
        logits = np.array([row.logprobs for row in rows], dtype=np.float32)
        next_tokens = np.asarray([ids[p + 1] for p in positions], dtype=np.int32)
        scores = compare(ref, logits, next_tokens, positions)
        n = len(positions)
        out.append(TopKScores(scores, vocab_size, np.zeros(n), np.zeros(n), 0, 0))
        if tick is not None:
            tick(n)
    return ServerScores(tuple(out), 0, exact=True)


def run_server_against(
    client: ServerClient,
    sequences: Sequence[Sequence[int]],
    refs: Sequence[RefDistributions],
    positions: np.ndarray,
    *,
    top_k: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    text_decode: Callable[[Sequence[int]], str] | None = None,
    tick: Callable[[int], None] | None = None,
) -> ServerScores:
    """Each sequence (`tokens + 1` ids) asked of the server at `positions` and scored against its row set.
    ServerArmError where more than `MAX_UNASKABLE` of the positions cannot be asked: a figure over the few
    left would not be the gate's."""
    out, disagreed = [], 0
    for ids, ref in zip(sequences, refs, strict=True):
        next_tokens = np.asarray([ids[p + 1] for p in positions], dtype=np.int32)
        asked = _asked_after(client, ids, positions, top_k, encode, decode, text_decode)
        out.append(compare_topk(ref, asked.lists, next_tokens, positions))
        disagreed += asked.chosen_disagreed
        if tick is not None:
            tick(len(positions))
    scores = ServerScores(tuple(out), disagreed)
    total = len(positions) * len(sequences)
    if scores.unaskable > MAX_UNASKABLE * total:
        raise _unaskable(client, scores.unaskable, total)
    return scores


@dataclass(frozen=True)
class ServedReference:
    """The reference arm asked of a server: each sequence's rows at the gate's positions (`served_reference`)
    and which positions could be asked (a candidate's scores elsewhere are dropped, never read)."""

    refs: tuple[RefDistributions, ...]
    asked: tuple[np.ndarray, ...]
    chosen_disagreed: int
    k: int  # the fewest tokens a row gave (0: whole distributions, the protocol)
    exact: bool

    @property
    def unaskable(self) -> int:
        return sum(int((~a).sum()) for a in self.asked)

    def mean_tail(self) -> float:
        """The mean mass the server left outside its rows at the positions asked."""
        tails = [np.exp(r.tail_logmass[a].astype(np.float64)) for r, a in zip(self.refs, self.asked, strict=True)]
        joined = np.concatenate(tails) if tails else np.zeros(0)
        return float(joined.mean()) if joined.size else 0.0


def ask_reference(
    client: ServerClient,
    sequences: Sequence[Sequence[int]],
    positions: np.ndarray,
    *,
    top_k: int,
    vocab_size: int,
    protocol: bool,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    text_decode: Callable[[Sequence[int]], str] | None = None,
    tick: Callable[[int], None] | None = None,
) -> ServedReference:
    """Each sequence's reference rows at `positions`, asked of the server: whole distributions by the mlxgate
    protocol (`protocol`: the rows an in-process reference would give), else its top-k teacher-forced.
    ServerArmError where more than `MAX_UNASKABLE` of the positions cannot be asked."""
    refs, asked, disagreed, k = [], [], 0, top_k
    for ids in sequences:
        next_tokens = np.asarray([ids[p + 1] for p in positions], dtype=np.int32)
        if protocol:
            rows = client.logprobs_at(list(ids[:-1]), [int(p) for p in positions], top_k=None, vocab_size=vocab_size)
            logits = np.array([row.logprobs for row in rows], dtype=np.float32)
            refs.append(compact_reference(logits, next_tokens))
            asked.append(np.ones(len(positions), dtype=bool))
        else:
            got = _asked_after(client, ids, positions, top_k, encode, decode, text_decode)
            rows_of, mask = served_reference(got.lists, next_tokens, vocab_size)
            refs.append(rows_of)
            asked.append(mask)
            disagreed += got.chosen_disagreed
            k = min([k, *(len(top.ids) for top in got.lists if top is not None)])
        if tick is not None:
            tick(len(positions))
    found = ServedReference(tuple(refs), tuple(asked), disagreed, 0 if protocol else k, protocol)
    total = len(positions) * len(sequences)
    if found.unaskable > MAX_UNASKABLE * total:
        raise _unaskable(client, found.unaskable, total)
    return found


def _unaskable(client: ServerClient, unaskable: int, total: int) -> ServerArmError:
    return ServerArmError(
        f"server {client.endpoint.url}: {unaskable} of the gate's {total} positions cannot be asked: the "
        "text of their prompt encodes to other tokens, so a server reading text would score another sequence. "
        f"More than {MAX_UNASKABLE:.0%} left out is no measurement of the gate's prompts: serve the model by "
        "the mlxgate protocol (docs/server-protocol.md), which takes token ids, or use prompts that survive "
        "the round trip"
    )


def _asked_after(
    client: ServerClient,
    ids: Sequence[int],
    positions: np.ndarray,
    top_k: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    text_decode: Callable[[Sequence[int]], str] | None,
) -> TeacherForced:
    """The server's top-k after each of `positions` of `ids`, the sequence's own tokens fed in before it."""
    return teacher_forced(
        client, ids, [int(p) + 1 for p in positions], top_k=top_k, encode=encode, decode=decode, text_decode=text_decode
    )
