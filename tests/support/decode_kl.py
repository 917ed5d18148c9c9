"""What the KV-plan tests share: a model loaded from a folder, and the KL of one plan against another at
each decode step, both caches fed the same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PROMPTS", "decode_kls", "load"]

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 5,  # longer than the 16-token window
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen",
    "Short one",
]


def load(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))[:2]
    return model, tokenizer


def decode_kls(model: Any, tok: Any, plan: Any, other: Any, steps: int = 4) -> list[float]:
    """KL(plan || other) at each of `steps` decode positions, both fed the same tokens."""
    import mlx.core as mx
    import numpy as np

    out = []
    for text in PROMPTS:
        ids = list(tok.encode(text))
        caches = [p.make_cache(model) for p in (plan, other)]
        for p, c in zip((plan, other), caches, strict=True):
            model(mx.array([ids[:-1]]), cache=c)
            p.maybe_quantize(c)
        token = ids[-1]
        for _ in range(steps):
            rows = []
            for p, c in zip((plan, other), caches, strict=True):
                logits = np.array(model(mx.array([[token]]), cache=c)[0, -1].astype(mx.float32), np.float64)
                p.maybe_quantize(c)
                rows.append(logits - np.logaddexp.reduce(logits))  # float64: the KL itself adds no noise
            a, b = rows
            out.append(float((np.exp(a) * (a - b)).sum()))
            token = int(np.argmax(a))
    return out
