"""The mlxgate log-probability protocol: teacher-forced log-probabilities at given token ids, over HTTP.

An OpenAI-style server only says what it would generate next, from a prompt given as text: a gate asks
one position per request, through a tokenizer round trip, and gets the top k (at most 11 on mlx_lm.server),
so its KL is a lower bound. A server that implements this protocol answers for given token ids at given
positions, in one request, with the whole distribution or its top k: the server arm's KL is then the
same statistic as in process. `docs/server-protocol.md` is the specification; `reference_server` the
reference implementation the tests run; `conformance` the check a server's author runs.

    GET  /v1/mlxgate                 -> {"protocol": 1, "model": ID, "vocab_size": V, "max_top_k": K | null}
    POST /v1/mlxgate/logprobs  {"tokens": [ids], "positions": [p, ...], "top_k": k | null}
                                     -> {"model": ID, "rows": [{"position": p, "ids": [...] | null,
                                                                "logprobs": [...]}, ...]}

Row p is the distribution of the token after `tokens[p]`, given `tokens[: p + 1]` (what a gate scores at
position p). `top_k` null: `ids` null and `logprobs` the whole vocabulary's, in id order; else the k most
likely, most likely first. This module holds the shapes and their checks only (standard library).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..stats.topk import finite_number

__all__ = ["INFO_ROUTE", "LOGPROBS_ROUTE", "PROTOCOL", "ProtocolError", "Row", "parse_info", "parse_rows"]

PROTOCOL = 1
INFO_ROUTE = "mlxgate"
LOGPROBS_ROUTE = "mlxgate/logprobs"
#: How far a whole row's mass may be from 1 (float32 rounding over a large vocabulary).
MASS_TOLERANCE = 1e-3


class ProtocolError(ValueError):
    """An answer that is not what the protocol says: the message names the field and the position."""


@dataclass(frozen=True)
class Row:
    """One position's answer: the whole distribution (`ids` None, `logprobs` over the vocabulary in id
    order) or its top k (`ids` and `logprobs`, most likely first)."""

    position: int
    ids: tuple[int, ...] | None
    logprobs: tuple[float, ...]


def parse_info(doc: Any) -> dict[str, Any]:
    """`GET /v1/mlxgate`'s answer, checked: protocol, model, vocabulary size, the largest top_k (None: any)."""
    if not isinstance(doc, Mapping) or doc.get("protocol") != PROTOCOL:
        raise ProtocolError(f"GET /v1/{INFO_ROUTE}: protocol {_get(doc, 'protocol')!r}, this mlxgate speaks {PROTOCOL}")
    vocab, model, top = doc.get("vocab_size"), doc.get("model"), doc.get("max_top_k")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise ProtocolError(f"GET /v1/{INFO_ROUTE}: vocab_size {vocab!r} is not a whole number >= 1")
    if not isinstance(model, str) or not model:
        raise ProtocolError(f"GET /v1/{INFO_ROUTE}: model {model!r} is not text")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 1):
        raise ProtocolError(f"GET /v1/{INFO_ROUTE}: max_top_k {top!r} is neither null nor a whole number >= 1")
    return {"protocol": PROTOCOL, "model": model, "vocab_size": vocab, "max_top_k": top}


def parse_rows(doc: Any, *, positions: Sequence[int], top_k: int | None, vocab_size: int) -> list[Row]:
    """A logprobs answer, checked against what was asked: one row per position, in order; each a
    distribution (finite log-probabilities at most 0; a whole row's mass 1, a top k's at most 1), a top k
    sorted most likely first with unique ids inside the vocabulary."""
    rows = doc.get("rows") if isinstance(doc, Mapping) else None
    if not isinstance(rows, list) or len(rows) != len(positions):
        got = len(rows) if isinstance(rows, list) else rows
        raise ProtocolError(f"POST /v1/{LOGPROBS_ROUTE}: {got!r} rows for {len(positions)} positions asked")
    out = []
    for asked, row in zip(positions, rows, strict=True):
        where = f"POST /v1/{LOGPROBS_ROUTE}, position {asked}"
        if not isinstance(row, Mapping) or row.get("position") != asked:
            raise ProtocolError(f"{where}: the row answers position {_get(row, 'position')!r}")
        logprobs, ids = row.get("logprobs"), row.get("ids")
        if not isinstance(logprobs, list) or not all(finite_number(v) and v <= 1e-6 for v in logprobs):
            raise ProtocolError(f"{where}: logprobs are not finite numbers at most 0")
        mass = math.fsum(math.exp(v) for v in logprobs)
        if top_k is None:
            if ids is not None or len(logprobs) != vocab_size:
                raise ProtocolError(
                    f"{where}: a whole row (top_k null) has ids null and {vocab_size} logprobs; got "
                    f"{'ids and ' if ids is not None else ''}{len(logprobs)}"
                )
            if abs(mass - 1.0) > MASS_TOLERANCE:
                raise ProtocolError(f"{where}: the whole row's probabilities add up to {mass:.6f}, not 1")
            out.append(Row(asked, None, tuple(float(v) for v in logprobs)))
            continue
        if not isinstance(ids, list) or len(ids) != len(logprobs) or len(ids) != min(top_k, vocab_size):
            raise ProtocolError(f"{where}: {top_k} ids and logprobs asked, got {_len(ids)} and {len(logprobs)}")
        if not all(_whole(t) and 0 <= t < vocab_size for t in ids) or len(set(ids)) != len(ids):  # vocab < 2**31
            raise ProtocolError(f"{where}: ids are not unique token ids inside the vocabulary ({vocab_size})")
        if any(a < b for a, b in zip(logprobs, logprobs[1:], strict=False)):
            raise ProtocolError(f"{where}: the top {top_k} are not sorted most likely first")
        if mass > 1.0 + MASS_TOLERANCE:
            raise ProtocolError(f"{where}: the top {top_k}'s probabilities add up to {mass:.6f}, more than 1")
        out.append(Row(asked, tuple(int(t) for t in ids), tuple(float(v) for v in logprobs)))
    return out


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _get(doc: object, key: str) -> object:
    return doc.get(key) if isinstance(doc, Mapping) else None


def _len(x: object) -> object:
    return len(x) if isinstance(x, list) else x
