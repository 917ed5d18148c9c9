"""Asking a server for greedy continuations and their top-k log-probabilities, and checking what it says.

What a server returns is checked, never believed. mlx_lm.server (0.32) is the first case: with
`top_logprobs > 0`, the entry each position reports as the chosen token is the first of an unsorted
argpartition, not the token generated ("The capital of France is" → " Paris.", while the first entry says
" the" at -2.72 beside " Paris" at -0.26). So the token scored at each position is the head of its own list,
sorted here (a greedy token is the top of its distribution), and the text the server returned must be what
those tokens spell (`reconcile`): a position where the list's head is not what the text continues with is
an error naming it. How many positions' "chosen" entries disagreed is kept, for the record to say.

Faults end in a ServerArmError naming the server (never its key), the request and what to do: the server
down, HTTP errors (429 and 5xx are retried a few times, honouring Retry-After), a timeout, JSON that is
malformed or truncated, fewer top-k than asked, a redirect (never followed: it could carry the key away).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..common.redact import redact
from ..common.server_endpoint import Endpoint
from ..errors import ServerArmError
from ..stats.topk import TopK, TopKError
from .protocol import INFO_ROUTE, LOGPROBS_ROUTE, ProtocolError, Row, parse_info, parse_rows

__all__ = ["MAX_TOP_LOGPROBS", "Completion", "ServerClient", "reconcile"]

#: mlx_lm.server's bound on `top_logprobs` (OpenAI's is 20).
MAX_TOP_LOGPROBS = 11
RETRIED = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Completion:
    """One greedy continuation as a server gave it, checked: the tokens generated and each one's top-k."""

    text: str
    tokens: tuple[int, ...]
    positions: tuple[TopK, ...]
    chosen_disagreed: int  # positions whose reported "chosen" entry was not the token generated
    model: str | None  # the model the response says answered
    prompt_tokens: int | None  # the server's count of the prompt's tokens


