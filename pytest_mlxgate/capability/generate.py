"""Greedy generation and choice scoring for one arm, through mlx_lm's models and caches.

- models whose layers all keep a plain `KVCache` (and prompts within one prefill chunk): batches
  of prompts through `serving.batch.greedy_batch`, each layer's cache plain or quantized as the
  arm's KV plan says, so both arms of a KV gate run the same loop and differ only in the cache;
- otherwise a plain KV cache: `mlx_lm.batch_generate` (continuous batching, greedy);
- otherwise a uniformly quantized KV cache: `mlx_lm.stream_generate(kv_bits=..., kv_group_size=...,
  quantized_kv_start=...)`, one prompt at a time, exactly what `mlx_lm.generate` runs in production;
- otherwise a per-layer KV plan (kv_config.json): the same greedy loop with the plan's cache,
  quantized after every model call where `generate_step` would.

Everything is greedy (argmax), so an arm's outputs are a function of its weights and kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm import batch_generate, stream_generate
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..serving.batch import batchable, greedy_batch
from ..serving.kv_plan import shared_kv_sources

if TYPE_CHECKING:
    from ..serving.kv_plan import KVPlan

#: `progress(done, total)`: items finished so far, called as work completes.
Progress = Callable[[int, int], None]

__all__ = ["choice_logprobs", "choice_logprobs_many", "generate_greedy", "prompt_length"]

#: A token prefix shared by several items (a few-shot block) is prefilled once when it is this long.
MIN_SHARED_PREFIX = 32
#: Batched choice rows stay under this many logits (rows x positions x vocabulary, float32: 512 MiB).
_MAX_BATCH_LOGITS = 1 << 27
#: ... and under this many tokens (activations and attention scores grow with rows x width).
_MAX_BATCH_TOKENS = 4096


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    kv: KVPlan,
    peers: Sequence[KVPlan] = (),
    batch_size: int = 16,
    progress: Progress | None = None,
) -> list[str]:
    """Greedy completions of `prompts` (already rendered text), in order.

    `peers`: the KV plans of the gate's other arms. The loop is chosen from all of them, so every
    arm of a gate takes the same one (and decodes text the same way) and the arms differ only in
    their caches: padding, batching and detokenization never count as a lever's drift."""
    if not prompts:
        return []
    kv.check_against(model)  # every route; mlx_lm's stream_generate would refuse it mid-run, in its words
    ids = [_encode(tokenizer, p) for p in prompts]
    route = generation_route(model, [kv, *peers], [len(x) for x in ids])
    if route == "batched":
        return _batched_plan(model, tokenizer, ids, max_new_tokens, kv, batch_size, progress)
    if route == "batch_generate":
        return _batched(model, tokenizer, ids, max_new_tokens, batch_size, progress)
    out: list[str] = []
    for x in ids:
        out.append(
            _stream(model, tokenizer, x, max_new_tokens, kv.default)
            if route == "stream"
            else _per_layer(model, tokenizer, x, max_new_tokens, kv)
        )
        if progress is not None:
            progress(len(out), len(ids))
    return out


def generate_sequential(
    model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int, kv: KVPlan | None = None
) -> list[str]:
    """One prompt at a time through `stream_generate` (the benchmark's baseline for batching), with
    `kv`'s uniform quantization when it has one (mlx_lm's `kv_bits`: keys and values at one width)."""
    spec = kv.default if kv is not None and kv.is_uniform else None
    if kv is not None:
        kv.check_against(model)
        if kv.apart:
            return [_per_layer(model, tokenizer, _encode(tokenizer, p), max_new_tokens, kv) for p in prompts]
    extra: dict[str, Any] = (
        {}
        if spec is None
        else {"kv_bits": spec.bits, "kv_group_size": spec.group_size, "quantized_kv_start": spec.start}
    )
    out = []
    for p in prompts:
        stream = stream_generate(model, tokenizer, _encode(tokenizer, p), max_tokens=max_new_tokens, **extra)
        out.append("".join(r.text for r in stream))
    return out


def choice_logprobs(model: Any, tokenizer: Any, text: str, choices: Sequence[str]) -> list[float]:
    """Log-probability of each continuation after `text`: one forward when every choice is one
    token after the prompt (MMLU's letters), else one forward per choice (summed over its tokens)."""
    plan = _choice_plan(tokenizer, text, choices)
    prompt, suffixes = plan.prompt, plan.suffixes
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


