"""Batched greedy decoding through each arm's real KV caches, quantized ones included.

mlx_lm batches generation (`batch_generate`, left-padded `BatchKVCache`) only for plain caches; a
quantized KV cache runs one prompt at a time (`stream_generate(kv_bits=...)`). A KV lever's
candidate arm was therefore the slowest part of a gate. Here a whole batch runs in one loop:
left-padded prompts, one cache per layer, `BatchQuantizedKVCache` once a layer's plan says so.

Sliding-window layers (gemma's `RotatingKVCache`) batch as mlx_lm's `BatchRotatingKVCache`: each row's
window, wrap and padding are its own. Once the plan quantizes such a layer it becomes a
`BatchQuantizedRotatingKVCache`: the same ring buffer, trims and masks, its storage quantized. A
model's KV-shared layers (gemma-4) read their source layer's batched cache through `SharedKVReader`.

Both arms of a gate take this same loop (a plain plan keeps `BatchKVCache`), so the arms differ
only in the cache a layer keeps. What the loop mirrors of `mlx_lm.generate_step`: the prompt but
its last token is prefilled in one call, each layer is quantized when its offset reaches its spec's
start (checked after every call), and the last prompt token starts decoding. Quantization is per
row and per group of the head dimension, so a row's quantized keys are the same in a batch as
alone; the mask hides the padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache, make_prompt_cache

from .caches import Parts, QuantizedWindow, SharedKVReader, quantize_pair, value_width
from .kv_plan import shared_kv_sources

if TYPE_CHECKING:
    from .kv_plan import KVPlan

__all__ = [
    "BatchQuantizedKVCache",
    "BatchQuantizedRotatingKVCache",
    "batchable",
    "greedy_batch",
    "quantize_batch_cache",
]

# mlx_lm's batched ring buffer, untyped: subclassed and called through Any.
_BatchRotatingBase: Any = BatchRotatingKVCache

#: mlx_lm's `generate_step` prefills in chunks of this many tokens; longer prompts would quantize
#: mid-prompt there, so the batched loop leaves them to the one-at-a-time path.
PREFILL_STEP = 2048


class BatchQuantizedKVCache:
    """A left-padded batch of quantized K/V (mlx_lm's `QuantizedKVCache` layout per row).

    `bits` and `group_size` make mlx_lm's attention take its quantized path (`value_bits`: the values'
    width, None for `bits`); `offset` is per row (positions for RoPE), `make_mask` hides each row's left
    padding, as `BatchKVCache` does.
    """

    step = 256

    def __init__(self, left_padding: Any, *, group_size: int, bits: int, value_bits: int | None = None) -> None:
        self.keys: tuple[Any, Any, Any] | None = None
        self.values: tuple[Any, Any, Any] | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = -self.left_padding
        self._idx = 0
        self.group_size = group_size
        self.bits = bits
        self.value_bits = value_width(bits, value_bits)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        steps = keys.shape[2]
        prev = self._idx
        if self.keys is None or self.values is None or prev + steps > self.keys[0].shape[2]:
            self._grow(keys, values, prev + steps)
        assert self.keys is not None and self.values is not None
        qk, qv = quantize_pair(keys, values, group_size=self.group_size, bits=self.bits, value_bits=self.value_bits)
        for stored, new in ((self.keys, qk), (self.values, qv)):
            for part, value in zip(stored, new, strict=True):
                part[..., prev : prev + steps, :] = value
        self._idx += steps
        self.offset = self.offset + steps
        return self._fetch()

    def _grow(self, keys: Any, values: Any, needed: int) -> None:
        size = (needed + self.step - 1) // self.step * self.step

        def empty(like: Any, have: tuple[Any, Any, Any] | None, bits: int) -> tuple[Any, Any, Any]:
            b, h, _, d = like.shape
            shape = (b, h, size)
            parts = (
                mx.zeros((*shape, d * bits // 32), mx.uint32),  # mx.quantize's packed width
                mx.zeros((*shape, d // self.group_size), like.dtype),
                mx.zeros((*shape, d // self.group_size), like.dtype),
            )
            if have is None:
                return parts
            return tuple(
                mx.concatenate([old[..., : self._idx, :], new[..., self._idx :, :]], axis=2)
                for old, new in zip(have, parts, strict=True)
            )  # type: ignore[return-value]

        self.keys, self.values = empty(keys, self.keys, self.bits), empty(values, self.values, self.value_bits)

    def _fetch(self) -> tuple[Any, Any]:
        assert self.keys is not None and self.values is not None
        cut = self._idx
        return (tuple(x[..., :cut, :] for x in self.keys), tuple(x[..., :cut, :] for x in self.values))

    def make_mask(self, n: int, return_array: bool = False, **kwargs: Any) -> Any:
        return create_causal_mask(n, offset=self._idx, left_padding=self.left_padding, **kwargs)

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        parts = (*(self.keys or ()), *(self.values or ()))
        return sum(int(p[..., : self._idx, :].nbytes) for p in parts)


def quantize_batch_cache(
    cache: Any, *, group_size: int, bits: int, value_bits: int | None = None
) -> BatchQuantizedKVCache:
    """A `BatchKVCache`'s contents, quantized (what `KVCache.to_quantized` does for one row)."""
    out = BatchQuantizedKVCache(cache.left_padding, group_size=group_size, bits=bits, value_bits=value_bits)
    keys, values = cache.keys[..., : cache._idx, :], cache.values[..., : cache._idx, :]
    out._grow(keys, values, cache._idx)
    assert out.keys is not None and out.values is not None
    new_k, new_v = quantize_pair(keys, values, group_size=group_size, bits=bits, value_bits=out.value_bits)
    for stored, new in ((out.keys, new_k), (out.values, new_v)):
        for part, value in zip(stored, new, strict=True):
            part[..., : cache._idx, :] = value
    out._idx = cache._idx
    out.offset = cache.offset
    return out


