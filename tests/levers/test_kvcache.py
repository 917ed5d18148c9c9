"""KV cache plans: parsing every value form, kv_config.json validation, and real mlx_lm caches."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import LeverError, VacuousLeverError
from pytest_mlxgate.serving.kv_plan import PLAIN, KVPlan, KVSpec, parse_kv_value, require_kv_difference

# --- parsing inline values ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "plain", "none", "PLAIN", " plain "])
def test_plain_values(value: object) -> None:
    plan = parse_kv_value(value)
    assert plan.is_plain and plan.source == "plain" and plan.describe() == "plain"
    assert plan.for_layer(0) is None and plan.for_layer(99) is None


@pytest.mark.parametrize(
    "value",
    [
        8,
        "8",
        "q8",
        "Q8",
        "8bit",
        "8-bit",
        "bits=8",
        "bits=8,group_size=64,start=0",
        " bits = 8 , start = 0 ",
        {"bits": 8},
        {"bits": 8, "group_size": 64, "start": 0},
    ],
)
def test_uniform_8bit_forms_agree(value: object) -> None:
    plan = parse_kv_value(value)
    assert plan.default == KVSpec(bits=8, group_size=64, start=0)
    assert plan.source == "bits=8,group_size=64,start=0"
    assert plan.describe() == "8-bit g64 from token 0"
    assert not plan.is_plain and plan.digest is None and not plan.layers


def test_uniform_with_group_and_start() -> None:
    plan = parse_kv_value("bits=4,group_size=32,start=128")
    assert plan.for_layer(5) == KVSpec(4, 32, 128)
    assert plan.describe() == "4-bit g32 from token 128"
    assert parse_kv_value(plan.source) == plan  # source is canonical: it reads back


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (7, "bits=7 is not supported"),
        ("q7", "bits=7 is not supported"),
        ({"bits": 8, "group_size": 16}, "group_size=16 is not supported"),
        ("bits=4,start=-1", "start=-1"),
        ({"bits": 4, "groups": 64}, "unknown keys ['groups']"),
        ({"group_size": 64}, "lacks 'bits'"),
        ("bits=eight", "is not an integer"),
        ("bits=4,bits=8", "sets 'bits' twice"),
        ("fast", "cannot read 'fast' as key=value"),
        (True, "is a bool"),
        (8.0, "KV value 8.0 (float) is not a KV setting"),
        ({"bits": True}, "bits=True is not supported"),
    ],
)
def test_bad_inline_values(value: object, fragment: str) -> None:
    with pytest.raises(LeverError, match="KV value") as info:
        parse_kv_value(value)
    assert fragment in str(info.value)


def test_kvspec_validates_when_built_directly() -> None:
    with pytest.raises(LeverError, match="bits=9"):
        KVSpec(bits=9)


# --- kv_config.json -----------------------------------------------------------------------------


def _write(path: Path, config: object) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_config_with_layer_object(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "kv_config.json",
        {
            "default": {"bits": 8, "group_size": 64},
            "quantized_kv_start": 16,
            "layers": {"0": {"bits": 4, "group_size": 32}, "3": None, "5": {"bits": 6, "start": 0}},
        },
    )
    plan = parse_kv_value(str(path))
    assert plan.for_layer(0) == KVSpec(4, 32, 16)  # inherits quantized_kv_start
    assert plan.for_layer(3) is None
    assert plan.for_layer(5) == KVSpec(6, 64, 0)  # its own start wins
    assert plan.for_layer(1) == plan.for_layer(42) == KVSpec(8, 64, 16)
    assert plan.source.startswith("kv_config.json sha256:") and len(plan.source.split(":")[1]) == 16
    assert plan.digest is not None and plan.source.endswith(plan.digest[:16])
    assert plan.describe().startswith("kv_config.json (default 8-bit g64 from token 16; 3 overridden")


def test_config_with_layer_list_describes_counts(tmp_path: Path) -> None:
    layers: list[object] = [4] * 10 + [{"bits": 8}] * 20
    plan = parse_kv_value(_write(tmp_path / "kv_config.json", {"layers": layers}))  # a Path works too
    assert plan.n_layers == 30 and plan.default is None
    assert plan.describe() == "kv_config.json (30 layers: 4-bit ×10, 8-bit ×20)"
    assert plan.fake_quant().describe() == "fake-quant kv_config.json (30 layers: 4-bit ×10, 8-bit ×20)"
    assert parse_kv_value("4").fake_quant().describe() == "fake-quant 4-bit g64 from token 0"
    plan.check_model(30)
    plan.check_model(40)  # extra layers take the default (plain)
    assert plan.for_layer(35) is None
    with pytest.raises(LeverError, match=r"configures 30 layers, but the model has 24 layers"):
        plan.check_model(24)


def test_a_plan_by_attention_type_describes_each_type_by_its_short_name(tmp_path: Path) -> None:
    plan = parse_kv_value(_write(tmp_path / "types.json", {"default": 8, "types": {"sliding": 4, "full_attention": 8}}))
    assert (
        plan.describe()
        == "types.json (default 8-bit g64 from token 0; sliding 4-bit g64 from token 0; full 8-bit g64 from token 0)"
    )


def test_config_layer_list_with_nulls_and_starts(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.json", {"default": 8, "layers": [None, {"bits": 2, "group_size": 128, "start": 3}]})
    plan = parse_kv_value(path)
    assert [plan.for_layer(i) for i in range(3)] == [None, KVSpec(2, 128, 3), KVSpec(8, 64, 0)]
    assert plan.describe() == "c.json (2 layers: plain ×1, 2-bit g128 from 3 ×1)"


def test_check_model_names_layers_beyond(tmp_path: Path) -> None:
    plan = parse_kv_value(_write(tmp_path / "kv.json", {"layers": {"2": 4, "40": 4}}))
    plan.check_model(41)
    with pytest.raises(LeverError, match=r"layers \[40\].*model has 24 layers") as info:
        plan.check_model(24)
    assert "kv.json" in str(info.value)
    with pytest.raises(LeverError, match=r"layers \[40\].*model has 40 layers \(0\.\.39\)"):
        plan.check_model(40)  # layer indices count from 0: a 40-layer model has no layer 40


def test_relative_config_path_uses_base_dir(tmp_path: Path) -> None:
    _write(tmp_path / "kv_config.json", {"default": 4})
    assert parse_kv_value("kv_config.json", base_dir=tmp_path).default == KVSpec(4)


def test_digest_follows_file_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path / "kv_config.json", {"default": 4})
    first = parse_kv_value(path)
    assert parse_kv_value(path).digest == first.digest  # stable
    _write(path, {"default": 8})
    assert parse_kv_value(path).digest != first.digest


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ([1, 2], "must hold a JSON object"),
        ({"default": 8, "layer": {}}, "unknown keys ['layer']"),
        ({"quantized_kv_start": -4}, "key 'quantized_kv_start': start=-4"),
        ({"default": {"bits": 7}}, "key 'default': bits=7"),
        ({"default": "8"}, "key 'default' is '8'"),
        ({"layers": {"x": 4}}, "names layer 'x'"),
        ({"layers": {"3": {"bits": 4, "group_size": 48}}}, "key 'layers'.'3': group_size=48"),
        ({"layers": [4, {"bit": 4}]}, "key 'layers'[1] has unknown keys ['bit']"),
        ({"layers": 4}, "key 'layers' is int"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, config: object, fragment: str) -> None:
    path = tmp_path / "broken_kv.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(LeverError) as info:
        parse_kv_value(str(path))
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(LeverError, match="cannot read kv_config .*nope.json"):
        parse_kv_value(str(tmp_path / "nope.json"))


# --- real mlx_lm caches -------------------------------------------------------------------------


def tiny_llama(n_layers: int = 3, seed: int = 0) -> Any:
    """A random mlx_lm llama small enough for CPU tests; head_dim 64 so every group size fits."""
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=n_layers,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rms_norm_eps=1e-5,
            vocab_size=256,
        )
    )
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama()


def _tokens(n: int, seed: int = 1) -> Any:
    import mlx.core as mx

    return mx.array(np.random.default_rng(seed).integers(0, 256, n), dtype=mx.int32)[None]


def _serve(
    model: Any, plan: KVPlan, prefix: int = 16, decode: int = 8, step: Any = None
) -> tuple[np.ndarray, list[Any]]:
    """Prefix through the cache, then one token per call: what the serving path does."""
    import mlx.core as mx

    step = step or plan.maybe_quantize
    x = _tokens(prefix + decode)
    cache = plan.make_cache(model)
    model(x[:, :prefix], cache=cache)
    step(cache)
    mx.eval([c.state for c in cache])
    rows = []
    for pos in range(prefix, prefix + decode):
        out = model(x[:, pos : pos + 1], cache=cache)
        step(cache)
        rows.append(np.array(out[0, -1].astype(mx.float32)))
    return np.stack(rows), cache


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    return np.asarray((np.exp(lp) * (lp - lq)).sum(-1))


def test_maybe_quantize_per_layer_specs(model: Any, tmp_path: Path) -> None:
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    plan = parse_kv_value(
        _write(
            tmp_path / "kv.json",
            {
                "default": {"bits": 8, "group_size": 64},
                "layers": {"0": {"bits": 4, "group_size": 32}, "2": None},
            },
        )
    )
    _, cache = _serve(model, plan, prefix=5, decode=2)
    assert isinstance(cache[0], QuantizedKVCache) and (cache[0].bits, cache[0].group_size) == (4, 32)
    assert isinstance(cache[1], QuantizedKVCache) and (cache[1].bits, cache[1].group_size) == (8, 64)
    assert type(cache[2]) is KVCache
    assert [c.offset for c in cache] == [7, 7, 7]


def test_start_defers_quantization(model: Any) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    plan = parse_kv_value("bits=8,start=8")
    cache = plan.make_cache(model)
    x = _tokens(10)
    model(x[:, :6], cache=cache)
    plan.maybe_quantize(cache)
    assert all(type(c) is KVCache for c in cache)  # offset 6 < start 8
    for pos in (6, 7):
        model(x[:, pos : pos + 1], cache=cache)
        plan.maybe_quantize(cache)
    mx.eval([c.state for c in cache])
    assert all(isinstance(c, QuantizedKVCache) and c.offset == 8 for c in cache)


def test_plain_plan_leaves_caches_alone(model: Any) -> None:
    from mlx_lm.models.cache import KVCache

    _, cache = _serve(model, PLAIN, prefix=4, decode=1)
    assert all(type(c) is KVCache for c in cache)


def test_uniform_plan_matches_mlx_lm_exactly(model: Any) -> None:
    """A uniform plan is mlx_lm's own --kv-bits path, bit for bit."""
    from mlx_lm.generate import maybe_quantize_kv_cache

    plan = parse_kv_value("bits=4,start=10")
    ours, _ = _serve(model, plan)
    theirs, _ = _serve(model, PLAIN, step=lambda c: maybe_quantize_kv_cache(c, 10, 64, 4))
    np.testing.assert_array_equal(ours, theirs)


