"""Quantization as decode crosses a plan's start, in every serving route alike.

mlx_lm's `generate_step` quantizes the KV cache after every forward (`maybe_quantize_kv_cache`), so a
plan whose `quantized_kv_start` lies past the prompt is quantized in the middle of decoding. Every
route of this project takes that step through one function (`KVPlan.forward`); each route is run here
on a real model wrapped so that every forward records the cache it is handed (the first layer's
offset, each layer's cache type), and the record must be `generate_step`'s own, call for call: a
route that dropped the re-quantize would hand plain caches to the forwards past the start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.serving.kv_plan import KVPlan, parse_kv_value

PROMPT, DECODE = 24, 8
START = PROMPT + 3  # crossed by the third decode step


class Recorder:
    """The model, recording before each forward what cache it is handed (from after the one-token probe
    a plan makes once per model to read its head dimensions)."""

    def __init__(self, model: Any) -> None:
        from pytest_mlxgate.serving.caches import kv_head_dims

        self.model = model
        self.calls: list[tuple[int, tuple[str, ...]]] = []
        kv_head_dims(self)
        self.calls.clear()

    def __call__(self, x: Any, cache: Any = None, **kwargs: Any) -> Any:
        self.calls.append((int(cache[0].offset), tuple(type(c).__name__ for c in cache)))
        return self.model(x, cache=cache, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def loaded(tiny_kv_model_dir: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    return model, tokenizer


def _ids(tokenizer: Any, n: int) -> list[int]:
    from pytest_mlxgate.kl.prompts import default_prompts

    ids = [int(i) for i in tokenizer.encode(" ".join(p.text or "" for p in default_prompts()[:4]))][:n]
    assert len(ids) == n
    return ids


def generate_steps_record(model: Any, prompt: list[int], steps: int, plan: KVPlan, chunk: int) -> list[Any]:
    """What `mlx_lm.generate.generate_step` hands its forwards: `prompt` (all but its last token
    prefilled in chunks of `chunk`), then `steps` tokens, under the plan's uniform kv_bits and start."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    assert plan.is_uniform and plan.default is not None
    spec = plan.default
    recorder = Recorder(model)
    for _ in generate_step(
        mx.array(prompt),
        recorder,
        max_tokens=steps,
        sampler=lambda lp: mx.argmax(lp, axis=-1),
        prefill_step_size=chunk,
        kv_bits=spec.bits,
        kv_group_size=spec.group_size,
        quantized_kv_start=spec.start,
    ):
        pass
    return recorder.calls


def _crossed(calls: list[Any]) -> list[Any]:
    """The forwards that follow the crossing of START: where only a re-quantize makes them agree."""
    after = [c for c in calls if c[0] >= START]
    assert after and all("QuantizedKVCache" in c[1] for c in after), calls  # the record itself can fail
    return after


PLAN = f"bits=4,group_size=64,start={START}"


def test_the_kl_arms_hand_each_decode_step_the_cache_generate_step_does(loaded: tuple[Any, Any]) -> None:
    from pytest_mlxgate.kl import arms
    from pytest_mlxgate.kl.prompts import TokenSequence
    from pytest_mlxgate.kl.shape import ArmCounters, RunShape

    model, tokenizer = loaded
    ids = _ids(tokenizer, PROMPT + DECODE + 1)
    shape = RunShape("serving", PROMPT + DECODE, DECODE)
    lever = Lever("kv", "kv", None, "plain", PLAN, path="serving")
    recorder = Recorder(model)
    seq = TokenSequence(0, tuple(ids), ("p",), "")
    refs = arms.run_reference(model, [seq], shape, lever, counters=ArmCounters())
    arms.run_candidate(recorder, [seq], shape, lever, refs, counters=ArmCounters())
    oracle = generate_steps_record(model, ids[: PROMPT + 1], DECODE, lever.kv_plan("candidate"), 512)
    assert _crossed(recorder.calls) == _crossed(oracle)[: len(_crossed(recorder.calls))]
    assert recorder.calls == oracle[: len(recorder.calls)]


def test_one_at_a_time_generation_hands_each_step_the_cache_generate_step_does(loaded: tuple[Any, Any]) -> None:
    """The capability route for plans mlx_lm cannot run itself (`per_layer`), on a plan it can, so
    mlx_lm's own loop is the oracle."""
    from pytest_mlxgate.capability.generate import _per_layer

    model, tokenizer = loaded
    prompt = _ids(tokenizer, PROMPT + 1)
    plan = parse_kv_value(PLAN)
    recorder = Recorder(model)
    _per_layer(recorder, tokenizer, prompt, DECODE, plan)
    oracle = generate_steps_record(model, prompt, DECODE, plan, 2048)
    assert _crossed(recorder.calls) and recorder.calls == oracle[: len(recorder.calls)]
    assert len(recorder.calls) >= DECODE  # not stopped early (an end-of-text token would cut the record)


def test_a_speed_trial_hands_each_decode_step_the_cache_generate_step_does(loaded: tuple[Any, Any]) -> None:
    from pytest_mlxgate.kl.shape import SERVING_PREFILL_STEP
    from pytest_mlxgate.speed.measure import ArmModel, _trial, memory_probe

    model, tokenizer = loaded
    ids = _ids(tokenizer, PROMPT + DECODE)
    lever = Lever("kv", "kv", None, "plain", PLAN, path="serving")
    recorder = Recorder(model)
    import mlx.core as mx

    trial = _trial(ArmModel(recorder, "candidate"), lever, mx.array([ids]), PROMPT, DECODE, memory_probe())
    oracle = generate_steps_record(model, ids[: PROMPT + 1], DECODE, lever.kv_plan("candidate"), SERVING_PREFILL_STEP)
    assert _crossed(recorder.calls) and recorder.calls == oracle[: len(recorder.calls)]
    # and what the trial reports is the quantized cache's size, not the plain one's
    plain = _trial(ArmModel(model, "reference"), lever, mx.array([ids]), PROMPT, DECODE, memory_probe())
    assert 0 < trial.kv_bytes < plain.kv_bytes
