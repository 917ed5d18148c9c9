"""Batched greedy decoding through real (quantized) KV caches: the same numbers as one row alone,
the same tokens as mlx_lm's own one-at-a-time production path."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.serving.kv_plan import KVPlan, KVSpec, parse_kv_value

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a king who",
    "1, 2, 3, 4, 5,",
    "A long time ago the river flooded the valley and the farmers moved their houses up the hill",
]


def _load(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(path))


def _ids(tok: Any) -> list[list[int]]:
    return [list(tok.encode(p)) for p in PROMPTS]


@pytest.mark.parametrize("plan", ["8", "4", "bits=4,group_size=32,start=0"])
def test_a_batch_of_one_is_mlx_lms_quantized_stream_generate(tiny_kv_model_dir: Path, plan: str) -> None:
    """Alone, the loop is `mlx_lm.stream_generate(kv_bits=...)` token for token: the production path."""
    from mlx_lm import stream_generate

    from pytest_mlxgate.serving.batch import greedy_batch

    model, tok = _load(tiny_kv_model_dir)
    kv = parse_kv_value(plan)
    spec = kv.default
    assert spec is not None
    for ids in _ids(tok):
        ours = greedy_batch(model, [ids], max_new_tokens=12, kv=kv, eos=set())[0]
        theirs = [
            r.token
            for r in stream_generate(
                model,
                tok,
                ids,
                max_tokens=12,
                kv_bits=spec.bits,
                kv_group_size=spec.group_size,
                quantized_kv_start=spec.start,
            )
        ]
        assert ours == theirs


def test_a_plain_batch_is_mlx_lms_batch_generate(tiny_model_dir: Path) -> None:
    from mlx_lm import batch_generate

    from pytest_mlxgate.serving.batch import greedy_batch

    model, tok = _load(tiny_model_dir)
    ids = _ids(tok)
    ours = greedy_batch(model, ids, max_new_tokens=12, kv=parse_kv_value("plain"), eos=set())
    theirs = batch_generate(model, tok, ids, max_tokens=12).texts
    assert [tok.decode(o) for o in ours] == theirs


@pytest.mark.parametrize("bits", [8, 4])
def test_each_row_of_a_padded_quantized_batch_has_its_own_logits(tiny_kv_model_dir: Path, bits: int) -> None:
    """Left padding is masked and positions are per row: a row's decode logits in a batch of rows of
    different lengths equal its logits alone (float32 rounding), through prefill and two steps."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    from pytest_mlxgate.serving.batch import BatchQuantizedKVCache, quantize_batch_cache

    model, tok = _load(tiny_kv_model_dir)
    ids = _ids(tok)
    width = max(map(len, ids))
    padding = [width - len(x) for x in ids]
    cache: list[Any] = [BatchKVCache(padding) for _ in model.layers]
    tokens = mx.array([[0] * p + x for p, x in zip(padding, ids, strict=True)])
    model(tokens[:, :-1], cache=cache)
    cache = [quantize_batch_cache(c, group_size=32, bits=bits) for c in cache]
    assert all(isinstance(c, BatchQuantizedKVCache) for c in cache)
    steps = [tokens[:, -1:], mx.array([[11]] * len(ids)), mx.array([[12]] * len(ids))]
    batched = [model(s, cache=cache)[:, -1] for s in steps]
    for row, x in enumerate(ids):
        alone: list[Any] = [KVCache() for _ in model.layers]
        model(mx.array([x[:-1]]), cache=alone)
        alone = [c.to_quantized(group_size=32, bits=bits) for c in alone]
        for k, s in enumerate([mx.array([[x[-1]]]), mx.array([[11]]), mx.array([[12]])]):
            mine = model(s, cache=alone)[0, -1]
            assert float(mx.abs(mine - batched[k][row]).max()) < 1e-4, (row, k)
    # and the comparison can fail: another row's logits differ
    assert float(mx.abs(batched[0][0] - batched[0][1]).max()) > 1e-2