def test_quantized_decode_is_close_but_not_identical(model: Any) -> None:
    plain, _ = _serve(model, PLAIN)
    q8, _ = _serve(model, parse_kv_value(8))
    q4, _ = _serve(model, parse_kv_value(4))
    assert np.isfinite(plain).all() and np.isfinite(q4).all()
    # Measured on this model: KL ≈ 5e-6 (8-bit) and ≈ 1e-3 (4-bit); 2-bit reaches ≈ 2e-2.
    kl8, kl4 = _kl(plain, q8).max(), _kl(plain, q4).max()
    assert kl8 < 1e-4 and kl4 < 1e-2
    assert kl4 > kl8 > 0
    assert not np.array_equal(plain, q4)
    assert np.abs(q4 - plain).max() < 0.1 * np.abs(plain).max()


def test_make_cache_refuses_plan_for_more_layers(model: Any, tmp_path: Path) -> None:
    plan = parse_kv_value(_write(tmp_path / "kv.json", {"layers": [8, 8, 8, 8]}))
    with pytest.raises(LeverError, match="model has 3 layers"):
        plan.make_cache(model)


# --- what a plan quantizes within a length, and what it refuses ---------------------------------

_specs = st.none() | st.builds(
    KVSpec, bits=st.sampled_from([4, 8]), group_size=st.sampled_from([32, 64]), start=st.integers(0, 12)
)


