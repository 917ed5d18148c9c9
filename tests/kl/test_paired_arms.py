"""Both arms on real models: a lever that changes nothing measures exactly 0, one that perturbs the
logits is caught, the reference cache hits and misses exactly when it should, and broken arms fail
with the arm, prompt and position named."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx  # noqa: F401  (imported once, before anything pytester runs in-process)
import pytest

from pytest_mlxgate import assert_kl_below
from pytest_mlxgate.errors import NonFiniteLogitsError, VocabularyMismatchError
from pytest_mlxgate.kl.measure import check_same_vocabulary
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
from pytest_mlxgate.kl.refcache import ReferenceCache
from pytest_mlxgate.kl.shape import RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.models.loaded import LoadedModel
from pytest_mlxgate.models.materialize import ResolvedSnapshot
from pytest_mlxgate.session.paired_run import PairedRun

MACHINE = {"device": "cpu", "blas": "test"}


def _loaded(path: Path, name: str = "tiny") -> LoadedModel:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(name=name, kind="local", repo_id=None, commit="local", path=str(path), source="local")
    return LoadedModel(model, tokenizer, snap)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LoadedModel:
    return _loaded(tiny_model_dir)


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    from pytest_mlxgate.models.embedded import EMBEDDED_REPO_ID, ensure_embedded_snapshot

    path = ensure_embedded_snapshot()
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(
        name="smollm2-135m",
        kind="embedded",
        repo_id=EMBEDDED_REPO_ID,
        commit=path.name,
        path=str(path),
        source="cached",
    )
    return LoadedModel(model, tokenizer, snap)


def _run(
    model: LoadedModel, lever: Lever, shape: RunShape, *, n: int = 3, cache: ReferenceCache | None = None, **kw: Any
) -> PairedRun:
    seqs = build_sequences(default_prompts(), model.tokenizer, n=n, tokens=shape.tokens)
    kw.setdefault("allow_untrained", True)  # tiny random models: the gates' arms are what is tested
    return PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=model,
        reference=kw.pop("reference", None),
        machine=kw.pop("machine", MACHINE),
        cache=cache,
        **kw,
    )


def env_lever(path: str = "prefill") -> Lever:
    """A lever on a variable nothing reads: both arms compute exactly the same thing."""
    return Lever(name="unused", kind="env", target="MLXGATE_TEST_UNUSED_FLAG", ref="0", cand="1", path=path)  # type: ignore[arg-type]


class _ScaledNorm:
    """A context lever: scale every RMSNorm weight of the model in the candidate arm."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, value: object) -> Any:
        import contextlib

        @contextlib.contextmanager
        def scaled() -> Any:
            layers = self.model.model.layers
            saved = [layer.input_layernorm.weight for layer in layers]
            if value == "scaled":
                for layer in layers:
                    layer.input_layernorm.weight = layer.input_layernorm.weight * 1.02
            try:
                yield
            finally:
                for layer, w in zip(layers, saved, strict=True):
                    layer.input_layernorm.weight = w

        return scaled()


def perturbing_lever(model: LoadedModel, path: str = "prefill") -> Lever:
    return Lever(
        name="norm_scale",
        kind="context",
        target="test",
        ref="plain",
        cand="scaled",  # type: ignore[arg-type]
        path=path,
        factory=_ScaledNorm(model.model),
    )


# -- the real embedded model ---------------------------------------------------------------------


@pytest.mark.slow  # the real embedded model
@pytest.mark.parametrize("path", ["prefill", "serving"])
def test_a_lever_that_changes_nothing_measures_exactly_zero(embedded: LoadedModel, path: str) -> None:
    shape = RunShape(path=path, tokens=48, decode=8)  # type: ignore[arg-type]
    result = _run(embedded, env_lever(path), shape, n=2).kl()
    s = result.stats.to_json()
    assert s["n_prompts"] == 2 and s["n_tokens"] == 2 * shape.scored
    assert s["mean"] == 0.0 and s["max"] == 0.0
    assert s["same_top"] == 1.0 and s["flips"] == 0
    assert s["ln_ppl_ratio"] == 0.0
    assert_kl_below(result, mean=1e-12, max=1e-12)


