"""n counts independent texts: a prompts file of one text, cut into 16 windows, is n = 1 through the
real measurement (the tiny llama, both arms), and a gate on it cannot pass on a bound it does not have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, load_prompts_file, sequences_digest, texts_of
from pytest_mlxgate.kl.shape import RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.models.loaded import LoadedModel
from pytest_mlxgate.models.materialize import ResolvedSnapshot
from pytest_mlxgate.session.paired_run import PairedRun


def _measured(model_dir: Path, prompts_file: Path, n: int) -> dict[str, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    snap = ResolvedSnapshot(name="t", kind="local", repo_id=None, commit="local", path=str(model_dir), source="local")
    seqs = build_sequences(load_prompts_file(prompts_file), tokenizer, n=n, tokens=24)
    run = PairedRun(
        lever=Lever("kv", "kv", None, "plain", "bits=4,group_size=64,start=0", path="serving"),
        shape=RunShape("serving", 24, 4),
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=LoadedModel(model, tokenizer, snap),
        reference=None,
        machine={"device": "cpu"},
        allow_untrained=True,
    )
    return {"texts": texts_of(seqs), "stats": run.kl().stats.to_json()}


@pytest.mark.parametrize(("lines", "texts"), [(1, 1), (2, 2)])
def test_a_prompts_file_of_few_texts_is_n_of_its_texts(
    tiny_kv_model_dir: Path, tmp_path: Path, lines: int, texts: int
) -> None:
    plain = [p.text for p in default_prompts() if p.text]
    prompts = tmp_path / "prompts.jsonl"  # each line one long text: enough for 16 windows of 25 tokens
    prompts.write_text("".join(json.dumps({"text": " ".join(plain[k::2])}) + "\n" for k in range(lines)))
    measured = _measured(tiny_kv_model_dir, prompts, 16)
    stats = measured["stats"]
    assert len(set(measured["texts"])) == texts and stats["n_sequences"] == 16
    assert stats["n_prompts"] == texts  # before: 16
    (mean,) = kl_checks(stats, {"mean": 100.0})  # a limit nothing could cross
    assert mean["n"] == texts
    assert mean["verdict"] == ("inconclusive" if texts == 1 else mean["verdict"])
    if texts == 1:
        assert stats["mean_ci"][1] is None
