"""`mlxgate plan weights`: what the search measures is what the quantized model computes, the plan it writes
is what mlx_lm loads, the drift model never buys an option a module cannot take, and a plan reaches --out
and --save only when the gate itself passed it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import LeverError, MlxgateUsageError
from pytest_mlxgate.explain.plan_kv import PLAIN_OPTION, Option, greedy_plan, selection_verdict
from pytest_mlxgate.levers.weights import WeightsSpec, parse_weights_value, quantization_block

WEIGHTS_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={{"bits": 8, "group_size": 64}}),
    pytest.mark.mlx_kl(prompts=4, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean={mean}, top1=0.5)
"""


def _loaded(path: Path) -> Any:
    from pytest_mlxgate.models.loaded import LoadedModel, load_mlx
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    snap = ResolvedSnapshot(name="tiny", kind="local", repo_id=None, commit="local", path=str(path), source="local")
    model, tok = load_mlx(snap)
    return LoadedModel(model, tok, snap)


def _gate(tmp_path: Path, mean: float = 0.05) -> Path:
    path = tmp_path / "test_weights_gate.py"
    path.write_text(WEIGHTS_GATE.format(mean=mean))
    return path


def _mixed_plan(units: dict[str, Any]) -> dict[str, Option]:
    """Every option a module may take, in turn, and one module kept as loaded."""
    choices = [Option(4, 32), Option(8, 64), Option(2, 64), Option(6, 128), Option(3, 32), PLAIN_OPTION]
    plan = {}
    for k, (path, unit) in enumerate(sorted(units.items())):
        o = choices[k % len(choices)]
        plan[path] = o if unit.allows(o) else Option(6, 32)
    return plan


def _log_softmax(x: Any) -> Any:
    import mlx.core as mx

    x = x.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def test_a_fake_quantized_plan_computes_what_the_quantized_model_does(tiny_kv_model_dir: Path) -> None:
    """The search scores plans on weights quantized and dequantized back (float matmuls); the gate runs the
    model mlx_lm's converter writes. The two must agree, and both must differ from the float model."""
    import mlx.core as mx

    from pytest_mlxgate.explain.plan_weights import quantizable_units, weights_spec
    from pytest_mlxgate.levers.weights import quantized_copy

    loaded = _loaded(tiny_kv_model_dir)
    units, itemsize, fixed = quantizable_units(loaded.model)
    assert "model.embed_tokens" in units and "model.layers.1.mlp.down_proj" in units and itemsize == 4
    plan = _mixed_plan(units)
    assert {o.bits for o in plan.values()} >= {2, 3, 4, 6, 8, None}
    x = mx.array([[5, 17, 300, 4000, 12, 99, 7, 1]])
    float_logp = _log_softmax(loaded.model(x))
    before = {p: mx.array(m.weight) for p, m in loaded.model.named_modules() if p in units}
    spec = weights_spec(plan, units)
    real_logp = _log_softmax(quantized_copy(loaded, spec).model(x))
    with weight_arms_for(loaded, tiny_kv_model_dir) as arms:
        arms.apply(plan)
        fake_logp = _log_softmax(loaded.model(x))
        stats = arms.measure(plan, "the mixed plan")
    kl = lambda p, q: float(mx.max(mx.sum(mx.exp(p) * (p - q), axis=-1)))  # noqa: E731
    assert kl(real_logp, fake_logp) < 1e-6  # the same numbers up to float rounding
    assert kl(float_logp, real_logp) > 1e-3 and stats.mean > 1e-3  # and the plan quantized something
    for p, m in loaded.model.named_modules():  # the arms leave the float weights as they found them
        if p in units:
            assert mx.array_equal(m.weight, before[p]), p
    assert fixed > 0 and fixed == sum(
        v.nbytes for k, v in _flat(loaded.model.parameters()) if k.removesuffix(".weight") not in units
    )