def test_a_quantized_batch_cache_keeps_its_rows_when_it_grows_past_a_step() -> None:
    """Decoding past the allocation (`step` positions) grows the arrays: every position written before
    stays as it was, so what the attention reads equals the whole history quantized at once."""
    import mlx.core as mx

    from pytest_mlxgate.serving.batch import BatchQuantizedKVCache

    cache = BatchQuantizedKVCache([0, 3], group_size=32, bits=8)
    first = cache.step - 4
    keys = mx.random.normal((2, 2, cache.step + 6, 64), key=mx.random.key(0))
    values = mx.random.normal(keys.shape, key=mx.random.key(1))
    cache.update_and_fetch(keys[:, :, :first], values[:, :, :first])
    assert cache.keys is not None and cache.keys[0].shape[2] == cache.step
    assert not cache.empty() and BatchQuantizedKVCache([0], group_size=32, bits=8).empty()  # mlx_lm's cache API
    for t in range(first, keys.shape[2]):  # one token at a time, across the boundary
        got_k, got_v = cache.update_and_fetch(keys[:, :, t : t + 1], values[:, :, t : t + 1])
    assert cache.keys[0].shape[2] == 2 * cache.step
    for got, whole in ((got_k, keys), (got_v, values)):
        for part, want in zip(got, mx.quantize(whole, group_size=32, bits=8), strict=True):
            assert part.shape == want.shape and bool(mx.array_equal(part, want)), part.shape


@pytest.mark.parametrize("route", ["batched", "stream", "per_layer"])
@pytest.mark.parametrize(
    ("model", "group", "says"),
    [
        ("tiny", 32, r"head dimension 16, which group size 32 does not divide: no group size"),
        ("kv", 128, r"head dimension 64, which group size 128 does not divide: use group_size 32 or 64 there"),
    ],
)
def test_a_group_size_the_head_dimension_is_no_multiple_of_is_refused_before_any_token_on_every_route(
    tiny_model_dir: Path, tiny_kv_model_dir: Path, tmp_path: Path, model: str, group: int, says: str, route: str
) -> None:
    """mx.quantize would refuse it from inside mlx_lm's cache, mid-run, with its own traceback (on
    the stream route, inside `stream_generate`); the plan says which layers, their head dimension
    and the group sizes that would fit, before the first token, whichever loop serves it."""
    import json

    from pytest_mlxgate.capability.generate import generate_greedy, generation_route
    from pytest_mlxgate.errors import LeverError

    m, tok = _load(tiny_model_dir if model == "tiny" else tiny_kv_model_dir)
    prompts = PROMPTS if route == "batched" else PROMPTS[:1]
    lengths = [len(x) for x in _ids(tok)[: len(prompts)]]
    start = 0 if route == "batched" else lengths[0]  # past the prefill: one prompt at a time, quantized mid-decode
    if route == "per_layer":
        config = tmp_path / "kv_config.json"
        layers = [{"bits": 8, "group_size": group}] * len(m.layers)
        config.write_text(json.dumps({"layers": layers, "quantized_kv_start": start}))
        value = str(config)
    else:
        value = f"bits=8,group_size={group},start={start}"
    kv = parse_kv_value(value)
    assert generation_route(m, [kv], lengths) == route
    layers_named = re.escape(f"layers {list(range(len(m.layers)))} keep keys/values of ") + says
    with pytest.raises(LeverError, match=rf"^KV plan .* cannot run on this model: {layers_named}"):
        generate_greedy(m, tok, prompts, max_new_tokens=8, kv=kv)


