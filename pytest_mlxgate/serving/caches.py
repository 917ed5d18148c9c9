"""The KV caches a quantized plan needs beyond mlx_lm's own, for architectures like gemma-4.

mlx_lm 0.32 quantizes only its plain `KVCache` (`to_quantized` -> `QuantizedKVCache`):
`RotatingKVCache.to_quantized` raises NotImplementedError, and gemma-4's KV-shared layers (which
reuse an earlier layer's K/V and keep no cache) hand quantized K/V to the float attention kernel,
a TypeError. The production setup runs e4b with mixed 4/8-bit KV over every cached layer, so:

- `QuantizedRotatingKVCache`: a sliding-window ring buffer with quantized storage, the same
  rotation, trimming and masks as `RotatingKVCache` (it subclasses it), quantized per row and
  group of the head dimension as `QuantizedKVCache` is;
- `SharedKVReader`: what a KV-shared layer gets as its cache: it passes the K/V through and, once
  its source layer's cache is quantized, carries that cache's `bits`/`group_size`, which is what
  makes mlx_lm's `scaled_dot_product_attention` take its quantized path;
- fake-quant caches (`FakeQuantKVCache`, `FakeQuantRotatingKVCache`): the same plan in float
  (quantize then dequantize into a plain cache), so a check can tell the plan's rounding from the
  quantized kernels;
- keys and values at their own widths (`value_bits`, a K8/V4 plan): every quantized cache here takes
  one, and `QuantizedApartKVCache` is mlx_lm's `QuantizedKVCache` with it; such a cache makes mlx_lm's
  attention read each operand's width (`serving.attention`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from .attention import read_widths_in_attention

__all__ = [
    "Parts",
    "QuantizedApartKVCache",
    "SharedKVReader",
    "attention_type",
    "fake_quantize_cache",
    "QuantizedWindow",
    "grown_parts",
    "kv_head_dims",
    "quantize_cache",
    "quantize_pair",
    "quantized_form",
    "sliding_window",
    "value_width",
]

Parts = tuple[Any, Any, Any]  # (packed ints, scales, biases): mx.quantize's output
# mlx_lm's cache classes, untyped: subclassed and called through Any.
_RotatingBase: Any = RotatingKVCache
_PlainBase: Any = KVCache
_QuantizedBase: Any = QuantizedKVCache


def value_width(bits: int, value_bits: int | None) -> int:
    """The values' width (None: the keys' `bits`); where the two differ, mlx_lm's attention is made to
    read each one's (`serving.attention`) before a cache holding them exists."""
    width = bits if value_bits is None else value_bits
    if width != bits:
        read_widths_in_attention()
    return width


def quantize_pair(keys: Any, values: Any, *, group_size: int, bits: int, value_bits: int) -> tuple[Parts, Parts]:
    """Keys at `bits` and values at `value_bits`, each quantized per row and group of the head dimension."""
    k = mx.quantize(keys, group_size=group_size, bits=bits)
    v = mx.quantize(values, group_size=group_size, bits=value_bits)
    return (k[0], k[1], k[2]), (v[0], v[1], v[2])


def attention_type(cache: Any) -> str | None:
    """The attention a cache serves, by its mlx_lm class: a sliding window or full attention; None
    for caches that hold no K/V (recurrent state) or that this project does not know."""
    if isinstance(cache, RotatingKVCache):
        return "sliding_attention"
    if isinstance(cache, (KVCache, QuantizedKVCache)):
        return "full_attention"
    return None


# id(model) -> its head dimensions, dropped when the model is (an mlx Module is a dict: unhashable).
_HEAD_DIMS: dict[int, dict[int, tuple[int, ...]]] = {}


def kv_head_dims(model: Any) -> dict[int, tuple[int, ...]]:
    """{cached layer: the head dimensions its keys and values keep}, for the layers a plan could
    quantize. Read from the shapes a one-token forward through a fresh plain prompt cache gives:
    MLX knows shapes without computing, so the graph is built and never evaluated, and it is the
    model's own attention that says, whatever its architecture. Once per model."""
    known = _HEAD_DIMS.get(id(model))
    if known is not None:
        return known
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    dims = {
        i: tuple(sorted({int(x.shape[-1]) for x in (c.keys, c.values) if x is not None}))
        for i, c in enumerate(cache)
        if quantized_form(c) is not None
    }
    _HEAD_DIMS[id(model)] = dims
    weakref.finalize(model, _HEAD_DIMS.pop, id(model), None)
    return dims


