"""Drift attribution finds a planted single-layer break: the layer comes first, with an interval that
separates it from every other layer's, on the llama-style models and on a tiny gemma-4 (sliding and
full layers, KV-shared ones); and each lever kind is scoped its own way, restoring everything after."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planted import halved_scale, patch_target

from pytest_mlxgate.explain.layers import decoder_layers, layers_from, wrapped_layers
from pytest_mlxgate.explain.scoped import Scope, kv_scoped_plan
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
from pytest_mlxgate.kl.shape import RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.models.loaded import LoadedModel
from pytest_mlxgate.models.materialize import ResolvedSnapshot
from pytest_mlxgate.results.attribution_text import attribution_lines, entry_step
from pytest_mlxgate.results.record_kl import parse_attribution
from pytest_mlxgate.session.paired_run import PairedRun


def _loaded(path: Path) -> LoadedModel:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(name="t", kind="local", repo_id=None, commit="local", path=str(path), source="local")
    return LoadedModel(model, tokenizer, snap)


@pytest.fixture(scope="module")
def gemma4(tiny_gemma4_dir: Path) -> LoadedModel:
    return _loaded(tiny_gemma4_dir)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LoadedModel:
    return _loaded(tiny_model_dir)


def _target(model: LoadedModel) -> str:
    return patch_target(decoder_layers(model.model)[0].self_attn)


#: On models this small a run's fixed costs outweigh its forwards, so the default budget (3x the gate's
#: time) buys few scopes; the embedded model's benchmark (benchmarks/explain.py) holds the default.
def _explained(
    model: LoadedModel,
    lever: Lever,
    shape: RunShape,
    *,
    n: int = 8,
    budget: float = 6.0,
    reference: Any = None,
    cache: Any = None,
) -> dict[str, Any]:
    seqs = build_sequences(default_prompts(), model.tokenizer, n=n, tokens=shape.tokens)
    run = PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=model,
        reference=reference,
        machine={"device": "cpu"},
        allow_untrained=True,
        explain_budget=budget,
        cache=cache,
    )
    kl = run.kl()
    found = run.explanation(kl, "fail")
    assert found is not None
    return found


def _separated(found: dict[str, Any], layer: int) -> None:
    """`layer` is the top contributor, and its interval's lower end clears every other layer's upper end."""
    a = parse_attribution(found)
    top = a.top(1)[0]
    assert top.layers == (layer,), _debug(found)
    others = [s for s in a.scopes if s.kind in ("layer", "block") and layer not in s.layers]
    assert others
    lo = top.mean_ci.lower
    assert lo is not None and all(s.mean_ci.upper is not None and lo > s.mean_ci.upper for s in others), [
        (s.name, s.mean_ci) for s in [top, *others]
    ]


@pytest.mark.slow  # a gate and its attribution on a real model
def test_a_halved_attention_scale_in_one_gemma4_layer_is_attributed_to_that_layer(gemma4: LoadedModel) -> None:
    layer = 3  # the first full-attention layer (sliding, sliding, sliding, full, ...)
    attention = decoder_layers(gemma4.model)[layer].self_attn
    lever = Lever("scale", "patch", _target(gemma4), None, halved_scale(attention))
    found = _explained(gemma4, lever, RunShape("prefill", 48, 8))
    _separated(found, layer)
    a = parse_attribution(found)
    assert {s.name for s in a.scopes if s.kind == "type"} == {"full layers", "sliding layers"}
    full, sliding = (next(s for s in a.scopes if s.name == f"{t} layers") for t in ("full", "sliding"))
    assert full.mean is not None and sliding.mean is not None and full.mean > 100 * max(sliding.mean, 1e-12)
    assert full.by_position is not None and full.by_position.first  # KL by position, per attention type
    # with the lever everywhere, the output error is zero before the broken layer and enters at it
    assert [e.rel_error for e in a.residual[:layer]] == [0.0] * layer
    assert entry_step(a.residual) == (layer, float("inf"))
    assert not a.notes


@pytest.mark.slow  # a gate and its attribution on a real model
def test_one_gemma4_layer_s_kv_at_2_bits_is_attributed_to_that_layer(gemma4: LoadedModel, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"default": {"bits": 8, "group_size": 32}, "layers": {"1": {"bits": 2, "group_size": 32}}})
    )
    lever = Lever("kv", "kv", None, None, str(plan), path="serving")
    found = _explained(gemma4, lever, RunShape("serving", 40, 16))
    _separated(found, 1)
    a = parse_attribution(found)
    # only cached layers are scoped for a KV lever: the KV-shared ones (5-7) keep no cache of their own
    assert sorted({i for s in a.scopes if s.kind in ("layer", "block") for i in s.layers}) == [0, 1, 2, 3, 4]
    assert not any(s.kind == "rest" for s in a.scopes)  # a KV plan has nothing outside the layers
    assert any("keep the same KV cache" in n for n in a.notes)


def test_a_lever_acting_outside_the_layers_is_said_to_be_unscopable(tiny: LoadedModel) -> None:
    from mlx_lm.models import llama

    original = llama.LlamaModel.__call__

    def louder(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs) * 1.5

    lever = Lever("outer", "patch", "mlx_lm.models.llama:LlamaModel.__call__", None, louder)
    found = _explained(tiny, lever, RunShape("prefill", 32, 8))
    a = parse_attribution(found)
    rest = next(s for s in a.scopes if s.kind == "rest")
    assert a.top(1)[0].name == "outside the layers"
    assert all(s.mean == 0.0 for s in a.scopes if s.kind == "layer")
    assert rest.mean is not None and a.whole_mean is not None and rest.mean == pytest.approx(a.whole_mean, rel=1e-6)
    assert any("never called inside the decoder layers" in n for n in a.notes)


def test_a_weights_lever_is_scoped_by_taking_layers_from_the_candidate_model(
    tiny: LoadedModel, tiny_model_dir: Path
) -> None:
    from mlx.utils import tree_flatten

    other = _loaded(tiny_model_dir)
    layer = decoder_layers(other.model)[1]
    layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 3.0  # a broken layer in the candidate
    mx.eval(other.model.parameters())
    lever = Lever("model", "model", None, None, None)
    found = _explained(other, lever, RunShape("prefill", 32, 8), reference=tiny)
    _separated(found, 1)
    # the reference model is back as it was: its layers are its own again
    assert decoder_layers(tiny.model)[1] is not layer
    assert all(
        a is not b
        for (_, a), (_, b) in zip(
            tree_flatten(tiny.model.parameters()), tree_flatten(other.model.parameters()), strict=True
        )
    )


def test_scoping_restores_every_layer_even_when_the_forward_raises(tiny: LoadedModel, tiny_model_dir: Path) -> None:
    layers = decoder_layers(tiny.model)
    classes = [type(x) for x in layers]

    def boom(i: int, forward: Callable[[], Any]) -> Any:
        raise RuntimeError(f"layer {i}")

    with pytest.raises(RuntimeError, match="layer 0"), wrapped_layers(tiny.model, boom, range(len(layers))):
        tiny.model(mx.array([[1, 2, 3]]))
    assert [type(x) for x in layers] == classes and not any(hasattr(x, "_mlxgate_wrap") for x in layers)
    other = _loaded(tiny_model_dir)
    before = list(layers)
    with pytest.raises(RuntimeError), layers_from(tiny.model, other.model, [0, 1]):
        assert decoder_layers(tiny.model)[0] is decoder_layers(other.model)[0]
        raise RuntimeError("mid-scope")
    assert all(a is b for a, b in zip(decoder_layers(tiny.model), before, strict=True))


def test_a_kv_scope_plan_holds_the_candidate_spec_on_its_layers_and_the_reference_s_elsewhere(
    gemma4: LoadedModel, tmp_path: Path
) -> None:
    lever = Lever("kv", "kv", None, {"bits": 8, "group_size": 32}, {"bits": 4, "group_size": 32}, path="serving")
    plan = kv_scoped_plan(lever, gemma4.model, Scope("layer 3", (3,), "layer").layers)
    eight, four = {"bits": 8, "group_size": 32, "start": 0}, {"bits": 4, "group_size": 32, "start": 0}
    assert plan == {"default": None, "layers": {"0": eight, "1": eight, "2": eight, "3": four, "4": eight}}


def _debug(found: dict[str, Any]) -> str:
    return (
        "\n".join(attribution_lines(found))
        + "\n"
        + "\n".join(f"{s['name']} {s['mean']} {s['mean_ci']} calls" for s in found["scopes"])
    )


def test_an_attribution_is_cached_beside_the_reference_and_read_back_without_a_forward(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    from pytest_mlxgate.kl.refcache import ReferenceCache

    attention = decoder_layers(tiny.model)[1].self_attn
    lever = Lever("scale", "patch", _target(tiny), None, halved_scale(attention))
    shape = RunShape("prefill", 32, 8)

    def explained() -> dict[str, Any]:
        return _explained(tiny, lever, shape, cache=ReferenceCache(tmp_path / "cache"))

    first = explained()
    assert len(list((tmp_path / "cache" / "attribution").glob("*.json"))) == 1  # beside the reference, one entry
    calls: list[int] = []
    second = wrapped_and_counted(tiny, calls, explained)
    assert first["source"] == "computed" and second["source"] == "cache"
    assert second["scopes"] == first["scopes"] and second["cost"] == first["cost"]
    seconds = first["cost"]["seconds"]
    assert isinstance(seconds, float) and seconds == round(seconds, 2) and first["cost"]["sequence_arms"] > 0
    gate = first["cost"]["gate_seconds"]  # what the gate's own arms took: the budget is in time
    assert isinstance(gate, float) and gate > 0 and gate == round(gate, 2), first["cost"]
    # the second run's forwards are its own gate's (a cached reference: the candidate arm only), none for attribution
    assert len(calls) == 8 * len(decoder_layers(tiny.model))


@pytest.mark.parametrize("kind", ["env", "context"])
def test_a_setting_lever_no_scope_sees_is_said_to_be_read_outside_the_layers(kind: str) -> None:
    """An env or context lever whose every scope measured no drift (while the gate measured some) is
    read at load time or around the layers: said, never shown as a table of zeros. One scope that
    drifts, or a patch lever, gets no such note."""
    from pytest_mlxgate.explain.attribute import _ScopeRunner

    lever = Lever("s", kind, "X" if kind == "env" else "x:y", "0", "1", factory=None if kind == "env" else nullcontext)
    runner = _ScopeRunner(lever, RunShape("prefill", 8, 2), [], [], None, None, Path("."), lambda _: None)  # type: ignore[arg-type]
    zeros = [{"mean": 0.0}, {"mean": None}]
    (note,) = runner.notes(zeros)
    assert note == (
        "no scope shows any drift: the setting is read outside the layers' forwards (at load time, or by code "
        "around them), so this lever cannot be scoped by layer"
    )
    assert runner.notes([*zeros, {"mean": 1e-4}]) == [] and runner.notes([]) == []
    patch = Lever("p", "patch", "mlx.core.fast.rms_norm", None, "m:f")
    assert _ScopeRunner(patch, RunShape("prefill", 8, 2), [], [], None, None, Path("."), print).notes(zeros) == []  # type: ignore[arg-type]


def wrapped_and_counted(model: LoadedModel, calls: list[int], fn: Callable[[], Any]) -> Any:
    def count(i: int, forward: Callable[[], Any]) -> Any:
        calls.append(i)
        return forward()

    with wrapped_layers(model.model, count, range(len(decoder_layers(model.model)))):
        return fn()


def test_an_attribution_that_cannot_run_leaves_the_gate_s_verdict_as_it_was(tiny: LoadedModel, tmp_path: Path) -> None:
    from tinymodel import build_tiny_model

    deeper = _loaded(build_tiny_model(tmp_path / "deeper", num_hidden_layers=3))
    lever = Lever("model", "model", None, None, None)
    found = _explained(deeper, lever, RunShape("prefill", 32, 8), reference=tiny)
    assert found["scopes"] == [] and "attribution could not run (LeverError" in found["notes"][0]
    assert attribution_lines(found)[0] == "where the drift comes from: not measured"


# --- the drill-down, in the fast lane: the scopes a budget buys, and the block it follows ----------------


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 64),
    capacity=st.integers(1, 80),
    two_types=st.booleans(),
    rest=st.booleans(),
)
def test_the_first_round_covers_every_layer_once_in_order_as_layers_or_blocks(
    n: int, capacity: int, two_types: bool, rest: bool
) -> None:
    from pytest_mlxgate.explain.attribute import plan_scopes

    layers = list(range(n))
    types = [("full_attention" if i % 4 == 3 else "sliding_attention") if two_types else None for i in layers]
    scopes, drill = plan_scopes(layers, types, capacity=capacity, rest=rest)
    by_kind: dict[str, list[Any]] = {}
    for s in scopes:
        by_kind.setdefault(s.kind, []).append(s)
    if two_types and n >= 4:  # each attention type alone, together every layer once
        assert sorted(i for s in by_kind["type"] for i in s.layers) == layers
    assert len(by_kind.get("rest", [])) == int(rest)
    parts = by_kind.get("layer", []) + by_kind.get("block", [])
    assert [i for s in parts for i in s.layers] == layers  # once each, in order, nothing left out
    for s in parts:  # a scope's name says its layers, as the report's table shows them
        first, last = s.layers[0], s.layers[-1]
        assert s.name == (f"layer {first}" if len(s.layers) == 1 else f"layers {first}-{last}")
    for s in by_kind.get("type", []):
        assert s.name in ("full layers", "sliding layers")
    assert drill == bool(by_kind.get("block")) and not (by_kind.get("layer") and by_kind.get("block"))
    if drill:  # blocks: contiguous, at least two, fewer runs than layers
        assert 2 <= len(by_kind["block"]) < n
        assert all(list(s.layers) == list(range(s.layers[0], s.layers[-1] + 1)) for s in by_kind["block"])
    else:  # every layer alone, only when they fit beside the type and rest scopes (or are two at most)
        assert len(scopes) <= capacity or n <= 2


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    from tinymodel import build_tiny_model

    return _loaded(build_tiny_model(tmp_path_factory.mktemp("deep-tiny"), num_hidden_layers=16))


@pytest.mark.parametrize("budget", [3.0, 4.5])
def test_the_drill_down_follows_the_block_with_the_most_drift_to_the_planted_layer(
    deep: LoadedModel, budget: float
) -> None:
    """16 layers on a budget counted in sequence-arms (no clock: the same scopes on every machine): the
    first round buys blocks, the second the layers of the block that drifts most, where the output error
    jumps first; the first of them alone drifts as much as its block, so it is named there, within the
    default budget (3x), and the rest of the budget is not spent on the block's other layers."""
    from pytest_mlxgate.explain.attribute import attribute
    from pytest_mlxgate.kl.arms import run_candidate, run_reference
    from pytest_mlxgate.kl.shape import ArmCounters

    layer = 11
    attention = decoder_layers(deep.model)[layer].self_attn
    lever = Lever("scale", "patch", _target(deep), None, halved_scale(attention))
    shape = RunShape("prefill", 32, 4)
    seqs = build_sequences(default_prompts(), deep.tokenizer, n=8, tokens=shape.tokens)
    refs = run_reference(deep.model, seqs, shape, lever, counters=ArmCounters())
    whole = run_candidate(deep.model, seqs, shape, lever, refs, counters=ArmCounters())
    found = attribute(
        lever=lever, shape=shape, sequences=seqs, whole=whole, reference=deep, candidate=deep, budget=budget
    ).to_json()
    a = parse_attribution(found)
    blocks = [s for s in a.scopes if s.kind == "block"]
    inner = [s for s in a.scopes if s.kind == "layer"]
    assert len(blocks) >= 2 and inner, _debug(found)  # the budget bought blocks, then layers of one of them
    worst = max(blocks, key=lambda s: s.mean or 0.0)
    assert layer in worst.layers, _debug(found)
    assert {i for s in inner for i in s.layers} <= set(worst.layers)  # the drill went into that block
    assert inner[0].layers == (layer,), _debug(found)  # the output error enters there: measured first
    assert a.top(1)[0].layers == (layer,), _debug(found)  # named, at the default budget too
    assert len(inner) == 1 and not any("the budget measured" in n for n in a.notes), _debug(found)
    assert any(n.startswith(f"layer {layer} alone drifts") and "carries that block's drift" in n for n in a.notes)