def choice_logprobs_many(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    choices: Sequence[Sequence[str]],
    *,
    progress: Progress | None = None,
) -> list[list[float]]:
    """`choice_logprobs` for many items at once, with the same numbers (to float32 rounding).

    Items whose token ids share a prefix of at least MIN_SHARED_PREFIX tokens (MMLU's instruction
    and five shots per subject) get that prefix prefilled once into a plain KV cache; each item then
    runs only its own suffix from a copy of it, and the suffixes run batched (right-padded, so
    causal attention keeps every row's real positions exact). Both arms take this same path.
    """
    plans = [_choice_plan(tokenizer, text, item_choices) for text, item_choices in zip(texts, choices, strict=True)]
    out: list[list[float | None]] = [[None] * len(c) for c in choices]
    head = _split_head(model)
    for members, shared in _shared_prefix_groups([p.prompt for p in plans], MIN_SHARED_PREFIX):
        prefix = _prefill(model, plans[members[0]].prompt[:shared]) if shared else None
        if prefix is None:
            shared = 0  # nothing reused: every member runs its whole prompt
        rows = [(i, row) for i in members for row in plans[i].rows(shared)]
        rows.sort(key=lambda r: len(r[1].tokens))  # similar lengths share a batch: little padding
        for batch in _batches(rows, _vocab_size(model), gathered=head is not None):
            width = max(len(row.tokens) for _, row in batch)
            tokens = mx.array([row.tokens + [0] * (width - len(row.tokens)) for _, row in batch])
            cache = _batched_cache(prefix, len(batch)) if prefix is not None else None
            wanted = [row.positions() for _, row in batch]
            if head is not None:  # the vocabulary projection only where a choice is read
                span = max(len(w) for w in wanted)
                index = mx.array([w + [w[-1]] * (span - len(w)) for w in wanted])
                logits = _logits_at(head, tokens, cache, index)
            else:
                logits = model(tokens, cache=cache)
                wanted = [list(range(width)) for _ in batch]
            logits = logits.astype(mx.float32)
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            for b, (i, row) in enumerate(batch):  # rows run sorted: each writes its own choices' slots
                values = row.read(logp[b], {p: k for k, p in enumerate(wanted[b])})
                out[i][row.slot : row.slot + len(values)] = values
            if progress is not None:
                progress(sum(None not in o for o in out), len(plans))
    return out  # type: ignore[return-value]  # every slot written: each choice is read by one row


class _Head:
    """A model split at its vocabulary projection: `body` gives hidden states, `project` logits."""

    def __init__(self, body: Any, project: Callable[[Any], Any]) -> None:
        self.body = body
        self.project = project


#: mlx_lm model types whose `Model.__call__` is body -> (tied embedding | lm_head) [-> softcap].
_SPLIT_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma4_text"})


def _split_head(model: Any) -> _Head | None:
    """The body/projection split for the architectures whose forward we know; None otherwise (the
    caller then projects every position). Choice scoring reads a handful of positions, and the
    projection onto a 49k-262k vocabulary at every position is a large share of a forward."""
    owner = getattr(model, "language_model", model)  # multimodal wrappers hold the text model
    args = getattr(owner, "args", None)
    body = getattr(owner, "model", None)
    if getattr(args, "model_type", None) not in _SPLIT_HEAD_TYPES or body is None:
        return None
    tied = getattr(owner, "tie_word_embeddings", getattr(args, "tie_word_embeddings", False))
    linear = body.embed_tokens.as_linear if tied else getattr(owner, "lm_head", None)
    if linear is None:
        return None
    cap = getattr(owner, "final_logit_softcapping", None)
    if cap is None:
        return _Head(body, linear)

    def capped(h: Any) -> Any:
        return mx.tanh(linear(h) / cap) * cap

    return _Head(body, capped)


def _logits_at(head: _Head, tokens: Any, cache: Any, index: Any) -> Any:
    """Logits of `tokens` (B, T) only at `index` (B, P) positions: (B, P, vocabulary)."""
    hidden = head.body(tokens, cache=cache)
    return head.project(mx.take_along_axis(hidden, index[..., None], axis=1))


