"""Quantized KV plans on gemma-4: a quantized sliding-window cache, KV-shared layers reading
quantized K/V, selection by attention type, and refusals that name the layers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from decode_kl import PROMPTS, decode_kls, load
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import LeverError
from pytest_mlxgate.serving.kv_plan import parse_kv_value


def test_the_quantized_ring_buffer_holds_what_mlx_lms_ring_buffer_holds() -> None:
    """Fed the same K/V (prefill chunks, then single steps far past the window), the quantized
    cache's dequantized contents, offsets, write index and masks equal mlx_lm's RotatingKVCache
    storing the same rounded values: the rotation and trimming are the same."""
    import mlx.core as mx

    from pytest_mlxgate.serving.caches import FakeQuantRotatingKVCache, QuantizedRotatingKVCache

    mx.random.seed(0)
    real = QuantizedRotatingKVCache(16, 0, group_size=32, bits=4)
    fake = FakeQuantRotatingKVCache(16, 0, group_size=32, bits=4)
    for steps in [5, 7, 1, 1, 9, *([1] * 30), 3, *([1] * 5)]:
        k, v = mx.random.normal((1, 2, steps, 64)), mx.random.normal((1, 2, steps, 64))
        rk, rv = real.update_and_fetch(k, v)
        fk, fv = fake.update_and_fetch(k, v)
        assert (real.offset, real._idx) == (fake.offset, fake._idx)
        deq = mx.dequantize(*rk, group_size=32, bits=4)
        assert deq.shape == fk.shape
        assert float(mx.abs(deq - fk).max()) < 1e-5
        assert float(mx.abs(mx.dequantize(*rv, group_size=32, bits=4) - fv).max()) < 1e-5
        for n in (1, 3):
            a, b = real.make_mask(n, window_size=16), fake.make_mask(n, window_size=16)
            assert (a is None and b is None) or (isinstance(a, str) and a == b) or bool(mx.all(a == b))
    assert real.nbytes < fake.nbytes


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(2, 12),
    padding=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    steps=st.lists(st.one_of(st.just(1), st.integers(2, 9)), min_size=4, max_size=30),
    quantize_after=st.integers(0, 3),
)
def test_the_batched_quantized_window_holds_what_mlx_lms_batched_window_holds(
    window: int, padding: list[int], steps: list[int], quantize_after: int
) -> None:
    """Left-padded rows, any window, prefill chunks and single steps in any order, quantized from the
    start or converted after some updates: the quantized batched window's dequantized K/V, positions,
    padding and masks are exactly mlx_lm's `BatchRotatingKVCache` storing the same rounded values."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchRotatingKVCache

    from pytest_mlxgate.serving.batch import BatchQuantizedRotatingKVCache

    mx.random.seed(len(steps) * 31 + window)
    g, b = 32, 4
    real: Any = BatchRotatingKVCache(window, padding)  # becomes the quantized one after `quantize_after`
    fake = BatchRotatingKVCache(window, padding)

    def rounded(x: Any) -> Any:
        return mx.dequantize(*mx.quantize(x, group_size=g, bits=b), group_size=g, bits=b)

    for n, step in enumerate(steps):
        if n == quantize_after:
            real = BatchQuantizedRotatingKVCache.from_cache(real, group_size=g, bits=b)
        k = mx.random.normal((len(padding), 2, step, 64))
        v = mx.random.normal((len(padding), 2, step, 64))
        rk, rv = real.update_and_fetch(k, v)  # raw values: the conversion rounds what it holds
        fk, fv = fake.update_and_fetch(rounded(k), rounded(v))
        assert (real._idx, real._offset, real.rotated) == (fake._idx, fake._offset, fake.rotated)
        assert real.offset.tolist() == fake.offset.tolist()
        assert real.left_padding.tolist() == fake.left_padding.tolist()
        if isinstance(real, BatchQuantizedRotatingKVCache):
            rk, rv = (mx.dequantize(*x, group_size=g, bits=b) for x in (rk, rv))
            assert rk.shape == fk.shape and bool(mx.all(rk == fk)) and bool(mx.all(rv == fv))
        for width in (1, 3):
            assert bool(mx.all(real.make_mask(width) == fake.make_mask(width)))
    assert isinstance(real, BatchQuantizedRotatingKVCache) and real.nbytes < fake.nbytes