def test_a_kv_lever_s_scope_is_a_serving_kv_lever_whose_plan_file_is_the_scoped_plan(
    gemma4: LoadedModel, tmp_path: Path
) -> None:
    from pytest_mlxgate.explain.scoped import scoped

    lever = Lever("kv", "kv", None, {"bits": 8, "group_size": 32}, {"bits": 4, "group_size": 32}, path="serving")
    scope = Scope("layer 3", (3,), "layer")
    arm = scoped(lever, scope, reference=gemma4.model, candidate=gemma4.model, workdir=tmp_path)
    assert arm.model is gemma4.model and arm.lever.name == "kv@layer 3"
    assert (arm.lever.kind, arm.lever.path, arm.lever.ref) == ("kv", "serving", lever.ref)
    written = Path(str(arm.lever.cand))
    assert written == tmp_path / "scope-3.json"
    assert json.loads(written.read_text()) == kv_scoped_plan(lever, gemma4.model, scope.layers)


def test_a_kv_lever_s_output_error_enters_where_the_cache_is_first_read_back(tiny_kv_model_dir: Path) -> None:
    """The residual curve on the serving path: with a 2-bit cache everywhere, the prefill's first layer
    already differs (its queries read quantized keys) and every layer's error is measured per sequence."""
    from pytest_mlxgate.explain.attribute import residual_error

    tiny_kv = _loaded(tiny_kv_model_dir)
    lever = Lever("kv", "kv", None, "plain", "bits=2,group_size=64,start=0", path="serving")
    shape = RunShape("serving", 24, 6)
    seqs = build_sequences(default_prompts(), tiny_kv.tokenizer, n=3, tokens=shape.tokens)
    found = residual_error(lever, shape, seqs, tiny_kv, tiny_kv)
    assert found["sequences"] == 3 and [e["layer"] for e in found["layers"]] == [0, 1]
    assert all(e["rel_error"] > 0 and e["ci"][0] is not None for e in found["layers"])
    plain = Lever("kv", "kv", None, "plain", "plain", path="serving")
    assert all(e["rel_error"] == 0 for e in residual_error(plain, shape, seqs, tiny_kv, tiny_kv)["layers"])


