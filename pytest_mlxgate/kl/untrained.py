"""Is the reference model trained at all? Gates' limits presume a model that predicts text.

A random-weight model (what a plugin's own tests and a CI smoke job use) or a broken conversion
predicts text no better than a uniform guess over its vocabulary: its mean next-token NLL is near
or above ln V (the check: >= 0.75 ln V) (trained models: ~2-3 nats; the embedded 135M model: 2.4; random ones: 13-20 at
ln V = 10.8). Drift limits and capability margins calibrated on trained models say nothing there,
so a gate skips, naming the figures, unless told it may run (`--mlx-allow-untrained`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .prompts import default_prompts

__all__ = [
    "SAMPLE_SEQUENCES",
    "SAMPLE_TOKENS",
    "UNTRAINED_SHARE",
    "mean_nll",
    "untrained_reason",
    "untrained_reason_for_prompts",
]

#: Untrained: a mean NLL at least this share of ln V (a uniform guess). Trained models sit far below
#: (the embedded 135M model: 0.22); the margin keeps a near-uniform model from slipping under ln V.
UNTRAINED_SHARE = 0.75
#: The check reads this many of the gate's KL sequences, each cut to this many tokens: one forward.
SAMPLE_SEQUENCES = 4
SAMPLE_TOKENS = 128


def mean_nll(model: Any, sequences: Sequence[Sequence[int]]) -> tuple[float, int]:
    """(mean next-token NLL in nats, vocabulary size) of `model` over `sequences` (each >= 2 ids)."""
    total, count, vocab = 0.0, 0, 0
    for ids in sequences:
        x = mx.array([list(ids)])
        logits = model(x[:, :-1])[0].astype(mx.float32)
        vocab = int(logits.shape[-1])
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked = logp[mx.arange(len(ids) - 1), x[0, 1:]]
        total -= float(picked.sum().item())
        count += len(ids) - 1
    return total / max(count, 1), vocab


def untrained_reason(model: Any, sequences: Sequence[Sequence[int]]) -> str | None:
    """The skip reason when `model` predicts `sequences` no better than a uniform guess, else None.
    Once per model object and sample in a process: gate modules with the same prompts ask the same."""
    sample = [list(s)[:SAMPLE_TOKENS] for s in sequences[:SAMPLE_SEQUENCES] if len(s) >= 2]
    if not sample:
        return None
    key = (id(model), tuple(tuple(s) for s in sample))
    if key not in _CHECKED:
        _CHECKED[key] = (model, _reason(model, sample))  # the model held too: its id is not reused meanwhile
    return _CHECKED[key][1]


#: (id of a model, its sample) -> (the model, the reason or None): the check's answers in this process.
_CHECKED: dict[tuple[int, tuple[tuple[int, ...], ...]], tuple[Any, str | None]] = {}


def _reason(model: Any, sample: list[list[int]]) -> str | None:
    nll, vocab = mean_nll(model, sample)
    uniform = math.log(vocab)
    if nll < UNTRAINED_SHARE * uniform:
        return None
    return (
        f"the reference model looks untrained: its mean next-token NLL on the gate's prompts is {nll:.1f} "
        f"nats, hardly better than a uniform guess over {vocab} tokens ({uniform:.1f}); drift limits and "
        "capability margins presume a trained model. Use trained weights (a random or broken conversion "
        "scores like this), or pass --mlx-allow-untrained to run the gate anyway"
    )


def untrained_reason_for_prompts(model: Any, tokenizer: Any) -> str | None:
    """`untrained_reason` over the built-in KL prompts, tokenized with `tokenizer`."""
    texts = [p.text or str((p.messages or [{}])[-1].get("content", "")) for p in default_prompts()[:SAMPLE_SEQUENCES]]
    return untrained_reason(model, [list(tokenizer.encode(t))[:SAMPLE_TOKENS] for t in texts])
