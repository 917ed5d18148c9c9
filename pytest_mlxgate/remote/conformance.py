"""The conformance check of the mlxgate log-probability protocol: what a server's author runs against their
own server (`mlxgate server-check URL`) before a gate believes it.

Each check asks the server something whose answer the protocol fixes, and compares: the info and the
model listing; whole rows that are distributions; a top k that is the head of the whole row, sorted; the
same request twice answered alike; a position answered the same whatever tokens come after it (a
teacher-forced row may not look ahead: an off-by-one there shifts every figure a gate reads); positions
asked together answered as when asked one by one. Token ids are drawn from the vocabulary with a fixed
seed, so the check needs no tokenizer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ServerArmError
from .client import ServerClient
from .protocol import Row

__all__ = ["Check", "check_server"]

#: Log-probabilities two answers of one computation may differ by (float32 over a long reduction).
SAME = 1e-4
TOP_K = 5


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def check_server(client: ServerClient, *, length: int = 24, seed: int = 0) -> list[Check]:
    """Every check, in order; a check that cannot run because an earlier one failed is reported failed."""
    out: list[Check] = []

    def run(name: str, body: Callable[[], str]) -> bool:
        try:
            out.append(Check(name, True, body()))
        except (ServerArmError, AssertionError) as e:
            out.append(Check(name, False, str(e)))
            return False
        return True

    info: dict[str, object] = {}

    def read_info() -> str:
        got = client.protocol_info()
        if got is None:
            raise AssertionError(f"GET /v1/mlxgate answered 404: {client.endpoint.url} does not speak the protocol")
        info.update(got)
        return f"protocol {got['protocol']}, model {got['model']}, vocabulary {got['vocab_size']}"

    if not run("info", read_info):
        return out
    vocab = int(str(info["vocab_size"]))
    rng = random.Random(seed)
    tokens = [rng.randrange(vocab) for _ in range(length)]
    positions = [0, length // 2, length - 1]

    def listed() -> str:
        models = client.served_models()
        assert info["model"] in models, f"/v1/models lists {models}, not {info['model']}"
        return f"/v1/models lists {info['model']}"

    def whole() -> list[Row]:
        return client.logprobs_at(tokens, positions, top_k=None, vocab_size=vocab)

    run("models", listed)
    rows: list[Row] = []
    if not run("whole rows", lambda: _keep(rows, whole(), "rows of the whole vocabulary, each adding up to 1")):
        return out

    def top() -> str:
        tops = client.logprobs_at(tokens, positions, top_k=TOP_K, vocab_size=vocab)
        for full, head in zip(rows, tops, strict=True):
            ranked = sorted(range(vocab), key=lambda t: (-full.logprobs[t], t))[:TOP_K]
            assert head.ids is not None
            if set(head.ids) != set(ranked):
                raise AssertionError(f"position {full.position}: top {TOP_K} {head.ids}, the whole row's {ranked}")
            _close(head.logprobs, [full.logprobs[t] for t in head.ids], f"position {full.position}'s top {TOP_K}")
        return f"the top {TOP_K} is the head of the whole row, sorted"

    def again() -> str:
        for first, second in zip(rows, whole(), strict=True):
            _close(first.logprobs, second.logprobs, f"position {first.position} asked twice")
        return "the same request, the same answer"

    def causal() -> str:
        for full in rows:
            (prefix,) = client.logprobs_at(tokens[: full.position + 1], [full.position], top_k=None, vocab_size=vocab)
            _close(prefix.logprobs, full.logprobs, f"position {full.position} with and without the tokens after it")
        return "a row depends on the tokens up to its position, none after"

    def alone() -> str:
        for full in rows:
            (one,) = client.logprobs_at(tokens, [full.position], top_k=None, vocab_size=vocab)
            _close(one.logprobs, full.logprobs, f"position {full.position} asked alone and with others")
        return "positions asked together answered as one by one"

    run("top k", top)
    run("determinism", again)
    run("teacher forcing", causal)
    run("batching", alone)
    return out


def _keep(into: list[Row], rows: list[Row], detail: str) -> str:
    into.extend(rows)
    return detail


def _close(a: Sequence[float], b: Sequence[float], what: str) -> None:
    worst = max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)
    if not worst <= SAME or math.isnan(worst):
        raise AssertionError(f"{what}: log-probabilities differ by up to {worst:.3g} (> {SAME:g})")
