"""The untrained-model check: the embedded (trained) model passes it, random-weight models do not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_mlxgate.kl.untrained import mean_nll, untrained_reason, untrained_reason_for_prompts


def test_a_trained_model_is_far_below_a_uniform_guess() -> None:
    import mlx_lm

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    model, tok = mlx_lm.load(str(ensure_embedded_snapshot()))
    assert untrained_reason_for_prompts(model, tok) is None
    nll, vocab = mean_nll(model, [list(tok.encode("The capital of France is Paris. The capital of Spain is Madrid."))])
    assert nll < 0.5 * math.log(vocab)


def test_random_weights_are_named_with_their_figures(tiny_model_dir: Path, tiny_gemma4_dir: Path) -> None:
    import mlx_lm

    for path in (tiny_model_dir, tiny_gemma4_dir):
        model, tok = mlx_lm.load(str(path))
        reason = untrained_reason_for_prompts(model, tok)
        assert reason is not None and "looks untrained" in reason and "--mlx-allow-untrained" in reason
        assert "49152 tokens (10.8)" in reason


def test_nothing_to_read_is_not_a_verdict(tiny_model_dir: Path) -> None:
    import mlx_lm

    model, _ = mlx_lm.load(str(tiny_model_dir))
    assert untrained_reason(model, [[5]]) is None  # one token predicts nothing


def test_the_check_runs_once_per_model_and_sample_in_a_process(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gate modules with the same prompts on the same model ask the same question: one forward answers all
    of them; another sample, or another model object (a quantized copy), is asked afresh."""
    import mlx_lm

    from pytest_mlxgate.kl import untrained

    calls = []
    real = untrained.mean_nll
    monkeypatch.setattr(untrained, "mean_nll", lambda m, s: calls.append(len(s)) or real(m, s))
    model, _ = mlx_lm.load(str(tiny_model_dir))
    other, _ = mlx_lm.load(str(tiny_model_dir))
    sample = [[1, 2, 3, 4], [5, 6, 7, 8]]
    first = untrained_reason(model, sample)
    assert untrained_reason(model, [list(s) for s in sample]) == first and len(calls) == 1
    untrained_reason(model, [[1, 2, 3, 5]])
    untrained_reason(other, sample)
    assert len(calls) == 3
