"""A plan search's shared measurements (`explain/plan_rows.py`): a plan decoded from the shared prefill
computes what the serving path computes for it, token for token, and plans side by side in one batch each
compute their own fake-quant, in order, on a llama and on the tiny gemma-4 (sliding, full, KV-shared)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TOKENS, DECODE = 40, 6


def _setup(model_dir: Path) -> tuple[Any, list[Any], Any, list[Any], list[int]]:
    import mlx_lm

    from pytest_mlxgate.explain.plan_kv import _layer_sizes
    from pytest_mlxgate.kl.arms import run_reference
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts
    from pytest_mlxgate.kl.shape import ArmCounters, RunShape
    from pytest_mlxgate.levers.lever import Lever

    model, tok = mlx_lm.load(str(model_dir))
    # 4 sequences: the serving path's first batch holds all 4, as the shared prefill does (one batch: the
    # same float rounding, so equal numbers are expected, not only close ones)
    seqs = build_sequences(default_prompts(), tok, n=4, tokens=TOKENS)
    shape = RunShape("serving", TOKENS, DECODE)
    plain = Lever("plan", "kv", None, None, None, path="serving")
    refs = run_reference(model, seqs, shape, plain, counters=ArmCounters())
    return model, seqs, shape, refs, sorted(_layer_sizes(model)[0])


def _lever(plan: dict[int, Any], tmp: Path) -> Any:
    from pytest_mlxgate.levers.lever import Lever

    path = tmp / f"plan{len(list(tmp.iterdir()))}.json"
    path.write_text(json.dumps({"default": None, "layers": {str(i): o.spec() for i, o in plan.items()}}))
    return Lever("plan", "kv", None, None, str(path), path="serving")


@pytest.mark.parametrize("model_fixture", ["tiny_kv_model_dir", "tiny_gemma4_dir"])
def test_a_plan_from_the_shared_prefill_is_the_serving_path_token_for_token(
    model_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from pytest_mlxgate.explain.plan_kv import Option
    from pytest_mlxgate.explain.plan_rows import SelectionRuns
    from pytest_mlxgate.kl.arms import run_candidate
    from pytest_mlxgate.kl.shape import ArmCounters

    model, seqs, shape, refs, layers = _setup(request.getfixturevalue(model_fixture))
    runs = SelectionRuns(model, seqs, shape, refs)
    assert runs.prefilled is not None  # the prefix fits one prefill chunk: shared
    plans = [
        {i: Option(4, 32) for i in layers},
        {i: Option(8, 64, 4) if n % 2 else Option(2, 64) for n, i in enumerate(layers)},
        {layers[-1]: Option(3, 64)},
    ]
    means = []
    for plan in plans:
        lever = _lever(plan, tmp_path)
        theirs = run_candidate(model, seqs, shape, lever, refs, counters=ArmCounters())
        ours = runs.measure(lever)
        kl = np.concatenate([s.kl for s in theirs])
        assert ours.mean == pytest.approx(float(kl.mean()), rel=1e-6, abs=1e-12)
        assert ours.n_tokens == kl.size == len(seqs) * DECODE
        means.append(ours.mean)
    assert min(means) > 0 and len(set(means)) == len(means)  # three plans, three different drifts
    # the shared prefill is never written by a plan's decode: the first plan again reads the same
    assert runs.measure(_lever(plans[0], tmp_path)).mean == means[0]


@pytest.mark.parametrize("model_fixture", ["tiny_kv_model_dir", "tiny_gemma4_dir"])
def test_plans_side_by_side_each_measure_their_own_fake_quant_in_order(
    model_fixture: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mlxgate.explain import plan_rows
    from pytest_mlxgate.explain.plan_kv import PLAIN_OPTION, Option
    from pytest_mlxgate.explain.plan_rows import SelectionRuns
    from pytest_mlxgate.kl.shape import RunShape

    model, seqs, shape, refs, layers = _setup(request.getfixturevalue(model_fixture))
    runs = SelectionRuns(model, seqs, shape, refs)
    plans: list[dict[int, Any]] = [{i: Option(2, 64)} for i in layers]  # each layer alone: the sensitivities
    plans += [{layers[0]: PLAIN_OPTION}, {i: Option(4, 64, 2) for i in layers}]
    real = [runs.measure(_lever(p, tmp_path)).mean for p in plans]
    together = [s.mean for s in runs.measure_many(plans)]
    # fake-quant: the real plan's numbers up to its kernels' float rounding (decode KL < 1e-6 here)
    assert together == pytest.approx(real, rel=1e-3, abs=1e-7)
    # a plain plan drifts by float rounding only (a batch of another size), each layer alone far more
    assert together[-2] < 1e-6 and min(together[: len(layers)]) > 100 * together[-2]
    assert len({round(m, 12) for m in together[: len(layers)]}) == len(layers)  # each row group its own layer
    # a batch too small for them all: the plans split over batches, each still its own
    monkeypatch.setattr(plan_rows, "SERVING_BATCH_BYTES", len(seqs) * DECODE * refs[0].vocab_size * 4 * 2)
    assert [s.mean for s in runs.measure_many(plans)] == pytest.approx(together, rel=1e-5, abs=1e-7)
    # a prefix past one prefill chunk shares nothing (later chunks attend the plan's cache): the whole path
    chunked = SelectionRuns(model, seqs, RunShape("serving", TOKENS, DECODE, chunk=8), refs)
    assert chunked.prefilled is None
    assert [s.mean for s in chunked.measure_many(plans[-3:])] == pytest.approx(
        [chunked.measure(_lever(p, tmp_path)).mean for p in plans[-3:]], rel=1e-3, abs=1e-7
    )
