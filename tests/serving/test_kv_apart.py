"""Keys and values at their own widths (K8/V4 plans): the spec's forms, the attention that reads each
operand's width, every quantized cache storing each half at its width, and whole models served by such
plans against the same plan in float (fake-quant), on gemma-4 (sliding, full, KV-shared) and a llama."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from decode_kl import decode_kls, load
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import LeverError
from pytest_mlxgate.serving.kv_plan import KV_BITS, KV_GROUP_SIZES, KVSpec, parse_kv_value

SPECS = st.builds(
    KVSpec,
    bits=st.sampled_from(KV_BITS),
    group_size=st.sampled_from(KV_GROUP_SIZES),
    start=st.integers(0, 300),
    value_bits=st.none() | st.sampled_from(KV_BITS),
)


@settings(max_examples=60, deadline=None)
@given(spec=SPECS)
def test_a_spec_reads_back_from_its_canonical_text_and_its_json(spec: KVSpec) -> None:
    """Both written forms of any spec parse back to it (what a plan file and a record carry); equal widths
    are one `bits`, so the text of a K/V-alike spec is the one existing plans have always written."""
    assert parse_kv_value(spec.canonical).default == spec
    assert parse_kv_value(spec.to_json()).default == spec
    assert spec.apart == (spec.k_bits != spec.v_bits)
    assert ("k_bits" in spec.canonical) == spec.apart and ("bits" in spec.to_json()) == (not spec.apart)


@pytest.mark.parametrize(
    ("value", "k_bits", "v_bits", "group"),
    [
        ("K8V4", 8, 4, 64),
        ("k8/v4", 8, 4, 64),
        ("k4v2", 4, 2, 64),
        ("k_bits=8,v_bits=4,group_size=32", 8, 4, 32),
        ({"k_bits": 6, "v_bits": 3}, 6, 3, 64),
        ({"bits": 8, "v_bits": 4}, 8, 4, 64),  # v_bits over bits for its half
        ({"bits": 4, "k_bits": 8}, 8, 4, 64),
        ({"k_bits": 8, "v_bits": 8}, 8, 8, 64),  # equal: one width
    ],
)
def test_keys_and_values_apart_in_every_value_form(value: Any, k_bits: int, v_bits: int, group: int) -> None:
    spec = parse_kv_value(value).default
    assert spec is not None and (spec.k_bits, spec.v_bits, spec.group_size) == (k_bits, v_bits, group)
    assert spec.apart == (k_bits != v_bits)
    assert spec.label() == (f"K{k_bits}/V{v_bits}" if k_bits != v_bits else f"{k_bits}-bit") + f" g{group} from token 0"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        # the one missing, by name, and a spec that works
        ({"v_bits": 4}, "lacks 'k_bits' (the keys' width); a valid spec: {'bits': 8, 'group_size': 64}"),
        ({"k_bits": 8}, "lacks 'v_bits' (the values' width); a valid spec: {'bits': 8, 'group_size': 64}"),
        ({"k_bits": 8, "v_bits": None}, "lacks 'v_bits' (the values' width)"),
        ({"group_size": 64}, "lacks 'bits'; a valid spec"),
        ({"bits": 8, "k_bits": 8, "v_bits": 4}, "bits would go unread"),
        ({"k_bits": 8, "v_bits": 7}, "v_bits=7 is not supported"),
        ("K9V4", "k_bits=9 is not supported"),
        ({"k_bits": 8, "v_bits": 4, "kv": 1}, "unknown keys ['kv']"),
    ],
)
def test_a_half_given_wrong_is_refused_by_name(value: Any, fragment: str) -> None:
    with pytest.raises(LeverError) as e:
        parse_kv_value(value)
    assert fragment in str(e.value)


def test_a_kv_config_gives_keys_and_values_apart_per_type_and_layer(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.write_text(json.dumps({"types": {"sliding": {"k_bits": 8, "v_bits": 4}, "full": 8}, "layers": {"2": "x"}}))
    with pytest.raises(LeverError, match="'layers'.'2'"):
        parse_kv_value(path)
    path.write_text(json.dumps({"types": {"sliding": {"k_bits": 8, "v_bits": 4}, "full": 8}, "layers": {"2": None}}))
    plan = parse_kv_value(path)
    assert plan.for_layer(0, "sliding_attention") == KVSpec(8, value_bits=4)
    assert plan.for_layer(1, "full_attention") == KVSpec(8) and plan.for_layer(2, "sliding_attention") is None
    assert plan.apart and not parse_kv_value("8").apart
    assert "K8/V4" in plan.describe()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(KV_BITS), group=st.sampled_from(KV_GROUP_SIZES), groups=st.integers(1, 4))
def test_the_width_is_read_back_from_the_packed_parts(bits: int, group: int, groups: int) -> None:
    import mlx.core as mx

    from pytest_mlxgate.serving.attention import packed_width

    parts = mx.quantize(mx.random.normal((1, 2, 3, group * groups)), group_size=group, bits=bits)
    assert packed_width((parts[0], parts[1], parts[2]), group) == bits
    with pytest.raises(LeverError, match="mx.quantize never makes"):  # the scales read as the packed words
        packed_width((parts[1], parts[1], parts[2]), group)


@settings(max_examples=30, deadline=None)
@given(
    k_bits=st.sampled_from(KV_BITS),
    v_bits=st.sampled_from(KV_BITS),
    group=st.sampled_from([32, 64]),
    heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
    queries=st.integers(1, 5),
    mask=st.sampled_from(["none", "causal", "bool", "additive", "additive 3-D", "bool 4-D"]),
    v_dim=st.sampled_from([64, 128]),
)
@example(k_bits=8, v_bits=4, group=64, heads=(2, 2), queries=2, mask="causal", v_dim=64)  # a head per K/V head
@example(k_bits=8, v_bits=4, group=64, heads=(4, 2), queries=3, mask="additive 3-D", v_dim=64)
@example(k_bits=4, v_bits=4, group=32, heads=(4, 2), queries=2, mask="additive 3-D", v_dim=64)
@example(k_bits=8, v_bits=4, group=64, heads=(4, 1), queries=3, mask="bool 4-D", v_dim=128)
def test_the_width_reading_attention_is_attention_over_what_each_half_holds(
    k_bits: int, v_bits: int, group: int, heads: tuple[int, int], queries: int, mask: str, v_dim: int
) -> None:
    """Against the float kernel over the dequantized keys and values (what the quantized ones hold), for
    any two widths, grouped-query heads, every mask form and a value head dim of its own: the same
    attention within float rounding; with one width, exactly mlx_lm's own quantized attention."""
    import mlx.core as mx
    from mlx_lm.models import base

    from pytest_mlxgate.serving.attention import _ONE_WIDTH, width_reading_attention

    # one width goes to mlx_lm's own function, which reshapes its output to the queries' head dim
    assume(k_bits != v_bits or v_dim == 64)
    q_heads, kv_heads = heads
    keys_n = queries + 7
    mx.random.seed(k_bits * 100 + v_bits * 10 + queries)
    q = mx.random.normal((1, q_heads, queries, 64))
    k, v = mx.random.normal((1, kv_heads, keys_n, 64)), mx.random.normal((1, kv_heads, keys_n, v_dim))
    qk, qv = mx.quantize(k, group_size=group, bits=k_bits), mx.quantize(v, group_size=group, bits=v_bits)
    masks: dict[str, Any] = {
        "none": None,
        "causal": "causal",
        "bool": mx.random.uniform(shape=(queries, keys_n)) > 0.3,
        "additive": mx.random.normal((queries, keys_n)),
    }
    if mask == "bool":
        masks["bool"][:, 0] = True  # every query sees some key
    # mlx_lm's quantized attention reads a 3-D mask per repeat of a key head (a 4-D one per batch row): the
    # float reference gets the same mask laid out per query head
    repeats = q_heads // kv_heads
    masks["additive 3-D"] = mx.random.normal((repeats, queries, keys_n))
    masks["bool 4-D"] = (mx.random.uniform(shape=(1, 1, queries, keys_n)) > 0.3) | (mx.arange(keys_n) == 0)
    as_float = {"additive 3-D": mx.tile(masks["additive 3-D"], (kv_heads, 1, 1))[None]}
    # each call gets its own queries: mlx_lm's quantized attention scales them in place (`queries *= scale`)
    got = width_reading_attention(
        mx.array(q), tuple(qk), tuple(qv), scale=0.125, mask=masks[mask], group_size=group, bits=0
    )
    dk, dv = mx.dequantize(*qk, group_size=group, bits=k_bits), mx.dequantize(*qv, group_size=group, bits=v_bits)
    want = base.scaled_dot_product_attention(
        mx.array(q), dk, dv, cache=None, scale=0.125, mask=as_float.get(mask, masks[mask])
    )
    assert got.shape == want.shape == (1, q_heads, queries, v_dim)
    assert float(mx.abs(got - want).max()) < 1e-3
    if k_bits == v_bits:
        theirs = _ONE_WIDTH(mx.array(q), qk, qv, scale=0.125, mask=masks[mask], group_size=group, bits=k_bits)
        assert bool(mx.array_equal(got, theirs))


