"""The weights lever: its values, a quantized copy that is what mlx_lm's converter writes (the
reference's weights untouched), and a gate over it whose records name both arms' weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.errors import LeverError
from pytest_mlxgate.levers.weights import WeightsSpec, parse_weights_value


@pytest.mark.parametrize(
    ("value", "spec"),
    [
        (None, None),
        ("float", None),
        ("none", None),
        (8, WeightsSpec(8, 64)),
        ("q4", WeightsSpec(4, 64)),
        ("4bit", WeightsSpec(4, 64)),
        ("bits=4,group_size=32", WeightsSpec(4, 32)),
        ({"bits": 6, "group_size": 128}, WeightsSpec(6, 128)),
    ],
)
def test_values(value: object, spec: WeightsSpec | None) -> None:
    assert parse_weights_value(value) == spec


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (7, "bits"),
        ({"bits": 4, "group_size": 48}, "groups of"),
        ({"bits": 4, "scale": 2}, "unknown keys"),
        ("fast", "not a quantization"),
        (True, "not a quantization"),
        ([4], "not a quantization"),
    ],
)
def test_bad_values_say_what_works(value: object, message: str) -> None:
    with pytest.raises(LeverError, match=message):
        parse_weights_value(value)


def _loaded(path: Path) -> Any:
    import mlx_lm

    from pytest_mlxgate.models.loaded import LoadedModel
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    model, tok = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(name="tiny", kind="local", repo_id=None, commit="local", path=str(path), source="local")
    return LoadedModel(model, tok, snap)


def test_the_quantized_copy_is_what_mlx_lm_convert_writes(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm import convert, load

    from pytest_mlxgate.levers.weights import quantized_copy

    loaded = _loaded(tiny_kv_model_dir)
    before = {k: mx.array(v) for k, v in tree_flatten(loaded.model.parameters())}
    copy = quantized_copy(loaded, WeightsSpec(4, 64))
    out = tmp_path / "q4"
    convert(str(tiny_kv_model_dir), mlx_path=str(out), quantize=True, q_bits=4, q_group_size=64)
    converted, _ = load(str(out))
    ours, theirs = dict(tree_flatten(copy.model.parameters())), dict(tree_flatten(converted.parameters()))
    assert ours.keys() == theirs.keys() and any(k.endswith(".scales") for k in ours)
    for k in ours:
        assert mx.array_equal(ours[k], theirs[k]), k
    assert any(isinstance(m, nn.QuantizedLinear) for m in copy.model.modules())
    assert not any(isinstance(m, nn.QuantizedLinear) for m in loaded.model.modules())  # the reference untouched
    assert all(mx.array_equal(v, before[k]) for k, v in tree_flatten(loaded.model.parameters()))
    from pytest_mlxgate.errors import LeverNotApplicableError

    with pytest.raises(LeverNotApplicableError, match="already quantized.*run it on the float repo"):
        quantized_copy(_loaded(out), WeightsSpec(8, 64))


def test_a_weights_gate_measures_drift_between_float_and_4_bit(tiny_kv_model_dir: Path) -> None:
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
    from pytest_mlxgate.kl.shape import RunShape
    from pytest_mlxgate.levers.lever import Lever
    from pytest_mlxgate.levers.weights import quantized_copy
    from pytest_mlxgate.session.paired_run import PairedRun

    loaded = _loaded(tiny_kv_model_dir)
    lever = Lever(name="weights", kind="weights", target=None, ref=None, cand={"bits": 4, "group_size": 64})
    assert lever.describe() == "weights: weights as loaded → 4-bit g64 weights · path=prefill"
    assert lever.two_models and lever.key("reference") != lever.key("candidate")
    shape = RunShape(path="prefill", tokens=24, decode=4)
    seqs = build_sequences(default_prompts(), loaded.tokenizer, n=3, tokens=shape.tokens)
    run = PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=quantized_copy(loaded, WeightsSpec(4, 64)),
        reference=loaded,
        machine={"device": "cpu", "blas": "test"},
        allow_untrained=True,
    )
    result = run.kl()
    assert result.stats.mean > 1e-4 and result.reference_model is not None
    assert result.counters.reference_forwards == 3 and result.counters.candidate_forwards == 3


def test_a_plan_naming_modules_the_model_cannot_take_is_refused_before_it_quantizes(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    """Green means tested: an entry for a path the model lacks (another model's plan, a typo) would leave
    that module at the default quantization, and the gate would pass a plan it never ran."""
    from types import SimpleNamespace

    from pytest_mlxgate.levers.lever import Lever
    from pytest_mlxgate.levers.weights import quantization_block
    from pytest_mlxgate.session.builder import _weights_arms, check_plan_modules

    loaded = _loaded(tiny_kv_model_dir)
    rows = loaded.model.layers[0].self_attn.q_proj.weight.shape[-1]
    odd = next(g for g in (32, 64, 128) if rows % g)  # a group these rows do not divide (hidden size 64)
    good = WeightsSpec(8, 32, (("model.layers.0.mlp.down_proj", (4, 32)), ("model.layers.1.self_attn.q_proj", None)))
    check_plan_modules(good, loaded.model, "here")  # every entry a real, quantizable module
    for entry, said in [
        (("model.layers.99.mlp.down_proj", (4, 32)), r"model\.layers\.99\.mlp\.down_proj \(no such module\)"),
        (("model.norm", (4, 32)), r"model\.norm \(RMSNorm: not quantizable\)"),
        (("model.layers.0.self_attn.q_proj", (4, odd)), rf"rows of {rows}: groups of {odd} do not divide"),
    ]:
        plan = tmp_path / "weights_config.json"  # as `plan weights --out` writes it, read as the gate reads it
        plan.write_text(json.dumps(quantization_block(WeightsSpec(8, 32, (entry,)))))
        lever = Lever(name="weights", kind="weights", target=None, ref=None, cand=str(plan))
        with pytest.raises(LeverError, match=rf"candidate value: the weights plan {plan}.*names 1 module.*{said}"):
            _weights_arms(SimpleNamespace(progress=None), lever, loaded)  # type: ignore[arg-type]
