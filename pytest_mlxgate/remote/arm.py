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
from ..stats.divergence import RefDistributions, compare
from ..stats.topk import TopKScores, compare_topk
from .client import ServerClient
from .teacher import teacher_forced

#: The share of a gate's positions that may be left unasked (their text does not encode back) before the arm
#: refuses to give a figure.
MAX_UNASKABLE = 0.1

__all__ = ["ServerCandidate", "ServerScores", "run_protocol_against", "run_server_against", "scored_positions"]


@dataclass(frozen=True)
class ServerCandidate:
    """The candidate arm of a run served over HTTP (`--mlx-cand-server`): where, and how many log-probabilities
    per position to ask for."""

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

    def facts(self, server: ServerCandidate) -> dict[str, object]:
        """The record's `server` part (`results.record_server`): where, and what the KL rests on."""
        ref_tail, cand_tail = self.mean_tails()
        return {
            "url": server.endpoint.url,
            "top_k": server.top_k,
            "k": self.k,
            "bound": "exact" if self.exact else "lower",
            "asked": sum(len(s.scores) + s.unaskable for s in self.sequences),
            "unaskable": self.unaskable,
            "next_unlisted": self.next_unlisted,
            "chosen_disagreed": self.chosen_disagreed,
            "ref_tail": round(ref_tail, 6),
            "cand_tail": round(cand_tail, 6),
            "served": list(self.served) if self.served is not None else None,
            "max_kl": max((float(s.scores.kl.max()) for s in self.sequences if len(s.scores)), default=0.0),
        }

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
        asked = teacher_forced(
            client,
            ids,
            [int(p) + 1 for p in positions],
            top_k=top_k,
            encode=encode,
            decode=decode,
            text_decode=text_decode,
        )
        out.append(compare_topk(ref, asked.lists, next_tokens, positions))
        disagreed += asked.chosen_disagreed
        if tick is not None:
            tick(len(positions))
    scores = ServerScores(tuple(out), disagreed)
    total = len(positions) * len(sequences)
    if scores.unaskable > MAX_UNASKABLE * total:
        raise ServerArmError(
            f"server {client.endpoint.url}: {scores.unaskable} of the gate's {total} positions cannot be asked: the "
            "text of their prompt encodes to other tokens, so a server reading text would score another sequence. "
            f"More than {MAX_UNASKABLE:.0%} left out is no measurement of the gate's prompts: serve the model by "
            "the mlxgate protocol (docs/server-protocol.md), which takes token ids, or use prompts that survive "
            "the round trip"
        )
    return scores