def _flat(tree: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    return list(tree_flatten(tree))


def weight_arms_for(loaded: Any, model_dir: Path) -> Any:
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain.plan_weights import weight_arms

    gate = weights_gate_spec(model_dir)
    return weight_arms(
        loaded.model, loaded.tokenizer, gate, bits=(2, 3, 4, 6, 8), groups=(32, 64, 128), selection=3, say=print
    )


def test_what_save_writes_is_what_mlx_lm_loads_module_by_module(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm

    from pytest_mlxgate.explain.plan_weights import quantizable_units, weights_spec
    from pytest_mlxgate.levers.weights import quantized_copy, save_quantized

    loaded = _loaded(tiny_kv_model_dir)
    units, _, _ = quantizable_units(loaded.model)
    plan = _mixed_plan(units)
    spec = weights_spec(plan, units)
    dest = tmp_path / "planned"
    save_quantized(loaded, spec, dest)
    model, _ = mlx_lm.load(str(dest))
    config = json.loads((dest / "config.json").read_text())
    modules = dict(model.named_modules())
    for path, o in plan.items():
        m = modules[path]
        if o.bits is None:
            assert not hasattr(m, "bits") and path not in config["quantization"], path
        else:
            assert (m.bits, m.group_size) == (o.bits, o.group_size), path
            assert config["quantization"][path]["bits"] == o.bits, path
    x = mx.array([[5, 17, 300, 4000, 12]])
    assert mx.array_equal(model(x), quantized_copy(loaded, spec).model(x))
    assert (dest / "tokenizer.json").is_file() and not list(tmp_path.glob(".planned.*"))  # no staging left
    # the plan file `plan weights` writes reads back as the same plan, and the lever quantizes it the same
    plan_file = tmp_path / "weights_config.json"
    plan_file.write_text(json.dumps(quantization_block(spec)))
    again = parse_weights_value(str(plan_file))
    assert (
        again is not None
        and again.layers == spec.layers
        and (again.bits, again.group_size) == (spec.bits, spec.group_size)
    )
    assert isinstance(modules["model.layers.0.self_attn.q_proj"], (nn.Linear, nn.QuantizedLinear))
    with pytest.raises(LeverError, match="it exists; give a new folder"):
        save_quantized(loaded, spec, dest)
    assert mx.array_equal(mlx_lm.load(str(dest))[0](x), model(x))  # refused, untouched


_PATHS = [f"model.layers.{i}.{m}" for i in range(3) for m in ("self_attn.q_proj", "mlp.down_proj")]
_ENTRY = st.one_of(st.none(), st.tuples(st.sampled_from([2, 3, 4, 5, 6, 8]), st.sampled_from([32, 64, 128])))


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from([2, 3, 4, 6, 8]),
    group=st.sampled_from([32, 64, 128]),
    entries=st.dictionaries(st.sampled_from(_PATHS), _ENTRY, max_size=len(_PATHS)),
)
def test_a_plan_round_trips_through_mlx_lm_s_quantization_block(
    tmp_path_factory: pytest.TempPathFactory, bits: int, group: int, entries: dict[str, Any]
) -> None:
    spec = WeightsSpec(bits, group, tuple(sorted(entries.items())))
    block = quantization_block(spec)
    for path, entry in entries.items():  # each module's own entry, as mlx_lm's loader reads it
        assert block[path] == (False if entry is None else {"group_size": entry[1], "bits": entry[0], "mode": "affine"})
        assert spec.predicate(path) == (block[path] if entry is not None else False)
    folder = tmp_path_factory.mktemp("plan")
    for where, data in (("block.json", block), ("config.json", {"model_type": "llama", "quantization": block})):
        (folder / where).write_text(json.dumps(data))
        read = parse_weights_value(folder / where)
        assert read == WeightsSpec(bits, group, spec.layers, str(folder / where))
        assert read.stable == spec.stable  # a cache key by content, not by file name
    assert spec.stable != WeightsSpec(bits, group, spec.layers + (("model.x", (2, 32)),)).stable


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"group_size": 64}', "no quantization block"),
        ('{"bits": 4, "group_size": 64, "model.x": 3}', "'model.x' is 3; give"),
        ('{"bits": 4, "group_size": 64, "model.x": {"bits": 7}}', "'model.x'.*MLX quantizes to bits"),
        ('{"bits": 4, "group_size": 64, "mode": "mxfp4"}', "mode 'mxfp4'; this lever quantizes affine"),
        ('{"bits": 4, "group_size": 64, "model.x": {"bits": 4, "scale": 2}}', "unknown keys \\['scale'\\]"),
    ],
)
def test_a_bad_plan_file_says_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "weights_config.json"
    path.write_text(content)
    with pytest.raises(LeverError, match=message):
        parse_weights_value(str(path))
    with pytest.raises(LeverError, match="cannot read it"):
        parse_weights_value(str(tmp_path / "missing.json"))


@settings(max_examples=150, deadline=None)
@given(
    sens=st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=8),
    wide=st.lists(st.booleans(), min_size=8, max_size=8),
    share=st.floats(1e-4, 1.5),
)
def test_the_drift_model_scales_by_each_module_s_own_error_and_never_buys_what_it_cannot_take(
    sens: list[float], wide: list[bool], share: float
) -> None:
    """A module whose rows 128 does not divide cannot take g128 (mlx_lm would leave it float): its drift
    there is inf, the greedy never buys it; elsewhere a drift is the probe's times the error ratio."""
    from pytest_mlxgate.explain.plan_weights import Unit, WeightSensitivities

    options = [Option(4, 64), Option(4, 128), Option(8, 64), Option(8, 128)]
    units = {f"m{i}": Unit(f"m{i}", (64, 256 if wide[i] else 192)) for i in range(len(sens))}
    errors = {
        (p, o): (4.0 if o.bits == 4 else 1 / 64) * (1.5 if o.group_size == 128 else 1.0) * (i + 1)
        for i, (p, u) in enumerate(units.items())
        for o in options
        if u.allows(o)
    }
    model = WeightSensitivities(Option(4, 64), [], {}, {p: s for p, s in zip(units, sens, strict=False)}, errors)
    for p, u in units.items():
        assert model.drift(p, PLAIN_OPTION) == 0.0
        assert model.drift(p, Option(8, 64)) == pytest.approx(model.sensitivity[p] / 256)
        assert (model.drift(p, Option(4, 128)) == float("inf")) != u.allows(Option(4, 128))
    start = {p: Option(4, 128) if u.allows(Option(4, 128)) else Option(4, 64) for p, u in units.items()}
    sizes = {p: float(u.size) for p, u in units.items()}
    total = sum(model.drift(p, o) for p, o in start.items())
    plan = greedy_plan(sizes, options, model.drift, target=total * share, start=start, itemsize=4)
    assert all(units[p].allows(o) for p, o in plan.items())
    assert sum(model.drift(p, o) for p, o in plan.items()) <= total * share + 1e-12


