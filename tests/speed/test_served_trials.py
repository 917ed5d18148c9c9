"""A served speed trial from its streamed completions (`speed.served._trial`): the prefill the median time to
first token, the decode time of the asked tokens at the summed rate (concurrent requests add up), and a
completion that cannot be a trial (under 2 tokens, a prefill from the server's cache) an error, never a time."""

from __future__ import annotations

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