@pytest.fixture
def mixed_config(tmp_path: Path) -> Path:
    """A production-like mixed plan: 8-bit on two layers, 4-bit on the rest, by type and index."""
    path = tmp_path / "kv_config.json"
    path.write_text(json.dumps({"types": {"sliding": {"bits": 4}, "full": {"bits": 8}}, "layers": {"1": 8}}))
    return path


@pytest.mark.parametrize("fixture", ["tiny_gemma4_dir", "tiny_gemma4_multimodal_dir"])
@pytest.mark.parametrize("value", ["8", "4", "mixed"])
def test_gemma4_plans_run_and_only_the_kernels_differ_from_fake_quant(
    fixture: str, value: str, mixed_config: Path, request: pytest.FixtureRequest
) -> None:
    """Every cached layer quantized (sliding and full), KV-shared layers reading quantized K/V: the
    decode steps' KL against the same plan in float (fake-quant) is <= 1e-6 on every prompt, while
    against the plain cache it is not 0 (the plan did quantize)."""
    model, tok = load(request.getfixturevalue(fixture))
    plan = parse_kv_value(str(mixed_config) if value == "mixed" else value)
    kls = decode_kls(model, tok, plan, plan.fake_quant())
    assert max(kls) <= 1e-6, kls
    assert max(decode_kls(model, tok, plan, parse_kv_value("plain"))) > 1e-5


def test_caches_follow_the_plan_by_type_index_and_sharing(tiny_gemma4_dir: Path, mixed_config: Path) -> None:
    import mlx.core as mx

    from pytest_mlxgate.serving.caches import QuantizedRotatingKVCache, SharedKVReader

    model, tok = load(tiny_gemma4_dir)
    plan = parse_kv_value(str(mixed_config))
    cache = plan.make_cache(model)
    assert len(cache) == len(model.layers)  # 5 cached layers + 3 readers
    shared = [c for c in cache if isinstance(c, SharedKVReader)]
    assert [c.source for c in shared] == [4, 4, 3]  # the last cached layer of each type
    assert not any(hasattr(c, "bits") for c in shared), "nothing quantized yet: readers stay float"
    model(mx.array([list(tok.encode(PROMPTS[0]))]), cache=cache)
    plan.maybe_quantize(cache)
    bits = [getattr(c, "bits", None) for c in cache]
    assert bits == [4, 8, 4, 8, 4, 4, 4, 8]
    assert isinstance(cache[0], QuantizedRotatingKVCache)
    assert type(cache[3]).__name__ == "QuantizedKVCache"
    # mlx_lm's prompt-cache tools walk every layer: a reader reports its source's position and trims with it
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    assert [c.offset for c in shared] == [cache[4].offset, cache[4].offset, cache[3].offset]
    full = [i for i, c in enumerate(cache) if type(c).__name__ == "QuantizedKVCache"]
    assert can_trim_prompt_cache([cache[i] for i in full] + shared)
    before = cache[3].offset
    assert trim_prompt_cache([cache[3], shared[2]], 2) == 2
    assert cache[3].offset == before - 2 and shared[2].offset == before - 2


def test_start_defers_quantization_and_readers_follow(tiny_gemma4_dir: Path) -> None:
    import mlx.core as mx

    from pytest_mlxgate.serving.caches import SharedKVReader

    model, tok = load(tiny_gemma4_dir)
    plan = parse_kv_value("bits=8,start=40")
    cache = plan.make_cache(model)
    ids = list(tok.encode(PROMPTS[1]))
    assert len(ids) < 40
    model(mx.array([ids]), cache=cache)
    plan.maybe_quantize(cache)
    assert not any(hasattr(c, "bits") for c in cache)
    while cache[0].offset < 40:  # on past the start
        model(mx.array([ids]), cache=cache)
        plan.maybe_quantize(cache)
    assert all(getattr(c, "bits", None) == 8 for c in cache)
    assert any(isinstance(c, SharedKVReader) for c in cache)