def test_every_layer_s_attention_type_is_the_model_s_own_even_where_it_keeps_no_cache(gemma4: LoadedModel) -> None:
    """gemma-4's KV-shared layers keep no cache of their own, so their type is read from the model's declared
    `layer_types`, never guessed from the prompt cache (which has no entry for them)."""
    from mlx_lm.models.cache import make_prompt_cache
    from tinygemma import LAYER_TYPES

    from pytest_mlxgate.explain.layers import attention_types

    got = attention_types(gemma4.model)
    assert got == list(LAYER_TYPES) and len(make_prompt_cache(gemma4.model)) < len(got)


def test_a_scope_s_plan_gives_each_cached_layer_its_own_attention_type_s_spec(
    gemma4: LoadedModel, tmp_path: Path
) -> None:
    """A candidate plan by attention type (`"types"`: sliding 4 bits, full 8): every layer the scope holds gets
    the spec of its own type, read from its cache (a plan read by layer index alone would give them none)."""
    from mlx_lm.models.cache import make_prompt_cache

    from pytest_mlxgate.serving.caches import attention_type, quantized_form

    config = tmp_path / "by_type.json"
    config.write_text(json.dumps({"default": None, "types": {"sliding": {"bits": 4}, "full": {"bits": 8}}}))
    lever = Lever("kv", "kv", None, None, str(config), path="serving")
    cached = [i for i, c in enumerate(make_prompt_cache(gemma4.model)) if quantized_form(c) is not None]
    plan = kv_scoped_plan(lever, gemma4.model, cached)
    types = {i: attention_type(c) for i, c in enumerate(make_prompt_cache(gemma4.model))}
    assert {t for t in types.values()} == {"sliding_attention", "full_attention"}
    for i in cached:
        assert plan["layers"][str(i)]["bits"] == (4 if types[i] == "sliding_attention" else 8), (i, plan)
