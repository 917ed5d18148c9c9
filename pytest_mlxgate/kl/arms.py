"""Running one arm of a gate: the model's next-token logits over fixed token ids, on one of two paths.

- prefill: one teacher-forced forward per sequence (or the same tokens in chunks through a KV
  cache, which is how the A/A calibration measures chunking noise);
- serving: the prefix goes through the production cache path in prefill chunks, then the
  remaining tokens are fed one at a time, quantizing the cache after every call exactly where
  `mlx_lm.generate.generate_step` does, so decode kernels and quantized caches are what is scored.

Both arms see identical token ids; the lever decides everything else. Each arm streams: one
sequence's logits (positions × vocabulary, float32) exist at a time, whatever the prompt count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..errors import NonFiniteLogitsError
from ..stats.divergence import RefDistributions, TokenScores, compact_reference, compare, first_nonfinite_row
from .shape import SERVING_PREFILL_STEP, ArmCounters, RunShape

if TYPE_CHECKING:
    from ..common.watch import ArmWatch
    from ..levers.lever import Arm, Lever
    from ..serving.kv_plan import KVPlan
    from .prompts import TokenSequence

__all__ = [
    "SERVING_BATCH_BYTES",
    "SequenceLogits",
    "run_candidate",
    "run_candidate_against",
    "run_reference",
    "run_reference_against",
    "sequence_logits",
    "serving_logits",
]


@dataclass
class SequenceLogits:
    """One sequence's scored distributions: logits[i] predicts next_tokens[i] at positions[i]."""

    logits: np.ndarray  # (rows, V) float32
    next_tokens: np.ndarray  # (rows,) int32
    positions: np.ndarray  # (rows,) int32
    dtype: str  # the model's own logits dtype, before the float32 cast (near-ties depend on it)


def sequence_logits(
    model: Any, ids: Sequence[int], shape: RunShape, kv: KVPlan, *, tick: Callable[[int], None] | None = None
) -> tuple[SequenceLogits, int]:
    """Run one sequence on `shape.path`; returns its logits and the number of model calls made.
    `tick(positions)` after each model call (an arm's progress and time limit)."""
    tokens = shape.tokens
    if len(ids) != tokens + 1:
        raise ValueError(f"a sequence must hold tokens + 1 = {tokens + 1} ids, got {len(ids)}")
    x = mx.array(list(ids[:tokens]), dtype=mx.int32)[None]
    next_tokens = np.asarray(ids[1 : tokens + 1], dtype=np.int32)
    if shape.path == "prefill":
        if shape.chunk is None or shape.chunk >= tokens:
            out = model(x)
            dtype = _dtype_name(out.dtype)
            logits = _to_numpy(out[0])
            calls = 1
            if tick is not None:
                tick(tokens)
        else:
            cache = make_prompt_cache(model)
            parts, calls, dtype = [], 0, "float32"
            for start in range(0, tokens, shape.chunk):
                out = model(x[:, start : start + shape.chunk], cache=cache)
                dtype = _dtype_name(out.dtype)
                parts.append(_to_numpy(out[0]))
                calls += 1
                if tick is not None:
                    tick(min(shape.chunk, tokens - start))
            logits = np.concatenate(parts)
        positions = np.arange(tokens, dtype=np.int32)
        return SequenceLogits(logits, next_tokens, positions, dtype), calls

    outs, calls = serving_logits(model, [ids], shape, kv, tick=tick)
    return outs[0], calls


