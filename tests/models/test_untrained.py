"""The untrained-model check: the embedded (trained) model passes it, random-weight models do not."""

from __future__ import annotations

import math
from pathlib import Path

from pytest_mlxgate.models.untrained import mean_nll, untrained_reason, untrained_reason_for_prompts


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