def test_the_model_s_own_quant_predicate_keeps_its_float_modules_out_of_the_plan(tiny_kv_model_dir: Path) -> None:
    """The modules a plan covers are exactly those mlx_lm's converter quantizes (`quantize_model`, the oracle)
    where the model's own predicate keeps some float: its embedding and one projection mid-model."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model

    from pytest_mlxgate.explain.plan_weights import quantizable_units

    class KeepsSomeFloat(llama.Model):  # type: ignore[misc]
        @property
        def quant_predicate(self) -> Any:
            return lambda path, _m: "embed_tokens" not in path and path != "model.layers.1.mlp.down_proj"

    config = json.loads((tiny_kv_model_dir / "config.json").read_text())
    model = KeepsSomeFloat(llama.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    units, _, fixed = quantizable_units(model)
    assert "model.embed_tokens" not in units and "model.layers.1.mlp.down_proj" not in units
    assert fixed >= model.model.embed_tokens.weight.nbytes
    quantized, _ = quantize_model(model, {}, 64, 8)
    scaled = {p.rsplit(".", 1)[0] for p, _ in tree_flatten(quantized.parameters()) if p.endswith(".scales")}
    assert set(units) == scaled
    assert "model.embed_tokens" in quantizable_units(llama.Model(llama.ModelArgs.from_dict(config)))[0]  # type: ignore[no-untyped-call]


def test_a_gate_plan_weights_cannot_use_is_refused_with_the_reason(tmp_path: Path) -> None:
    from pytest_mlxgate.explain.plan_gate import read_gate

    kv = tmp_path / "test_kv.py"
    kv.write_text(
        "import pytest\nfrom pytest_mlxgate import assert_kl_below\n"
        'pytestmark = [pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand=8, path="serving")]\n\n'
        "def test_drift(paired):\n    assert_kl_below(paired, mean=.1)\n"
    )
    with pytest.raises(MlxgateUsageError) as caught:
        read_gate(kv, kind="weights")
    assert str(caught.value) == (
        f"{kv}'s lever 'kv_cache' is a kv lever: `plan weights` searches weight plans; give a weight gate "
        "module, e.g. gates/test_weights_8bit.py"
    )
    quantized_ref = tmp_path / "test_q.py"
    quantized_ref.write_text(WEIGHTS_GATE.format(mean=0.1).replace("ref=None", "ref=4"))
    with pytest.raises(MlxgateUsageError, match="reference arm is not the weights as loaded"):
        read_gate(quantized_ref, kind="weights")
    gate = read_gate(Path("gates/test_weights_8bit.py").resolve(), kind="weights", model="gemma3-270m")
    assert gate.limits == {"mean": 0.02, "p99": 0.5, "top1": 0.7} and (gate.prompts, gate.tokens) == (8, 32)


def test_mlx_lm_s_plans_are_priced_as_mlx_lm_makes_them(tiny_kv_model_dir: Path) -> None:
    """mixed_4_6 as mlx_lm's converter quantizes it, module by module; dynamic_quant's plan within a
    budget upgrades its most sensitive modules first and never exceeds the bytes."""
    import mlx.nn as nn
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import quantize_model

    from pytest_mlxgate.explain.plan_weights_compare import dynamic_quant_plan, recipe_plan

    loaded = _loaded(tiny_kv_model_dir)
    with weight_arms_for(loaded, tiny_kv_model_dir) as arms:
        ours = recipe_plan(arms, "mixed_4_6")
        budget = (arms.plan_bytes(arms.uniform(Option(4, 64))) + arms.plan_bytes(arms.uniform(Option(8, 64)))) / 2
        dynamic, found = dynamic_quant_plan(arms, 4, 8, budget)
    theirs, _ = quantize_model(
        _loaded(tiny_kv_model_dir).model,
        {},
        64,
        4,
        quant_predicate=mixed_quant_predicate_builder("mixed_4_6", loaded.model),
    )
    quantized = {
        p: (m.bits, m.group_size)
        for p, m in theirs.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }
    assert {p: (o.bits, o.group_size) for p, o in ours.items()} == quantized
    assert {o.bits for o in ours.values()} == {4, 6}
    assert arms.plan_bytes(dynamic) <= budget and {o.bits for o in dynamic.values()} == {4, 8}
    high = {p for p, o in dynamic.items() if o.bits == 8}
    low = set(dynamic) - high
    assert min(found[p] for p in high) >= max(found[p] for p in low)  # its threshold rule: the most sensitive


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--apart"], "--apart is a KV plan's option"),
        (["--budget-bytes", "5"], "--budget-bytes picks a plan from the frontier: add --frontier"),
        (["--frontier", "--budget-bytes", "0"], "--budget-bytes 0: give the weight bytes a plan may take"),
        (["--bits", "5"], "--bits 5: 5 is not a choice mlx_lm loads weights at"),
        (["--selection", "1"], "fewer than 2 give none; give 2 or more (default 8)"),  # the weights search's own
        (["--save", "{tmp}"], "--save {tmp}: it exists; give a new folder"),
    ],
)
def test_plan_weights_refuses_bad_options_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    from pytest_mlxgate.cli import main

    gate = _gate(tmp_path)
    argv = ["plan", "weights", "--gate", str(gate), "--model", str(tmp_path / "no-model")]
    code = main(argv + [a.format(tmp=tmp_path) for a in extra])
    err = capsys.readouterr().err
    assert code == 2 and message.format(tmp=tmp_path) in err and "Traceback" not in err, err
    assert main(["plan", "kv", "--gate", str(gate), "--save", str(tmp_path / "m")]) == 2
    assert "--save and --no-compare are `plan weights` options" in capsys.readouterr().err


def _plan_weights(tmp_path: Path, model: Path, mean: float, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_mlxgate.cli",
            "plan",
            "weights",
            "--gate",
            str(_gate(tmp_path, mean)),
            "--model",
            str(model),
            "--out",
            str(tmp_path / "weights_config.json"),
            "--bits",
            "2,4,8",
            "--group-sizes",
            "64,128",
            "--selection",
            "3",
            "--save",
            str(tmp_path / "planned"),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"},
    )


@pytest.mark.slow  # a search on the tiny llama (14 modules), mlx_lm's plans beside it, two gate runs
def test_plan_weights_writes_a_verified_plan_mlx_lm_loads_and_its_comparisons(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    import mlx_lm

    done = _plan_weights(tmp_path, tiny_kv_model_dir, 0.05)
    record = json.loads((tmp_path / "weights_config.search.json").read_text())
    verification = record["verification"]
    assert verification is not None and (done.returncode == 0) == verification["verified"], done.stderr
    out, saved = tmp_path / "weights_config.json", tmp_path / "planned"
    # green means tested: --out and --save hold a plan the gate passed, or nothing
    assert out.is_file() == saved.is_dir() == verification["verified"], done.stderr
    assert "long" in verification or not verification["verified"]  # and at 4x the gate's length
    plan = parse_weights_value(str(out if out.is_file() else tmp_path / "weights_config.unverified.json"))
    assert plan is not None and len(plan.layers) == 15  # the embedding and 7 projections x 2 layers
    if saved.is_dir():
        model, _ = mlx_lm.load(str(saved))
        assert {p for p, m in model.named_modules() if hasattr(m, "bits")} == {p for p, e in plan.layers if e}
    names = [c["name"] for c in record["comparisons"]]
    assert names[:2] == ["uniform 4-bit g64", "uniform 8-bit g64"] and "mlx_lm mixed_4_6" in names
    for c in record["comparisons"]:
        assert c["held_out"]["mean"] >= 0 and ("ours" not in c or c["ours"]["bytes"] <= c["bytes"])
    assert "beside mlx_lm's plans" in done.stderr


@pytest.mark.slow
def test_a_plan_nothing_passes_is_written_nowhere_it_would_be_used(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    done = _plan_weights(tmp_path, tiny_kv_model_dir, 1e-12, "--no-compare")
    assert done.returncode == 1 and "no plan passed the gate's limits on the selection" in done.stderr, done.stderr
    assert not (tmp_path / "weights_config.json").exists() and not (tmp_path / "planned").exists()
    record = json.loads((tmp_path / "weights_config.search.json").read_text())
    assert record["chosen"] == "none" and record["verification"] is None and record["comparisons"] == []


@pytest.mark.slow  # the frontier on the tiny llama: the sensitivities, 4 plans along the path, one gate run
def test_plan_weights_frontier_measures_the_trade_and_writes_the_answer_as_mlx_lm_s_block(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    done = _plan_weights(tmp_path, tiny_kv_model_dir, 0.05, "--frontier", "--points", "4", "--long-tokens", "0")
    record = json.loads((tmp_path / "weights_config.search.json").read_text())
    points = record["frontier"]
    assert len(points) >= 6 and all("quantization" in p and "kv_config" not in p for p in points), done.stderr
    assert [p["bytes_per_token"] for p in points] == sorted(p["bytes_per_token"] for p in points)
    on = [p for p in points if p["frontier"]]
    for p in on:  # no measured plan has fewer bytes and a lower bound than a frontier point
        assert not any(
            q["bytes_per_token"] < p["bytes_per_token"] and q["mean_ci"][1] < p["mean_ci"][1] for q in points
        )
    assert all(p["bytes_per_token"] <= record["plain_bytes_per_token"] for p in points)  # plain: the dearest
    page = (tmp_path / "weights_config.frontier.html").read_text()
    assert "weight bytes, share of the weights as loaded" in page and "weight bytes" in done.stderr
    if record["answer"] is None:
        assert done.returncode == 1 and not (tmp_path / "weights_config.json").exists()
        return
    answer = points[record["answer"]]
    assert answer["verdict"] == "pass" and answer["frontier"]
    assert (done.returncode == 0) == record["verification"]["verified"], done.stderr
    written = tmp_path / ("weights_config.json" if done.returncode == 0 else "weights_config.unverified.json")
    assert json.loads(written.read_text()) == answer["quantization"] == record["quantization"]
    assert (tmp_path / "planned").is_dir() == (done.returncode == 0)


def test_a_weights_gate_names_a_plan_file_beside_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate module's `cand="weights_config.json"` is the file beside the module, wherever pytest runs."""
    from pytest_mlxgate.explain.plan_gate import read_gate

    spec = WeightsSpec(8, 64, (("model.embed_tokens", None), ("model.layers.0.mlp.down_proj", (6, 64))))
    (tmp_path / "weights_config.json").write_text(json.dumps(quantization_block(spec)))
    gate = tmp_path / "test_planned.py"
    gate.write_text(WEIGHTS_GATE.format(mean=0.1).replace('{"bits": 8, "group_size": 64}', '"weights_config.json"'))
    monkeypatch.chdir(tmp_path.parent)
    read = read_gate(gate, kind="weights").lever.weights_spec("candidate")
    assert read is not None and read.layers == spec.layers and read.source == str(tmp_path / "weights_config.json")
    assert read.describe() == "weights plan (weights_config.json): 1 × as loaded, 1 × 6-bit g64; others 8-bit g64"