def serving_logits(
    model: Any,
    batch: Sequence[Sequence[int]],
    shape: RunShape,
    kv: KVPlan,
    *,
    tick: Callable[[int], None] | None = None,
) -> tuple[list[SequenceLogits], int]:
    """The serving path for sequences of one length, as one batch: the prefixes through the arm's
    caches in prefill chunks, then one token per call, quantizing where `generate_step` does.

    Equal lengths need no padding or masks, so mlx_lm's own caches (plain, rotating, quantized,
    KV-shared readers) hold a batch as they hold one row; each row's numbers are its own."""
    tokens = shape.tokens
    for ids in batch:
        if len(ids) != tokens + 1:
            raise ValueError(f"a sequence must hold tokens + 1 = {tokens + 1} ids, got {len(ids)}")
    x = mx.array([list(ids[:tokens]) for ids in batch], dtype=mx.int32)
    prefix = tokens - shape.decode
    step = shape.chunk or SERVING_PREFILL_STEP
    cache = kv.make_cache(model)
    calls = 0
    for start in range(0, prefix, step):
        kv.forward(model, x[:, start : min(start + step, prefix)], cache)
        mx.eval([c.state for c in cache])
        calls += 1
        if tick is not None:
            tick(len(batch) * (min(start + step, prefix) - start))
    rows: np.ndarray | None = None
    dtype = "float32"
    for i, pos in enumerate(range(prefix, tokens)):
        out = kv.forward(model, x[:, pos : pos + 1], cache)
        step_rows = out[:, -1]
        dtype = _dtype_name(step_rows.dtype)
        values = _to_numpy(step_rows)
        if rows is None:
            rows = np.empty((len(batch), shape.decode, values.shape[-1]), dtype=np.float32)
        rows[:, i] = values
        calls += 1
        if tick is not None:
            tick(len(batch))
    assert rows is not None
    positions = np.arange(prefix, tokens, dtype=np.int32)
    outs = [
        SequenceLogits(rows[b], np.asarray(ids[prefix + 1 : tokens + 1], dtype=np.int32), positions, dtype)
        for b, ids in enumerate(batch)
    ]
    return outs, calls


#: The serving path holds a batch's decoded logits (rows x decode x vocabulary, float32) until the
#: batch ends: this bounds them, so peak memory stays independent of the prompt count.
SERVING_BATCH_BYTES = 256 << 20
#: The first batch, before the vocabulary size is known from a model output.
_FIRST_BATCH = 4


def run_reference(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    *,
    counters: ArmCounters,
    arm: Arm = "reference",
    on_sequence: Callable[[int], None] | None = None,
    watch: ArmWatch | None = None,
) -> list[RefDistributions]:
    """The reference arm, compacted per sequence (what the reference cache stores)."""
    refs, _ = run_reference_against(
        model, sequences, shape, lever, None, counters=counters, arm=arm, on_sequence=on_sequence, watch=watch
    )
    return refs


def run_reference_against(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    against: Sequence[RefDistributions] | None,
    *,
    counters: ArmCounters,
    arm: Arm = "reference",
    on_sequence: Callable[[int], None] | None = None,
    watch: ArmWatch | None = None,
) -> tuple[list[RefDistributions], list[TokenScores] | None]:
    """`run_reference`, and in the same pass (`against`) its scores against other distributions (the float32
    oracle's); None without them."""
    refs = []
    scores: list[TokenScores] | None = None if against is None else []
    with lever.applied(arm, on_call=site_counter(lever, counters, arm)):
        kv = lever.kv_plan(arm)
        for seq, out in _each(model, sequences, shape, kv, arm, lever, counters, watch=watch):
            refs.append(compact_reference(out.logits, out.next_tokens, logits_dtype=out.dtype))
            if against is not None and scores is not None:
                scores.append(compare(against[seq.index], out.logits, out.next_tokens, out.positions))
            if on_sequence:
                on_sequence(seq.index)
    return refs, scores


def run_candidate(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    refs: Sequence[RefDistributions],
    *,
    counters: ArmCounters,
    arm: Arm = "candidate",
    override_shape: RunShape | None = None,
    watch: ArmWatch | None = None,
) -> list[TokenScores]:
    """The candidate arm, scored against the reference sequence by sequence (its logits never pile up).

    `arm`/`override_shape` let the A/A calibration run the reference configuration again, or
    with another chunk size, through this same scoring path.
    """
    (scores,) = run_candidate_against(
        model, sequences, shape, lever, [refs], counters=counters, arm=arm, override_shape=override_shape, watch=watch
    )
    return scores