@pytest.mark.slow  # the real embedded model
def test_a_perturbing_lever_is_caught_with_a_report(embedded: LoadedModel) -> None:
    shape = RunShape(path="prefill", tokens=48, decode=8)
    result = _run(embedded, perturbing_lever(embedded), shape, n=3).kl()
    s = result.stats.to_json()
    assert s["mean"] > 1e-5, s
    assert s["mean_ci"][0] <= s["mean"] <= s["mean_ci"][1]
    with pytest.raises(AssertionError) as failure:
        assert_kl_below(result, mean=1e-6, top1=0.5)
    text = str(failure.value)
    assert text.startswith("KL gate failed")
    assert "mean KL" in text and "over 3 prompts, 144 tokens" in text and "> limit 1.00e-06" in text
    assert "worst: prompt" in text and "position" in text
    assert "norm_scale=plain vs norm_scale=scaled" in text
    assert "mlxgate/SmolLM2-135M-Instruct-f32@" in text
    # ... and a limit above the drift passes on the same numbers
    assert_kl_below(result, mean=10 * s["mean_ci"][1])


def test_a_model_s_own_limits_replace_the_gate_s_on_that_model_only(tiny: LoadedModel) -> None:
    """`models=` limits apply when the candidate is that model (by built-in alias, given name or repo id),
    and its record says whose they were; on any other candidate the gate's own decide."""
    import dataclasses

    from pytest_mlxgate.config.names import BUILT_MODELS

    result = _run(tiny, perturbing_lever(tiny), RunShape(path="prefill", tokens=32, decode=8), n=3).kl()
    mean = result.stats.to_json()["mean_ci"][1]
    assert mean > 0
    loose = {"gemma3-270m": {"mean": 10 * mean}}
    with pytest.raises(AssertionError, match="KL gate failed"):
        assert_kl_below(result, mean=mean / 10, models=loose)  # the tiny model is not gemma3-270m
    as_gemma = dataclasses.replace(result, candidate={"name": "x", "repo_id": BUILT_MODELS["gemma3-270m"]})
    assert_kl_below(as_gemma, mean=mean / 10, models=loose)  # by its repo id: the alias's limits
    as_named = dataclasses.replace(result, candidate={"name": "org/other", "repo_id": "org/other"})
    assert_kl_below(as_named, mean=mean / 10, models={"org/other": {"mean": 10 * mean}})
    with pytest.raises(ValueError, match="metrics among"):
        assert_kl_below(as_gemma, mean=1.0, models={"gemma3-270m": {"meen": 1.0}})
    with pytest.raises(ValueError, match="the embedded model's limits are the gate's own"):
        assert_kl_below(as_gemma, mean=1.0, models={"smollm2-135m": {"mean": 1.0}})


# -- reference cache -----------------------------------------------------------------------------


def test_the_reference_cache_hits_on_an_unchanged_gate(tiny: LoadedModel, tmp_path: Path) -> None:
    cache = ReferenceCache(tmp_path / "ref")
    shape = RunShape(path="prefill", tokens=32, decode=8)
    first = _run(tiny, perturbing_lever(tiny), shape, cache=cache)
    r1 = first.kl()
    assert r1.reference_source == "computed" and first.counters.reference_forwards == 3
    second = _run(tiny, perturbing_lever(tiny), shape, cache=cache)
    r2 = second.kl()
    assert r2.reference_source == "cache"
    assert second.counters.reference_forwards == 0 and second.counters.candidate_forwards == 3
    assert r2.stats.to_json() == r1.stats.to_json()  # the cached reference gives the very same numbers
    refreshed = _run(tiny, perturbing_lever(tiny), shape, cache=cache, refresh_reference=True)
    assert refreshed.kl().reference_source == "computed" and refreshed.counters.reference_forwards == 3