class ServerClient:
    """httpx to one server: no redirects followed, the key on its own origin only, bounded retries."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float = 120.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.retries = retries
        self._http = httpx.Client(timeout=timeout, follow_redirects=False, transport=transport)

    def close(self) -> None:
        self._http.close()

    def served_models(self) -> list[str]:
        """The ids `/v1/models` lists."""
        doc = self._call("GET", "models", None)
        data = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(data, list):
            raise self._error("GET /v1/models", "answered no model list ('data')")
        return [str(m.get("id")) for m in data if isinstance(m, Mapping)]

    def protocol_info(self) -> dict[str, Any] | None:
        """What the server says of the mlxgate log-probability protocol (`remote.protocol`); None where it
        does not speak it (404)."""
        doc = self._call("GET", INFO_ROUTE, None, missing_ok=True)
        if doc is None:
            return None
        try:
            return parse_info(doc)
        except ProtocolError as e:
            raise self._error(f"GET /v1/{INFO_ROUTE}", str(e)) from None

    def logprobs_at(
        self, tokens: Sequence[int], positions: Sequence[int], *, top_k: int | None, vocab_size: int
    ) -> list[Row]:
        """The protocol's rows at `positions` of `tokens` (top_k None: whole distributions), checked."""
        body = {"tokens": list(tokens), "positions": list(positions), "top_k": top_k}
        doc = self._call("POST", LOGPROBS_ROUTE, body)
        try:
            return parse_rows(doc, positions=positions, top_k=top_k, vocab_size=vocab_size)
        except ProtocolError as e:
            raise ServerArmError(self.endpoint.scrub(f"server {self.endpoint.url}: {e}")) from None

    def complete(
        self, prompt: str, *, max_tokens: int, top_k: int, decode: Callable[[Sequence[int]], str]
    ) -> Completion:
        """The greedy continuation of `prompt` (`max_tokens` at most) with each position's top `top_k`,
        reconciled with the text through the local tokenizer's `decode`. Every error's message is scrubbed
        of the server's key (a server may echo anything back)."""
        try:
            return self._complete(prompt, max_tokens=max_tokens, top_k=top_k, decode=decode)
        except ServerArmError as e:
            raise ServerArmError(self.endpoint.scrub(str(e))) from None

    def _complete(
        self, prompt: str, *, max_tokens: int, top_k: int, decode: Callable[[Sequence[int]], str]
    ) -> Completion:
        if not 1 <= top_k <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_k {top_k} outside 1..{MAX_TOP_LOGPROBS}")
        body = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": top_k,
        }
        doc = self._call("POST", "completions", body)
        what = "POST /v1/completions"
        choices = doc.get("choices") if isinstance(doc, Mapping) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise self._error(what, "answered no choices")
        choice = choices[0]
        text = choice.get("text")
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
        if not isinstance(text, str) or not isinstance(content, list):
            raise self._error(what, "answered no text or no logprobs.content: does it support logprobs?")
        lists, chosen = [], []
        for i, entry in enumerate(content):
            where = f"{self.endpoint.url}, generated position {i}"
            top = entry.get("top_logprobs") if isinstance(entry, Mapping) else None
            if not isinstance(top, list):
                raise ServerArmError(f"{where}: no top_logprobs list (asked for {top_k})")
            if len(top) < top_k:
                raise ServerArmError(
                    f"{where}: {len(top)} top log-probabilities where {top_k} were asked: the server cut them; "
                    "ask for fewer (top_k) or fix the server"
                )
            try:
                lists.append(
                    TopK.read(((e.get("id"), e.get("logprob")) for e in top if isinstance(e, Mapping)), where=where)
                )
            except TopKError as e:
                raise ServerArmError(str(e)) from None
            chosen.append(entry.get("id"))
        tokens = reconcile(text, lists, decode, where=self.endpoint.url)
        usage = doc.get("usage") if isinstance(doc.get("usage"), Mapping) else {}
        prompt_tokens = usage.get("prompt_tokens")
        return Completion(
            text=text,
            tokens=tokens,
            positions=tuple(lists),
            chosen_disagreed=sum(1 for c, t in zip(chosen, tokens, strict=True) if c != t),
            model=doc.get("model") if isinstance(doc.get("model"), str) else None,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
        )

    def generate(self, prompt: str, *, max_tokens: int) -> tuple[str, int | None]:
        """The greedy continuation of `prompt` (`max_tokens` at most, the server's own end): its text and the
        server's count of the prompt's tokens (None where it gives none)."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        doc = self._call("POST", "completions", body)
        choices = doc.get("choices") if isinstance(doc, Mapping) else None
        text = (
            choices[0].get("text")
            if isinstance(choices, list) and choices and isinstance(choices[0], Mapping)
            else None
        )
        if not isinstance(text, str):
            raise self._error("POST /v1/completions", "answered no text (choices[0].text)")
        usage = doc.get("usage") if isinstance(doc.get("usage"), Mapping) else {}
        count = usage.get("prompt_tokens")
        return text, count if isinstance(count, int) and not isinstance(count, bool) else None

    def stream_lines(self, route: str, body: Mapping[str, Any]) -> Iterator[str]:
        """The lines of a streamed POST (server-sent events), as they arrive; the request's faults as `_call`'s
        (no retry: a stream half read cannot be asked again unseen), a stall or a cut connection mid-stream an
        error naming the server. Every message scrubbed of the key."""
        url, what = self.endpoint.api(route), f"POST /v1/{route} (streamed)"
        try:
            with self._http.stream("POST", url, json=body, headers=self.endpoint.headers_for(url)) as response:
                if 300 <= response.status_code < 400:
                    raise self._error(what, f"redirected ({response.status_code}): not followed; give the final URL")
                if response.status_code >= 400:
                    response.read()
                    raise self._error(what, f"answered HTTP {response.status_code}: {_snippet(response.text)}")
                yield from response.iter_lines()
        except httpx.TimeoutException:
            raise self._error(what, f"stalled: nothing within {self._http.timeout.read} s") from None
        except httpx.TransportError as e:
            raise self._error(what, f"cut off or unreachable ({type(e).__name__}: {e})") from None
        except httpx.HTTPError as e:
            raise self._error(what, f"could not be asked ({type(e).__name__}: {e})") from None

    # -- one request, its faults -----------------------------------------------------------------------

    def _call(self, method: str, route: str, body: Mapping[str, Any] | None, *, missing_ok: bool = False) -> Any:
        url = self.endpoint.api(route)
        what = f"{method} /v1/{route}"
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, url, json=body, headers=self.endpoint.headers_for(url))
            except httpx.TimeoutException:
                raise self._error(what, f"did not answer within {self._http.timeout.read} s") from None
            except httpx.TransportError as e:
                raise self._error(
                    what, f"cannot be reached ({type(e).__name__}: {e}): is it running, and on that port?"
                ) from None
            except httpx.HTTPError as e:  # an answer httpx cannot decode, a URL it cannot use
                raise self._error(what, f"could not be asked ({type(e).__name__}: {e})") from None
            if response.status_code in RETRIED and attempt < self.retries:
                time.sleep(_retry_after(response, attempt))
                continue
            if 300 <= response.status_code < 400:
                raise self._error(
                    what,
                    f"redirected ({response.status_code}) to {response.headers.get('location', '?')}: not followed "
                    "(a key must not leave the server's origin); give the final URL",
                )
            if missing_ok and response.status_code == 404:
                return None
            if response.status_code >= 400:
                raise self._error(what, f"answered HTTP {response.status_code}: {_snippet(response.text)}")
            try:
                return json.loads(response.text)
            except ValueError as e:
                raise self._error(what, f"answered what is not JSON ({e}): {_snippet(response.text)}") from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _error(self, what: str, why: str) -> ServerArmError:
        return ServerArmError(self.endpoint.scrub(f"server {self.endpoint.url} ({what}) {why}"))


def reconcile(
    text: str, lists: Sequence[TopK], decode: Callable[[Sequence[int]], str], *, where: str
) -> tuple[int, ...]:
    """The tokens generated: each position's most likely token (greedy), checked to spell `text` (a leading
    space the server's detokenizer dropped aside). ServerArmError naming the first position where the head of
    the list is not what the text continues with: that server's lists and text cannot both be true."""
    tokens = tuple(top.top for top in lists)
    spelled = decode(list(tokens))
    if spelled == text or spelled.lstrip() == text.lstrip():
        return tokens
    for i in range(len(tokens)):
        prefix = decode(list(tokens[: i + 1]))
        if not text.lstrip().startswith(prefix.lstrip()):
            raise ServerArmError(
                f"{where}: at generated position {i} the most likely token {tokens[i]} ({decode([tokens[i]])!r}, "
                f"log-probability {lists[i].logprobs[0]:.4g}) is not what the returned text continues with "
                f"({text!r}): a greedy continuation's text and lists disagree (is the server sampling?)"
            )
    raise ServerArmError(
        f"{where}: the returned text {text!r} is not what its {len(tokens)} tokens spell ({spelled!r})"
    )


def _retry_after(response: httpx.Response, attempt: int) -> float:
    """The server's Retry-After in seconds (at most 10), else a doubling backoff from 0.5 s (at most 5)."""
    backoff = min(0.5 * 2.0**attempt, 5.0)
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), 10.0) if value is not None else backoff
    except ValueError:
        return backoff


def _snippet(text: str) -> str:
    """A response body as an error quotes it: one line, 200 characters, secrets redacted."""
    text = redact(" ".join(text.split()))
    return text[:200] + ("…" if len(text) > 200 else "")