def run_candidate_against(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    ref_sets: Sequence[Sequence[RefDistributions]],
    *,
    counters: ArmCounters,
    arm: Arm = "candidate",
    override_shape: RunShape | None = None,
    watch: ArmWatch | None = None,
) -> list[list[TokenScores]]:
    """`run_candidate` scored against several references in one pass (the reference arm's and the float32
    oracle's): one list of scores per set, in order."""
    for refs in ref_sets:
        if len(refs) != len(sequences):
            raise ValueError(f"{len(refs)} reference sequences for {len(sequences)} candidate sequences")
    scores: list[list[TokenScores]] = [[] for _ in ref_sets]
    with lever.applied(arm, on_call=site_counter(lever, counters, arm)):
        kv = lever.kv_plan(arm)
        for seq, out in _each(model, sequences, override_shape or shape, kv, arm, lever, counters, watch=watch):
            for refs, into in zip(ref_sets, scores, strict=True):
                into.append(compare(refs[seq.index], out.logits, out.next_tokens, out.positions))
    lever.require_exercised(arm, counters.lever_calls.get(arm), during=f"{(override_shape or shape).path} path")
    return scores


def site_counter(lever: Lever, counters: ArmCounters, arm: Arm) -> Callable[[], None] | None:
    """A patch lever's call counter for `arm` (other kinds have no site to count)."""
    return counters.call_counter(arm) if lever.kind == "patch" else None


def _each(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    kv: KVPlan,
    arm: Arm,
    lever: Lever,
    counters: ArmCounters,
    *,
    watch: ArmWatch | None = None,
) -> Iterator[tuple[TokenSequence, SequenceLogits]]:
    for seq, out in _batches(model, sequences, shape, kv, counters, arm, watch=watch):
        _check_finite(seq, out, arm, lever)
        yield seq, out


def _batches(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    kv: KVPlan,
    counters: ArmCounters,
    arm: Arm,
    *,
    watch: ArmWatch | None = None,
) -> Iterator[tuple[TokenSequence, SequenceLogits]]:
    """Prefill: one sequence per forward. Serving (`shape.batched`): the sequences in batches whose
    decoded logits fit `SERVING_BATCH_BYTES`; else one at a time. `watch` hears of every forward's
    positions (progress lines; the arm's time limit, checked between forwards)."""
    tick = watch.advance if watch is not None else None
    if shape.path != "serving" or not shape.batched:
        for seq in sequences:
            out, calls = sequence_logits(model, seq.ids, shape, kv, tick=tick)
            counters.add(arm, calls)
            yield seq, out
        return
    size = _FIRST_BATCH
    i = 0
    while i < len(sequences):
        group = sequences[i : i + size]
        outs, calls = serving_logits(model, [s.ids for s in group], shape, kv, tick=tick)
        counters.add(arm, calls)
        yield from zip(group, outs, strict=True)
        i += len(group)
        vocab = outs[0].logits.shape[-1]
        size = max(1, SERVING_BATCH_BYTES // (shape.decode * vocab * 4))


def _check_finite(seq: TokenSequence, out: SequenceLogits, arm: Arm, lever: Lever) -> None:
    bad = first_nonfinite_row(out.logits)
    if bad is not None:
        row = out.logits[bad]
        what = "NaN" if np.isnan(row).any() else "inf"
        raise NonFiniteLogitsError(
            f"the {arm} arm ({lever.name}={lever.describe_value(arm)}) produced {what} logits at "
            f"prompt {seq.index} ({seq.preview!r}), position {int(out.positions[bad])}: "
            "a broken kernel or overflow, not drift; run that arm alone to debug it"
        )


def _to_numpy(x: Any) -> np.ndarray:
    return np.asarray(x.astype(mx.float32))


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]
