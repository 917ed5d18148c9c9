"""Faults of a server arm, each a clear ServerArmError (or usage error), never a completion believed: a real
HTTP server on loopback that answers what it is told to (500 and 429 with recovery and without, malformed
and truncated JSON, fewer top-k than asked, lists and text that disagree, a redirect, a stall, a server that
is down, a stream cut off or without its end), and the key: sent to the server's own origin alone, never in a
message."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from mlx_server import free_port

from pytest_mlxgate.common.server_endpoint import Endpoint
from pytest_mlxgate.errors import MlxgateUsageError, ServerArmError
from pytest_mlxgate.remote.client import ServerClient

VOCAB = {1: "A", 2: "B", 3: "C", 4: " D"}


def decode(ids: Any) -> str:
    return "".join(VOCAB[i] for i in ids)


def completion(text: str, lists: list[list[tuple[int, float]]], chosen: list[int] | None = None) -> dict[str, Any]:
    content = [
        {"id": (chosen or [top[0][0] for top in lists])[i], "top_logprobs": [{"id": t, "logprob": lp} for t, lp in top]}
        for i, top in enumerate(lists)
    ]
    return {"model": "m", "choices": [{"text": text, "logprobs": {"content": content}}], "usage": {"prompt_tokens": 3}}


GOOD = completion("AB", [[(2, -1.5), (1, -0.3)], [(2, -0.1), (3, -2.5)]], chosen=[2, 2])


@dataclass
class Script:
    """What the loopback server answers, in order (the last one repeats): (status, headers, body bytes)."""

    answers: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    seen: list[dict[str, str]] = field(default_factory=list)  # each request's headers
    bodies: list[bytes] = field(default_factory=list)  # and body
    stall: float = 0.0


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            script.seen.append(dict(self.headers))
            length = int(self.headers.get("content-length") or 0)
            script.bodies.append(self.rfile.read(length))
            if script.stall:
                threading.Event().wait(script.stall)
            status, headers, body = script.answers.pop(0) if len(script.answers) > 1 else script.answers[0]
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "content-length" not in headers:  # a script may claim more than it sends: a cut connection
                self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()


def _json(doc: Any, status: int = 200, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **headers}, json.dumps(doc).encode()


def _ask(url: str, **kw: Any) -> Any:
    client = ServerClient(Endpoint.parse(url, key_env=kw.pop("key_env", None)), **kw)
    try:
        return client.complete("p", max_tokens=2, top_k=2, decode=decode)
    finally:
        client.close()


def test_a_good_answer_is_read_and_its_disagreeing_chosen_entry_counted(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [_json(GOOD)]
    got = _ask(url)
    assert got.tokens == (1, 2) and got.text == "AB" and got.chosen_disagreed == 1  # position 0's entry said 2
    assert got.positions[0].ids == (1, 2) and got.model == "m" and got.prompt_tokens == 3


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_transient_status_is_retried_and_then_answered(server: tuple[str, Script], status: int) -> None:
    url, script = server
    script.answers = [_json({"error": "busy"}, status, **{"retry-after": "0"}), _json(GOOD)]
    assert _ask(url).tokens == (1, 2)
    assert len(script.seen) == 2


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_json({"error": "boom"}, 500), 'answered HTTP 500: {"error": "boom"}'),
        (_json({"error": "slow down"}, 429), "answered HTTP 429"),
        (_json({"error": "no"}, 404), "answered HTTP 404"),
        ((200, {}, b"<html>oops"), "answered what is not JSON"),
        ((200, {}, json.dumps(GOOD).encode()[:40]), "answered what is not JSON"),  # truncated
        (_json({"choices": []}), "answered no choices"),
        (_json({"choices": [{"text": "AB"}]}), "answered no text or no logprobs.content"),
        (_json(completion("AB", [[(1, -0.3)], [(2, -0.1)]])), "1 top log-probabilities where 2 were asked"),
        (_json(completion("AB", [[(1, -0.3), (1, -0.3)], [(2, -0.1), (3, -2)]])), "a token id appears twice"),
        (_json(completion("AB", [[(1, 0.5), (2, -3)], [(2, -0.1), (3, -2)]])), "above 0"),
        (_json(completion("AC", [[(1, -0.3), (2, -2)], [(2, -0.1), (3, -2.5)]])), "at generated position 1 the most"),
        (_json(completion("ABC", [[(1, -0.3), (2, -2)], [(2, -0.1), (3, -2.5)]])), "is not what its 2 tokens spell"),
        ((302, {"location": "http://elsewhere.example/v1/completions"}, b""), "redirected (302) to http://elsewhere"),
    ],
)
def test_a_fault_is_an_error_naming_the_server_and_what_it_did(
    server: tuple[str, Script], answer: tuple[int, dict[str, str], bytes], said: str
) -> None:
    url, script = server
    script.answers = [answer]
    with pytest.raises(ServerArmError) as e:
        _ask(url, retries=1)
    assert said in str(e.value) and url in str(e.value), str(e.value)


def test_a_server_that_is_down_or_stalls_is_an_error_in_bounded_time(server: tuple[str, Script]) -> None:
    with pytest.raises(ServerArmError, match="cannot be reached .* is it running, and on that port"):
        _ask(f"http://127.0.0.1:{free_port()}")
    url, script = server
    script.answers, script.stall = [_json(GOOD)], 2.0
    with pytest.raises(ServerArmError, match="did not answer within 0.3 s"):
        _ask(url, timeout=0.3)


def test_the_key_goes_to_the_server_s_origin_alone_and_into_no_message(
    server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, script = server
    monkeypatch.setenv("MY_SERVER_KEY", "sk-secret-4242")
    script.answers = [_json(GOOD)]
    _ask(url, key_env="MY_SERVER_KEY")
    assert script.seen[-1].get("Authorization") == "Bearer sk-secret-4242"
    endpoint = Endpoint.parse(url, key_env="MY_SERVER_KEY")
    assert endpoint.headers_for("http://elsewhere.example/v1/completions") == {}  # another origin: no key
    assert endpoint.headers_for(url.replace("127.0.0.1", "localhost")) == {}  # another host name, too
    script.answers = [(302, {"location": "http://elsewhere.example/x"}, b""), _json({"error": "sk-secret-4242"}, 500)]
    with pytest.raises(ServerArmError, match="redirected"):
        _ask(url, key_env="MY_SERVER_KEY", retries=0)
    assert len(script.seen) == 2  # the redirect was not followed
    script.answers = [_json({"error": "bad key sk-secret-4242", "auth": "Bearer sk-secret-4242"}, 401)]
    with pytest.raises(ServerArmError) as echoed:
        _ask(url, key_env="MY_SERVER_KEY", retries=0)
    assert "answered HTTP 401" in str(echoed.value) and "sk-secret-4242" not in str(echoed.value)
    monkeypatch.delenv("MY_SERVER_KEY")
    with pytest.raises(MlxgateUsageError, match=r"needs the key in \$MY_SERVER_KEY, which is not set"):
        _ask(url, key_env="MY_SERVER_KEY")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("http://user:hunter2@127.0.0.1:8080", "carries a user name or password"),
        ("ftp://127.0.0.1", "is not an http(s) URL with a host"),
        ("127.0.0.1:8080", "is not an http(s) URL with a host"),
        ("http://127.0.0.1:8080/v1?x=1", "has a query or fragment"),
    ],
)
def test_a_url_that_cannot_work_or_would_leak_is_refused_with_the_fix(text: str, said: str) -> None:
    with pytest.raises(MlxgateUsageError) as e:
        Endpoint.parse(text)
    assert said in str(e.value) and "hunter2" not in str(e.value)


def test_a_base_url_reads_the_same_with_or_without_v1() -> None:
    assert Endpoint.parse("http://127.0.0.1:8080/v1/").api("completions") == "http://127.0.0.1:8080/v1/completions"
    assert Endpoint.parse("https://h.example/proxy").api("models") == "https://h.example/proxy/v1/models"
    assert Endpoint.parse("http://h:80").origin == ("http", "h", 80) == Endpoint.parse("http://H").origin


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_json(completion("AB", [[(1, 10**400), (2, -3.0)], [(2, -0.1), (3, -2)]])), "is not a finite number"),
        (
            _json(completion("AB", [[(2**40, -0.3), (2, -3.0)], [(2, -0.1), (3, -2)]])),
            "not a whole number in [0, 2**31)",
        ),
    ],
)
def test_numbers_no_float_holds_are_refused_not_overflowed(
    server: tuple[str, Script], answer: tuple[int, dict[str, str], bytes], said: str
) -> None:
    url, script = server
    script.answers = [answer]
    with pytest.raises(ServerArmError) as e:
        _ask(url)
    assert said in str(e.value)


@pytest.mark.parametrize("text", ["http://127.0.0.1:abc", "http://[::1", "http://127.0.0.1:99999"])
def test_a_url_whose_port_or_host_cannot_be_read_is_a_usage_error(text: str) -> None:
    with pytest.raises(MlxgateUsageError, match="cannot be read .* give it as http://HOST:PORT"):
        Endpoint.parse(text)


def test_too_many_positions_that_cannot_be_asked_is_an_error_not_a_figure_over_the_rest(
    server: tuple[str, Script],
) -> None:
    """A tokenizer whose text does not encode back to the gate's ids: every position left unasked would leave
    a figure over nothing (or a few); more than a tenth is refused, naming the cause and the protocol."""
    import numpy as np

    from pytest_mlxgate.remote.arm import run_server_against
    from pytest_mlxgate.stats.divergence import compact_reference

    url, script = server
    script.answers = [_json({**completion("A", [[(1, -0.3), (2, -3.0)]]), "usage": {}})]
    ids = [1, 2, 1, 2, 1]
    logits = np.zeros((4, 5), dtype=np.float32)
    positions = np.arange(4, dtype=np.int32)
    ref = compact_reference(logits, np.array(ids[1:]))

    def merging(text: str) -> list[int]:
        return [9] if len(text) > 2 else [{"A": 1, "B": 2}[c] for c in text]  # longer texts encode otherwise

    with pytest.raises(ServerArmError, match=r"2 of the gate's 4 positions cannot be asked.*mlxgate protocol"):
        run_server_against(
            ServerClient(Endpoint.parse(url)), [ids], [ref], positions, top_k=2, encode=merging, decode=decode
        )


def test_server_check_with_its_key_unset_is_a_usage_error(
    server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_mlxgate.cli import main

    url, _ = server
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    assert main(["server-check", url, "--key-env", "NO_SUCH_KEY"]) == 2
    assert "needs the key in $NO_SUCH_KEY" in capsys.readouterr().err


def _events(*events: object, done: bool = True) -> bytes:
    lines = [": keepalive 10/48"]  # mlx_lm.server's comment during a long prefill: not an event
    lines += [f"data: {json.dumps(e) if not isinstance(e, str) else e}" for e in events]
    return ("\n\n".join(lines + (["data: [DONE]"] if done else [])) + "\n\n").encode()


def _chunk(text: str) -> dict[str, Any]:
    return {"choices": [{"text": text, "finish_reason": None}]}


USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 48, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 1}},
}
SSE = {"content-type": "text/event-stream"}


def _timed(url: str, **kw: Any) -> Any:
    from pytest_mlxgate.remote.stream import timed_completion

    client = ServerClient(Endpoint.parse(url), **kw)
    try:
        return timed_completion(client, "p", max_tokens=3, never=[2, 0])
    finally:
        client.close()


def test_a_stream_is_timed_with_the_server_s_own_counts_and_the_end_tokens_biased_off(
    server: tuple[str, Script],
) -> None:
    url, script = server
    script.answers = [(200, SSE, _events(_chunk("A"), _chunk(""), _chunk("B"), _chunk("C"), USAGE))]
    got = _timed(url)
    assert (got.tokens, got.prompt_tokens, got.cached_tokens) == (3, 48, 1)
    assert got.first_s > 0 and got.rest_s >= 0
    asked = json.loads(script.bodies[-1])
    assert asked["stream"] is True and asked["stream_options"] == {"include_usage": True}
    assert asked["logit_bias"] == {"2": -100.0, "0": -100.0} and asked["max_tokens"] == 3 and asked["temperature"] == 0
    script.answers = [(200, SSE, _events(_chunk("A"), _chunk("B")))]  # no usage: the chunks of text are counted
    assert _timed(url).tokens == 2


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((200, SSE, _events(_chunk("A"), _chunk("B"), done=False)), "ended without its [DONE] after 2 chunks"),
        ((200, {**SSE, "content-length": "4000"}, _events(_chunk("A"), done=False)), "cut off or unreachable"),
        ((200, SSE, _events("{not json", _chunk("A"))), "an event that is not JSON"),
        ((200, SSE, _events([1, 2])), "an event that is not a JSON object"),
        ((200, SSE, _events(USAGE)), "gave no text at all"),
        (_json({"error": "boom"}, 500), "answered HTTP 500"),
        ((307, {"location": "http://elsewhere.example/"}, b""), "redirected (307): not followed"),
    ],
)
def test_a_stream_that_is_cut_or_malformed_is_an_error_never_a_trial(
    server: tuple[str, Script], answer: tuple[int, dict[str, str], bytes], said: str
) -> None:
    url, script = server
    script.answers = [answer]
    with pytest.raises(ServerArmError) as e:
        _timed(url)
    assert said in str(e.value) and url in str(e.value), str(e.value)


def test_a_stream_that_stalls_is_an_error_in_bounded_time(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers, script.stall = [(200, SSE, _events(_chunk("A")))], 2.0
    with pytest.raises(ServerArmError, match="stalled: nothing within 0.3 s"):
        _timed(url, timeout=0.3)


class _Chars:
    """A tokenizer of one token a character: enough to count a prompt's tokens."""

    bos_token = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def _served(url: str, items: list[Any]) -> dict[str, str]:
    from types import SimpleNamespace

    from pytest_mlxgate.capability.served import served_outputs
    from pytest_mlxgate.remote.arm import ServedArm

    rendered = {it.id: f"Q{it.id}?" for it in items}
    task = SimpleNamespace(name="quiz")
    return served_outputs(task, items, rendered, ServedArm(Endpoint.parse(url)), _Chars(), budget=4)  # type: ignore[arg-type]