def test_the_sensitivities_and_the_plan_say_what_they_measured(tiny_kv_model_dir: Path) -> None:
    """The search's middle on the tiny llama, small: every uniform option measured with its bytes (the model's
    plan priced as `plan_bytes` prices it), each module's quantization error at every option it may take,
    each module alone at the probe; the plan it chooses carries its spec, and its JSON every figure it rests
    on (the sensitivities sorted, the comparisons list). The fast lane's reach into plan_weights."""
    import mlx_lm
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain.plan_weights import (
        choose_weights_plan,
        measure_weight_sensitivities,
        weight_arms,
        weights_spec,
    )
    from pytest_mlxgate.explain.plan_weights_compare import compare_with_recipes, dynamic_quant_plan

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    gate = weights_gate_spec(tiny_kv_model_dir.parent)
    with weight_arms(model, tokenizer, gate, bits=(4, 8), groups=(64,), selection=2, say=lambda _: None) as arms:
        sens = measure_weight_sensitivities(arms, gate.limits)
        assert [u["option"] for u in sens.uniform] == [o.label for o in arms.options]
        assert all(
            u["bytes"] == arms.plan_bytes(arms.uniform(o)) for u, o in zip(sens.uniform, arms.options, strict=True)
        )
        assert {p for p, _ in sens.errors} == set(arms.units) and all(e >= 0 for e in sens.errors.values())
        assert set(sens.sensitivity) == {p for p, u in arms.units.items() if u.allows(sens.probe)}
        for u, o in zip(sens.uniform, arms.options, strict=True):  # each row the figures of its own measurement
            stats = sens.uniform_stats[o]
            assert u["mean"] == stats.mean and u["mean_ci"] == list(stats.mean_ci)
            assert u["passes"] == (selection_verdict(stats, gate.limits) == "pass")
        found = choose_weights_plan(arms, sens, gate.limits)
        assert found.spec == weights_spec(found.plan, arms.units)
        # each round priced in the model's bytes (its planned modules' and every other parameter's)
        assert all(set(r) >= {"bytes"} and "bytes_per_token" not in r for r in found.rounds), found.rounds
        assert all(arms.fixed_bytes < r["bytes"] <= found.plain_bytes for r in found.rounds)
        # against the uniform plans, each way: none passes, so the mixed plan stands on its own verdict...
        failing = [{**u, "passes": False} for u in sens.uniform]
        alone = choose_weights_plan(arms, replace(sens, uniform=failing), gate.limits)
        assert alone.chosen == ("mixed" if alone.passed_selection else "none"), alone.notes
        # ...and one that passes at fewer bytes than any plan is chosen whole: its plan, spec and bytes
        cheap = [{**sens.uniform[0], "passes": True, "bytes": 0.0}, *failing[1:]]
        uniform = choose_weights_plan(arms, replace(sens, uniform=cheap), gate.limits)
        assert uniform.chosen == f"uniform {arms.options[0].label}" and uniform.passed_selection
        assert uniform.plan == arms.uniform(arms.options[0]) and uniform.spec == weights_spec(uniform.plan, arms.units)
        assert uniform.bytes == arms.plan_bytes(uniform.plan)
        assert uniform.notes[-1] == f"no mixed plan found costs fewer bytes than {uniform.chosen}, which passes"
        # mlx_lm's dynamic_quant is given the mixed plan's bytes; beside a uniform answer (one of its own
        # plans), halfway between uniform 6- and 8-bit
        halfway = sum(arms.plan_bytes(arms.uniform(Option(b, 64))) for b in (6, 8)) / 2
        for result, budget in ((uniform, halfway), *(((alone, alone.bytes),) if alone.chosen == "mixed" else ())):
            said: list[str] = []
            rows = {r["name"]: r for r in compare_with_recipes(arms, sens, result, say=said.append)}
            assert rows["mlx_lm dynamic_quant 4/8"]["bytes"] <= budget
            assert said == [f"plan weights: mlx_lm dynamic_quant 4->8 bits within {budget:,.0f} bytes"]
            if result is uniform:  # halfway to 8-bit is room to upgrade modules past 4-bit
                assert rows["mlx_lm dynamic_quant 4/8"]["bytes"] > arms.plan_bytes(arms.uniform(Option(4, 64)))
            assert set(rows) >= {"uniform 4-bit g64", "uniform 8-bit g64", "mlx_lm mixed_4_6"}
        assert uniform.comparisons == []  # compare_with_recipes returns its rows: the caller keeps them
        # its rule spends the budget to the byte: at uniform 8-bit's bytes every module that may takes 8 bits
        eight = arms.plan_bytes(arms.uniform(Option(8, 64)))
        dynamic, _ = dynamic_quant_plan(arms, 4, 8, eight)
        assert arms.plan_bytes(dynamic) == eight and dynamic == arms.uniform(Option(8, 64))
        strict = {"mean": 1e-30, "top1": 1.0}  # nothing passes: it says so, and what to do
        nothing = choose_weights_plan(arms, measure_weight_sensitivities(arms, strict), strict)
        assert nothing.chosen == "none" and nothing.notes[-1] == (
            "no plan among 4-bit g64, 8-bit g64 per module passed the gate's limits on the selection sequences"
            f"{' but every module as loaded' if nothing.passed_selection else ''}; keep the weights as loaded, or "
            "widen the options (--bits, --group-sizes)"
        )
        plain = weights_spec({p: PLAIN_OPTION for p in arms.units}, arms.units)  # nothing quantized: 8-bit g64
        assert (plain.bits, plain.group_size) == (8, 64) and all(entry is None for _, entry in plain.layers)
    doc = found.to_json()
    assert doc["rounds"] == found.rounds and len(found.rounds) >= 1
    assert (doc["bytes"], doc["plain_bytes"]) == (found.bytes, found.plain_bytes) and found.bytes < found.plain_bytes
    assert doc["quantization"] == found.config() == quantization_block(found.spec)
    assert doc["comparisons"] == found.comparisons and list(doc["sensitivity"]) == sorted(sens.sensitivity)
    assert doc["sensitivity"] == sens.sensitivity and doc["probe"] == sens.probe.label


