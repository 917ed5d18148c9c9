"""Gate: the candidate is the model it claims to be, and it works.

Every other gate trusts the weights. This one re-hashes the candidate's snapshot against the
hashes that name its blobs — so a corrupt cache fails here, by name, instead of showing up as
unexplained drift in a KL gate — and checks that the model loads and answers a question that
has one right answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_mlxgate import ResolvedSnapshot, verify_snapshot


def test_snapshot_is_intact(mlx_snapshot: ResolvedSnapshot) -> None:
    if mlx_snapshot.kind == "local":
        pytest.skip("a local directory carries no hashes to check against")
    assert mlx_snapshot.repo_id is not None
    report = verify_snapshot(
        mlx_snapshot.repo_id,
        revision=mlx_snapshot.commit,
        repo_type=mlx_snapshot.repo_type,
        cache_dir=mlx_snapshot.dir.parents[2],
    )
    assert report.files_checked > 0
    assert report.ok, (
        f"{mlx_snapshot.pinned}: the cached snapshot is corrupt:\n  "
        + "\n  ".join(report.problems)
        + f"\nfix: mlxgate verify {mlx_snapshot.name} --repair, then run again to fetch the damaged files"
    )


def test_model_answers(mlx_trained_model: tuple[Any, Any]) -> None:
    """A chat model is asked through its chat template; a base model (no template) the same question
    as a plain-text Q/A completion. (Not "The capital of France is": gemma-3-270m's greedy ending is
    " the capital of the country of France. It is the largest city ...", a fluent answer without the
    name, while the Q/A form is answered " The capital of France is Paris.")"""
    import mlx_lm

    model, tokenizer = mlx_trained_model
    has_template = getattr(tokenizer, "has_chat_template", None)
    if not isinstance(has_template, bool):  # a tokenizer that is not mlx_lm's wrapper
        has_template = getattr(tokenizer, "chat_template", None) is not None
    if has_template:
        question = "What is the capital of France?"
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        asked = f"greedy answer to {question!r}"
    else:
        prompt = "Q: What is the capital of France?\nA:"
        asked = f"greedy completion of {prompt!r} (no chat template: a base model)"
    answer = mlx_lm.generate(model, tokenizer, prompt, max_tokens=24)
    assert "Paris" in answer, f"{asked}: {answer!r}"
