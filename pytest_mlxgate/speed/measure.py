"""Timing both arms of a lever on the serving path: prefill and decode tokens/s, peak and KV bytes.

One trial is what `mlx_lm.generate` does with a prompt: a fresh cache from the arm's KV plan, the
context prefilled in chunks of 2048 (only the cache is evaluated, as mlx_lm does), quantized where
the plan says, then `decode` tokens fed one at a time, each call synchronised with `mx.eval`. Fixed
token ids (the gate's own prompts, cycled) stand in for sampled ones, so both arms do identical
work. No KL work happens inside a timed span.

Per context: `warmup` untimed trials per arm, then pairs in ABBA order (reference first in even
pairs, candidate first in odd ones), so drift of the machine over the run (thermal state, a
background job) falls on both arms alike. Each pair gives one ratio (`stats.ratios`). Pairs are
added until the context is decided (`stop_reason`: the module's goals there shown met or missed, or
with none, the estimates as precise as the shape asks), at most `repetitions`; the intervals are
the sequential looks' (`stats.ratios.look_confidence`), valid whenever the trials stop.

The trials time alone: under xdist they hold the run's trial lock (`common.watch`), so no other
worker's trials overlap them and other workers' KL arms pause between forwards; what other
processes still did on the cores meanwhile is sampled around the trials (`speed.load`) and recorded.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..kl.shape import SERVING_PREFILL_STEP
from ..stats.ratios import look_points
from .load import load_seen, sample
from .result import ContextSpeed, SpeedResult, Trial
from .shape import SAMPLED_GOALS, SpeedShape

if TYPE_CHECKING:
    from ..common.watch import ArmWatch, Watcher
    from ..levers.lever import Arm, Lever

__all__ = [
    "ArmModel",
    "MemoryProbe",
    "cache_bytes",
    "cache_held_bytes",
    "measure_speed",
    "memory_probe",
    "pair_order",
    "pairs_until_decided",
    "stop_reason",
    "weight_bytes",
]


@dataclass(frozen=True)
class ArmModel:
    """What one side of a speed pair runs: the model, and which arm's lever value it runs under."""

    model: Any
    arm: Arm


def measure_speed(
    *,
    lever: Lever,
    reference: ArmModel,
    candidate: ArmModel,
    token_ids: Sequence[int],
    shape: SpeedShape,
    say: Callable[[str], None] | None = None,
    watch: Watcher | None = None,
) -> SpeedResult:
    """Both arms at every context of `shape`, interleaved; `reference`/`candidate` may name the same
    arm (an A/A run measures the noise of the measurement itself). `watch`: progress lines, the
    time limit (checked between decode steps) and the run's trial lock."""
    if not token_ids:
        raise ValueError("speed needs token ids to feed the model")
    probe = memory_probe()
    started = time.perf_counter()
    contexts = {}
    trials_total = len(shape.contexts) * 2 * (shape.warmup + shape.repetitions)
    alone = watch.timing_alone("speed trials") if watch is not None else contextlib.nullcontext(0.0)
    with alone as waited:
        meter = (
            watch.arm("speed trials (both arms, ABBA)", trials_total, unit="trials", action="timing", verb="timed")
            if watch is not None
            else None
        )
        before = sample()
        for context in shape.contexts:
            ids = _ids(token_ids, context + shape.decode)
            sides = (reference, candidate)
            for _ in range(shape.warmup):
                for side in sides:
                    _trial(side, lever, ids, context, shape.decode, probe, meter)

            def pair(rep: int, ids: Any = ids, context: int = context) -> dict[str, Trial]:
                timed = {}
                for name in pair_order(rep):
                    side = reference if name == "reference" else candidate
                    timed[name] = _trial(side, lever, ids, context, shape.decode, probe, meter)
                return timed

            contexts[context] = pairs_until_decided(shape, context, pair)
            if say is not None:
                say(f"speed at {context} tokens: {contexts[context].short_text()}")
        seen = load_seen(before, sample(), waited_s=float(waited or 0.0))
        if meter is not None:
            meter.finish()
    return SpeedResult(
        shape=shape,
        contexts=contexts,
        memory_method=probe.method,
        weights={"reference": weight_bytes(reference.model), "candidate": weight_bytes(candidate.model)},
        arms={"reference": reference.arm, "candidate": candidate.arm},
        duration_s=time.perf_counter() - started,
        load_seen=seen,
    )