def _replaced_after(model: Any, plan: KVPlan, positions: int) -> dict[int, Any]:
    """The oracle: the caches `maybe_quantize` replaces once the first positions - 1 tokens are in,
    so the forward at the last position reads them quantized."""
    cache = plan.make_cache(model)
    before = list(cache)
    model(_tokens(positions - 1), cache=cache)
    plan.maybe_quantize(cache)
    return {i: c for i, (old, c) in enumerate(zip(before, cache, strict=True)) if c is not old}


@settings(max_examples=40, deadline=None)
@given(
    default=_specs,
    layers=st.dictionaries(st.integers(0, 2), _specs, max_size=3),
    types=st.dictionaries(st.just("full_attention"), _specs, max_size=1),
    fake=st.booleans(),
    positions=st.integers(2, 15),
)
def test_quantized_within_names_the_layers_the_serving_path_quantizes(
    model: Any,
    default: KVSpec | None,
    layers: dict[int, KVSpec | None],
    types: dict[str, KVSpec | None],
    fake: bool,
    positions: int,
) -> None:
    """Per-layer specs over per-type specs over the default, each from its own start: the layers (and
    their bits and group size) are those the plan's own caches turn quantized within `positions`."""
    plan = KVPlan(default=default, layers=layers, types=types, source="test", fake=fake)
    within = plan.quantized_within(model, positions)
    replaced = _replaced_after(model, plan, positions)
    assert set(within) == set(replaced)
    for i, c in replaced.items():
        spec = plan.for_layer(i, "full_attention")
        assert spec is not None
        assert within[i] == f"{spec.bits}-bit g{spec.group_size}" + ("-fake" if fake else "")
        if not fake:  # a real quantized cache carries its own bits and group size
            assert (c.bits, c.group_size) == (spec.bits, spec.group_size)