def test_mlx_lm_s_plans_stand_beside_ours_each_with_its_own_figures(tiny_kv_model_dir: Path) -> None:
    """The search with its comparisons on the tiny llama, small (the fast lane's reach into
    plan_weights_compare): mlx_lm's uniform, recipe and dynamic_quant plans each measured on the selection
    and on the gate's prompts, ours at each one's bytes (the dearest plan on our path that fits), the
    summary counting every module once; the frontier through the same sensitivities."""
    import mlx_lm
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain.plan_frontier import Reach
    from pytest_mlxgate.explain.plan_weights_compare import (
        search_weights_frontier,
        search_weights_plan,
        weights_summary,
    )

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    gate = weights_gate_spec(tiny_kv_model_dir.parent)
    said: list[str] = []
    found = search_weights_plan(model, tokenizer, gate, bits=(4, 8), groups=(64,), selection=2, say=said.append)
    assert [r["name"] for r in found.comparisons] == [
        "uniform 4-bit g64",
        "uniform 8-bit g64",
        "mlx_lm mixed_3_6",
        "mlx_lm mixed_4_6",
        "mlx_lm dynamic_quant 4/8",
    ]
    assert any("mlx_lm dynamic_quant 4->8 bits within" in s for s in said)
    for row in found.comparisons:  # each plan measured under its own name, ours under the name of theirs
        named = [f"plan weights: compare: {row['name']} (selection)"]
        named += [f"plan weights: compare: ours within {row['name']}'s bytes (selection)"] if "ours" in row else []
        assert all(any(s.startswith(n) for s in said) for n in named), (named, said)
    for row in found.comparisons:
        assert row["bytes"] > 0 and set(row) <= {"name", "bytes", "selection", "held_out", "ours"}
        for part in (row["selection"], row["held_out"], *((row["ours"]["held_out"],) if "ours" in row else ())):
            lo, hi = part["mean_ci"]
            assert isinstance(lo, float) and lo <= part["mean"] <= hi and part["mean"] >= 0
        if "ours" in row:
            assert row["ours"]["bytes"] <= row["bytes"]
    assert "ours" in found.comparisons[1]  # every plan on our path fits within uniform 8-bit's bytes
    assert "ours" in found.comparisons[0]  # and our path starts at each module's cheapest: within 4-bit's too
    summary = weights_summary(found)
    counted = [int(n) for n in re.findall(r"(\d+) modules? ", summary[0])]
    assert summary[0].startswith(f"plan ({found.chosen}): ") and sum(counted) == len(found.plan)
    assert counted == sorted(counted, reverse=True)  # the most common option first
    assert "  beside mlx_lm's plans, at their bytes (mean KL on the gate's own prompts):" in summary
    assert any(line.startswith("    uniform 4-bit g64: ") for line in summary)  # each comparison indented under it
    frontier = search_weights_frontier(model, tokenizer, gate, Reach(2), bits=(4, 8), groups=(64,), selection=2)
    assert frontier.points and frontier.selection == 2 and frontier.seconds > 0