def pairs_until_decided(shape: SpeedShape, context: int, pair: Callable[[int], Mapping[str, Trial]]) -> ContextSpeed:
    """One context's ratios: `pair(rep)` times both arms once ({"reference": trial, "candidate": trial},
    in `pair_order(rep)`), called until `stop_reason`, asked at each of `look_points`, says the context
    is decided, at most `shape.repetitions` times; the intervals are the looks'."""
    trials: dict[str, list[Trial]] = {"reference": [], "candidate": []}
    budget = shape.repetitions
    looks = look_points(budget)
    for rep in range(budget):
        timed = pair(rep)
        for name in ("reference", "candidate"):
            trials[name].append(timed[name])
        if rep + 1 in looks and rep + 1 < budget:
            so_far = ContextSpeed.from_trials(
                context, shape.decode, trials["reference"], trials["candidate"], budget=budget
            )
            reason = stop_reason(so_far, shape)
            if reason is not None:
                return replace(so_far, stopped=reason)
    return ContextSpeed.from_trials(
        context, shape.decode, trials["reference"], trials["candidate"], budget=budget, stopped="budget"
    )


def stop_reason(speed: ContextSpeed, shape: SpeedShape) -> str | None:
    """Why no more pairs are needed at this context, or None: "decided" when every goal that applies
    here has its interval on one side of its limit (a goal whose ratio is not measured on this
    backend never will be), "precise" when no goal applies and the prefill and decode estimates' standard
    errors (sd of the pairs' log ratios / sqrt(pairs)) are within `shape.precision`. The intervals are the
    sequential looks', so stopping on them keeps the verdict's error rate; a stop on the spread alone
    leaves the estimate unbiased (under the lognormal model a sample's mean and spread are independent)."""
    goals = shape.goals_at(speed.context)
    if goals:
        for goal in goals:
            est = {"decode": speed.decode, "prefill": speed.prefill, "memory": speed.peak}[goal.key]
            if est is None or not (math.isfinite(est.lower) and math.isfinite(est.upper)):
                continue
            if SAMPLED_GOALS[goal.key] == "min":
                shown = est.lower >= goal.limit or est.upper < goal.limit
            else:
                shown = est.upper <= goal.limit or est.lower > goal.limit
            if not shown:
                return None
        return "decided"
    for est in (speed.prefill, speed.decode):
        if est.n < 2 or not math.isfinite(est.log_sd) or est.log_sd / math.sqrt(est.n) > shape.precision:
            return None
    return "precise"


def pair_order(rep: int) -> tuple[str, str]:
    """ABBA: which side runs first in pair `rep` (a trend over the run then falls on both alike)."""
    return ("reference", "candidate") if rep % 2 == 0 else ("candidate", "reference")


