"""Greedy generation and choice scoring for one arm, through mlx_lm's own serving code.

- plain KV cache: `mlx_lm.batch_generate` (continuous batching, greedy), the throughput path;
- a uniformly quantized KV cache: `mlx_lm.stream_generate(kv_bits=..., kv_group_size=...,
  quantized_kv_start=...)`, one prompt at a time, exactly what `mlx_lm.generate` runs in production;
- a per-layer KV plan (kv_config.json): the same greedy loop with the plan's cache, quantized
  after every model call where `generate_step` would.

Everything is greedy (argmax), so an arm's outputs are a function of its weights and kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..levers.kvcache import KVPlan

__all__ = ["choice_logprobs", "generate_greedy"]


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    kv: KVPlan,
    batch_size: int = 16,
) -> list[str]:
    """Greedy completions of `prompts` (already rendered text), in order."""
    if not prompts:
        return []
    ids = [_encode(tokenizer, p) for p in prompts]
    if kv.is_plain:
        return _batched(model, tokenizer, ids, max_new_tokens, batch_size)
    uniform = kv.default if not kv.layers else None
    if uniform is not None:
        return [_stream(model, tokenizer, x, max_new_tokens, uniform) for x in ids]
    return [_per_layer(model, tokenizer, x, max_new_tokens, kv) for x in ids]


def generate_sequential(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int) -> list[str]:
    """One prompt at a time through `stream_generate` (the benchmark's baseline for batching)."""
    from mlx_lm import stream_generate

    out = []
    for p in prompts:
        text = "".join(r.text for r in stream_generate(model, tokenizer, _encode(tokenizer, p), max_tokens=max_new_tokens))
        out.append(text)
    return out


def choice_logprobs(model: Any, tokenizer: Any, text: str, choices: Sequence[str]) -> list[float]:
    """Log-probability of each continuation after `text`: one forward when every choice is one
    token after the prompt (MMLU's letters), else one forward per choice (summed over its tokens)."""
    import mlx.core as mx

    prompt = _encode(tokenizer, text)
    suffixes = []
    for choice in choices:
        full = _encode(tokenizer, text + choice)
        if full[: len(prompt)] != prompt:  # the choice merged with the prompt's last token
            full = prompt + _encode(tokenizer, choice, special=False)
        suffixes.append(full[len(prompt):])
    if all(len(s) == 1 for s in suffixes):
        logits = model(mx.array(prompt)[None])[0, -1].astype(mx.float32)
        logp = logits - mx.logsumexp(logits)
        picked = logp[mx.array([s[0] for s in suffixes])]
        return [float(v) for v in picked.tolist()]
    out = []
    for s in suffixes:
        x = mx.array(prompt + s)[None]
        logits = model(x)[0].astype(mx.float32)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        positions = mx.arange(len(prompt) - 1, len(prompt) - 1 + len(s))
        total: Any = mx.sum(logp[positions, mx.array(s)]).item()
        out.append(float(total))
    return out


def _encode(tokenizer: Any, text: str, *, special: bool = True) -> list[int]:
    """Rendered chat text already carries its BOS/special tokens: never add a second BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    add = special and not (bos and text.startswith(bos))
    try:
        return list(tokenizer.encode(text, add_special_tokens=add))
    except TypeError:
        return list(tokenizer.encode(text))


def _batched(model: Any, tokenizer: Any, ids: list[list[int]], max_new_tokens: int, batch_size: int) -> list[str]:
    from mlx_lm import batch_generate

    out: list[str] = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        response = batch_generate(model, tokenizer, chunk, max_tokens=max_new_tokens,
                                  completion_batch_size=batch_size, prefill_batch_size=min(batch_size, 8))
        out.extend(response.texts)
    return out


def _stream(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int, spec: Any) -> str:
    from mlx_lm import stream_generate

    return "".join(
        r.text
        for r in stream_generate(model, tokenizer, ids, max_tokens=max_new_tokens, kv_bits=spec.bits,
                                 kv_group_size=spec.group_size, quantized_kv_start=spec.start)
    )


def _per_layer(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int, kv: KVPlan) -> str:
    import mlx.core as mx

    cache = kv.make_cache(model)
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    x = mx.array(ids)
    if len(ids) > 1:
        model(x[None, :-1], cache=cache)
        kv.maybe_quantize(cache)
    token = ids[-1]
    generated: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(mx.array([[token]]), cache=cache)[0, -1]
        kv.maybe_quantize(cache)
        best: Any = mx.argmax(logits).item()
        token = int(best)
        if token in eos:
            break
        generated.append(token)
    return str(tokenizer.decode(generated))