@pytest.mark.parametrize(
    ("ours", "word"),
    [
        (0.5, "(0.50x, lower)"),
        (2.0, "(2.00x, higher)"),
        (1.02, "(1.02x, the same (a tie))"),
        (None, "ours: no plan"),
        (0.0, "(nanx, the same (a tie))"),  # theirs drifted nothing: no ratio to read
    ],
)
def test_a_comparison_reads_ours_against_theirs_in_words(ours: float | None, word: str) -> None:
    from pytest_mlxgate.explain.plan_weights_compare import comparison_lines

    theirs = 0.0 if ours == 0.0 else 0.01
    row: dict[str, Any] = {"name": "mlx_lm mixed_4_6", "bytes": 1000.0, "held_out": {"mean": theirs}}
    if ours is not None:
        row["ours"] = {"bytes": 900.0, "held_out": {"mean": 0.01 * ours}}
    [line] = comparison_lines([row])
    assert (
        line.startswith(f"  mlx_lm mixed_4_6: 1,000 B, mean KL {theirs:.3g} on the gate's prompts · ") and word in line
    )


def test_ours_at_their_bytes_starts_from_each_module_s_cheapest_option_it_may_take(tiny_kv_model_dir: Path) -> None:
    """At group 128 the tiny llama's modules reading its 64-wide hidden state take no option (they stay
    float): our path starts there, so a recipe cheaper than that start has no plan of ours beside it, and
    none of ours is ever a plan with a module at an option it refuses (cheaper, and not what mlx_lm makes)."""
    import mlx_lm
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain.plan_weights import measure_weight_sensitivities, start_plan, weight_arms
    from pytest_mlxgate.explain.plan_weights_compare import compare_with_recipes

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    gate = weights_gate_spec(tiny_kv_model_dir.parent)
    with weight_arms(model, tokenizer, gate, bits=(4, 8), groups=(128,), selection=2, say=lambda _: None) as arms:
        refusing = {p for p, u in arms.units.items() if not u.allows(Option(4, 128))}
        assert refusing and refusing != set(arms.units)  # some modules stay float, some quantize
        start = arms.plan_bytes(start_plan(arms))
        result = SimpleNamespace(bytes=start, chosen="none", notes=[])
        rows = compare_with_recipes(arms, measure_weight_sensitivities(arms, gate.limits), result)  # type: ignore[arg-type]
    assert [r["name"] for r in rows] == ["mlx_lm mixed_3_6", "mlx_lm mixed_4_6"]  # no g64 option: no uniform rows
    for row in rows:
        assert ("ours" in row) == (row["bytes"] >= start), (row["name"], row["bytes"], start)
        assert "ours" not in row or start <= row["ours"]["bytes"] <= row["bytes"]