@settings(max_examples=20, deadline=None)
@given(
    bits=st.sampled_from(KV_BITS),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
    heads=st.sampled_from([(2, 2), (4, 2)]),
    mask=st.sampled_from([None, "causal"]),
)
@example(bits=8, dtype="bfloat16", heads=(4, 2), mask="causal")
def test_the_attention_apart_at_one_width_is_mlx_lms_own_in_every_precision(
    bits: int, dtype: str, heads: tuple[int, int], mask: str | None
) -> None:
    """Its steps are mlx_lm's (scale, scores, mask, a softmax computed in float32 whatever the inputs'
    precision, values): given one width, the same bits as mlx_lm's own attention, in bfloat16 and float16
    too, where a softmax in the inputs' precision would round otherwise."""
    import mlx.core as mx

    from pytest_mlxgate.serving.attention import _ONE_WIDTH, _attention_apart

    mx.random.seed(bits)
    kind = getattr(mx, dtype)
    q = mx.random.normal((1, heads[0], 3, 64)).astype(kind)
    k = (mx.random.normal((1, heads[1], 10, 64)) * 3).astype(kind)
    v = mx.random.normal((1, heads[1], 10, 64)).astype(kind)
    qk, qv = mx.quantize(k, group_size=64, bits=bits), mx.quantize(v, group_size=64, bits=bits)
    ours = _attention_apart(mx.array(q), tuple(qk), tuple(qv), 0.125, mask, 64, bits, bits)
    theirs = _ONE_WIDTH(mx.array(q), qk, qv, scale=0.125, mask=mask, group_size=64, bits=bits)
    assert ours.dtype == theirs.dtype == kind and bool(mx.array_equal(ours, theirs))