class BatchQuantizedRotatingKVCache(QuantizedWindow, _BatchRotatingBase):  # type: ignore[misc]
    """mlx_lm's `BatchRotatingKVCache` (left-padded rows, per-row offsets, the wrap) with each of the
    keys and values stored quantized (`Parts`). Every index, trim, rotation and mask is the parent's:
    only the storage differs, and it is quantized per row, head, position and group of the head
    dimension, so a row holds the same quantized K/V in a batch as alone. `bits`/`group_size` make
    mlx_lm's attention take its quantized path."""

    keys: Any  # Parts, or None before the first update
    values: Any
    left_padding: Any  # (rows,) int32, as the parent keeps them
    offset: Any
    _idx: int
    _offset: int
    rotated: bool

    def __init__(
        self, max_size: int, left_padding: list[int], *, group_size: int, bits: int, value_bits: int | None = None
    ) -> None:
        super().__init__(max_size, left_padding)
        self._store_at(group_size, bits, value_bits)

    @classmethod
    def from_cache(
        cls, cache: Any, *, group_size: int, bits: int, value_bits: int | None = None
    ) -> BatchQuantizedRotatingKVCache:
        """A `BatchRotatingKVCache`'s contents and positions, quantized."""
        if cache._lengths is not None:
            raise ValueError("finalize() the BatchRotatingKVCache (right padding) before quantizing it")
        out = cls(cache.max_size, [0], group_size=group_size, bits=bits, value_bits=value_bits)
        out.left_padding, out.offset = cache.left_padding, cache.offset
        out._idx, out._offset, out.rotated = cache._idx, cache._offset, cache.rotated
        if cache.keys is not None:
            out.keys, out.values = out._quantize(cache.keys, cache.values)
        return out

    def _settle(self) -> None:
        """Make the lazily updated positions evaluate with the keys (what the parent's `mx.depends` does)."""
        first, *rest = self.keys
        self.keys = (mx.depends(first, (self.left_padding, self.offset)), *rest)

    def _temporal_order(self) -> None:
        if self.rotated:
            self.keys = tuple(mx.roll(p, -self._idx, 2) for p in self.keys)
            self.values = tuple(mx.roll(p, -self._idx, 2) for p in self.values)
            self._idx = self.keys[0].shape[2]
            self.rotated = False

    def _update_concat(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        if self._lengths is not None:
            raise ValueError("right-padded rows are not supported by the quantized batched window")
        new_k, new_v = self._quantize(keys, values)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
        else:
            self._temporal_order()
            cut = self._idx
            trim = max(0, cut - self.max_size + 1)  # every new token still sees max_size of context
            if trim > 0:
                self.left_padding -= trim
            self.keys = tuple(
                mx.concatenate([p[..., trim:cut, :], n], axis=2) for p, n in zip(self.keys, new_k, strict=True)
            )
            self.values = tuple(
                mx.concatenate([p[..., trim:cut, :], n], axis=2) for p, n in zip(self.values, new_v, strict=True)
            )
        self.offset = self.offset + keys.shape[2]
        self._offset += keys.shape[2]
        self._idx = self.keys[0].shape[2]
        self._settle()
        return self.keys, self.values

    def _update_in_place(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        steps = keys.shape[2]
        new_k, new_v, trim = self._quantized_update(self._offset, keys, values)
        if trim > 0:
            self.keys = tuple(p[..., trim:, :] for p in self.keys)
            self.values = tuple(p[..., trim:, :] for p in self.values)
            self._idx = self.max_size
            self.left_padding -= trim
        if self._idx == self.max_size:  # rotate
            self.rotated = True
            self._idx = 0
        if self.rotated:
            self.left_padding -= steps
        self._write(new_k, new_v, steps)
        self._offset += steps
        self.offset = self.offset + steps
        self._idx += steps
        self._settle()
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Parts, Parts]:
        if self._offset < self.keys[0].shape[2]:
            cut = self._offset
            return tuple(p[..., :cut, :] for p in self.keys), tuple(p[..., :cut, :] for p in self.values)
        return self.keys, self.values

    def filter(self, batch_indices: Any) -> None:
        if self.keys is not None:
            self.keys = tuple(p[batch_indices] for p in self.keys)
            self.values = tuple(p[batch_indices] for p in self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]

    def extend(self, other: Any) -> None:
        raise NotImplementedError("the quantized batched window holds one batch for its whole run")


def batchable(model: Any, kv: KVPlan, lengths: Sequence[int]) -> bool:
    """True when the batched loop reproduces what one prompt at a time would do: every layer keeps
    a `KVCache` or a sliding window with no kept prefix (no recurrent state), no prompt is
    longer than one prefill chunk, and every quantized layer starts at or before the shortest
    prompt's prefill end (so all rows quantize at the same call, right after the prefill, as they
    would alone)."""
    if not lengths or max(lengths) - 1 > PREFILL_STEP or min(lengths) < 2 or kv.fake:
        return False
    starts = []
    for i, c in enumerate(make_prompt_cache(model)):
        if type(c) is RotatingKVCache and c.keep == 0:
            spec = kv.for_layer(i, "sliding_attention")
        elif type(c) is KVCache:
            spec = kv.for_layer(i, "full_attention")
        else:
            return False
        if spec is not None:
            starts.append(spec.start)
    return all(start <= min(lengths) - 1 for start in starts)


def _batch_cache(cache: Any, padding: list[int]) -> Any:
    """The batched twin of one layer's cache (`batchable` has checked there is one)."""
    if type(cache) is RotatingKVCache:
        return BatchRotatingKVCache(cache.max_size, padding)
    return BatchKVCache(padding)


def _quantized_twin(cache: Any, kv: KVPlan, layer: int, padding: list[int]) -> Any:
    """`cache` quantized when the plan's spec for `layer` is due (the shortest row's offset reached
    its start, as each row alone would have), else `cache` itself."""
    if type(cache) is BatchKVCache:
        spec, filled = kv.for_layer(layer, "full_attention"), cache._idx
    elif type(cache) is BatchRotatingKVCache:
        spec, filled = kv.for_layer(layer, "sliding_attention"), cache._offset
    else:
        return cache  # already quantized, or a KV-shared layer's reader
    if spec is None or filled - max(padding) < spec.start:
        return cache
    widths = {"group_size": spec.group_size, "bits": spec.bits, "value_bits": spec.v_bits}
    if type(cache) is BatchKVCache:
        return quantize_batch_cache(cache, **widths)
    return BatchQuantizedRotatingKVCache.from_cache(cache, **widths)


def greedy_batch(
    model: Any,
    ids: Sequence[list[int]],
    *,
    max_new_tokens: int,
    kv: KVPlan,
    eos: set[int],
    on_token: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations of the token lists `ids` (one batch; see `batchable`), each cut at its
    first end-of-sequence token. `on_token(step)` after each decode step."""
    width = max(len(x) for x in ids)
    padding = [width - len(x) for x in ids]
    tokens = mx.array([[0] * p + x for p, x in zip(padding, ids, strict=True)])
    kv.check_against(model)
    cache: list[Any] = [_batch_cache(c, padding) for c in make_prompt_cache(model)]
    shared = shared_kv_sources(model, len(cache))
    if shared and not kv.is_plain:  # as `KVPlan.make_cache`: they must see their source's quantized K/V
        cache.extend(SharedKVReader(cache, shared[j]) for j in sorted(shared))

    def quantize_due() -> None:
        for i, c in enumerate(cache):
            cache[i] = _quantized_twin(c, kv, i, padding)

    model(tokens[:, :-1], cache=cache)
    quantize_due()
    mx.eval([c.state for c in cache])
    last = tokens[:, -1:]
    out: list[list[int]] = [[] for _ in ids]
    done = [False] * len(ids)
    for step in range(max_new_tokens):
        logits = model(last, cache=cache)[:, -1]
        quantize_due()
        best = mx.argmax(logits, axis=-1)
        values: Any = best.tolist()
        picked = [int(t) for t in values]
        for row, token in enumerate(picked):
            if done[row]:
                continue
            if token in eos:
                done[row] = True
            else:
                out[row].append(token)
        if on_token is not None:
            on_token(step)
        if all(done):
            break
        last = best[:, None]
    return out