def _hand_made_search() -> Any:
    """A weights search as a reader meets it: a mixed plan (a module as loaded, one 4-bit, two 8-bit), two
    uniform plans, two rounds (the second passing at the long context too), one comparison, a note, verified."""
    from pytest_mlxgate.explain.plan_weights import WeightsPlanSearch, weights_spec

    plan = {
        "model.embed_tokens": PLAIN_OPTION,
        "model.layers.0.mlp.down_proj": Option(4, 64),
        "model.layers.0.self_attn.q_proj": Option(8, 64),
        "model.layers.1.self_attn.q_proj": Option(8, 64),
    }
    return WeightsPlanSearch(
        plan=plan,
        spec=weights_spec(plan, plan),
        bytes=1.5e6,
        plain_bytes=6e6,
        uniform=[
            {"option": "4-bit g64", "mean": 0.031, "mean_ci": [0.02, 0.04], "passes": False, "bytes": 1.2e6},
            {"option": "8-bit g64", "mean": 2e-4, "mean_ci": [1e-4, 3e-4], "passes": True, "bytes": 1.8e6},
        ],
        rounds=[
            {
                "target": 1e-3,
                "predicted": 9e-4,
                "mean": 1.2e-3,
                "mean_ci": [8e-4, 1.6e-3],
                "verdict": "fail",
                "checks": {"mean": "fail", "top1": "pass"},
                "bytes": 1.4e6,
            },
            {
                "target": 5e-4,
                "predicted": 4e-4,
                "mean": 4e-4,
                "mean_ci": [3e-4, 5e-4],
                "verdict": "pass",
                "checks": {"mean": "pass"},
                "bytes": 1.5e6,
                "long": {"mean": 6e-4, "mean_ci": [4e-4, 8e-4], "verdict": "pass"},
            },
        ],
        probe="4-bit g64",
        passed_selection=True,
        chosen="mixed",
        selection=4,
        seconds=61.4,
        comparisons=[
            {
                "name": "mlx_lm mixed_4_6",
                "bytes": 1.6e6,
                "held_out": {"mean": 8e-4},
                "ours": {"bytes": 1.5e6, "held_out": {"mean": 4e-4}},
            }
        ],
        sensitivity={"model.layers.0.self_attn.q_proj": 2e-4, "model.layers.0.mlp.down_proj": 1e-3},
        verification={
            "verified": True,
            "tokens": 16,
            "verdicts": {"g.py::test_drift": "pass"},
            "long": {"tokens": 64, "verdicts": {"g.py::test_drift": "pass"}},
        },  # fmt: skip
        notes=["a note"],
    )


def test_a_weights_search_reads_whole_in_its_json() -> None:
    """Every field under its own name, the plan as mlx_lm's quantization block (an as-loaded module `False`),
    the sensitivities sorted by module."""
    found = _hand_made_search()
    assert found.to_json() == {
        "quantization": {
            "bits": 8,
            "group_size": 64,
            "mode": "affine",
            "model.embed_tokens": False,
            "model.layers.0.mlp.down_proj": {"bits": 4, "group_size": 64, "mode": "affine"},
            "model.layers.0.self_attn.q_proj": {"bits": 8, "group_size": 64, "mode": "affine"},
            "model.layers.1.self_attn.q_proj": {"bits": 8, "group_size": 64, "mode": "affine"},
        },
        "bytes": 1.5e6,
        "plain_bytes": 6e6,
        "chosen": "mixed",
        "probe": "4-bit g64",
        "uniform": found.uniform,
        "rounds": found.rounds,
        "comparisons": found.comparisons,
        "passed_selection": True,
        "selection_sequences": 4,
        "sensitivity": {"model.layers.0.mlp.down_proj": 1e-3, "model.layers.0.self_attn.q_proj": 2e-4},
        "seconds": 61.4,
        "verification": found.verification,
        "notes": ["a note"],
    }
    assert list(found.to_json()["sensitivity"]) == sorted(found.sensitivity)


def test_a_weights_search_reads_whole_in_words() -> None:
    """The summary a user reads, line by line: the plan counted by option (most common first, one module
    said as one), its share of the weights as loaded, the uniform plans, the rounds, mlx_lm's plan beside
    ours, the note, the verification and the time."""
    from pytest_mlxgate.explain.plan_weights_compare import weights_summary

    assert weights_summary(_hand_made_search()) == [
        "plan (mixed): 2 modules 8-bit g64, 1 module as loaded, 1 module 4-bit g64 · 1,500,000 weight bytes "
        "(25.0% of the weights as loaded)",
        "  sensitivities: each module alone at 4-bit g64, scaled by its own quantization error per option",
        "  uniform 4-bit g64: mean KL 0.031 on the selection, does not pass · 0.800x the plan's bytes",
        "  uniform 8-bit g64: mean KL 0.0002 on the selection, passes · 1.200x the plan's bytes",
        "  round 1: predicted 0.0009 <= target 0.001; measured mean KL 0.0012 [0.0008, 0.0016] (mean fail) -> fail "
        "on 4 selection sequences",
        "  round 2: predicted 0.0004 <= target 0.0005; measured mean KL 0.0004 [0.0003, 0.0005], at the long "
        "context 0.0006 (pass) -> pass on 4 selection sequences",
        "  beside mlx_lm's plans, at their bytes (mean KL on the gate's own prompts):",
        "    mlx_lm mixed_4_6: 1,600,000 B, mean KL 0.0008 on the gate's prompts · ours within its bytes: "
        "1,500,000 B, 0.0004 (0.50x, lower)",
        "  note: a note",
        "  VERIFIED: passes the gate on its own (held-out) prompts at 16 tokens: {'g.py::test_drift': 'pass'}; and "
        "at 64 tokens: {'g.py::test_drift': 'pass'}",
        "  took 61 s",
    ]


