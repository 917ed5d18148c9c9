"""KV cache plans: which layers of the serving path keep a quantized KV cache, and how.

A plan mirrors what `mlx_lm.generate` does with `--kv-bits/--kv-group-size/--quantized-kv-start`
(`maybe_quantize_kv_cache`: once a layer's cache offset reaches the start, its `KVCache` is
replaced by `cache.to_quantized(...)`, a `QuantizedKVCache`), but lets each layer have its own
spec. Only the serving path reads a KV cache back, so only it can show a KV lever's drift.

Values a KV lever accepts (`parse_kv_value`):

* `None`, `"plain"`, `"none"`: the plain `KVCache` everywhere;
* `8`, `"8"`, `"q8"`, `"8bit"`, `"bits=8,group_size=64,start=0"`, `{"bits": 8, "group_size": 64,
  "start": 0}`: every layer quantized alike (group_size defaults to 64, start to 0);
* `"K8V4"`, `"k_bits=8,v_bits=4"`, `{"k_bits": 8, "v_bits": 4}`: keys and values at their own widths
  (here keys at 8 bits, values at 4; `{"bits": 8, "v_bits": 4}` says the same);
* a path to a kv_config.json (a `str` ending in `.json`, or a `Path`): a per-layer plan.

The kv_config.json format::

    {
      "default": {"bits": 8, "group_size": 64} | null,   # layers not named below; null = plain
      "quantized_kv_start": 0,                           # start for every spec without its own
      "layers": {"0": {"bits": 4, "group_size": 32}, "3": null},
      "verified": false, "verification": "why"           # optional: `mlxgate plan --no-verify`'s mark
    }

`"types"` (optional) sets a spec per attention type, for models with sliding-window and full
layers (gemma-4): `"types": {"sliding": {"bits": 4}, "full": 8}` (`full_attention` and
`sliding_attention` are the long names). A layer takes its `"layers"` entry, else its type's,
else `"default"`.

`"layers"` may instead be a list indexed by layer, each entry a spec, `null` (plain) or a bare
bit count: `"layers": [4, 4, {"bits": 8, "start": 16}, null]`. A spec holds `bits` (2, 3, 4, 5, 6
or 8) for keys and values alike, or `k_bits` and `v_bits` for each its own, optionally `group_size`
(32, 64 or 128; default 64) and `start` (default `quantized_kv_start`); unknown keys are errors, not
silently ignored. A plan's `source` carries the sha256 of the file's bytes, so a cache key changes
with the file.

`KVCache` layers quantize to mlx_lm's `QuantizedKVCache`, `RotatingKVCache` (sliding-window)
layers to this project's `QuantizedRotatingKVCache` (mlx_lm 0.32 has none), and gemma-4's
KV-shared layers read their source layer's quantized K/V (`serving.caches`); a layer with keys and
values apart keeps each at its width, and mlx_lm's quantized attention reads both (`serving.attention`). Caches with no
quantized form (e.g. `ArraysCache` of recurrent layers) stay as they are under `"default"`, as in
mlx_lm; naming one in `"layers"` is an error, raised when the plan meets the model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..common.plan_mark import MARK_KEYS, unverified_reason
from ..errors import LeverError, VacuousLeverError

__all__ = [
    "KV_BITS",
    "ATTENTION_TYPES",
    "KV_GROUP_SIZES",
    "KVPlan",
    "KVSpec",
    "PLAIN",
    "parse_kv_value",
    "require_kv_difference",
    "shared_kv_sources",
]

#: Bit widths mlx's quantized KV cache path supports.
KV_BITS: tuple[int, ...] = (2, 3, 4, 5, 6, 8)
#: Group sizes `mx.quantize` supports (the head dimension must be a multiple of it).
KV_GROUP_SIZES: tuple[int, ...] = (32, 64, 128)

_VALUE_FORMS = (
    "use None/'plain', a bit count (8, '8', 'q8', '8bit'), keys and values apart ('K8V4', "
    "'k_bits=8,v_bits=4'), 'bits=8,group_size=64,start=0', "
    "a dict {'bits': 8, 'group_size': 64, 'start': 0}, or a path to a kv_config.json"
)
_SPEC_KEYS = frozenset({"bits", "k_bits", "v_bits", "group_size", "start"})
_CONFIG_KEYS = frozenset({"default", "quantized_kv_start", "layers", "types"}) | MARK_KEYS
_BITS_TEXT = re.compile(r"(?:q)?(\d+)(?:-?bits?)?", re.IGNORECASE)
_KV_TEXT = re.compile(r"k(\d+)[/_-]?v(\d+)", re.IGNORECASE)  # K8V4, k8/v4: keys and values apart


@dataclass(frozen=True)
class KVSpec:
    """How one layer's KV cache is quantized: keys at `bits`, values at `value_bits` (None: `bits` too).

    Keys and values are not equally sensitive (keys carry RoPE's outliers; KIVI, KVTuner), so a plan may
    give them their own widths: `KVSpec(8, value_bits=4)` is K8/V4. Equal widths are held as one `bits`,
    so `KVSpec(8, value_bits=8) == KVSpec(8)`."""

    bits: int
    group_size: int = 64
    start: int = 0  # quantize once the layer's cache offset >= start (mlx_lm's quantized_kv_start)
    value_bits: int | None = None

    def __post_init__(self) -> None:
        _check_int(self.bits, "bits", KV_BITS, where="KV spec")
        _check_int(self.group_size, "group_size", KV_GROUP_SIZES, where="KV spec")
        _check_start(self.start, where="KV spec")
        if self.value_bits is not None:
            _check_int(self.value_bits, "v_bits", KV_BITS, where="KV spec")
            if self.value_bits == self.bits:
                object.__setattr__(self, "value_bits", None)

    @property
    def k_bits(self) -> int:
        return self.bits

    @property
    def v_bits(self) -> int:
        return self.bits if self.value_bits is None else self.value_bits

    @property
    def apart(self) -> bool:
        """Keys and values at different widths (mlx_lm's own `--kv-bits` cannot serve it)."""
        return self.value_bits is not None

    @property
    def widths(self) -> str:
        """`8-bit`, or `K8/V4` for a spec with keys and values apart."""
        return f"K{self.k_bits}/V{self.v_bits}" if self.apart else f"{self.bits}-bit"

    @property
    def canonical(self) -> str:
        """The spec as `bits=B,group_size=G,start=S` (`k_bits=K,v_bits=V,...` apart): what
        `parse_kv_value` reads back."""
        widths = f"k_bits={self.k_bits},v_bits={self.v_bits}" if self.apart else f"bits={self.bits}"
        return f"{widths},group_size={self.group_size},start={self.start}"

    def label(self) -> str:
        """Short human text: `8-bit g64 from token 0`, `K8/V4 g64 from token 0`."""
        return f"{self.widths} g{self.group_size} from token {self.start}"

    def to_json(self) -> dict[str, int]:
        """The spec as a kv_config.json entry (what `parse_kv_value` and the config reader take)."""
        widths = {"k_bits": self.k_bits, "v_bits": self.v_bits} if self.apart else {"bits": self.bits}
        return {**widths, "group_size": self.group_size, "start": self.start}


def _spec_label(spec: KVSpec | None) -> str:
    return "plain" if spec is None else spec.label()


#: kv_config.json's attention types (mlx_lm's `layer_types` names) and their short forms.
ATTENTION_TYPES: dict[str, str] = {
    "full": "full_attention",
    "full_attention": "full_attention",
    "sliding": "sliding_attention",
    "sliding_attention": "sliding_attention",
}


@dataclass(frozen=True)
class KVPlan:
    """A KV cache spec per layer: `layers` by index, else `types` by attention type, else `default`."""

    default: KVSpec | None  # None = plain KVCache
    layers: Mapping[int, KVSpec | None] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "plain"  # canonical text (a config file: its name and sha256 prefix)
    digest: str | None = None  # full sha256 of the kv_config.json bytes; None for inline values
    n_layers: int | None = None  # the layer count a list-form kv_config.json declares
    types: Mapping[str, KVSpec | None] = field(default_factory=lambda: MappingProxyType({}))
    fake: bool = False  # quantize -> dequantize into float caches (see `fake_quant`)
    unverified: str | None = None  # why the file says no gate verified it (`common.plan_mark`)

    def for_layer(self, i: int, attention: str | None = None) -> KVSpec | None:
        """Layer `i`'s spec (its attention type, when known, for `types`); None means a plain cache."""
        if i in self.layers:
            return self.layers[i]
        if attention is not None and attention in self.types:
            return self.types[attention]
        return self.default

    @property
    def is_plain(self) -> bool:
        """No layer is ever quantized."""
        specs = [self.default, *self.layers.values(), *self.types.values()]
        return all(spec is None for spec in specs)

    @property
    def is_uniform(self) -> bool:
        """Every layer alike (what `mlx_lm.generate --kv-bits` can run, keys and values at one width)."""
        return not self.layers and not self.types

    @property
    def apart(self) -> bool:
        """Some layer keeps its keys and values at different widths (mlx_lm's `--kv-bits` has one)."""
        specs = [self.default, *self.layers.values(), *self.types.values()]
        return any(spec is not None and spec.apart for spec in specs)

    def fake_quant(self) -> KVPlan:
        """The same plan in float: each quantized layer stores its K/V quantized then dequantized
        and attends with the float kernel. Against the real plan, what differs is the kernels."""
        return replace(self, fake=True, source=f"fake-quant {self.source}")

    def check_against(self, model: Any) -> None:
        """Refuse, before any token is served, what this plan cannot run on `model` (`check_caches`).
        Every loop that serves a plan calls it: the project's own, and mlx_lm's `stream_generate`."""
        from mlx_lm.models.cache import make_prompt_cache

        from .caches import kv_head_dims

        cache = make_prompt_cache(model)
        shared = shared_kv_sources(model, len(cache))
        self.check_caches(cache, shared, n_layers=len(cache) + len(shared), head_dims=kv_head_dims(model))

    def make_cache(self, model: Any) -> list[Any]:
        """A fresh prompt cache for `model` (quantization happens later, in `maybe_quantize`), after
        checking the plan against the model (`check_against`). A model with KV-shared layers (gemma-4) gets
        a `SharedKVReader` in each of their slots, so they read a quantized source correctly."""
        from mlx_lm.models.cache import make_prompt_cache

        from .caches import SharedKVReader

        self.check_against(model)
        cache: list[Any] = make_prompt_cache(model)
        shared = shared_kv_sources(model, len(cache))
        if shared and not self.is_plain and not self.fake:
            cache.extend(SharedKVReader(cache, shared[j]) for j in sorted(shared))
        return cache

    def forward(self, model: Any, tokens: Any, cache: list[Any]) -> Any:
        """The model over `tokens` through `cache`, then this plan's quantization where mlx_lm's
        `generate_step` does it: the step of every serving loop (KL arms, speed trials, one-at-a-time
        generation, plan runs), so none can drop the re-quantize as decode crosses a start."""
        out = model(tokens, cache=cache)
        self.maybe_quantize(cache)
        return out

    def maybe_quantize(self, cache: list[Any]) -> None:
        """Quantize, in place, each layer whose spec's start its offset has reached.

        Call it after every forward, as mlx_lm's `generate_step` calls `maybe_quantize_kv_cache`;
        a quantized cache (or one with no quantized form) is left alone.
        """
        if self.is_plain:
            return
        from .caches import attention_type, fake_quantize_cache, quantize_cache, quantized_form

        convert = fake_quantize_cache if self.fake else quantize_cache
        for i, c in enumerate(cache):
            if quantized_form(c) is None:
                continue
            spec = self.for_layer(i, attention_type(c))
            if spec is not None and c.offset >= spec.start:
                cache[i] = convert(c, group_size=spec.group_size, bits=spec.bits, value_bits=spec.v_bits)

    def describe(self) -> str:
        """Short human text: `plain`, `8-bit g64 from token 0`, `kv_config.json (…)`."""
        if self.digest is None:
            return ("fake-quant " if self.fake else "") + _spec_label(self.default)
        name = self.source.removeprefix("fake-quant ").split(" sha256:")[0]  # fake_quant() marks the source too
        mark = f" [NOT verified: {self.unverified}]" if self.unverified is not None else ""
        return ("fake-quant " if self.fake else "") + f"{name} ({self._summary()}){mark}"

    def _summary(self) -> str:
        if self.n_layers is not None:
            specs = [self.for_layer(i) for i in range(self.n_layers)]
            return f"{self.n_layers} layers: {_counted(specs)}"
        text = f"default {_spec_label(self.default)}"
        for kind, spec in self.types.items():
            text += f"; {kind.removesuffix('_attention')} {_spec_label(spec)}"
        if self.layers:
            text += f"; {len(self.layers)} overridden: {_counted(list(self.layers.values()))}"
        return text

    def check_model(self, n_layers: int) -> None:
        """Refuse a per-layer plan that names layers the model does not have."""
        beyond = sorted(i for i in self.layers if i >= n_layers)
        declared = self.n_layers if self.n_layers is not None else 0
        if beyond or declared > n_layers:
            named = f"{declared} layers" if declared > n_layers else f"layers {beyond}"
            raise LeverError(
                f"KV plan {self.source} configures {named}, but the model has {n_layers} "
                f"layers (0..{n_layers - 1}); fix the kv_config.json for this model"
            )

    def check_caches(
        self,
        cache: list[Any],
        shared: Mapping[int, int],
        *,
        n_layers: int,
        head_dims: Mapping[int, tuple[int, ...]],
    ) -> None:
        """Refuse, when the plan meets the model, what it cannot run: a layer beyond the model, a
        quantized spec on a KV-shared layer (it keeps no cache) or on a cache with no quantized form,
        an attention type the model has none of, a group size a layer's head dimension (`head_dims`,
        `serving.caches.kv_head_dims`) is no multiple of (mx.quantize would refuse it from inside
        mlx_lm, mid-run). The message names the layers and their caches."""
        from .caches import attention_type, quantized_form

        self.check_model(n_layers)
        problems: list[str] = []
        on_shared = sorted(i for i, spec in self.layers.items() if spec is not None and i in shared)
        if on_shared:
            sources = ", ".join(f"{i} reads layer {shared[i]}" for i in on_shared)
            problems.append(
                f"layers {on_shared} are KV-shared and keep no cache ({sources}): quantize their "
                "source layers instead, and set these to null"
            )
        stuck = sorted(
            i
            for i, spec in self.layers.items()
            if spec is not None and i < len(cache) and quantized_form(cache[i]) is None
        )
        if stuck:
            kinds = ", ".join(f"{i}: {type(cache[i]).__name__}" for i in stuck)
            problems.append(
                f"layers {stuck} keep caches with no quantized form ({kinds}): set them to null "
                "(only KVCache and RotatingKVCache layers can be quantized)"
            )
        present = {attention_type(c) for c in cache}
        missing = sorted(t for t, spec in self.types.items() if spec is not None and t not in present)
        if missing:
            have = sorted(t for t in present if t) or ["none"]
            problems.append(f"it sets attention types {missing}, but the model's cached layers are {have}")
        problems.extend(self._group_misfits(cache, head_dims))
        if problems:
            raise LeverError(
                f"KV plan {self.source} cannot run on this model: "
                + "; ".join(problems)
                + " (kv_config.json format: see pytest_mlxgate.serving.kv_plan)"
            )

    def _group_misfits(self, cache: list[Any], head_dims: Mapping[int, tuple[int, ...]]) -> list[str]:
        """One problem per (head dimensions, group size) that does not divide, naming its layers."""
        from .caches import attention_type

        misfit: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for i, dims in sorted(head_dims.items()):
            spec = self.for_layer(i, attention_type(cache[i])) if i < len(cache) else None
            if spec is not None and any(d % spec.group_size for d in dims):
                misfit.setdefault((dims, spec.group_size), []).append(i)
        problems = []
        for (dims, group), layers in misfit.items():
            fits = [g for g in KV_GROUP_SIZES if all(d % g == 0 for d in dims)]
            fix = (
                f"use group_size {' or '.join(map(str, fits))} there, or set those layers to null (plain)"
                if fits
                else f"no group size mx.quantize supports ({', '.join(map(str, KV_GROUP_SIZES))}) divides it: "
                "set those layers to null (plain)"
            )
            problems.append(
                f"layers {layers} keep keys/values of head dimension {' and '.join(map(str, dims))}, "
                f"which group size {group} does not divide: {fix}"
            )
        return problems

    def quantized_within(self, model: Any, positions: int) -> dict[int, str]:
        """{cached layer: its spec} for the layers this plan quantizes before the last of `positions`
        tokens is fed (a layer quantizes once its offset reaches its spec's start, so a forward at
        position p reads quantized K/V when start <= p): what the plan changes on sequences that long."""
        from mlx_lm.models.cache import make_prompt_cache

        from .caches import attention_type, quantized_form

        out: dict[int, str] = {}
        for i, c in enumerate(make_prompt_cache(model)):
            spec = self.for_layer(i, attention_type(c)) if quantized_form(c) is not None else None
            if spec is not None and spec.start <= positions - 1:
                out[i] = f"{spec.widths} g{spec.group_size}" + ("-fake" if self.fake else "")
        return out


def require_kv_difference(
    name: str, reference: KVPlan, candidate: KVPlan, model: Any, positions: int, *, where: str
) -> None:
    """Refuse a KV lever whose two plans serve the same caches at every position `where` scores
    (e.g. a start beyond the sequences, both arms plain): a pass would certify nothing."""
    ref, cand = reference.quantized_within(model, positions), candidate.quantized_within(model, positions)
    if ref != cand:
        return
    late = sorted(
        {
            spec.start
            for plan in (reference, candidate)
            for spec in (plan.default, *plan.layers.values(), *plan.types.values())
            if spec is not None and spec.start > positions - 1
        }
    )
    why = (
        f"every quantized spec starts at token {', '.join(map(str, late))}, beyond the {positions} tokens {where} feeds"
        if late and not ref
        else "both plans quantize the same layers the same way"
        if ref
        else "neither plan quantizes any layer"
    )
    raise VacuousLeverError(
        f"KV lever {name!r}: {reference.describe()} (reference) and {candidate.describe()} (candidate) serve "
        f"the same caches at every position {where} scores ({why}): the lever changes nothing the gate "
        "measures, so it would pass without testing anything. Fix: a quantized_kv_start (start=) below the "
        "sequence length, longer sequences (mlx_kl(tokens=...) / --mlx-kl-tokens), or a candidate plan "
        "that differs from the reference on this model's layers"
    )


def shared_kv_sources(model: Any, n_cached: int) -> dict[int, int]:
    """{KV-shared layer: the layer whose K/V it reuses} for models whose last layers keep no cache
    (gemma-4's `previous_kvs`); empty for every other model."""
    text = getattr(model, "language_model", model)
    previous = getattr(getattr(text, "model", None), "previous_kvs", None)
    layers = getattr(model, "layers", None)
    if not isinstance(previous, list) or layers is None or len(layers) <= n_cached:
        return {}
    return {j: int(previous[j]) for j in range(n_cached, len(layers))}


def _counted(specs: list[KVSpec | None]) -> str:
    counts: dict[str, int] = {}
    for spec in specs:
        key = (
            "plain"
            if spec is None
            else (
                spec.widths
                + ("" if spec.group_size == 64 else f" g{spec.group_size}")
                + ("" if spec.start == 0 else f" from {spec.start}")
            )
        )
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} ×{n}" for k, n in counts.items())


#: The plain plan: every layer keeps mlx_lm's plain `KVCache`.
PLAIN = KVPlan(default=None, layers=MappingProxyType({}), source="plain")


def parse_kv_value(value: object, *, base_dir: Path | None = None) -> KVPlan:
    """Turn a KV lever value (see the module docstring) into a plan; LeverError says what is wrong.

    A relative kv_config.json path is taken relative to `base_dir` (default: the working dir).
    """
    if value is None:
        return PLAIN
    if isinstance(value, Path):
        return _load_config(value, base_dir)
    if isinstance(value, bool):
        raise LeverError(f"KV value {value!r} is a bool, not a KV setting; {_VALUE_FORMS}")
    if isinstance(value, int):
        return _uniform(_spec_from_mapping({"bits": value}, where=f"KV value {value!r}"))
    if isinstance(value, Mapping):
        return _uniform(_spec_from_mapping(value, where=f"KV value {dict(value)!r}"))
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in {"plain", "none", ""}:
            return PLAIN
        if text.lower().endswith(".json"):
            return _load_config(Path(text), base_dir)
        return _uniform(_spec_from_text(text))
    raise LeverError(f"KV value {value!r} ({type(value).__name__}) is not a KV setting; {_VALUE_FORMS}")


def _uniform(spec: KVSpec) -> KVPlan:
    return KVPlan(default=spec, layers=MappingProxyType({}), source=spec.canonical)


def _spec_from_text(text: str) -> KVSpec:
    where = f"KV value {text!r}"
    bare = _BITS_TEXT.fullmatch(text)
    if bare:
        return _spec_from_mapping({"bits": int(bare.group(1))}, where=where)
    apart = _KV_TEXT.fullmatch(text)
    if apart:
        return _spec_from_mapping({"k_bits": int(apart.group(1)), "v_bits": int(apart.group(2))}, where=where)
    fields: dict[str, object] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LeverError(f"{where}: cannot read {part.strip()!r} as key=value; {_VALUE_FORMS}")
        if key in fields:
            raise LeverError(f"{where} sets {key!r} twice; give each of bits, group_size, start once")
        try:
            fields[key] = int(raw.strip())
        except ValueError:
            raise LeverError(f"{where}: {key}={raw.strip()!r} is not an integer; {_VALUE_FORMS}") from None
    return _spec_from_mapping(fields, where=where)


def _spec_from_mapping(raw: Mapping[Any, Any], *, where: str, start: int = 0) -> KVSpec:
    """A spec from its keys: `bits` for keys and values alike, `k_bits`/`v_bits` for either half (each
    over `bits`), `group_size`, `start`."""
    unknown = sorted(str(k) for k in raw if k not in _SPEC_KEYS)
    if unknown:
        raise LeverError(
            f"{where} has unknown keys {unknown}; a KV spec holds only bits (or k_bits and v_bits), group_size, start"
        )
    if "bits" in raw and "k_bits" in raw and "v_bits" in raw:
        raise LeverError(
            f"{where} gives bits, k_bits and v_bits: bits would go unread; give bits, or k_bits and v_bits"
        )
    k_raw, v_raw = raw.get("k_bits", raw.get("bits")), raw.get("v_bits", raw.get("bits"))
    if k_raw is None or v_raw is None:
        halves = (("k", "keys", k_raw), ("v", "values", v_raw))
        half = [f"'{k}_bits' (the {w}' width)" for k, w, x in halves if x is None]
        missing = "'bits'" if "k_bits" not in raw and "v_bits" not in raw else " and ".join(half)
        raise LeverError(
            f"{where} lacks {missing}; a valid spec: {{'bits': 8, 'group_size': 64}} (keys and values alike, bits one "
            f"of {list(KV_BITS)}), or {{'k_bits': 8, 'v_bits': 4, 'group_size': 64}} (each its own); null: plain"
        )
    k_bits = _check_int(k_raw, "k_bits" if "k_bits" in raw else "bits", KV_BITS, where=where)
    v_bits = _check_int(v_raw, "v_bits" if "v_bits" in raw else "bits", KV_BITS, where=where)
    group = _check_int(raw.get("group_size", 64), "group_size", KV_GROUP_SIZES, where=where)
    first = _check_start(raw.get("start", start), where=where)
    return KVSpec(bits=k_bits, group_size=group, start=first, value_bits=v_bits)


def _check_int(value: object, key: str, allowed: tuple[int, ...], *, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise LeverError(f"{where}: {key}={value!r} is not supported; use one of {list(allowed)}")
    return value


def _check_start(value: object, *, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LeverError(f"{where}: start={value!r} must be a token count >= 0 (0 quantizes from the first token)")
    return value


def _load_config(path: Path, base_dir: Path | None) -> KVPlan:
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LeverError(
            f"cannot read kv_config {path}: {e.strerror or e}; give an existing kv_config.json "
            "(a relative path is taken from the gate module's directory, else the working directory)"
        ) from None
    where = f"kv_config {path}"
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LeverError(
            f"{where} is not valid JSON ({e}); fix the file (format: see pytest_mlxgate.serving.kv_plan)"
        ) from None
    if not isinstance(config, dict):
        raise LeverError(f"{where} must hold a JSON object with 'default', 'quantized_kv_start', 'layers'")
    unknown = sorted(k for k in config if k not in _CONFIG_KEYS)
    if unknown:
        raise LeverError(f"{where} has unknown keys {unknown}; allowed: {sorted(_CONFIG_KEYS)}")
    start = _check_start(config.get("quantized_kv_start", 0), where=f"{where} key 'quantized_kv_start'")

    def spec(raw: object, key: str) -> KVSpec | None:
        at = f"{where} key {key}"
        if raw is None:
            return None
        if isinstance(raw, int) and not isinstance(raw, bool):
            return _spec_from_mapping({"bits": raw}, where=at, start=start)
        if isinstance(raw, dict):
            return _spec_from_mapping(raw, where=at, start=start)
        raise LeverError(f"{at} is {raw!r}; give a spec {{'bits': 8, 'group_size': 64}}, a bit count, or null")

    default = spec(config.get("default"), "'default'")
    raw_types = config.get("types", {})
    if not isinstance(raw_types, dict):
        raise LeverError(
            f"{where} key 'types' is {type(raw_types).__name__}; give an object {{'full': spec, 'sliding': spec}}"
        )
    types: dict[str, KVSpec | None] = {}
    for name, raw in raw_types.items():
        kind = ATTENTION_TYPES.get(str(name))
        if kind is None:
            raise LeverError(f"{where} key 'types' names {name!r}; attention types are {sorted(set(ATTENTION_TYPES))}")
        if kind in types:
            raise LeverError(f"{where} key 'types' sets {kind!r} twice ({name!r}); give it once")
        types[kind] = spec(raw, f"'types'.{name!r}")
    raw_layers = config.get("layers", {})
    layers: dict[int, KVSpec | None] = {}
    n_layers: int | None = None
    if isinstance(raw_layers, list):
        n_layers = len(raw_layers)
        for i, raw in enumerate(raw_layers):
            layers[i] = spec(raw, f"'layers'[{i}]")
    elif isinstance(raw_layers, dict):
        for name, raw in raw_layers.items():
            if not re.fullmatch(r"\d+", name):
                raise LeverError(f"{where} key 'layers' names layer {name!r}; layer keys are indices '0', '1', …")
            layers[int(name)] = spec(raw, f"'layers'.{name!r}")
    else:
        raise LeverError(f"{where} key 'layers' is {type(raw_layers).__name__}; give an object {{'0': spec}} or a list")
    digest = hashlib.sha256(data).hexdigest()
    return KVPlan(
        default=default,
        layers=MappingProxyType(layers),
        source=f"{path.name} sha256:{digest[:16]}",
        digest=digest,
        n_layers=n_layers,
        types=MappingProxyType(types),
        unverified=unverified_reason(config, where),
    )
