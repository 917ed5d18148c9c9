"""One streamed greedy completion, timed: what a server's speed is made of (`speed.served`).

Time to first token is from the request's start to the first chunk of generated text (the prompt's
prefill, the first decode step and HTTP both ways); the decode rate is the tokens after the first over the
time from the first chunk to the last. The end of every token is asked off (`logit_bias` against the
tokenizer's end tokens), so a trial decodes as many tokens as it asks for on both arms alike; the server's
own counts (`stream_options.include_usage`) are read where it gives them: the tokens it generated, the
prompt's tokens, and how many it took from its prompt cache (a prefill it did not compute is no prefill
timed). A stream that ends without its `[DONE]`, or gives no text at all, is an error, never a trial.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ServerArmError
from .client import ServerClient

__all__ = ["StreamTiming", "timed_completion"]

#: The logit bias that keeps a token from being generated (OpenAI's range ends at -100).
NEVER = -100.0


@dataclass(frozen=True)
class StreamTiming:
    """One streamed completion: seconds to the first generated text, seconds from it to the last, how many
    tokens came (the server's count, else the text chunks'), and the server's counts of the prompt."""

    first_s: float
    rest_s: float
    tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None

    @property
    def decode_rate(self) -> float:
        """Tokens a second after the first (`rest_s` over the tokens after the first)."""
        return (self.tokens - 1) / self.rest_s if self.tokens > 1 and self.rest_s > 0 else float("nan")


def timed_completion(client: ServerClient, prompt: str, *, max_tokens: int, never: Iterable[int] = ()) -> StreamTiming:
    """`prompt` continued greedily for `max_tokens`, streamed and timed; `never`: token ids biased off (the
    end tokens). ServerArmError where the stream is cut, empty or not the server-sent events it should be."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    bias = {str(int(t)): NEVER for t in never}
    if bias:
        body["logit_bias"] = bias
    where = f"server {client.endpoint.url} (POST /v1/completions, streamed)"
    started = time.perf_counter()
    first = last = None
    chunks, done = 0, False
    usage: Mapping[str, Any] = {}
    for line in client.stream_lines("completions", body):
        if not line.startswith("data:"):
            continue  # a blank line between events, or a comment (mlx_lm.server's keepalive during prefill)
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise ServerArmError(f"{where}: an event that is not JSON: {data[:120]!r}") from None
        if not isinstance(event, Mapping):
            raise ServerArmError(f"{where}: an event that is not a JSON object: {data[:120]!r}")
        if isinstance(event.get("usage"), Mapping):
            usage = event["usage"]
        choices = event.get("choices")
        text = (
            choices[0].get("text")
            if isinstance(choices, list) and choices and isinstance(choices[0], Mapping)
            else None
        )
        if isinstance(text, str) and text:
            now = time.perf_counter()
            first = now if first is None else first
            last, chunks = now, chunks + 1
    if not done:
        raise ServerArmError(f"{where}: the stream ended without its [DONE] after {chunks} chunks of text: cut off")
    if first is None or last is None:
        raise ServerArmError(f"{where}: the stream gave no text at all (asked for {max_tokens} tokens)")
    tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return StreamTiming(
        first_s=first - started,
        rest_s=last - first,
        tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else chunks,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        cached_tokens=_count(cached),
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