def test_a_weights_search_asked_for_a_long_context_measures_each_passing_round_there(
    tiny_kv_model_dir: Path,
) -> None:
    """`long`: the round whose plan passes on the selection is measured again at that many tokens, and the
    round says so with its figure; without it, no round has one."""
    import mlx_lm
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain.plan_weights_compare import search_weights_plan

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    gate = weights_gate_spec(tiny_kv_model_dir.parent)
    asked: dict[str, Any] = dict(bits=(4, 8), groups=(64,), selection=2, compare=False)
    longer = search_weights_plan(model, tokenizer, gate, long=24, **asked)
    passing = [r for r in longer.rounds if r["verdict"] == "pass" or "long" in r]
    assert passing and all(set(r["long"]) == {"mean", "mean_ci", "verdict"} for r in passing), longer.rounds
    assert all("long" not in r for r in search_weights_plan(model, tokenizer, gate, **asked).rounds)


def test_a_weights_frontier_point_is_written_as_mlx_lm_s_quantization_block() -> None:
    """A point on `plan weights --frontier` is written as the search's plan is: the most common option the
    default, every module its own entry, one kept as loaded `False`."""
    from pytest_mlxgate.explain.plan_weights import WeightsPlanSearch
    from pytest_mlxgate.explain.plan_weights_compare import WEIGHT_WORDS

    found: WeightsPlanSearch = _hand_made_search()
    assert WEIGHT_WORDS.config_key == "quantization"
    assert WEIGHT_WORDS.config_of(found.plan) == found.config() == found.to_json()["quantization"]


def test_on_a_model_without_down_proj_mlx_lm_s_recipes_are_named_not_measured(tmp_path: Path) -> None:
    """A tiny random GPT-2 (mlx_lm's own class: its MLP is c_fc/c_proj): the search plans its modules, its
    uniform and dynamic_quant comparisons stand, and each mixed recipe, which needs down_proj, is said not
    measured with mlx_lm's reason; never a traceback."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.models import gpt2
    from plan_gates import weights_gate_spec
    from tinymodel import write_snapshot

    from pytest_mlxgate.explain.plan_weights_compare import search_weights_plan

    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_ctx": 256, "n_positions": 256,
              "n_embd": 64, "n_head": 4, "n_layer": 2, "layer_norm_epsilon": 1e-5, "vocab_size": 49152,
              "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "float32"}  # fmt: skip
    mx.random.seed(0)
    built = gpt2.Model(gpt2.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    folder = write_snapshot(tmp_path / "gpt2", config, dict(tree_flatten(built.parameters())))
    model, tokenizer = mlx_lm.load(str(folder))[:2]
    found = search_weights_plan(model, tokenizer, weights_gate_spec(tmp_path), bits=(4, 8), groups=(64,), selection=2)
    assert not any("down_proj" in p for p in found.plan) and any("c_fc" in p for p in found.plan)
    names = [r["name"] for r in found.comparisons]
    assert names == ["uniform 4-bit g64", "uniform 8-bit g64", "mlx_lm dynamic_quant 4/8"]
    assert [n for n in found.notes if n.startswith("mlx_lm mixed")] == [
        f"mlx_lm {recipe}: not measured (Model does not have expected keys for mixed quant.)"
        for recipe in ("mixed_3_6", "mixed_4_6")
    ]


@settings(max_examples=60, deadline=None)
@given(
    means=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=3, max_size=3),
    width=st.sampled_from([64, 96, 128]),
)
def test_the_probe_is_the_cheapest_calm_option_every_module_takes_or_else_the_dearest(
    means: list[float], width: int
) -> None:
    """Whatever the uniform means: the probe is an option every module may take; the cheapest of those whose
    mean is at most PROBE_MEAN; with none that calm, the dearest of them (the least drift there is)."""
    from pytest_mlxgate.explain.plan_weights import PROBE_MEAN, Unit, probe_option

    options = [Option(2, 64), Option(4, 128), Option(8, 32)]
    units = [Unit("a", (8, 64)), Unit("b", (8, width))]
    by_option = dict(zip(options, means, strict=True))
    probe = probe_option(options, units, by_option, 4)
    # a 64-wide module takes no group of 128, a 96-wide one none of 64 either
    whole = [Option(8, 32)] if width == 96 else [Option(2, 64), Option(8, 32)]
    price = {o: o.bytes_per_value(4) for o in options}
    calm = [o for o in whole if by_option[o] <= PROBE_MEAN]
    assert probe in whole
    if calm:
        assert by_option[probe] <= PROBE_MEAN and all(price[probe] <= price[o] for o in calm)
    else:
        assert all(price[probe] >= price[o] for o in whole)


def test_a_module_takes_a_group_size_that_divides_its_rows_whatever_its_rank() -> None:
    """mlx_lm quantizes along the last axis: a 2-D projection's inputs, and an MoE layer's stacked experts
    (experts, outputs, inputs) too."""
    from pytest_mlxgate.explain.plan_weights import Unit

    experts = Unit("model.layers.0.mlp.switch_mlp.down_proj", (8, 64, 96))
    assert [experts.allows(Option(4, g)) for g in (32, 64, 128)] == [True, False, False]
    assert experts.allows(PLAIN_OPTION) and Unit("p", (96, 128)).allows(Option(4, 128))