class _Row:
    """One forward row: tokens after the shared prefix, and how to read choice log-probs from it."""

    def __init__(self, tokens: list[int], reads: list[tuple[list[int], list[int]]], slot: int = 0) -> None:
        self.tokens = tokens
        self.reads = reads  # per choice: (row positions whose logits predict it, its token ids)
        self.slot = slot  # the index of its first choice among the item's choices

    def positions(self) -> list[int]:
        """The row positions whose logits any choice reads, ascending."""
        return sorted({p for positions, _ in self.reads for p in positions})

    def read(self, logp: Any, at: dict[int, int]) -> list[float]:
        """Each choice's summed log-probability from `logp` (rows = the positions `at` maps to)."""
        picked = [logp[mx.array([at[p] for p in positions]), mx.array(ids)].sum() for positions, ids in self.reads]
        values: Any = mx.stack(picked).tolist()
        return [float(v) for v in values]


class _ChoicePlan:
    """An item's prompt ids and each choice's continuation ids (as `choice_logprobs` derives them)."""

    def __init__(self, prompt: list[int], suffixes: list[list[int]]) -> None:
        self.prompt = prompt
        self.suffixes = suffixes

    def rows(self, shared: int) -> list[_Row]:
        """One row reading every single-token choice from the prompt's last logits; else a row per
        choice (prompt + choice, its tokens' log-probabilities summed)."""
        rest = self.prompt[shared:]
        last = len(rest) - 1
        if all(len(s) == 1 for s in self.suffixes):
            return [_Row(rest, [([last], s) for s in self.suffixes])]
        return [
            _Row(rest + s[:-1], [(list(range(last, last + len(s))), s)], slot=j) for j, s in enumerate(self.suffixes)
        ]


def _choice_plan(tokenizer: Any, text: str, choices: Sequence[str]) -> _ChoicePlan:
    prompt = _encode(tokenizer, text)
    suffixes = []
    for choice in choices:
        full = _encode(tokenizer, text + choice)
        if full[: len(prompt)] != prompt:  # the choice merged with the prompt's last token
            full = prompt + _encode(tokenizer, choice, special=False)
        suffixes.append(full[len(prompt) :])
    return _ChoicePlan(prompt, suffixes)


def _shared_prefix_groups(prompts: Sequence[list[int]], min_shared: int) -> list[tuple[list[int], int]]:
    """(member indices, shared prefix length) groups; 0 for items that share nothing worth reusing.

    Sorted token lists put items with a common prefix next to each other; a group grows while its
    first member shares at least `min_shared` tokens with the next. The shared length leaves every
    member at least one token of its own (the position whose logits score the choices).
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[tuple[list[int], int]] = []
    alone: list[int] = []
    start = 0
    while start < len(order):
        first = prompts[order[start]]
        end, shared = start + 1, len(first)
        while end < len(order):
            common = _common_prefix(first, prompts[order[end]])
            if common < min_shared:
                break
            shared = min(shared, common)
            end += 1
        members = order[start:end]
        if len(members) > 1:
            shared = min(shared, *(len(prompts[i]) - 1 for i in members))
            groups.append((members, shared) if shared >= min_shared else (members, 0))
        else:
            alone.extend(members)
        start = end
    if alone:
        groups.append((alone, 0))
    return groups


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _prefill(model: Any, tokens: list[int]) -> list[Any] | None:
    """The shared prefix through a plain KV cache, evaluated once: its per-layer (keys, values,
    offset). None for models whose caches are not all plain (sliding windows, state-space layers):
    their items run whole."""
    cache = make_prompt_cache(model)
    if not all(type(c) is KVCache for c in cache):
        return None
    model(mx.array(tokens)[None], cache=cache)
    states = [c.state for c in cache]
    mx.eval(states)
    return states


def _batched_cache(prefix: list[Any], rows: int) -> list[Any]:
    """A fresh plain cache per layer holding the shared prefix for `rows` rows (a copy: the prefix
    itself is never written, so the next batch starts from the same state)."""
    caches = []
    for keys, values, offset in prefix:
        c = KVCache()  # type: ignore[no-untyped-call]
        k, v = keys[..., :offset, :], values[..., :offset, :]
        c.state = (mx.broadcast_to(k, (rows, *k.shape[1:])), mx.broadcast_to(v, (rows, *v.shape[1:])), offset)
        caches.append(c)
    return caches


def _batches(rows: list[tuple[int, _Row]], vocab: int, *, gathered: bool = False) -> list[list[tuple[int, _Row]]]:
    """Consecutive rows in batches whose logits stay under _MAX_BATCH_LOGITS and whose tokens stay
    under _MAX_BATCH_TOKENS (at least one row each). `gathered`: logits only at the read positions."""
    out: list[list[tuple[int, _Row]]] = []
    for item in rows:
        if out:
            batch = [*out[-1], item]
            width = max(len(r.tokens) for _, r in batch)
            span = max(len(r.positions()) for _, r in batch) if gathered else width
            if len(batch) * span * vocab <= _MAX_BATCH_LOGITS and len(batch) * width <= _MAX_BATCH_TOKENS:
                out[-1].append(item)
                continue
        out.append([item])
    return out


def _vocab_size(model: Any) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None) or getattr(getattr(args, "text_config", None), "vocab_size", None)
    return int(size) if isinstance(size, int) and size > 0 else 262_144  # unknown: assume a large one


def prompt_length(tokenizer: Any, text: str) -> int:
    """How many tokens generation feeds for `text` before its first new token."""
    return len(_encode(tokenizer, text))


def _encode(tokenizer: Any, text: str, *, special: bool = True) -> list[int]:
    """Rendered chat text already carries its BOS/special tokens: never add a second BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    add = special and not (bos and text.startswith(bos))
    try:
        return list(tokenizer.encode(text, add_special_tokens=add))
    except TypeError:
        return list(tokenizer.encode(text))