def test_check_caches_lists_every_problem_of_the_plan(model: Any) -> None:
    """Each problem once, in order, joined by '; ', then where the format is described."""
    from mlx_lm.models.cache import make_prompt_cache

    plan = KVPlan(default=None, layers={1: KVSpec(8)}, types={"sliding_attention": KVSpec(4)}, source="two.json")
    with pytest.raises(LeverError) as info:
        plan.check_caches(make_prompt_cache(model), {1: 0}, n_layers=3, head_dims={})
    head, _, rest = str(info.value).partition(": ")
    assert head == "KV plan two.json cannot run on this model"
    assert rest.endswith(" (kv_config.json format: see pytest_mlxgate.serving.kv_plan)")
    problems = rest.removesuffix(" (kv_config.json format: see pytest_mlxgate.serving.kv_plan)").split("; ")
    assert problems == [
        (
            "layers [1] are KV-shared and keep no cache (1 reads layer 0): quantize their source layers instead, "
            "and set these to null"
        ),
        "it sets attention types ['sliding_attention'], but the model's cached layers are ['full_attention']",
    ]


@pytest.mark.parametrize("start", [True, False, 1.5, "3", None, -1])
def test_a_start_that_is_no_token_count_is_refused(start: object) -> None:
    with pytest.raises(LeverError, match=rf"^KV spec: start={start!r} must be a token count >= 0"):
        KVSpec(bits=8, start=start)  # type: ignore[arg-type]
    with pytest.raises(LeverError, match=r"start=.* must be a token count >= 0"):
        parse_kv_value({"bits": 8, "start": start})


