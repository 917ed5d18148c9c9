"""The mlxgate log-probability protocol (`remote.protocol`): the reference implementation conforms, each
deliberately broken one fails the check that names its fault (`mlxgate server-check`), and a server arm that
speaks it is scored exactly as an in-process arm is: the same statistic, not a bound. Real HTTP servers on
loopback (the reference server in a thread, on the tiny models)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.cli import main
from pytest_mlxgate.common.server_endpoint import Endpoint
from pytest_mlxgate.errors import ServerArmError
from pytest_mlxgate.remote import reference_server
from pytest_mlxgate.remote.client import ServerClient
from pytest_mlxgate.remote.conformance import check_server
from pytest_mlxgate.remote.reference_server import ReferenceModel


def _load(model_dir: Path) -> tuple[Any, int]:
    import mlx.core as mx
    from mlx_lm import load

    model = load(str(model_dir))[0]
    return model, int(model(mx.array([[0]]))[0].shape[-1])


class LooksAhead(ReferenceModel):
    """Off by one: row p from the forward's row p + 1 (it has seen the token after p)."""

    def rows(self, tokens: Sequence[int], positions: Sequence[int], top_k: int | None) -> list[dict[str, Any]]:
        shifted = [min(p + 1, len(tokens) - 1) for p in positions]
        return [{**row, "position": p} for p, row in zip(positions, super().rows(tokens, shifted, top_k), strict=True)]


class Unsorted(ReferenceModel):
    def rows(self, tokens: Sequence[int], positions: Sequence[int], top_k: int | None) -> list[dict[str, Any]]:
        out = super().rows(tokens, positions, top_k)
        if top_k is not None:
            for row in out:
                row["ids"], row["logprobs"] = row["ids"][::-1], row["logprobs"][::-1]
        return out


class Noisy(ReferenceModel):
    def rows(self, tokens: Sequence[int], positions: Sequence[int], top_k: int | None) -> list[dict[str, Any]]:
        out = super().rows(tokens, positions, None)  # whole rows, noised, then cut
        noised = []
        for row in out:
            x = np.array(row["logprobs"]) + np.random.default_rng(random.getrandbits(32)).normal(
                0, 1e-2, len(row["logprobs"])
            )
            x -= np.log(np.exp(x - x.max()).sum()) + x.max()  # still a distribution, never twice alike
            ids = np.argsort(-x, kind="stable")[:top_k] if top_k is not None else None
            noised.append(
                {
                    **row,
                    "ids": None if ids is None else ids.tolist(),
                    "logprobs": (x if ids is None else x[ids]).tolist(),
                }
            )
        return noised


class Logits(ReferenceModel):
    """Raw logits where log-probabilities belong (no log-softmax): no distribution."""

    def rows(self, tokens: Sequence[int], positions: Sequence[int], top_k: int | None) -> list[dict[str, Any]]:
        return [
            {**row, "logprobs": [v + 0.5 for v in row["logprobs"]]} for row in super().rows(tokens, positions, top_k)
        ]


def _serve(served: ReferenceModel) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), reference_server._handler(served))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, int]:
    return _load(tiny_model_dir)


@pytest.fixture
def serving(tiny: tuple[Any, int]) -> Iterator[Any]:
    servers: list[Iterator[str]] = []

    def start(kind: type[ReferenceModel] = ReferenceModel) -> str:
        model, vocab = tiny
        gen = _serve(kind(model, "tiny", vocab))
        servers.append(gen)
        return next(gen)

    yield start
    for gen in servers:
        next(gen, None)


def _checks(url: str) -> dict[str, bool]:
    return {c.name: c.ok for c in check_server(ServerClient(Endpoint.parse(url)))}