def test_plans_the_model_cannot_run_are_refused_naming_the_layers(
    tiny_gemma4_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gemma, _ = load(tiny_gemma4_dir)
    llama, _ = load(tiny_model_dir)

    def plan(config: dict[str, Any]) -> Any:
        path = tmp_path / "kv.json"
        path.write_text(json.dumps(config))
        return parse_kv_value(path)

    with pytest.raises(LeverError, match=r"layers \[6\] are KV-shared.*6 reads layer 4"):
        plan({"layers": {"6": 8}}).make_cache(gemma)
    with pytest.raises(LeverError, match=r"attention types \['sliding_attention'\].*\['full_attention'\]"):
        plan({"types": {"sliding": 4}}).make_cache(llama)
    with pytest.raises(LeverError, match="the model has 8 layers"):
        plan({"layers": {"9": 8}}).make_cache(gemma)
    plan({"layers": {"6": None}, "default": 8}).make_cache(gemma)  # null on a shared layer is fine


def test_head_dimensions_are_read_from_the_model_s_own_attention_per_cached_layer(
    tiny_gemma4_dir: Path, tmp_path: Path
) -> None:
    """gemma-4 keeps two head dims (sliding 64, full 128): a group size of 128 fits its full layer
    only, and the refusal names exactly the sliding cached layers, not the KV-shared ones."""
    from tinygemma import KV_SHARED_LAYERS, LAYER_TYPES, TEXT_CONFIG

    from pytest_mlxgate.serving.caches import kv_head_dims

    gemma, _ = load(tiny_gemma4_dir)
    cached = LAYER_TYPES[: len(LAYER_TYPES) - KV_SHARED_LAYERS]
    head = {"full_attention": TEXT_CONFIG["global_head_dim"], "sliding_attention": TEXT_CONFIG["head_dim"]}
    dims = {i: (head[t],) for i, t in enumerate(cached)}
    assert kv_head_dims(gemma) == dims and kv_head_dims(gemma) is kv_head_dims(gemma)  # once per model
    sliding = [i for i, t in enumerate(cached) if t == "sliding_attention"]
    says = f"layers {sliding} keep keys/values of head dimension 64, which group size 128 does not divide"
    with pytest.raises(LeverError, match=re.escape(says)):
        parse_kv_value("bits=8,group_size=128,start=0").make_cache(gemma)
    config = tmp_path / "kv_config.json"
    config.write_text(json.dumps({"types": {"full": {"bits": 8, "group_size": 128}}}))
    parse_kv_value(config).make_cache(gemma)  # the full layer's head dim (128) fits


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"types": {"windowed": 4}}, "attention types are"),
        ({"types": {"full": 4, "full_attention": 8}}, "twice"),
        ({"types": [4]}, "key 'types' is list"),
    ],
)
def test_bad_types_in_kv_config(tmp_path: Path, config: dict[str, Any], fragment: str) -> None:
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(config))
    with pytest.raises(LeverError, match=fragment):
        parse_kv_value(path)


def test_capability_generation_runs_quantized_gemma4(tiny_gemma4_dir: Path) -> None:
    """mlx_lm's own quantized generation raises on gemma-4 (RotatingKVCache quantization NYI);
    the arm's greedy path runs the plan, and its fake-quant twin gives the same texts."""
    from pytest_mlxgate.capability.generate import generate_greedy

    model, tok = load(tiny_gemma4_dir)
    plan = parse_kv_value("8")
    texts = generate_greedy(model, tok, PROMPTS, max_new_tokens=6, kv=plan)
    assert len(texts) == 3 and all(isinstance(t, str) and t for t in texts)
    assert texts == generate_greedy(model, tok, PROMPTS, max_new_tokens=6, kv=plan.fake_quant())