def test_a_per_layer_plan_runs_batched_as_its_uniform_twin(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    """A kv_config naming every layer's spec is checked against the model and runs like the uniform plan
    it spells out, token for token."""
    import json

    from pytest_mlxgate.serving.batch import greedy_batch

    model, tok = _load(tiny_kv_model_dir)
    config = tmp_path / "kv_config.json"
    config.write_text(json.dumps({"layers": [{"bits": 8, "group_size": 32}] * len(model.layers)}))
    runs = [
        greedy_batch(model, _ids(tok), max_new_tokens=4, kv=parse_kv_value(v), eos=set())
        for v in (str(config), "bits=8,group_size=32,start=0")
    ]
    assert runs[0] == runs[1] and all(len(r) == 4 for r in runs[0])


def test_what_the_batched_loop_refuses(tiny_model_dir: Path, tiny_gemma4_dir: Path) -> None:
    from pytest_mlxgate.serving.batch import PREFILL_STEP, batchable

    model, _ = _load(tiny_model_dir)
    assert batchable(model, parse_kv_value("8"), [10, 20])
    assert batchable(model, parse_kv_value("bits=8,start=9"), [10, 20])
    assert not batchable(model, parse_kv_value("bits=8,start=10"), [10, 20]), "rows would quantize at different steps"
    assert not batchable(model, parse_kv_value("8"), [10, PREFILL_STEP + 2]), "mlx_lm would quantize mid-prompt"
    assert not batchable(model, parse_kv_value("8"), [])
    by_type = KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8, 64, 10)}, source="types.json")
    assert batchable(model, dataclasses.replace(by_type, types={"full_attention": KVSpec(8, 64, 9)}), [10, 20])
    assert not batchable(model, by_type, [10, 20]), "a spec by attention type starts too late for the short row"
    gemma, _ = _load(tiny_gemma4_dir)
    assert batchable(gemma, parse_kv_value("plain"), [10, 20]), "plain sliding windows batch (BatchRotatingKVCache)"
    assert batchable(gemma, parse_kv_value("8"), [10, 20]), "quantized windows batch (BatchQuantizedRotatingKVCache)"
    assert not batchable(gemma, parse_kv_value("8").fake_quant(), [10, 20]), "fake quantization runs per layer"


def test_cache_bytes_count_the_quantized_arrays() -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from pytest_mlxgate.serving.batch import quantize_batch_cache

    plain = BatchKVCache([0, 0])
    k = mx.random.normal((2, 2, 64, 64))
    plain.update_and_fetch(k, k)
    q8 = quantize_batch_cache(plain, group_size=32, bits=8)
    q4 = quantize_batch_cache(plain, group_size=32, bits=4)
    float_bytes = 2 * k.nbytes
    assert q4.nbytes < q8.nbytes < float_bytes
    # 8-bit: 1 byte per element + a float32 scale and bias per group of 32 -> (32 + 8) / 128 of float32
    assert q8.nbytes == float_bytes * (32 + 8) // 128


@pytest.mark.parametrize("bits", [3, 5, 6])
def test_odd_bit_widths_pack_as_mx_quantize_does(bits: int) -> None:
    """3/5/6 bits do not divide 32: the packed width is d * bits / 32, not d / (32 // bits)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from pytest_mlxgate.serving.batch import quantize_batch_cache

    plain = BatchKVCache([0, 1])
    k = mx.random.normal((2, 2, 9, 256))
    plain.update_and_fetch(k, k)
    q = quantize_batch_cache(plain, group_size=64, bits=bits)
    keys, _ = q.update_and_fetch(k[:, :, :1], k[:, :, :1])
    want = mx.quantize(k, group_size=64, bits=bits)
    assert keys[0].shape[-1] == want[0].shape[-1] == 256 * bits // 32
    back = mx.dequantize(*(p[..., :9, :] for p in keys), group_size=64, bits=bits)
    assert float(mx.abs(back - mx.dequantize(*want, group_size=64, bits=bits)).max()) == 0.0


def test_every_arm_of_a_gate_takes_one_loop(tiny_kv_model_dir: Path, tiny_gemma4_dir: Path) -> None:
    """The loop is chosen from both arms' plans: a plan that cannot batch sends its peer along."""
    from pytest_mlxgate.capability.generate import generation_route
    from pytest_mlxgate.serving.batch import PREFILL_STEP

    llama, _ = _load(tiny_kv_model_dir)
    gemma, _ = _load(tiny_gemma4_dir)
    plain, q8, late = parse_kv_value("plain"), parse_kv_value("8"), parse_kv_value("bits=8,start=5000")
    lengths = [20, 30]
    assert generation_route(llama, [plain, q8], lengths) == "batched"
    assert generation_route(llama, [q8, plain], lengths) == "batched"
    assert (
        generation_route(llama, [plain, late], lengths) == generation_route(llama, [late, plain], lengths) == "stream"
    )
    assert generation_route(llama, [plain, q8.fake_quant()], lengths) == "per_layer"
    assert generation_route(gemma, [plain, plain], lengths) == "batched"
    full_only = KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8, 64, 0)}, source="types.json")
    assert generation_route(gemma, [plain, full_only], lengths) == "batched"
    assert generation_route(gemma, [plain, plain], [20, PREFILL_STEP + 2]) == "batch_generate"
    assert generation_route(gemma, [plain, q8], lengths) == generation_route(gemma, [q8, plain], lengths) == "batched"
    assert generation_route(gemma, [plain, q8], [20, PREFILL_STEP + 2]) == "per_layer"