@pytest.mark.parametrize(("field", "value"), [("bits", 7), ("group_size", 48), ("group_size", True)])
def test_a_spec_built_directly_names_itself_and_the_field(field: str, value: object) -> None:
    with pytest.raises(LeverError, match=rf"^KV spec: {field}={value!r} is not supported; use one of \["):
        KVSpec(**{"bits": 8, field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "code"), [("nope.json", errno.ENOENT), ("folder.json", errno.EISDIR)])
def test_an_unreadable_config_names_its_path_once_and_the_systems_reason(tmp_path: Path, name: str, code: int) -> None:
    path = tmp_path / name
    if code == errno.EISDIR:
        path.mkdir()
    with pytest.raises(LeverError) as info:
        parse_kv_value(str(path))
    message = str(info.value)
    assert message.startswith(f"cannot read kv_config {path}: {os.strerror(code)}; give an existing kv_config.json")
    assert message.count(str(path)) == 1


@pytest.mark.parametrize(
    ("kinds", "have"),
    [(["arrays", "arrays"], "['none']"), (["arrays", "rotating"], "['sliding_attention']")],
)
def test_an_attention_type_the_model_lacks_is_refused_naming_the_types_it_has(kinds: list[str], have: str) -> None:
    """Caches that hold no K/V (recurrent state) have no attention type: with no other, the model has 'none'."""
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    cache = [ArraysCache(2) if kind == "arrays" else RotatingKVCache(16) for kind in kinds]
    plan = KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8)}, source="types.json")
    with pytest.raises(LeverError) as info:
        plan.check_caches(cache, {}, n_layers=len(cache), head_dims={})
    assert f"it sets attention types ['full_attention'], but the model's cached layers are {have} (" in str(info.value)


_plans = st.builds(
    KVPlan,
    default=_specs,
    layers=st.dictionaries(st.integers(0, 2), _specs, max_size=2),
    types=st.dictionaries(st.just("full_attention"), _specs, max_size=1),
    source=st.just("plan.json"),
)


@settings(max_examples=60, deadline=None)
@given(reference=_plans, candidate=_plans, same=st.booleans(), positions=st.integers(2, 15))
def test_a_kv_lever_is_refused_exactly_when_its_plans_serve_the_same_caches_and_says_why(
    model: Any, reference: KVPlan, candidate: KVPlan, same: bool, positions: int
) -> None:
    """Refused iff both plans quantize the same layers the same way within `positions` tokens; the reason
    says which of three: both quantize alike, every spec starts too late, or neither quantizes at all."""
    if same:
        candidate = dataclasses.replace(reference, source="copy.json")
    ref, cand = reference.quantized_within(model, positions), candidate.quantized_within(model, positions)
    if ref != cand:
        require_kv_difference("kv", reference, candidate, model, positions, where="the serving path")
        return
    with pytest.raises(VacuousLeverError) as info:
        require_kv_difference("kv", reference, candidate, model, positions, where="the serving path")
    message = str(info.value)
    starts = {
        spec.start
        for plan in (reference, candidate)
        for spec in (plan.default, *plan.layers.values(), *plan.types.values())
        if spec is not None
    }
    late = sorted(start for start in starts if start >= positions)
    if ref:
        why = "both plans quantize the same layers the same way"
    elif late:
        why = f"every quantized spec starts at token {', '.join(map(str, late))}, beyond the {positions} tokens"
    else:
        why = "neither plan quantizes any layer"
    assert f"scores ({why}" in message and message.startswith("KV lever 'kv': ")
    assert message.endswith(
        "Fix: a quantized_kv_start (start=) below the sequence length, longer sequences (mlx_kl(tokens=...) / "
        "--mlx-kl-tokens), or a candidate plan that differs from the reference on this model's layers"
    )


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"default": 7}, "key 'default': bits=7 is not supported; use one of [2, 3, 4, 5, 6, 8]"),
        ({"layers": [8, 9]}, "key 'layers'[1]: bits=9 is not supported"),
        ({"layers": {"3": {"bits": 8, "group_size": 48}}}, "key 'layers'.'3': group_size=48 is not supported"),
    ],
)
def test_a_bad_spec_in_a_config_names_the_file_and_the_key_it_sits_under(
    tmp_path: Path, config: dict[str, object], says: str
) -> None:
    path = _write(tmp_path / "kv_config.json", config)
    with pytest.raises(LeverError) as info:
        parse_kv_value(path)
    assert f"kv_config {path} {says}" in str(info.value), str(info.value)