def _ids(pool: Sequence[int], n: int) -> Any:
    reps = -(-n // len(pool))
    return mx.array((list(pool) * reps)[:n], dtype=mx.int32)[None]


def _trial(
    side: ArmModel, lever: Lever, ids: Any, context: int, decode: int, probe: MemoryProbe, meter: ArmWatch | None = None
) -> Trial:
    """One timed trial; `meter.check()` (a clock read) between calls keeps the time limit, and the
    trial counts as done (a progress line, maybe) only after its timed spans."""
    model = side.model
    with lever.applied(side.arm):
        kv = lever.kv_plan(side.arm)
        cache = kv.make_cache(model)
        probe.reset()
        t0 = time.perf_counter()
        for start in range(0, context, SERVING_PREFILL_STEP):
            kv.forward(model, ids[:, start : min(start + SERVING_PREFILL_STEP, context)], cache)
            mx.eval([c.state for c in cache])
            if meter is not None:
                meter.check()
        t1 = time.perf_counter()
        for pos in range(context, context + decode):
            out = kv.forward(model, ids[:, pos : pos + 1], cache)
            mx.eval(out)
            if meter is not None:
                meter.check()
        t2 = time.perf_counter()
        peak = probe.peak()
        kv_bytes, held = cache_bytes(cache), cache_held_bytes(cache)
    del cache, out
    if meter is not None:
        meter.advance()
    return Trial(prefill_s=t1 - t0, decode_s=t2 - t1, peak_bytes=peak, kv_bytes=kv_bytes, kv_held_bytes=held)


def cache_bytes(cache: Sequence[Any]) -> int:
    """Bytes the arm's KV cache holds: every array of every layer's cache (quantized caches count
    their packed values, scales and biases; a KV-shared layer holds nothing of its own)."""
    total = 0
    for layer in cache:
        if getattr(layer, "keys", None) is None and not getattr(layer, "state", None):
            continue
        total += sum(int(a.nbytes) for a in _leaves(_arrays(layer)))
    return total


def cache_held_bytes(cache: Sequence[Any]) -> int:
    """Bytes of the positions the arm's KV cache holds a token in: what `cache_bytes` counts less the
    slack mlx_lm allocates ahead (a plain cache grows 256 positions at a time). A sliding window holds
    at most its window once it wraps, however long the context: this is where a wrapped window's
    saving shows, and where a window that kept everything would be seen."""
    total = 0
    for layer in cache:
        if getattr(layer, "keys", None) is None and not getattr(layer, "state", None):
            continue
        offset = getattr(layer, "offset", None)
        for a in _leaves(_arrays(layer)):
            size = int(a.nbytes)
            if isinstance(offset, int) and a.ndim == 4 and a.shape[2]:
                size = size // a.shape[2] * min(offset, a.shape[2])  # (batch, heads, positions, dim)
            total += size
    return total


def _leaves(tree: Any) -> Iterator[Any]:
    """The arrays in nested lists, tuples and dicts (cache state, parameters)."""
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    elif hasattr(tree, "nbytes"):
        yield tree


def _arrays(layer: Any) -> Any:
    """The arrays a cache holds, allocated size (mlx_lm grows caches in steps: the slack is memory too)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is not None and values is not None:
        return [keys, values]
    return layer.state


def weight_bytes(model: Any) -> int:
    """The model's parameter bytes (quantized weights count packed values, scales and biases)."""
    return sum(int(a.nbytes) for a in _leaves(model.parameters()))


class MemoryProbe:
    """Peak memory over one trial, above what was in use when it began."""

    method = "not measured"

    def reset(self) -> None:
        """Called just before a trial's first forward."""

    def peak(self) -> int | None:
        """Bytes above the reset's level at the highest point since; None: not measurable here."""
        return None


class _MlxAllocatorProbe(MemoryProbe):
    """MLX's own allocator counters: exact for MLX arrays on every backend that tracks them."""

    method = "mlx allocator peak (mx.get_peak_memory)"

    def reset(self) -> None:
        mx.synchronize()
        self._base = int(mx.get_active_memory())
        mx.reset_peak_memory()

    def peak(self) -> int:
        mx.synchronize()
        return max(0, int(mx.get_peak_memory()) - self._base)


class _LinuxRSSProbe(MemoryProbe):
    """Resident set size high-water mark (Linux: /proc, reset through clear_refs): a backend whose
    allocator reports nothing still shows what the process grew by."""

    method = "RSS high-water mark (/proc/self/status VmHWM)"

    def reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self._base = _proc_status_kib("VmRSS") * 1024

    def peak(self) -> int:
        return max(0, _proc_status_kib("VmHWM") * 1024 - self._base)


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


class _NoMemoryProbe(MemoryProbe):
    method = "not measured (no allocator counters, no /proc)"


def memory_probe() -> MemoryProbe:
    """The allocator's peak where MLX tracks it (Metal, CUDA and CPU in MLX >= 0.24), else RSS on
    Linux, else nothing (the record says so)."""
    if hasattr(mx, "get_peak_memory") and hasattr(mx, "reset_peak_memory") and mx.get_active_memory() > 0:
        return _MlxAllocatorProbe()
    if os.path.exists("/proc/self/clear_refs"):
        return _LinuxRSSProbe()
    return _NoMemoryProbe()