def _tiny_gemma3(window: int = 8) -> Any:
    from tinygemma import tiny_gemma3_model

    return tiny_gemma3_model(window)


def _one_at_a_time(model: Any, ids: list[int], n: int) -> list[int]:
    """mlx_lm's own loop, one prompt, its own RotatingKVCache: the production path."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    return [int(t) for (t, _), _ in zip(generate_step(mx.array(ids), model, max_tokens=n), range(n), strict=False)]


def test_a_sliding_window_batch_is_each_row_alone_through_the_wrap() -> None:
    """Rows of 3 to 20 tokens and 12 new ones with an 8-token window: every row wraps its window inside
    the batch (at a different step), and each is token for token what mlx_lm gives it alone."""
    import random

    from pytest_mlxgate.serving.batch import batchable, greedy_batch

    model = _tiny_gemma3()
    rng = random.Random(0)
    ids = [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 7, 12, 20)]
    plain = parse_kv_value("plain")
    assert batchable(model, plain, [len(x) for x in ids])
    batched = greedy_batch(model, ids, max_new_tokens=12, kv=plain, eos=set())
    assert batched == [_one_at_a_time(model, x, 12) for x in ids]
    # and the window matters here: the same weights attending to everything continue otherwise
    wide = _tiny_gemma3(window=10_000)
    assert all(
        a != b for a, b in zip(greedy_batch(wide, ids, max_new_tokens=12, kv=plain, eos=set()), batched, strict=True)
    )


def test_a_gemma4_batch_with_kv_shared_layers_is_each_row_alone(tiny_gemma4_dir: Path) -> None:
    """gemma-4's KV-shared layers read the batched windows of the layers they share: rows of 3 to 40
    tokens with a 16-token window, token for token what mlx_lm gives each alone."""
    import random

    from pytest_mlxgate.serving.batch import greedy_batch

    model, _ = _load(tiny_gemma4_dir)
    rng = random.Random(0)
    ids = [[rng.randrange(3, 40_000) for _ in range(n)] for n in (3, 7, 12, 40)]
    batched = greedy_batch(model, ids, max_new_tokens=12, kv=parse_kv_value("plain"), eos=set())
    assert batched == [_one_at_a_time(model, x, 12) for x in ids]


def _per_layer_alone(model: Any, ids: list[int], n: int, kv: KVPlan) -> list[int]:
    """The one-prompt-at-a-time loop with the plan's caches (`QuantizedRotatingKVCache` for a quantized
    window): what a gate ran for such plans before they batched."""
    import mlx.core as mx

    cache = kv.make_cache(model)
    model(mx.array(ids)[None, :-1], cache=cache)
    kv.maybe_quantize(cache)
    token, out = ids[-1], []
    for _ in range(n):
        logits = model(mx.array([[token]]), cache=cache)[0, -1]
        kv.maybe_quantize(cache)
        token = int(mx.argmax(logits).item())
        out.append(token)
    return out


SLIDING_PLANS = {
    "uniform 8-bit g32": parse_kv_value("bits=8,group_size=32,start=0"),
    "uniform 4-bit g32": parse_kv_value("bits=4,group_size=32,start=0"),
    "windows 4-bit, full plain": KVPlan(
        default=None, layers={}, types={"sliding_attention": KVSpec(4, 32, 0)}, source="types.json"
    ),
    "from token 2": parse_kv_value("bits=4,group_size=32,start=2"),
}


@pytest.mark.parametrize("name", list(SLIDING_PLANS))
def test_a_quantized_sliding_window_batch_is_each_row_alone_through_the_wrap(name: str) -> None:
    """Rows of 3 to 20 tokens, 12 new ones, an 8-token window quantized: every row wraps inside the
    batch at its own step, and each is token for token the quantized one-at-a-time loop's."""
    import random

    from pytest_mlxgate.serving.batch import batchable, greedy_batch

    model, kv = _tiny_gemma3(), SLIDING_PLANS[name]
    rng = random.Random(0)
    ids = [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 7, 12, 20)]
    assert batchable(model, kv, [len(x) for x in ids])
    assert greedy_batch(model, ids, max_new_tokens=12, kv=kv, eos=set()) == [
        _per_layer_alone(model, x, 12, kv) for x in ids
    ]