def test_the_reference_implementation_conforms(serving: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = serving()
    assert _checks(url) == dict.fromkeys(
        ("info", "models", "whole rows", "top k", "determinism", "teacher forcing", "batching"), True
    )
    assert main(["server-check", url]) == 0
    assert f"mlxgate server-check {url}: conforms" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("broken", "fails"),
    [
        (LooksAhead, {"teacher forcing"}),
        (Unsorted, {"top k"}),
        (Noisy, {"determinism", "teacher forcing", "batching", "top k"}),
        (Logits, {"whole rows"}),
    ],
)
def test_a_deliberately_broken_server_fails_the_check_that_names_its_fault(
    serving: Any, broken: type[ReferenceModel], fails: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = serving(broken)
    got = _checks(url)
    assert {name for name, ok in got.items() if not ok} == fails, got
    assert main(["server-check", url]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_server_that_does_not_speak_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlx_server import free_port

    assert main(["server-check", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot be reached" in capsys.readouterr().out
    assert main(["server-check", "http://user:pw@127.0.0.1:1"]) == 2


def test_through_the_protocol_the_server_arm_is_the_in_process_statistic(
    serving: Any, tiny: tuple[Any, int], tiny_kv_model_dir: Path
) -> None:
    """Another model served by the protocol, scored against the tiny model's reference rows: the KL at every
    position is what `compare` gives on that model's logits in process (to float32 rounding), not a bound."""
    import mlx.core as mx

    from pytest_mlxgate.kl.served import served_facts
    from pytest_mlxgate.remote.arm import ServedArm, ask_reference, run_protocol_against
    from pytest_mlxgate.stats.divergence import compact_reference, compare

    model, vocab = tiny
    other, other_vocab = _load(tiny_kv_model_dir)
    assert other_vocab == vocab
    gen = _serve(ReferenceModel(other, "other", vocab))
    url = next(gen)
    try:
        rng = np.random.default_rng(0)
        sequences = [[int(t) for t in rng.integers(0, vocab, size=17)] for _ in range(2)]
        positions = np.arange(16, dtype=np.int32)
        refs, expected, logits = [], [], []
        for ids in sequences:
            x = mx.array([ids[:16]])
            ref_logits = np.array(model(x)[0].astype(mx.float32))
            cand_logits = np.array(other(x)[0].astype(mx.float32))
            nxt = np.array(ids[1:], dtype=np.int32)
            ref = compact_reference(ref_logits, nxt)
            refs.append(ref)
            expected.append(compare(ref, cand_logits, nxt, positions))
            logits.append((ref_logits, cand_logits, nxt))
        got = run_protocol_against(ServerClient(Endpoint.parse(url)), sequences, refs, positions, vocab_size=vocab)
        facts = served_facts(
            [s.scores for s in got.sequences], candidate=(ServedArm(Endpoint.parse(url)), got), reference=None
        )
        assert got.exact and facts["bound"] == "exact" and facts["unaskable"] == 0 and facts["k"] is None
        for mine, theirs in zip(got.sequences, expected, strict=True):
            np.testing.assert_allclose(mine.scores.kl, theirs.kl, rtol=1e-4, atol=1e-7)
            assert np.array_equal(mine.scores.cand_top1, theirs.cand_top1)
        assert float(np.mean([s.scores.kl.mean() for s in got.sequences])) > 1e-2  # two models: a real drift
        # the served model as the reference arm: the rows an in-process reference of it would give
        served = ask_reference(
            ServerClient(Endpoint.parse(url)),
            sequences,
            positions,
            top_k=11,
            vocab_size=vocab,
            protocol=True,
            encode=lambda _: [],  # token ids travel as they are: no text round trip
            decode=lambda _: "",
        )
        assert served.exact and served.k == 0 and served.unaskable == 0
        for rows, (ref_logits, cand_logits, nxt) in zip(served.refs, logits, strict=True):
            mine = compare(rows, ref_logits, nxt, positions)
            theirs = compare(compact_reference(cand_logits, nxt), ref_logits, nxt, positions)
            np.testing.assert_allclose(mine.kl, theirs.kl, rtol=1e-4, atol=1e-7)
        with pytest.raises(ServerArmError, match="answered HTTP 400: .*positions must be indices into tokens"):
            ServerClient(Endpoint.parse(url)).logprobs_at(sequences[0], [99], top_k=None, vocab_size=vocab)
    finally:
        next(gen, None)
