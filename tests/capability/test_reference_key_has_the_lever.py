"""The capability reference cache, seen from the gate: two gates on one model whose levers differ in
their REFERENCE value never share cached reference outputs.

Run through `PairedRun.capability` (what the `paired` fixture runs) with one cache directory, so the
whole key the session builds is exercised, not a key the test hands the runner. The lever scales
every RMSNorm weight in the arm whose value says so: a gate whose reference arm is scaled has other
reference outputs than one whose reference arm is plain, and a cache hit across the two would score
the candidate against the wrong reference.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import user_tasks
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
from pytest_mlxgate.kl.refcache import ReferenceCache
from pytest_mlxgate.kl.shape import RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.models.loaded import LoadedModel
from pytest_mlxgate.models.materialize import ResolvedSnapshot
from pytest_mlxgate.session.paired_run import PairedRun

MACHINE = {"device": "cpu", "blas": "test"}
PROMPTS = ["The river", "Once upon a time there", "1, 2, 3,", "A cat sat on", "Red, green and"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LoadedModel:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_model_dir))[:2]
    snap = ResolvedSnapshot(
        name="tiny", kind="local", repo_id=None, commit="local", path=str(tiny_model_dir), source="local"
    )
    return LoadedModel(model, tokenizer, snap)


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    data = tmp_path / "says.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "target": "x"}) + "\n" for p in PROMPTS))
    user_tasks.jsonl_task("says", data, max_new_tokens=4)
    return "says"


class ScaledNorms:
    """A context lever: in the arm whose value is "scaled", every input RMSNorm weight times 3."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, value: object) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def applied() -> Iterator[None]:
            layers = self.model.model.layers
            saved = [layer.input_layernorm.weight for layer in layers]
            if value == "scaled":
                for layer in layers:
                    layer.input_layernorm.weight = layer.input_layernorm.weight * 3.0
            try:
                yield
            finally:
                for layer, w in zip(layers, saved, strict=True):
                    layer.input_layernorm.weight = w

        return applied()


def _paired(model: LoadedModel, lever: Lever, cache: ReferenceCache | None) -> PairedRun:
    shape = RunShape(path="prefill", tokens=16, decode=4)
    seqs = build_sequences(default_prompts(), model.tokenizer, n=2, tokens=shape.tokens)
    return PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=model,
        reference=None,
        machine=dict(MACHINE),
        cache=cache,
        allow_untrained=True,
        capability_options={"tier": "full"},
    )


def _outputs(run: Any) -> list[str]:
    return [r.output for r in run.reference]


@pytest.mark.parametrize("kind", ["context", "env"])
def test_gates_whose_reference_values_differ_do_not_share_reference_outputs(
    tiny: LoadedModel, task: str, tmp_path: Path, kind: str
) -> None:
    cache = ReferenceCache(tmp_path / "ref")

    def lever(ref: str) -> Lever:
        if kind == "context":
            return Lever(
                name="norms",
                kind="context",
                target="norm_scale",
                ref=ref,
                cand="plain",
                path="prefill",
                factory=ScaledNorms(tiny.model),
            )
        return Lever(name="flag", kind="env", target="MLXGATE_TEST_UNUSED_FLAG", ref=ref, cand="1", path="prefill")

    first_ref, other_ref = ("plain", "scaled") if kind == "context" else ("0", "2")
    first = _paired(tiny, lever(first_ref), cache).capability_arms.capability(task, n=None)
    assert first.reference_source == "computed"
    again = _paired(tiny, lever(first_ref), cache).capability_arms.capability(task, n=None)
    assert again.reference_source == "cache"  # the cache works: an unchanged gate hits it
    assert _outputs(again) == _outputs(first)

    other = _paired(tiny, lever(other_ref), cache).capability_arms.capability(task, n=None)
    assert other.reference_source == "computed", "a gate with another reference value took the cached reference"
    fresh = _paired(tiny, lever(other_ref), None).capability_arms.capability(task, n=None)  # no cache at all
    assert _outputs(other) == _outputs(fresh)
    if kind == "context":  # the wrong entry would have been wrong, not merely reused
        assert _outputs(fresh) != _outputs(first)
