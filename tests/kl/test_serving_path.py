"""The KL serving path against mlx_lm's own decode loop, position by position.

The oracle is `mlx_lm.generate.generate_step` (what `mlx_lm.generate` runs), with its `kv_bits`,
`kv_group_size`, `quantized_kv_start` and `prefill_step_size`, fed the sequence's own tokens by a
sampler that returns the next id of the sequence: at step k it yields the log-probabilities it
computed and the token it then fed. The serving path's row k must be those log-probabilities, its
`next_tokens[k]` that token and `positions[k]` = prefix + k — nothing here is derived from the code
under test. Plans start before, inside and after the prefill chunks and inside the decode window
(where only a re-quantize after a decode step makes the two agree).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.kl import arms
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts
from pytest_mlxgate.kl.shape import SERVING_PREFILL_STEP, ArmCounters, RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.serving.kv_plan import KVPlan, parse_kv_value

TOKENS, DECODE = 40, 8
PREFIX = TOKENS - DECODE  # 32: positions 32..39 are decoded one at a time


@dataclasses.dataclass
class Steps:
    """What `generate_step` computed at each decode step."""

    logprobs: np.ndarray  # (decode, V) float32, as mlx_lm normalizes them
    tokens: np.ndarray  # (decode,) the token fed after step k: the one row k predicts


def generate_step_oracle(
    model: Any, ids: list[int], shape: RunShape, plan: KVPlan, monkeypatch: pytest.MonkeyPatch | None = None
) -> Steps:
    """`ids` through `mlx_lm.generate.generate_step`: the prompt is `ids[:prefix + 1]` (mlx_lm
    prefills all of it but its last token), then each step feeds the next id of `ids`.

    A uniform plan is mlx_lm's own `kv_bits` path. A plan mlx_lm cannot quantize (gemma-4's
    sliding-window and KV-shared caches) gets the plan's caches and its conversion in place of
    `maybe_quantize_kv_cache` (`monkeypatch`): the loop, the call order and what is yielded stay mlx_lm's."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prefix = shape.tokens - shape.decode
    feed: Iterator[int] = iter([*ids[prefix + 1 :], ids[-1]])  # generate_step computes one step ahead

    def sampler(logprobs: Any) -> Any:
        return mx.array([next(feed)], dtype=mx.int32)

    extra: dict[str, Any] = {}
    if plan.is_uniform and plan.default is not None and monkeypatch is None:
        spec = plan.default
        extra = {"kv_bits": spec.bits, "kv_group_size": spec.group_size, "quantized_kv_start": spec.start}
    elif monkeypatch is not None:
        import importlib

        loop = importlib.import_module("mlx_lm.generate")  # the module (mlx_lm.generate is also a function)
        monkeypatch.setattr(loop, "maybe_quantize_kv_cache", lambda cache, *_a, **_k: plan.maybe_quantize(cache))
        extra = {"prompt_cache": plan.make_cache(model), "kv_bits": 8}  # kv_bits: any, the plan decides
    logprobs, tokens = [], []
    for token, lp in generate_step(
        mx.array(list(ids[: prefix + 1])),
        model,
        max_tokens=shape.decode,
        sampler=sampler,
        prefill_step_size=shape.chunk or SERVING_PREFILL_STEP,
        **extra,
    ):
        tokens.append(int(token))
        logprobs.append(np.asarray(lp.astype(mx.float32)))
    return Steps(np.stack(logprobs), np.asarray(tokens, dtype=np.int32))


def mlx_log_softmax(logits: np.ndarray) -> np.ndarray:
    """generate_step's normalization (float32 logsumexp), so equal logits give equal numbers."""
    import mlx.core as mx

    x = mx.array(logits)
    return np.asarray(x - mx.logsumexp(x, axis=-1, keepdims=True))


def _load(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))[:2]
    return model, tokenizer


@pytest.fixture(scope="module")
def llama(tiny_kv_model_dir: Path) -> tuple[Any, Any]:
    return _load(tiny_kv_model_dir)


def _sequences(tok: Any, n: int) -> list[Any]:
    seqs = build_sequences(default_prompts(), tok, n=n, tokens=TOKENS)
    for s in seqs:  # the check can fail: shifting next_tokens by one changes them
        assert list(s.ids[PREFIX:TOKENS]) != list(s.ids[PREFIX + 1 : TOKENS + 1])
    return seqs


PLANS = [
    pytest.param("plain", None, id="plain"),
    pytest.param("bits=8,group_size=64,start=0", None, id="q8-from-0"),
    pytest.param(f"bits=4,group_size=32,start={PREFIX + 3}", None, id="q4-starts-inside-decode"),
    pytest.param("bits=4,group_size=32,start=13", 8, id="q4-starts-inside-a-prefill-chunk"),
    pytest.param(f"bits=4,group_size=64,start={TOKENS + 5}", None, id="q4-starts-after-the-sequence"),
]


