"""A served speed trial from its streamed completions (`speed.served._trial`): the prefill the median time to
first token, the decode time of the asked tokens at the summed rate (concurrent requests add up), and a
completion that cannot be a trial (under 2 tokens, a prefill from the server's cache) an error, never a time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import ServerArmError
from pytest_mlxgate.remote.stream import StreamTiming
from pytest_mlxgate.speed.served import _trial

timings = st.builds(
    StreamTiming,
    first_s=st.floats(0.01, 10.0),
    rest_s=st.floats(0.01, 10.0),
    tokens=st.integers(2, 64),
    prompt_tokens=st.none() | st.just(48),
    cached_tokens=st.none() | st.integers(0, 24),
)


@settings(max_examples=80, deadline=None)
@given(ts=st.lists(timings, min_size=1, max_size=4), decode=st.integers(1, 32))
def test_a_trial_is_the_median_first_token_and_the_summed_decode_rate(ts: list[StreamTiming], decode: int) -> None:
    got = _trial(ts, 48, decode, "http://127.0.0.1:1")
    rates = [(t.tokens - 1) / t.rest_s for t in ts]
    assert got.decode_s == pytest.approx(decode / sum(rates))
    assert min(t.first_s for t in ts) <= got.prefill_s <= max(t.first_s for t in ts)
    assert got.peak_bytes is None and got.kv_bytes is None  # nothing a server's memory says is seen over HTTP
    if len(ts) == 1:
        assert got.decode_s == pytest.approx(decode * ts[0].rest_s / (ts[0].tokens - 1))


@pytest.mark.parametrize(
    ("timing", "said"),
    [
        (StreamTiming(0.5, 0.2, 1, 48, 0), "decoded 1 token(s) where 9 were asked"),
        (StreamTiming(0.5, 0.0, 5, 48, 0), "a speed trial's 5 tokens came in one piece"),
        (StreamTiming(0.5, 0.2, 9, 48, 25), "25 of a speed trial's 48 prompt tokens came from its prompt cache"),
        (StreamTiming(0.5, 0.2, 9, None, 30), "30 of a speed trial's 48 prompt tokens"),
    ],
)
def test_a_completion_that_is_no_trial_is_an_error_naming_the_server(timing: StreamTiming, said: str) -> None:
    with pytest.raises(ServerArmError) as e:
        _trial([timing], 48, 8, "http://127.0.0.1:1")
    assert said in str(e.value) and "http://127.0.0.1:1" in str(e.value)


class _Streamer:
    """A loopback server streaming a completion token by token (`tokens` chunks, `gap_s` apart), with mlx_lm's
    usage chunk: the shape of mlx_lm.server's stream, without a model (the served speed's bookkeeping, fast)."""

    def __init__(self, tokens: int, gap_s: float) -> None:
        import http.server
        import threading

        streamer = self
        self.tokens, self.gap_s, self.asked = tokens, gap_s, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                import json
                import time

                self.rfile.read(int(self.headers.get("content-length") or 0))
                streamer.asked += 1
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for _ in range(streamer.tokens):
                    chunk = {"choices": [{"text": "a", "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(streamer.gap_s)
                usage = {"choices": [], "usage": {"prompt_tokens": 48, "completion_tokens": streamer.tokens}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def streamers() -> Iterator[tuple[_Streamer, _Streamer]]:
    pair = (_Streamer(4, 0.002), _Streamer(4, 0.002))
    yield pair
    for s in pair:
        s.httpd.shutdown()


def test_two_servers_are_timed_in_pairs_and_again_with_requests_at_once(streamers: tuple[_Streamer, _Streamer]) -> None:
    """`measure_served_speed` end to end against two loopback streams: each context paired, the shortest again
    with `requests` at once, both servers named in what it returns, and the method in the record's words."""
    from pytest_mlxgate.common.server_endpoint import Endpoint
    from pytest_mlxgate.remote.arm import ServedArm
    from pytest_mlxgate.speed.served import measure_served_speed
    from pytest_mlxgate.speed.shape import SpeedShape

    ref, cand = streamers
    shape = SpeedShape(contexts=(48, 96), decode=3, repetitions=3, warmup=0)
    asked: list[tuple[int, int]] = []

    def prompt(context: int, k: int) -> str:
        asked.append((context, k))
        return f"p{k}"

    result, served = measure_served_speed(
        reference=ServedArm(Endpoint.parse(ref.url)),
        candidate=ServedArm(Endpoint.parse(cand.url)),
        prompt=prompt,
        shape=shape,
        requests=2,
    )
    assert result.shape == shape and sorted(result.contexts) == [48, 96]
    assert (served.reference, served.candidate, served.requests) == (ref.url, cand.url, 2)
    assert served.concurrent is not None and served.concurrent.context == 48  # the shortest context, at once
    assert served.to_json()["method"] == (
        "streamed /v1/completions: time to first token, decode tokens/s after it (end tokens biased off)"
    )
    assert served.to_json()["concurrent"]["requests"] == 2
    said = " ".join(result.lines())
    assert "speed @48" in said and "speed @96" in said and "decode" in said, said  # the result's own words
    # 3 pairs at each context (a request a side), then 3 pairs of 2 requests at once at 48
    assert [c for c, _ in asked].count(96) == 6 and [c for c, _ in asked].count(48) == 6 + 12
    assert ref.asked == cand.asked == 3 + 3 + 3 * 2
    assert len({k for _, k in asked}) == len(asked) // 2  # each pair's prompt new, the same for both arms


def test_a_served_trial_that_decodes_one_token_names_its_server(streamers: tuple[_Streamer, _Streamer]) -> None:
    from pytest_mlxgate.common.server_endpoint import Endpoint
    from pytest_mlxgate.remote.arm import ServedArm
    from pytest_mlxgate.speed.served import measure_served_speed
    from pytest_mlxgate.speed.shape import SpeedShape

    ref, cand = streamers
    cand.tokens = 1
    with pytest.raises(ServerArmError) as e:
        measure_served_speed(
            reference=ServedArm(Endpoint.parse(ref.url)),
            candidate=ServedArm(Endpoint.parse(cand.url)),
            prompt=lambda context, k: f"p{k}",
            shape=SpeedShape(contexts=(48,), decode=3, repetitions=3, warmup=0),
            requests=1,
        )
    assert f"server {cand.url}: a speed trial decoded 1 token(s)" in str(e.value)