def test_a_served_capability_arm_checks_each_prompt_s_tokens_and_refuses_choice_items(
    server: tuple[str, Script],
) -> None:
    """The server's answer is taken where it counts the prompt as the local tokenizer does; a prompt it
    counts otherwise (another tokenizer, its own template) is an error naming the item; a task with choice
    items is refused before anything is asked, never scored on the rest."""
    from pytest_mlxgate.capability.base import Item

    url, script = server
    items = [Item(id="1", text="x"), Item(id="22", text="y")]
    script.answers = [_json({"choices": [{"text": " Paris"}], "usage": {"prompt_tokens": 3}})]
    script.answers.append(_json({"choices": [{"text": " Rome"}], "usage": {"prompt_tokens": 4}}))
    assert _served(url, items) == {"1": " Paris", "22": " Rome"}
    asked = json.loads(script.bodies[-1])
    assert asked == {"prompt": "Q22?", "max_tokens": 4, "temperature": 0.0}
    script.answers = [_json({"choices": [{"text": " Paris"}], "usage": {"prompt_tokens": 9}})]
    with pytest.raises(ServerArmError, match="item 1 of quiz is 3 prompt tokens here and 9 there"):
        _served(url, items)
    seen = len(script.bodies)
    with pytest.raises(ServerArmError, match="1 of its items are scored by the log-probabilities of given answers"):
        _served(url, [*items, Item(id="c", text="z", kind="choice", choices=(" A", " B"))])
    assert len(script.bodies) == seen  # nothing asked
    script.answers = [_json({"choices": []})]
    with pytest.raises(ServerArmError, match="answered no text"):
        _served(url, items)