@pytest.mark.parametrize("plan_value, chunk", PLANS)
def test_each_decoded_position_is_generate_steps_own(
    llama: tuple[Any, Any], plan_value: str, chunk: int | None
) -> None:
    model, tok = llama
    shape = RunShape(path="serving", tokens=TOKENS, decode=DECODE, chunk=chunk, batched=False)
    plan = parse_kv_value(plan_value)
    for seq in _sequences(tok, 3):
        out, calls = arms.sequence_logits(model, list(seq.ids), shape, plan)
        want = generate_step_oracle(model, list(seq.ids), shape, plan)
        np.testing.assert_array_equal(out.positions, np.arange(PREFIX, TOKENS))
        np.testing.assert_array_equal(out.next_tokens, want.tokens)
        ours = mlx_log_softmax(out.logits)
        for k in range(DECODE):  # position by position, so a failure names the first one that differs
            np.testing.assert_allclose(
                ours[k],
                want.logprobs[k],
                atol=1e-5,
                rtol=0,
                err_msg=f"{plan_value}: decode step {k} (position {PREFIX + k})",
            )
        # the ln-PPL check reads the log-probability of the token each row predicts
        picked = ours[np.arange(DECODE), out.next_tokens]
        np.testing.assert_allclose(picked, want.logprobs[np.arange(DECODE), want.tokens], atol=1e-5, rtol=0)
        assert calls == -(-PREFIX // (chunk or SERVING_PREFILL_STEP)) + DECODE


def test_a_plan_starting_inside_the_decode_window_does_change_the_numbers(llama: tuple[Any, Any]) -> None:
    """The comparison above can tell a late re-quantize from none: the same tokens with the plan
    never applied differ from the plan at the positions after its start, and only there."""
    model, tok = llama
    shape = RunShape(path="serving", tokens=TOKENS, decode=DECODE, batched=False)
    start = PREFIX + 3
    (seq,) = _sequences(tok, 1)
    late = generate_step_oracle(model, list(seq.ids), shape, parse_kv_value(f"bits=4,group_size=32,start={start}"))
    plain = generate_step_oracle(model, list(seq.ids), shape, parse_kv_value("plain"))
    gap = np.abs(late.logprobs - plain.logprobs).max(axis=-1)
    quantized_from = start - PREFIX  # the step after the call that reaches `start` reads quantized K/V
    assert np.all(gap[:quantized_from] == 0.0), gap
    assert np.all(gap[quantized_from:] > 1e-3), gap


def test_the_arms_score_what_generate_step_computed(llama: tuple[Any, Any]) -> None:
    """Through the gate's arms (a KV lever, batched): each sequence's scored positions, next tokens
    and both arms' next-token log-probabilities (what ln-PPL and the worst tokens report) are
    generate_step's, for the reference plan and the candidate plan alike."""
    model, tok = llama
    lever = Lever(
        name="kv", kind="kv", target=None, ref="plain", cand=f"bits=4,group_size=32,start={PREFIX + 2}", path="serving"
    )
    shape = RunShape(path="serving", tokens=TOKENS, decode=DECODE)
    seqs = _sequences(tok, 5)
    refs = arms.run_reference(model, seqs, shape, lever, counters=ArmCounters())
    scores = arms.run_candidate(model, seqs, shape, lever, refs, counters=ArmCounters())
    rows = np.arange(DECODE)
    for seq, s in zip(seqs, scores, strict=True):
        ref = generate_step_oracle(model, list(seq.ids), shape, lever.kv_plan("reference"))
        cand = generate_step_oracle(model, list(seq.ids), shape, lever.kv_plan("candidate"))
        np.testing.assert_array_equal(s.positions, np.arange(PREFIX, TOKENS))
        np.testing.assert_array_equal(s.next_tokens, ref.tokens)
        # a batch rounds its matmuls a little differently from one row: far below the plan's own effect
        np.testing.assert_allclose(s.ref_next_logprob, ref.logprobs[rows, ref.tokens], atol=1e-3, rtol=0)
        np.testing.assert_allclose(s.cand_next_logprob, cand.logprobs[rows, cand.tokens], atol=1e-3, rtol=0)
        assert np.abs(ref.logprobs[rows, ref.tokens] - cand.logprobs[rows, cand.tokens])[3:].max() > 1e-3


@pytest.mark.parametrize("fixture", ["tiny_kv_model_dir", "tiny_gemma4_dir"])
@pytest.mark.parametrize(
    "plan_value", ["plain", "bits=8,group_size=64,start=0", f"bits=4,group_size=32,start={PREFIX + 3}"]
)
def test_each_row_of_a_batch_is_generate_steps_sequence(
    fixture: str, plan_value: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of five through the serving path, each row against generate_step on that sequence
    alone (gemma-4: sliding-window and KV-shared caches; its quantized plans through the plan's caches)."""
    model, tok = _load(request.getfixturevalue(fixture))
    shape = RunShape(path="serving", tokens=TOKENS, decode=DECODE)
    seqs = _sequences(tok, 5)
    plan = parse_kv_value(plan_value)
    batch, calls = arms.serving_logits(model, [s.ids for s in seqs], shape, plan)
    assert calls == 1 + DECODE  # one prefill call and one per decoded token, for the whole batch
    gemma_quantized = fixture == "tiny_gemma4_dir" and not plan.is_plain
    for seq, row in zip(seqs, batch, strict=True):
        want = generate_step_oracle(model, list(seq.ids), shape, plan, monkeypatch if gemma_quantized else None)
        np.testing.assert_array_equal(row.next_tokens, want.tokens)
        np.testing.assert_array_equal(row.positions, np.arange(PREFIX, TOKENS))
        ours = mlx_log_softmax(row.logits)
        if plan.is_plain:  # float rounding of a batched matmul only: a row never sees another row
            assert np.abs(ours - want.logprobs).max() <= 1e-4, fixture
        else:  # that rounding may flip a quantization step of K/V now and then: far below the plan's own drift
            assert _mean_kl(want.logprobs, ours) <= 1e-4, (fixture, plan_value)


def _mean_kl(p: np.ndarray, q: np.ndarray) -> float:
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    return float(np.mean(np.sum(np.exp(p64) * (p64 - q64), axis=-1)))