def sliding_window(model: Any) -> int | None:
    """The narrowest sliding window among `model`'s cached layers (the positions its `RotatingKVCache`
    keeps), or None for a model with no sliding-window layer. Read from the model's own prompt cache,
    whatever its architecture calls the setting."""
    sizes = [int(c.max_size) for c in make_prompt_cache(model) if isinstance(c, RotatingKVCache)]
    return min(sizes) if sizes else None


def quantized_form(cache: Any) -> str | None:
    """The name of the quantized cache that replaces `cache`, or None when it has none."""
    if type(cache) is KVCache:
        return "QuantizedKVCache"
    if type(cache) is RotatingKVCache:
        return "QuantizedRotatingKVCache"
    return None


def quantize_cache(cache: Any, *, group_size: int, bits: int, value_bits: int | None = None) -> Any:
    """`cache` with its contents quantized, the values at `value_bits` (None: `bits`): mlx_lm's own
    conversion for a `KVCache` of one width, ours for keys and values apart and for `RotatingKVCache`.
    Raises TypeError for anything else (check `quantized_form` first)."""
    if type(cache) is KVCache and value_bits in (None, bits):
        return cache.to_quantized(group_size=group_size, bits=bits)
    if type(cache) is KVCache:
        return QuantizedApartKVCache.from_cache(cache, group_size=group_size, bits=bits, value_bits=value_bits)
    if type(cache) is RotatingKVCache:
        return QuantizedRotatingKVCache.from_cache(cache, group_size=group_size, bits=bits, value_bits=value_bits)
    raise TypeError(f"{type(cache).__name__} has no quantized form")


def fake_quantize_cache(cache: Any, *, group_size: int, bits: int, value_bits: int | None = None) -> Any:
    """`cache` as a float cache that stores every K/V quantized then dequantized (see module doc)."""
    v_bits = bits if value_bits is None else value_bits
    if type(cache) is KVCache:
        out: Any = FakeQuantKVCache(group_size=group_size, bits=bits, value_bits=v_bits)
    elif type(cache) is RotatingKVCache:
        out = FakeQuantRotatingKVCache(cache.max_size, cache.keep, group_size=group_size, bits=bits, value_bits=v_bits)
    else:
        raise TypeError(f"{type(cache).__name__} has no quantized form")
    if cache.keys is not None:
        out.keys = _round_trip(cache.keys, group_size, bits)
        out.values = _round_trip(cache.values, group_size, v_bits)
    out.offset = cache.offset
    if hasattr(cache, "_idx"):
        out._idx = cache._idx
    return out


def _round_trip(x: Any, group_size: int, bits: int) -> Any:
    return mx.dequantize(*mx.quantize(x, group_size=group_size, bits=bits), group_size=group_size, bits=bits)


class SharedKVReader:
    """The cache slot of a KV-shared layer: K/V pass through unchanged; `bits` and `group_size`
    exist exactly while the source layer's cache is quantized (mlx_lm picks the kernel by them)."""

    def __init__(self, caches: Sequence[Any], source: int) -> None:
        self._caches = caches  # the live list: a layer quantized later is seen from then on
        self.source = source

    def __getattr__(self, name: str) -> Any:
        if name in ("bits", "group_size"):
            source = self._caches[self.source]
            if not isinstance(source, SharedKVReader) and hasattr(source, name):
                return getattr(source, name)
        raise AttributeError(name)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        return keys, values

    @property
    def offset(self) -> int:
        """The source layer's position (mlx_lm's prompt-cache tools read every layer's offset)."""
        source = self._caches[self.source]
        return int(getattr(source, "offset", 0))

    def is_trimmable(self) -> bool:
        return True  # holds nothing: trimming the source trims what this layer reads

    def trim(self, n: int) -> int:
        return min(n, self.offset)

    @property
    def state(self) -> list[Any]:
        return []  # holds nothing of its own

    @property
    def nbytes(self) -> int:
        return 0

    def empty(self) -> bool:
        return True


def grown_parts(have: Parts | None, like: Parts, size: int) -> Parts:
    """Quantized K or V (`have`; None: none yet) with `size` more zeroed positions, shaped and typed
    as `like` (the parts of the update that needs them): how a quantized ring buffer grows."""
    zeros = tuple(mx.zeros((*p.shape[:2], size, p.shape[3]), p.dtype) for p in like)
    if have is None:
        return zeros  # type: ignore[return-value]
    return tuple(mx.concatenate([h, z], axis=2) for h, z in zip(have, zeros, strict=True))  # type: ignore[return-value]