@settings(max_examples=12, deadline=None)
@given(
    rotating=st.booleans(),
    group_size=st.sampled_from([32, 64, 128]),
    bits=st.sampled_from([4, 8]),
    n=st.integers(1, 12),
)
def test_a_cache_quantizes_at_the_group_size_and_bits_it_is_given(
    rotating: bool, group_size: int, bits: int, n: int
) -> None:
    """Either cache with a quantized form holds, after `quantize_cache`, exactly `mx.quantize` of what it
    held, at the group size and bits asked for (the scales' width shows the group size), at the same offset."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    from pytest_mlxgate.serving.caches import quantize_cache

    mx.random.seed(n)
    cache = RotatingKVCache(16) if rotating else KVCache()
    keys, values = mx.random.normal((1, 2, n, 128)), mx.random.normal((1, 2, n, 128))
    cache.update_and_fetch(keys, values)
    q = quantize_cache(cache, group_size=group_size, bits=bits)
    assert (q.group_size, q.bits, q.offset) == (group_size, bits, n)
    for held, fed in ((q.keys, keys), (q.values, values)):
        assert held[1].shape[-1] == 128 // group_size
        ours = mx.dequantize(*(p[..., :n, :] for p in held), group_size=group_size, bits=bits)
        theirs = mx.dequantize(*mx.quantize(fed, group_size=group_size, bits=bits), group_size=group_size, bits=bits)
        assert bool(mx.array_equal(ours, theirs))


@settings(max_examples=8, deadline=None)
@given(group_size=st.sampled_from([32, 64, 128]), bits=st.sampled_from([4, 8]), n=st.integers(1, 8))
def test_a_fake_quant_cache_rounds_what_it_is_fed_at_its_group_size_and_bits(
    group_size: int, bits: int, n: int
) -> None:
    """Fed after the conversion (the decode steps), the float cache stores exactly mx.quantize's round
    trip of each new K/V at the plan's group size and bits: only the kernels differ from the real plan."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from pytest_mlxgate.serving.caches import fake_quantize_cache

    mx.random.seed(n)
    fake = fake_quantize_cache(KVCache(), group_size=group_size, bits=bits)
    keys, values = mx.random.normal((1, 2, n, 128)), mx.random.normal((1, 2, n, 128))
    got_k, got_v = fake.update_and_fetch(keys, values)
    for got, fed in ((got_k, keys), (got_v, values)):
        want = mx.dequantize(*mx.quantize(fed, group_size=group_size, bits=bits), group_size=group_size, bits=bits)
        assert bool(mx.array_equal(got, want)), (group_size, bits)


def test_only_a_real_quantized_plan_adds_readers_for_gemma4_s_kv_shared_layers(tiny_gemma4_dir: Path) -> None:
    """The plain plan (the reference arm) and a fake-quant one serve through mlx_lm's own cache list,
    untouched: its KV-shared layers read their source through mlx_lm. Only a real quantized plan
    gives each shared layer a reader of its (quantized) source."""
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from pytest_mlxgate.serving.caches import SharedKVReader

    model = mlx_lm.load(str(tiny_gemma4_dir))[0]
    own = [type(c) for c in make_prompt_cache(model)]
    n_layers = len(model.layers)
    assert len(own) < n_layers  # the tiny gemma-4 has KV-shared layers
    for value in ("plain", "8"):
        plan = parse_kv_value(value)
        for p in (plan, plan.fake_quant()):
            if p.is_plain and p.fake:
                continue
            got = p.make_cache(model)
            real = not p.is_plain and not p.fake
            assert [type(c) for c in got[: len(own)]] == own
            assert len(got) == (n_layers if real else len(own)), (p.describe(), len(got))
            assert all(isinstance(c, SharedKVReader) for c in got[len(own) :])


def test_a_cache_with_no_quantized_form_is_refused_by_both_conversions_naming_its_class() -> None:
    """Called directly on a recurrent layer's cache (the plan's loop checks `quantized_form` first),
    the real and the fake-quant conversion both raise a TypeError that says which cache it was."""
    from mlx_lm.models.cache import ArraysCache

    from pytest_mlxgate.serving.caches import fake_quantize_cache, quantize_cache

    for convert in (quantize_cache, fake_quantize_cache):
        with pytest.raises(TypeError, match=r"^ArraysCache has no quantized form$"):
            convert(ArraysCache(2), group_size=64, bits=8)


def test_a_shared_reader_has_bits_only_from_a_quantized_cache_never_through_another_reader() -> None:
    """A reader's `bits` and `group_size` are its source layer's, while that layer is quantized; a reader
    pointed at another reader's slot is no quantized cache, so it has none (the chain is not followed)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    from pytest_mlxgate.serving.caches import SharedKVReader

    caches: list[Any] = [KVCache()]
    caches += [SharedKVReader(caches, 0), SharedKVReader(caches, 1)]
    assert not any(hasattr(c, "bits") or hasattr(c, "group_size") for c in caches[1:])
    caches[0] = QuantizedKVCache(group_size=32, bits=4)
    assert (caches[1].bits, caches[1].group_size) == (4, 32)
    assert not hasattr(caches[2], "bits") and not hasattr(caches[2], "group_size")
