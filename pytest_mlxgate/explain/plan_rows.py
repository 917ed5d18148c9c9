"""A plan search's measurements on its selection sequences, sharing what every plan computes alike.

On the serving path a plan's caches quantize after the first forward (`KVPlan.maybe_quantize`, as mlx_lm's
`generate_step`), so a prefix prefilled in one chunk attends in float under every plan: its prefill is the
reference's. `SelectionRuns` prefills the selection once and decodes each plan from a copy of those caches,
quantized as the plan's first forward would have left them. On the embedded model (96-token prefixes, 32
decoded tokens) the prefill was a third of each measurement.

`measure_many` goes further for the sensitivities (30-odd plans that differ in one layer each): their rows
share one batch, each cached layer quantizing (then dequantizing: float kernels) the keys and values of the
rows whose plan quantizes it; a CPU decode step costs nearly the same for 6 rows as for 36, the weights
being read once a step. That is each plan's fake-quant (`KVPlan.fake_quant`), whose kernels differ from
the real quantized attention's in float rounding only (the same means to 4 digits on the embedded model,
tests/explain/test_plan_rows.py): fine for a sensitivity, a *prediction* the measured rounds check with the
real caches. `./dev bench plan` times both against one plan at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx
import numpy as np

from ..kl.arms import SERVING_BATCH_BYTES, run_candidate, serving_logits
from ..kl.prompts import texts_of
from ..kl.shape import SERVING_PREFILL_STEP, ArmCounters, RunShape
from ..serving.kv_plan import KVPlan
from ..stats.divergence import compare
from ..stats.kl_stats import KLStats, summarize

if TYPE_CHECKING:
    from ..kl.prompts import TokenSequence
    from ..levers.lever import Lever
    from ..stats.divergence import RefDistributions

__all__ = ["SelectionRuns"]


class Option(Protocol):
    """What a plan's layer option says here (`plan_kv.Option`: this module sits below it)."""

    @property
    def bits(self) -> int | None: ...
    @property
    def group_size(self) -> int | None: ...
    @property
    def v_bits(self) -> int | None: ...