def test_the_batched_loop_quantizes_the_windows_it_is_told_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantized windows are really there (and the plain ones are not): the caches each decode
    step reads, by layer, for a plan that quantizes only the sliding layers."""
    import random

    from pytest_mlxgate.serving import batch

    seen: list[list[str]] = []
    real = batch._quantized_twin

    def spy(cache: Any, kv: KVPlan, layer: int, padding: list[int]) -> Any:
        out = real(cache, kv, layer, padding)
        if layer == 0:
            seen.append([])
        seen[-1].append(type(out).__name__)
        return out

    monkeypatch.setattr(batch, "_quantized_twin", spy)
    model = _tiny_gemma3()
    rng = random.Random(1)
    ids = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 11)]
    batch.greedy_batch(model, ids, max_new_tokens=3, kv=SLIDING_PLANS["windows 4-bit, full plain"], eos=set())
    assert seen and all(step == ["BatchQuantizedRotatingKVCache", "BatchKVCache"] * 2 for step in seen), seen


def test_a_gemma4_batch_with_a_quantized_plan_is_each_row_alone(tiny_gemma4_dir: Path) -> None:
    """gemma-4's KV-shared layers read their source's quantized K/V in a batch too (they once got none
    of its quantization and raised a TypeError from inside mlx_lm): full layers 8-bit, and a uniform
    4-bit plan over windows and full layers, each row token for token the one-at-a-time loop's."""
    import random

    from pytest_mlxgate.serving.batch import batchable, greedy_batch

    model, _ = _load(tiny_gemma4_dir)
    rng = random.Random(0)
    ids = [[rng.randrange(3, 40_000) for _ in range(n)] for n in (3, 7, 12, 40)]
    for kv in (
        KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8, 64, 0)}, source="types.json"),
        parse_kv_value("4"),
    ):
        assert batchable(model, kv, [len(x) for x in ids])
        assert greedy_batch(model, ids, max_new_tokens=8, kv=kv, eos=set()) == [
            _per_layer_alone(model, x, 8, kv) for x in ids
        ], kv.describe()


def test_a_plan_quantizing_a_window_late_runs_one_prompt_at_a_time() -> None:
    """A window quantized after the shortest prompt's prefill would quantize rows at different calls:
    that plan is left to the one-at-a-time loop."""
    from pytest_mlxgate.serving.batch import batchable

    model = _tiny_gemma3()
    assert batchable(model, parse_kv_value("bits=8,group_size=32,start=9"), [10, 20])
    assert not batchable(model, parse_kv_value("bits=8,group_size=32,start=10"), [10, 20])
    late = KVPlan(default=None, layers={0: KVSpec(8, 32, 15)}, types={}, source="l.json")
    assert not batchable(model, late, [10, 20])
    assert batchable(model, late, [16, 20])