@pytest.mark.parametrize(
    "change",
    # Three key inputs in the fast lane, the rest (~2 s each on the tiny model) in the full run only.
    [
        "lever_ref_value",
        "sequences",
        *(pytest.param(c, marks=pytest.mark.slow) for c in ("tokens", "path", "chunk")),
        "machine",
        *(pytest.param(c, marks=pytest.mark.slow) for c in ("model_file", "tokenizer")),
    ],
)
def test_the_reference_cache_misses_when_any_key_input_changes(tiny: LoadedModel, tmp_path: Path, change: str) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(tiny.snapshot.path, model_dir)
    model = _loaded(model_dir)
    cache = ReferenceCache(tmp_path / "ref")
    lever, shape, n, machine = env_lever(), RunShape(path="prefill", tokens=32, decode=8), 3, dict(MACHINE)
    assert _run(model, lever, shape, n=n, cache=cache).kl().reference_source == "computed"
    assert _run(model, lever, shape, n=n, cache=cache).kl().reference_source == "cache"
    if change == "lever_ref_value":
        lever = dataclasses.replace(lever, ref="2")
    elif change == "sequences":
        n = 4
    elif change == "tokens":
        shape = dataclasses.replace(shape, tokens=33)
    elif change == "path":
        lever, shape = env_lever("serving"), dataclasses.replace(shape, path="serving")
    elif change == "chunk":
        shape = dataclasses.replace(shape, chunk=8)
    elif change == "machine":
        machine["blas"] = "other"
    elif change == "model_file":
        (model_dir / "config.json").write_text((model_dir / "config.json").read_text() + "\n")
        model = _loaded(model_dir)
    elif change == "tokenizer":
        cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
        cfg["model_max_length"] = 12345
        (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    run = _run(model, lever, shape, n=n, cache=cache, **({"machine": machine} if change == "machine" else {}))
    assert run.kl().reference_source == "computed"


def test_a_damaged_cache_entry_is_a_miss_not_a_wrong_reference(tiny: LoadedModel, tmp_path: Path) -> None:
    cache = ReferenceCache(tmp_path / "ref")
    shape = RunShape(path="prefill", tokens=32, decode=8)
    _run(tiny, env_lever(), shape, cache=cache).kl()
    (entry,) = (tmp_path / "ref").glob("*.npz")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    again = _run(tiny, env_lever(), shape, cache=cache)
    with pytest.warns(UserWarning, match=r"\.npz is damaged .*recomputing the reference arm and replacing"):
        assert again.kl().reference_source == "computed"
    assert again.kl().stats.to_json()["mean"] == 0.0


# -- broken arms ---------------------------------------------------------------------------------


def test_nan_logits_name_the_arm_prompt_and_position(tiny: LoadedModel) -> None:
    class _Poison:
        def __call__(self, value: object) -> Any:
            import contextlib

            @contextlib.contextmanager
            def poisoned() -> Any:
                norm = tiny.model.model.norm
                saved = norm.weight
                if value == "nan":
                    norm.weight = saved * float("nan")
                try:
                    yield
                finally:
                    norm.weight = saved

            return poisoned()

    lever = Lever(name="poison", kind="context", target="t", ref="ok", cand="nan", path="prefill", factory=_Poison())
    run = _run(tiny, lever, RunShape(path="prefill", tokens=16, decode=4), n=2)
    with pytest.raises(
        NonFiniteLogitsError, match=r"candidate arm \(poison=nan\) produced NaN logits at prompt 0 .*position 0"
    ):
        run.kl()


def test_two_models_with_different_vocabularies_are_refused(tiny: LoadedModel, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny.snapshot.path, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[1000:1002]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped: still not the same tokenizer
    (other / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(
        VocabularyMismatchError, match="different tokenizers .* 2 \\(token, id\\) pairs only in the reference"
    ):
        check_same_vocabulary(_loaded(other, "other"), tiny)
    check_same_vocabulary(tiny, tiny)