def test_a_quantized_layer_on_a_cache_with_no_quantized_form_is_refused_naming_that_cache() -> None:
    """A recurrent layer (mlx_lm's ArraysCache) holds no K/V to quantize: the refusal names the layer,
    its cache class and the fix, as a LeverError like every other problem of the plan."""
    from mlx_lm.models.cache import ArraysCache, KVCache

    plan = KVPlan(default=None, layers={1: KVSpec(8)}, source="stuck.json")
    with pytest.raises(LeverError) as info:
        plan.check_caches([KVCache(), ArraysCache(2)], {}, n_layers=2, head_dims={})
    assert str(info.value) == (
        "KV plan stuck.json cannot run on this model: layers [1] keep caches with no quantized form "
        "(1: ArraysCache): set them to null (only KVCache and RotatingKVCache layers can be quantized) "
        "(kv_config.json format: see pytest_mlxgate.serving.kv_plan)"
    )


def test_a_group_size_set_by_attention_type_is_checked_against_the_layers_of_that_type() -> None:
    """A plan that quantizes the full-attention layers in groups of 64 cannot run where their head
    dimension is 96; the sliding-window layer of the same dimension stays plain and is not named."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    plan = KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8, 64)}, source="types.json")
    cache = [KVCache(), RotatingKVCache(16), KVCache()]
    with pytest.raises(LeverError) as info:
        plan.check_caches(cache, {}, n_layers=3, head_dims={0: (96,), 1: (96,), 2: (96,)})
    assert (
        "layers [0, 2] keep keys/values of head dimension 96, which group size 64 does not divide: "
        "use group_size 32 there, or set those layers to null (plain)"
    ) in str(info.value)
    plan.check_caches(cache, {}, n_layers=3, head_dims={0: (128,), 1: (96,), 2: (128,)})  # 64 divides 128


def test_a_fake_quant_plan_names_itself_as_such_when_refused(tmp_path: Path) -> None:
    """The float twin of a plan is a plan of its own: a refusal says it is the fake-quant one."""
    plan = parse_kv_value(_write(tmp_path / "kv.json", {"layers": {"40": 4}}))
    with pytest.raises(LeverError) as info:
        plan.fake_quant().check_model(24)
    assert str(info.value).startswith(f"KV plan fake-quant {plan.source} configures ")


def test_kv_shared_layers_need_the_models_layers_and_are_none_without_them() -> None:
    """gemma-4 keeps `previous_kvs` on its text model: the layers past the cached ones read the layer it
    names. A model with that list but no `layers` of its own has no shared layers to name (not an error)."""
    from types import SimpleNamespace

    from pytest_mlxgate.serving.kv_plan import shared_kv_sources

    text = SimpleNamespace(previous_kvs=[0, 1, 0, 1])
    assert shared_kv_sources(SimpleNamespace(model=text, layers=[None] * 4), 2) == {2: 0, 3: 1}
    assert shared_kv_sources(SimpleNamespace(model=text), 2) == {}