def test_a_foreign_quantized_attention_is_refused_not_read_at_one_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Something else in mlx_lm's place (a lever's own kernel) would read both halves at one width: a
    cache apart refuses to be made, naming the function."""
    from mlx_lm.models import base

    from pytest_mlxgate.serving.caches import QuantizedApartKVCache

    def custom_kernel(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("never called")

    monkeypatch.setattr(base, "quantized_scaled_dot_product_attention", custom_kernel)
    with pytest.raises(LeverError, match="custom_kernel.*k_bits != v_bits"):
        QuantizedApartKVCache(64, 8, 4)
    QuantizedApartKVCache(64, 8, 8)  # one width: nothing to read, nothing refused
    # a kernel that is no function (a partial, a callable object): named by what it is, never an AttributeError
    monkeypatch.setattr(base, "quantized_scaled_dot_product_attention", functools.partial(custom_kernel, 1))
    with pytest.raises(LeverError, match=r"functools.partial\(<function .*custom_kernel.*k_bits != v_bits"):
        QuantizedApartKVCache(64, 8, 4)


def _rounded(x: Any, group: int, bits: int) -> Any:
    import mlx.core as mx

    return mx.dequantize(*mx.quantize(x, group_size=group, bits=bits), group_size=group, bits=bits)


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["full", "rotating", "batch", "batch_rotating"]),
    k_bits=st.sampled_from(KV_BITS),
    v_bits=st.sampled_from(KV_BITS),
    steps=st.lists(st.one_of(st.just(1), st.integers(2, 9)), min_size=2, max_size=12),
    convert_after=st.integers(1, 2),
)
def test_every_quantized_cache_stores_each_half_at_its_width(
    kind: str, k_bits: int, v_bits: int, steps: list[int], convert_after: int
) -> None:
    """Converted from the float cache after some updates, then fed prefill chunks and single steps: each
    cache (full, sliding window, and both batched) holds keys rounded at `k_bits` and values at `v_bits`,
    what its float twin holds when fed those rounded values from the start, at the same positions
    (rounding is per row, position and group, so converting what was held rounds it the same way)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache

    from pytest_mlxgate.serving.batch import BatchQuantizedRotatingKVCache, quantize_batch_cache
    from pytest_mlxgate.serving.caches import quantize_cache

    g = 32
    make: dict[str, Any] = {
        "full": KVCache,
        "rotating": lambda: RotatingKVCache(8),
        "batch": lambda: BatchKVCache([0, 2]),
        "batch_rotating": lambda: BatchRotatingKVCache(8, [0, 2]),
    }
    convert: dict[str, Any] = {
        "full": quantize_cache,
        "rotating": quantize_cache,
        "batch": quantize_batch_cache,
        "batch_rotating": BatchQuantizedRotatingKVCache.from_cache,
    }
    rows = 2 if kind.startswith("batch") else 1
    real, twin = make[kind](), make[kind]()
    mx.random.seed(len(steps) + k_bits)
    for n, step in enumerate(steps):
        if n == convert_after:
            real = convert[kind](real, group_size=g, bits=k_bits, value_bits=v_bits)
            assert (real.bits, getattr(real, "value_bits", real.bits)) == (k_bits, v_bits)  # one width: mlx_lm's
        k, v = mx.random.normal((rows, 2, step, 64)), mx.random.normal((rows, 2, step, 64))
        held_k, held_v = real.update_and_fetch(k, v)
        want_k, want_v = twin.update_and_fetch(_rounded(k, g, k_bits), _rounded(v, g, v_bits))
        if n < convert_after:
            continue
        got_k = mx.dequantize(*held_k, group_size=g, bits=k_bits)
        got_v = mx.dequantize(*held_v, group_size=g, bits=v_bits)
        assert got_k.shape == want_k.shape and got_v.shape == want_v.shape
        assert float(mx.abs(got_k - want_k).max()) < 1e-5 and float(mx.abs(got_v - want_v).max()) < 1e-5