def _batched(
    model: Any,
    tokenizer: Any,
    ids: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    progress: Progress | None = None,
) -> list[str]:
    out: list[str] = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        response = batch_generate(
            model,
            tokenizer,
            chunk,
            max_tokens=max_new_tokens,
            completion_batch_size=batch_size,
            prefill_batch_size=min(batch_size, 8),
        )
        out.extend(response.texts)
        if progress is not None:
            progress(len(out), len(ids))
    return out


def _batched_plan(
    model: Any,
    tokenizer: Any,
    ids: list[list[int]],
    max_new_tokens: int,
    kv: KVPlan,
    batch_size: int,
    progress: Progress | None = None,
) -> list[str]:
    """Batches of similar length (less padding), each through `greedy_batch`; outputs in order."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    out: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        generated = greedy_batch(model, [ids[i] for i in chunk], max_new_tokens=max_new_tokens, kv=kv, eos=eos)
        out.update((i, str(tokenizer.decode(g))) for i, g in zip(chunk, generated, strict=True))
        if progress is not None:
            progress(len(out), len(ids))
    return [out[i] for i in range(len(ids))]


def generation_route(model: Any, plans: Sequence[KVPlan], lengths: Sequence[int]) -> str:
    """The one loop every plan of a gate runs: "batched" (`serving.batch`: plain caches and plain windows),
    "batch_generate" (every plan plain), "stream" (`mlx_lm.stream_generate`, uniform plans mlx_lm
    can quantize), else "per_layer" (the project's loop with the plans' caches, one prompt at a time)."""
    if all(batchable(model, p, lengths) for p in plans):
        return "batched"
    if all(p.is_plain for p in plans):
        return "batch_generate"
    if all(p.is_uniform and not p.fake and not p.apart for p in plans) and _mlx_lm_quantizes(model):
        return "stream"
    return "per_layer"


def _mlx_lm_quantizes(model: Any) -> bool:
    """mlx_lm's own `generate(kv_bits=...)` runs this model: every cache is a plain `KVCache` and no
    layer shares another's K/V (sliding windows and KV-shared layers take the project's caches)."""
    cache = make_prompt_cache(model)
    return all(type(c) is KVCache for c in cache) and not shared_kv_sources(model, len(cache))


def _stream(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int, spec: Any) -> str:
    extra: dict[str, Any] = (
        {}
        if spec is None
        else {"kv_bits": spec.bits, "kv_group_size": spec.group_size, "quantized_kv_start": spec.start}
    )
    return "".join(r.text for r in stream_generate(model, tokenizer, ids, max_tokens=max_new_tokens, **extra))


def _per_layer(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int, kv: KVPlan) -> str:
    cache = kv.make_cache(model)
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    x = mx.array(ids)
    if len(ids) > 1:
        kv.forward(model, x[None, :-1], cache)
    token = ids[-1]
    generated: list[int] = []
    for _ in range(max_new_tokens):
        logits = kv.forward(model, mx.array([[token]]), cache)[0, -1]
        best: Any = mx.argmax(logits).item()
        token = int(best)
        if token in eos:
            break
        generated.append(token)
    return str(tokenizer.decode(generated))
