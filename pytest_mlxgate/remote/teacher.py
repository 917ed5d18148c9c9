"""A server's distributions at given positions of fixed token sequences: teacher-forced by growing prompts.

A gate scores fixed token ids; a server only says what it would generate next. So position t of a sequence
is asked as the prompt `decode(ids[:t])` with one token to generate: the server's first generated position
is position t, its top-k list is the distribution there. mlx_lm.server's prompt cache holds the shared
prefix, so each longer prompt costs about one more token. A prompt the local tokenizer does not encode back
to exactly `ids[:t]` would ask the server about other tokens: such a position is never asked and never
silently dropped, it is counted (`TeacherForced.unaskable`) and the server's own count of the prompt's tokens
is checked against `t` at every position asked (`ServerArmError` where a server encodes otherwise: another
tokenizer than the local one).

Positions are asked longest prompt first. mlx_lm.server 0.32 caches each prompt with the token it generated;
asked shortest first, the next prompt is often exactly such an entry (the model's greedy token is the text's
next token), the prompt left to compute is empty, and the server's generation thread dies ("Sequence N has
an empty prompt"; every later request fails). Longest first, each prompt is a strict prefix of what is
cached: the server trims its cache to it and computes the last token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ServerArmError
from ..stats.topk import TopK
from .client import ServerClient

__all__ = ["TeacherForced", "teacher_forced"]


@dataclass(frozen=True)
class TeacherForced:
    """One sequence's asked positions and the server's top-k at each (None: not askable, counted)."""

    positions: tuple[int, ...]  # t: the distribution predicts ids[t] from ids[:t]
    lists: tuple[TopK | None, ...]
    chosen_disagreed: int  # positions whose reported "chosen" entry was not the head of its own list

    @property
    def unaskable(self) -> int:
        return sum(1 for top in self.lists if top is None)


def teacher_forced(
    client: ServerClient,
    ids: Sequence[int],
    positions: Sequence[int],
    *,
    top_k: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    text_decode: Callable[[Sequence[int]], str] | None = None,
) -> TeacherForced:
    """The server's top-`top_k` at each of `positions` (each >= 1) of the token sequence `ids`. `decode` makes
    each prompt's text (special tokens kept, so they encode back); `text_decode` (default: `decode`) reads
    what the server generated (its text has them stripped)."""
    found: dict[int, TopK | None] = {}
    disagreed = 0
    for t in sorted(set(positions), reverse=True):  # the longest prompt first (the module's docstring)
        if not 1 <= t < len(ids) + 1:
            raise ValueError(f"position {t} outside 1..{len(ids)}")
        prompt = decode(list(ids[:t]))
        if encode(prompt) != list(ids[:t]):
            found[t] = None  # its text encodes to other tokens: asking would score another sequence
            continue
        got = client.complete(prompt, max_tokens=1, top_k=top_k, decode=text_decode or decode)
        if got.prompt_tokens is not None and got.prompt_tokens != t:
            raise ServerArmError(
                f"server {client.endpoint.url}: a prompt of {t} tokens here is {got.prompt_tokens} tokens there "
                f"(first at position {t}: {prompt[-60:]!r}): it encodes with another tokenizer than the local one; "
                "serve the same model snapshot as the gate's other arm"
            )
        if not got.positions:
            raise ServerArmError(f"server {client.endpoint.url}: generated nothing at position {t} (max_tokens=1)")
        found[t] = got.positions[0]
        disagreed += got.chosen_disagreed
    return TeacherForced(tuple(positions), tuple(found[t] for t in positions), disagreed)