class QuantizedWindow:
    """What the quantized rotating caches (one sequence here, a batch in `serving.batch`) share: how an
    update is quantized, and how the buffers grow a step at a time until the window is full. A mixin
    before mlx_lm's rotating cache, whose indices, trims and rotation stay the parent's."""

    keys: Any  # Parts, or None before the first update
    values: Any
    group_size: int
    bits: int  # the keys' width (what mlx_lm's attention is handed)
    value_bits: int  # the values' (`value_width`)
    step: int
    max_size: int
    _idx: int

    def _store_at(self, group_size: int, bits: int, value_bits: int | None) -> None:
        """The widths the window stores at (`value_width`: the values' defaults to the keys')."""
        self.group_size, self.bits, self.value_bits = group_size, bits, value_width(bits, value_bits)

    def _quantize(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        return quantize_pair(keys, values, group_size=self.group_size, bits=self.bits, value_bits=self.value_bits)

    def _quantized_update(self, prev: int, keys: Any, values: Any) -> tuple[Parts, Parts, int]:
        """Before writing in place at `prev`: the update quantized, the buffers a step longer (never past
        the window, the write index at `prev` then) where it would run past them, and how many positions
        the buffers now hold beyond the window (the trim)."""
        new_k, new_v = self._quantize(keys, values)
        if self.keys is None or (prev >= self.keys[0].shape[2] and self.keys[0].shape[2] < self.max_size):
            size = min(self.step, self.max_size - prev)
            self.keys, self.values = grown_parts(self.keys, new_k, size), grown_parts(self.values, new_v, size)
            self._idx = prev
        return new_k, new_v, self.keys[0].shape[2] - self.max_size

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> Any:
        raise TypeError("already quantized")

    @property
    def nbytes(self) -> int:
        """Bytes the quantized keys and values hold (packed, scales and biases)."""
        if self.keys is None:
            return 0
        return sum(int(p.nbytes) for p in (*self.keys, *self.values))

    def _write(self, new_k: Parts, new_v: Parts, steps: int) -> None:
        """The quantized update written at the write index."""
        for stored, new in ((self.keys, new_k), (self.values, new_v)):
            for part, value in zip(stored, new, strict=True):
                part[..., self._idx : self._idx + steps, :] = value


class QuantizedRotatingKVCache(QuantizedWindow, _RotatingBase):  # type: ignore[misc]
    """`RotatingKVCache` whose keys and values are stored quantized (`Parts` per array)."""

    keys: Any  # Parts, or None before the first update
    values: Any

    def __init__(
        self, max_size: int, keep: int = 0, *, group_size: int = 64, bits: int = 8, value_bits: int | None = None
    ) -> None:
        super().__init__(max_size, keep)
        self._store_at(group_size, bits, value_bits)

    @classmethod
    def from_cache(
        cls, cache: Any, *, group_size: int, bits: int, value_bits: int | None = None
    ) -> QuantizedRotatingKVCache:
        out = cls(cache.max_size, cache.keep, group_size=group_size, bits=bits, value_bits=value_bits)
        if cache.keys is not None:
            out.keys, out.values = out._quantize(cache.keys, cache.values)
        out.offset, out._idx = cache.offset, cache._idx
        return out

    def _each(self, fn: Any, parts: Parts, other: Parts | None = None) -> Parts:
        if other is None:
            return tuple(fn(p) for p in parts)
        return tuple(fn(p, o) for p, o in zip(parts, other, strict=True))

    def _update_concat(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        new_k, new_v = self._quantize(keys, values)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
        else:  # temporal order, then trim so every new token still sees max_size of context
            self.keys = self._each(lambda p: _RotatingBase._temporal_order(self, p), self.keys)
            self.values = self._each(lambda p: _RotatingBase._temporal_order(self, p), self.values)
            self._idx = self.keys[0].shape[2]
            trim = self._idx - self.max_size + 1
            self.keys = self._each(lambda p, a: _RotatingBase._trim(self, trim, p, a), self.keys, new_k)
            self.values = self._each(lambda p, a: _RotatingBase._trim(self, trim, p, a), self.values, new_v)
        self.offset += keys.shape[2]
        self._idx = self.keys[0].shape[2]
        return self.keys, self.values

    def _update_in_place(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        steps = keys.shape[2]
        new_k, new_v, trim = self._quantized_update(self.offset, keys, values)
        if trim > 0:
            self.keys = self._each(lambda p: _RotatingBase._trim(self, trim, p), self.keys)
            self.values = self._each(lambda p: _RotatingBase._trim(self, trim, p), self.values)
            self._idx = self.max_size
        if self._idx == self.max_size:  # rotate
            self._idx = self.keep
        self._write(new_k, new_v, steps)
        self.offset += steps
        self._idx += steps
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Parts, Parts]:
        if self.offset < self.keys[0].shape[2]:
            cut = self.offset
            return (
                self._each(lambda p: p[..., :cut, :], self.keys),
                self._each(lambda p: p[..., :cut, :], self.values),
            )
        return self.keys, self.values


class QuantizedApartKVCache(_QuantizedBase):  # type: ignore[misc]
    """mlx_lm's `QuantizedKVCache` with the values at a width of their own (`value_bits`): the same
    layout, growth by `step` positions and trims; `bits` (the keys') is what mlx_lm's attention is
    handed, and it reads the values' from their parts (`serving.attention`)."""

    keys: Any  # Parts, or None before the first update
    values: Any
    offset: int
    group_size: int
    bits: int
    step: int

    def __init__(self, group_size: int = 64, bits: int = 8, value_bits: int | None = None) -> None:
        super().__init__(group_size=group_size, bits=bits)
        self.value_bits = value_width(bits, value_bits)

    @classmethod
    def from_cache(cls, cache: Any, *, group_size: int, bits: int, value_bits: int | None) -> QuantizedApartKVCache:
        """A `KVCache`'s contents quantized, as `KVCache.to_quantized` does at one width."""
        out = cls(group_size, bits, value_bits)
        out.offset = cache.offset
        if cache.keys is not None:
            out.keys, out.values = quantize_pair(
                cache.keys, cache.values, group_size=group_size, bits=bits, value_bits=out.value_bits
            )
        return out

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        prev, steps = self.offset, keys.shape[2]
        new_k, new_v = quantize_pair(
            keys, values, group_size=self.group_size, bits=self.bits, value_bits=self.value_bits
        )
        if self.keys is None or prev + steps > self.keys[0].shape[2]:
            size = (self.step + steps - 1) // self.step * self.step
            kept_k = None if self.keys is None else tuple(p[..., :prev, :] for p in self.keys)
            kept_v = None if self.values is None else tuple(p[..., :prev, :] for p in self.values)
            self.keys, self.values = grown_parts(kept_k, new_k, size), grown_parts(kept_v, new_v, size)
        for stored, new in ((self.keys, new_k), (self.values, new_v)):
            for part, value in zip(stored, new, strict=True):
                part[..., prev : prev + steps, :] = value
        self.offset += steps
        return self.keys_and_values()  # type: ignore[no-any-return]

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.group_size, self.bits, self.value_bits

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.group_size, self.bits, self.value_bits = v

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> Any:
        raise TypeError("already quantized")


class _RoundTrips:
    """What the fake-quant caches share: each update's keys and values quantized then dequantized."""

    fake_group_size: int
    fake_bits: int
    fake_value_bits: int

    def _set_widths(self, group_size: int, bits: int, value_bits: int | None) -> None:
        self.fake_group_size, self.fake_bits = group_size, bits
        self.fake_value_bits = bits if value_bits is None else value_bits

    def update_and_fetch(self, keys: Any, values: Any) -> Any:
        g = self.fake_group_size
        keys, values = _round_trip(keys, g, self.fake_bits), _round_trip(values, g, self.fake_value_bits)
        return super().update_and_fetch(keys, values)  # type: ignore[misc]


class FakeQuantKVCache(_RoundTrips, _PlainBase):  # type: ignore[misc]
    """A plain `KVCache` that stores K/V quantized then dequantized (float storage, float kernels)."""

    def __init__(self, *, group_size: int, bits: int, value_bits: int | None = None) -> None:
        super().__init__()
        self._set_widths(group_size, bits, value_bits)


class FakeQuantRotatingKVCache(_RoundTrips, _RotatingBase):  # type: ignore[misc]
    """A `RotatingKVCache` that stores K/V quantized then dequantized."""

    def __init__(
        self, max_size: int, keep: int = 0, *, group_size: int, bits: int, value_bits: int | None = None
    ) -> None:
        super().__init__(max_size, keep)
        self._set_widths(group_size, bits, value_bits)