class SelectionRuns:
    """Plans measured on `sequences` against their reference `refs`, from one shared prefill (above) where
    the prefix fills one prefill chunk; otherwise each plan runs the whole serving path."""

    def __init__(
        self, model: Any, sequences: Sequence[TokenSequence], shape: RunShape, refs: Sequence[RefDistributions]
    ):
        self.model, self.sequences, self.shape, self.refs = model, sequences, shape, refs
        self.texts = texts_of(sequences)
        self.prefix = shape.tokens - shape.decode
        self.x = mx.array([list(s.ids[: shape.tokens]) for s in sequences], dtype=mx.int32)
        self.prefilled: list[Any] | None = None
        if shape.path == "serving" and 0 < self.prefix <= (shape.chunk or SERVING_PREFILL_STEP) and shape.decode:
            cache = KVPlan(default=None).make_cache(model)
            model(self.x[:, : self.prefix], cache=cache)
            mx.eval([c.state for c in cache])
            self.prefilled = cache

    def measure(self, lever: Lever) -> KLStats:
        """The candidate arm of `lever` (a KV plan) with its real caches."""
        if self.prefilled is None:
            scores = run_candidate(self.model, self.sequences, self.shape, lever, self.refs, counters=ArmCounters())
            return summarize(scores, texts=self.texts)
        with lever.applied("candidate"):
            kv = lever.kv_plan("candidate")
            cache = kv.make_cache(self.model)
            cache[: len(self.prefilled)] = [_copied(c, 1) for c in self.prefilled]
            kv.maybe_quantize(cache)  # what the plan's first forward leaves
            return self._scored(self._decode(lambda t: kv.forward(self.model, t, cache), 1))[0]

    def measure_many(self, plans: Sequence[Mapping[int, Option]]) -> list[KLStats]:
        """Each plan's fake-quant statistics, as many plans a batch as keep its decoded logits within the
        serving path's `SERVING_BATCH_BYTES`."""
        n, vocab = len(self.sequences), self.refs[0].vocab_size if self.refs else 1
        per_batch = max(1, SERVING_BATCH_BYTES // max(1, n * self.shape.decode * vocab * 4))
        stats: list[KLStats] = []
        for start in range(0, len(plans), per_batch):
            chunk = plans[start : start + per_batch]
            if self.prefilled is None:
                rows = [s.ids for _ in chunk for s in self.sequences]
                outs, _ = serving_logits(self.model, rows, self.shape, _RowPlans(chunk, n))  # type: ignore[arg-type]
                logits = np.stack([o.logits for o in outs]).reshape(len(chunk), n, *outs[0].logits.shape)
                stats.extend(self._scored(logits))
                continue
            stats.extend(self._scored(self._decode_rows(chunk)))
        return stats

    def _decode_rows(self, plans: Sequence[Mapping[int, Option]]) -> np.ndarray:
        """`plans` side by side from the shared prefill, each plan's rows round-tripped where it quantizes."""
        assert self.prefilled is not None
        row_plans = _RowPlans(plans, len(self.sequences))
        cache = row_plans.wrap([_copied(c, len(plans)) for c in self.prefilled])
        row_plans.arm(cache)  # what each plan's first forward leaves
        return self._decode(lambda t: self.model(t, cache=cache), len(plans), mx.concatenate([self.x] * len(plans)))

    def _decode(self, step: Any, plans: int, x: Any = None) -> np.ndarray:
        """(plans, sequences, decode, vocabulary) logits: one token a step from the prefix on, as
        `kl.arms.serving_logits` decodes."""
        x = self.x if x is None else x
        rows: np.ndarray | None = None
        for i, pos in enumerate(range(self.prefix, self.shape.tokens)):
            values = np.asarray(step(x[:, pos : pos + 1])[:, -1].astype(mx.float32))
            if rows is None:
                rows = np.empty((x.shape[0], self.shape.decode, values.shape[-1]), dtype=np.float32)
            rows[:, i] = values
        assert rows is not None
        return rows.reshape(plans, len(self.sequences), *rows.shape[1:])

    def _scored(self, logits: np.ndarray) -> list[KLStats]:
        """Each plan's statistics from its (sequences, positions, vocabulary) logits."""
        out = []
        for plan_logits in logits:
            scores = []
            for k, s in enumerate(self.sequences):
                positions = np.arange(self.prefix, self.shape.tokens, dtype=np.int32)
                nxt = np.asarray(s.ids[self.prefix + 1 : self.shape.tokens + 1], dtype=np.int32)
                scores.append(compare(self.refs[k], plan_logits[k], nxt, positions))
            out.append(summarize(scores, texts=self.texts))
        return out


def _copied(cache: Any, times: int) -> Any:
    """A cache holding `cache`'s state `times` over along the batch (new arrays: the original never moves)."""
    out = copy.copy(cache)
    if cache.keys is not None:
        out.keys = mx.concatenate([cache.keys] * times) if times > 1 else mx.array(cache.keys)
        out.values = mx.concatenate([cache.values] * times) if times > 1 else mx.array(cache.values)
    return out


class _RowPlans:
    """What `serving_logits` asks of a plan (`make_cache`, `forward`) for a batch of plans, `rows` rows each:
    the model's plain cache, each layer some plan quantizes wrapped in `_RowRoundTrip`."""

    def __init__(self, plans: Sequence[Mapping[int, Option]], rows: int) -> None:
        self.plans, self.rows = plans, rows

    def make_cache(self, model: Any) -> list[Any]:
        return self.wrap(KVPlan(default=None).make_cache(model))  # checked against the model

    def wrap(self, cache: list[Any]) -> list[Any]:
        for i, c in enumerate(cache):
            widths = [plan.get(i) for plan in self.plans]
            if any(o is not None and o.bits is not None for o in widths):
                cache[i] = _RowRoundTrip(c, widths, self.rows)
        return cache

    def forward(self, model: Any, tokens: Any, cache: list[Any]) -> Any:
        """A step, then the quantization where `KVPlan.maybe_quantize` does it (a plan's layers from token
        0: after the first forward, so the first prefill chunk attends in float, as mlx_lm serves it)."""
        out = model(tokens, cache=cache)
        self.arm(cache)
        return out

    @staticmethod
    def arm(cache: list[Any]) -> None:
        for c in cache:
            if isinstance(c, _RowRoundTrip) and not c.armed:
                c.arm()


class _RowRoundTrip:
    """A cache whose updates are, row by row, quantized then dequantized at that row's plan's widths for
    this layer (plain rows untouched); everything else is the wrapped cache's."""

    def __init__(self, inner: Any, widths: Sequence[Option | None], rows: int) -> None:
        self.inner = inner
        self.armed = False  # quantizing: from the first step's end on (`_RowPlans.forward`)
        self.masks: list[tuple[Option, Any]] = []
        for o in {o for o in widths if o is not None and o.bits is not None}:
            rows_of = [w == o for w in widths for _ in range(rows)]
            self.masks.append((o, mx.array(rows_of).reshape(-1, 1, 1, 1)))

    def arm(self) -> None:
        """What the cache holds so far quantized (then dequantized), and every later update."""
        if self.inner.keys is not None:
            self.inner.keys, self.inner.values = self._round_trip(self.inner.keys, self.inner.values)
        self.armed = True

    def update_and_fetch(self, keys: Any, values: Any) -> Any:
        if self.armed:
            keys, values = self._round_trip(keys, values)
        return self.inner.update_and_fetch(keys, values)

    def _round_trip(self, keys: Any, values: Any) -> tuple[Any, Any]:
        for o, mask in self.masks:
            g = int(o.group_size or 64)
            keys = mx.where(mask, _round_trip(keys, g, int(o.bits or 8)), keys)
            values = mx.where(mask, _round_trip(values, g, int(o.v_bits or 8)), values)
        return keys, values

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _round_trip(x: Any, group_size: int, bits: int) -> Any:
    return mx.dequantize(*mx.quantize(x, group_size=group_size, bits=bits), group_size=group_size, bits=bits)
