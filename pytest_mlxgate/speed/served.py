"""Speed between two served arms (`--mlx-ref-server` and `--mlx-cand-server`): time to first token and
decode tokens/s from streamed completions (`remote.stream`), paired and interleaved as the in-process trials
are (`speed.measure`: warm-up, ABBA pairs until decided, the sequential looks' intervals).

Both arms of a pair get the same prompt, and every trial a prompt of its own (a number first, so no server's
prompt cache holds any of it: a cached prefill is no prefill timed, and a trial whose server says it took
more than half the prompt from its cache is an error). Concurrency is a context of its own: at the shortest
context, `requests` completions at once, the decode rate the sum of theirs (what the server serves at that
load), time to first token their median. A speed ratio between a server and an arm in process would time
HTTP against a function call: both arms must be served, or neither.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ServerArmError
from ..remote.client import ServerClient
from ..remote.stream import StreamTiming, timed_completion
from .measure import pair_order, pairs_until_decided
from .result import ContextSpeed, SpeedResult, Trial
from .shape import SpeedShape

if TYPE_CHECKING:
    from ..common.watch import Watcher
    from ..remote.arm import ServedArm

__all__ = ["CONCURRENT_REQUESTS", "ServedSpeed", "measure_served_speed"]

#: The load the concurrent context puts on each server: requests in flight at once.
CONCURRENT_REQUESTS = 4
#: A trial whose server took more than this share of the prompt from its cache timed no prefill.
MAX_CACHED_SHARE = 0.5


@dataclass(frozen=True)
class ServedSpeed:
    """What a served speed measurement adds to its `SpeedResult`: the servers, the method, the concurrent
    context (None: not measured)."""

    reference: str
    candidate: str
    concurrent: ContextSpeed | None
    requests: int

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "method": "streamed /v1/completions: time to first token, decode tokens/s after it (end tokens biased off)",
            "concurrent": (
                {"requests": self.requests, **self.concurrent.to_json()} if self.concurrent is not None else None
            ),
        }


def measure_served_speed(
    *,
    reference: ServedArm,
    candidate: ServedArm,
    prompt: Callable[[int, int], str],
    shape: SpeedShape,
    never: Sequence[int] = (),
    requests: int = CONCURRENT_REQUESTS,
    say: Callable[[str], None] | None = None,
    watch: Watcher | None = None,
) -> tuple[SpeedResult, ServedSpeed]:
    """Both servers at every context of `shape` (one request at a time), then at the shortest with `requests`
    at once. `prompt(context, k)`: the text of about `context` tokens for trial `k`, unlike every other
    trial's from its first token; `never`: the end tokens, biased off so each trial decodes `shape.decode`."""
    clients = {"reference": ServerClient(reference.endpoint), "candidate": ServerClient(candidate.endpoint)}
    started = time.perf_counter()
    counter = iter(range(1_000_000))
    alone = watch.timing_alone("speed trials") if watch is not None else contextlib.nullcontext(0.0)

    def trial(side: str, context: int, k: int, load: int) -> Trial:
        def one(j: int) -> StreamTiming:
            return timed_completion(
                clients[side], prompt(context, k * load + j), max_tokens=shape.decode + 1, never=never
            )

        if load == 1:
            timings = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=load) as pool:
                timings = list(pool.map(one, range(load)))
        return _trial(timings, context, shape.decode, clients[side].endpoint.url)

    def measured(context: int, load: int) -> ContextSpeed:
        for _ in range(shape.warmup):
            k = next(counter)
            for side in ("reference", "candidate"):
                trial(side, context, k, load)

        def pair(rep: int) -> dict[str, Trial]:
            k = next(counter)  # one prompt for both arms of the pair
            return {side: trial(side, context, k, load) for side in pair_order(rep)}

        return pairs_until_decided(shape, context, pair)

    try:
        with alone:
            contexts = {}
            for context in shape.contexts:
                contexts[context] = measured(context, 1)
                if say is not None:
                    say(f"speed at {context} tokens (served): {contexts[context].short_text()}")
            concurrent = measured(min(shape.contexts), requests) if requests > 1 else None
            if say is not None and concurrent is not None:
                say(f"speed at {concurrent.context} tokens, {requests} requests at once: {concurrent.short_text()}")
    finally:
        for client in clients.values():
            client.close()
    result = SpeedResult(
        shape=shape,
        contexts=contexts,
        memory_method="not measured (served over HTTP)",
        weights={},
        arms={"reference": "reference", "candidate": "candidate"},
        duration_s=time.perf_counter() - started,
    )
    return result, ServedSpeed(reference.endpoint.url, candidate.endpoint.url, concurrent, requests)


def _trial(timings: Sequence[StreamTiming], context: int, decode: int, url: str) -> Trial:
    """One trial from its completions: the median time to first token as the prefill, the decode time of
    `decode` tokens at the summed rate. ServerArmError where a completion decoded fewer than 2 tokens or its
    prompt came from the server's cache."""
    for t in timings:
        if t.tokens < 2:
            raise ServerArmError(
                f"server {url}: a speed trial decoded {t.tokens} token(s) where {decode + 1} were asked: no decode "
                "rate to time (does it honour max_tokens and logit_bias?)"
            )
        if not t.rest_s > 0:
            raise ServerArmError(
                f"server {url}: a speed trial's {t.tokens} tokens came in one piece: a server that buffers its "
                "stream shows no decode rate (stream token by token)"
            )
        if t.cached_tokens is not None and t.cached_tokens > MAX_CACHED_SHARE * (t.prompt_tokens or context):
            raise ServerArmError(
                f"server {url}: {t.cached_tokens} of a speed trial's {t.prompt_tokens or context} prompt tokens came "
                "from its prompt cache: a prefill it did not compute is no prefill timed"
            )
    rate = sum(t.decode_rate for t in timings)
    return Trial(
        prefill_s=statistics.median(t.first_s for t in timings),
        decode_s=decode / rate,
        peak_bytes=None,
        kv_bytes=None,  # a server's cache is not seen over HTTP
    )