PLANS = {
    "K8V4": "K8V4",
    "K4V8": "k_bits=4,v_bits=8",
    "types": {"types": {"sliding": {"k_bits": 8, "v_bits": 4}, "full": {"k_bits": 6, "v_bits": 3}}, "layers": {"1": 8}},
}


def _plan(value: Any, tmp_path: Path) -> Any:
    if isinstance(value, dict):
        path = tmp_path / "kv_config.json"
        path.write_text(json.dumps(value))
        return parse_kv_value(path)
    return parse_kv_value(value)


@pytest.mark.parametrize(
    ("fixture", "value"),
    [
        (f, v)
        for f in ("tiny_gemma4_dir", "tiny_kv_model_dir")
        for v in PLANS
        if (f, v) != ("tiny_kv_model_dir", "types")
    ],
)  # the llama has no sliding layers for the per-type plan
def test_plans_apart_serve_and_only_the_kernels_differ_from_fake_quant(
    fixture: str, value: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """gemma-4 (sliding and full layers quantized, KV-shared layers reading them) and a llama: a plan with
    keys and values apart, decoding, is within KL 1e-6 of the same plan in float at every step, and neither
    the plain cache nor either half's width for both (the values' width is not silently the keys')."""
    model, tok = load(request.getfixturevalue(fixture))
    plan = _plan(PLANS[value], tmp_path)
    assert max(decode_kls(model, tok, plan, plan.fake_quant())) <= 1e-6
    assert max(decode_kls(model, tok, plan, parse_kv_value("plain"))) > 1e-5
    if value != "types":
        spec = plan.default
        for one in (spec.k_bits, spec.v_bits):
            same = parse_kv_value(one)
            assert max(decode_kls(model, tok, plan, same.fake_quant())) > 1e-6, f"{value} served as {one}-bit"


def test_a_plan_apart_is_sized_by_what_each_half_holds(tiny_gemma4_dir: Path) -> None:
    """The memory gate's bytes (`cache_bytes`) of a K8/V4 plan are the 8-bit plan's less half the values'
    packed bytes: the values are held at 4 bits, the keys, scales and biases as before."""
    import mlx.core as mx

    from pytest_mlxgate.speed.measure import cache_bytes

    model, tok = load(tiny_gemma4_dir)
    ids = mx.array([list(tok.encode(" ".join(["word"] * 30)))])

    def served(value: str) -> list[Any]:
        plan = parse_kv_value(value)
        cache = plan.make_cache(model)
        plan.forward(model, ids, cache)
        mx.eval([c.state for c in cache])
        return cache

    eight, apart = served("8"), served("K8V4")
    packed_values = sum(int(c.values[0].nbytes) for c in eight if hasattr(c, "bits") and hasattr(c, "values"))
    assert packed_values > 0
    assert cache_bytes(apart) == cache_bytes(eight) - packed_values // 2


def test_the_batched_loop_and_one_prompt_at_a_time_agree_on_a_plan_apart(tiny_gemma4_dir: Path) -> None:
    """The capability loops: batched greedy decoding through the batched caches apart gives the tokens the
    project's one-prompt loop gives (route `batched` against `per_layer`), and mlx_lm's own `kv_bits`
    route is never taken for a plan it cannot express."""
    from pytest_mlxgate.capability.generate import _per_layer, generate_greedy, generation_route

    model, tok = load(tiny_gemma4_dir)
    plan = parse_kv_value("K8V4")
    prompts = ["The quick brown fox jumps over the lazy dog", "One two three four five six seven"]
    ids = [list(tok.encode(p)) for p in prompts]
    assert generation_route(model, [plan], [len(x) for x in ids]) == "batched"
    batched = generate_greedy(model, tok, prompts, max_new_tokens=6, kv=plan)
    alone = [_per_layer(model, tok, x, 6, plan) for x in ids]
    assert batched == alone


def test_mlx_lms_own_route_is_not_taken_for_a_plan_apart(tiny_kv_model_dir: Path) -> None:
    """mlx_lm's `stream_generate(kv_bits=...)` has one width: a uniform plan apart takes the project's loop."""
    from pytest_mlxgate.capability.generate import generation_route

    model, _ = load(tiny_kv_model_dir)
    late = {"start": 40, "group_size": 64}
    lengths = [5, 9]
    one, apart = parse_kv_value({"bits": 8, **late}), parse_kv_value({"k_bits": 8, "v_bits": 4, **late})
    assert generation_route(model, [one], lengths) == "stream"
    assert generation_route(model, [apart], lengths) == "per_layer"
