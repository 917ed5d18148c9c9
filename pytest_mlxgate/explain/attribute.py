"""Drift attribution: which layers a lever's drift comes from, measured, with intervals, within a budget.

Two measurements, both against the gate's own reference distributions:

- *scopes*: the candidate applied to one scope of layers, the reference elsewhere (`scoped`); each
  scope's teacher-forced KL over the same sequences, with its 95% interval over them. Blocks of
  layers first, then the layers of the worst block (`plan_scopes`), where the output error jumps first
  first, until one alone drifts as much as its block (`CARRIES_BLOCK`), and for a model with two attention
  types each type alone, with KL by position (a sliding-window bug past the window shows there).
- *where error enters*: the lever everywhere, the relative error of each layer's output against the
  reference arm's (same inputs): compounding shows as growth, one bad layer as a step.

Cost is counted in sequence-arms (one sequence through one arm); the gate itself costs 2 x its
prompts, and the budget (`--mlx-explain-budget`, default 3) multiplies that.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from ..common.keys import canonical_json, key_digest
from ..kl.arms import run_candidate, run_reference, sequence_logits, serving_logits
from ..kl.prompts import texts_of
from ..kl.shape import ArmCounters, RunShape
from ..models.identity import model_identity
from ..stats.intervals import mean_interval
from ..stats.kl_profile import kl_profile
from ..stats.kl_stats import summarize
from .layers import attention_types, decoder_layers, output_of, wrapped_layers
from .scoped import Scope, kv_scoped_plan, scoped

if TYPE_CHECKING:
    from ..kl.prompts import TokenSequence
    from ..kl.refcache import ReferenceCache
    from ..levers.lever import Arm, Lever
    from ..models.loaded import LoadedModel
    from ..stats.divergence import RefDistributions, TokenScores

__all__ = ["ATTRIBUTION_VERSION", "DEFAULT_BUDGET", "Attribution", "attribute", "plan_scopes"]

#: Bump when a reader would misread the record's `attribution`.
ATTRIBUTION_VERSION = 1
#: The default budget: attribution costs at most this many times the gate's own two arms.
DEFAULT_BUDGET = 3.0
#: Sequences per scope: enough for an interval; fewer when the budget is tight, never under the minimum.
SCOPE_SEQUENCES, MIN_SCOPE_SEQUENCES = 6, 3
#: Every layer alone is worth a few fewer sequences per scope, down to this many (else: blocks, then a drill).
PER_LAYER_SEQUENCES = 4
#: A layer alone whose mean KL is at least this share of its block's carries the block's drift: the drill
#: stops there and names it (the block's other layers are not needed to explain what the block shows).
CARRIES_BLOCK = 0.8
#: Sequences the residual-error curve runs (both arms, every layer's output kept for them).
RESIDUAL_SEQUENCES = 2


@dataclass(frozen=True)
class Attribution:
    """What attribution found, as the record's `attribution` carries it (`to_json`)."""

    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data


def plan_scopes(
    layers: Sequence[int], types: Sequence[str | None], *, capacity: int, rest: bool = False
) -> tuple[list[Scope], bool]:
    """The first round of scopes for `capacity` scope runs in all, and whether a second round drills
    into the worst block: each attention type alone (when there are two), what lies outside the layers
    (`rest`), then every layer when they fit, else K blocks and the worst block's layers, with K the
    count that needs the fewest runs (about sqrt(n))."""
    scopes: list[Scope] = []
    kinds = sorted({t for t in (types[i] for i in layers) if t})
    if len(kinds) > 1:
        for kind in kinds:
            short = kind.removesuffix("_attention")
            scopes.append(Scope(f"{short} layers", tuple(i for i in layers if types[i] == kind), "type"))
    if rest:
        scopes.append(Scope("outside the layers", (), "rest"))
    left, n = capacity - len(scopes), len(layers)
    if n <= max(left, 2):  # two layers are their own smallest blocks
        return scopes + [Scope(f"layer {i}", (i,), "layer") for i in layers], False
    blocks = min(range(2, n), key=lambda k: (k + math.ceil(n / k), -k))
    for part in np.array_split(np.asarray(layers), blocks):
        scopes.append(Scope(_block_name(part.tolist()), tuple(int(i) for i in part), "block"))
    return scopes, True


def _block_name(layers: Sequence[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"


def attribute(
    *,
    lever: Lever,
    shape: RunShape,
    sequences: Sequence[TokenSequence],
    whole: Sequence[TokenScores],
    reference: LoadedModel,
    candidate: LoadedModel,
    budget: float = DEFAULT_BUDGET,
    refs: Sequence[RefDistributions] | None = None,
    cache: ReferenceCache | None = None,
    cache_key: Mapping[str, Any] | None = None,
    say: Callable[[str], None] = lambda _: None,
    gate_seconds: float | None = None,
) -> Attribution:
    """Attribute a lever's drift to layers. `whole`: the gate's own scores (the lever everywhere);
    `refs`: the gate's reference distributions when at hand (else computed on the sequences used);
    `gate_seconds`: what the gate's two arms took (the budget is then in time, else in sequence-arms)."""
    key = _key(cache_key, lever, candidate, budget) if cache_key is not None else None
    if cache is not None and key is not None:
        hit = _load(cache, key)
        if hit is not None:
            say("attribution: from the reference cache")
            return Attribution({**hit, "source": "cache"})
    clock = _Clock(budget, len(sequences), gate_seconds)
    n = len(sequences)
    n_res, n_s = min(RESIDUAL_SEQUENCES, n), min(SCOPE_SEQUENCES, n)
    layers, notes = _scopable_layers(lever, reference.model)
    types = attention_types(reference.model)
    rest = lever.kind != "kv"
    kinds = len({t for t in types if t})
    extra = (kinds if kinds > 1 else 0) + int(rest)
    fixed = 2 * n_res * clock.overhead

    def capacity_at(k: int) -> int:
        return int((clock.units - fixed - (0 if refs is not None else k * clock.overhead)) // (k * clock.overhead))

    # every layer alone with a few fewer sequences rather than blocks, down to PER_LAYER_SEQUENCES
    while capacity_at(n_s) < len(layers) + extra and n_s > min(PER_LAYER_SEQUENCES, n):
        n_s -= 1
    if capacity_at(n_s) < len(layers) + extra:
        n_s = min(SCOPE_SEQUENCES, n)
    while capacity_at(n_s) < extra + 2 and n_s > MIN_SCOPE_SEQUENCES:
        n_s -= 1
    seqs = list(sequences[:n_s])
    if refs is None:
        say(f"attribution: reference arm on {n_s} sequences")
        refs = run_reference(reference.model, seqs, shape, lever, counters=ArmCounters())
        clock.count(n_s)
    say(f"attribution: each layer's output error, {n_res} sequences, both arms")
    residual = residual_error(lever, shape, list(sequences[:n_res]), reference, candidate)
    clock.count(2 * n_res)
    rows: list[dict[str, Any]] = []
    first, drill = plan_scopes(layers, types, capacity=capacity_at(n_s), rest=rest)
    with tempfile.TemporaryDirectory(prefix="mlxgate-explain-") as tmp:
        run = _ScopeRunner(lever, shape, seqs, list(refs[:n_s]), reference, candidate, Path(tmp), say)
        round_started = clock.spent()
        for scope in first:
            rows.append(run(scope, level=1))
            clock.count(n_s)
        per_scope = (clock.spent() - round_started) / max(1, len(first))
        if drill:
            blocks = [r for r in rows if r["kind"] == "block"]
            worst = max(blocks, key=lambda r: r["mean"] or 0.0)
            worst["ranked"] = False  # its layers stand for it
            # where the output error jumps first: the layers most likely to carry the block's drift
            jumps = _jumps(residual)
            order = sorted(worst["layers"], key=lambda i: -jumps.get(i, 0.0))
            inner = [Scope(f"layer {i}", (i,), "layer") for i in order]
            affordable = max(0, int((clock.units - clock.spent()) // max(per_scope, 1e-9)))
            carried = None
            for scope in inner[:affordable]:
                rows.append(run(scope, level=2))
                clock.count(n_s)
                if (rows[-1]["mean"] or 0.0) >= CARRIES_BLOCK * (worst["mean"] or 0.0) > 0:
                    carried = rows[-1]  # one layer alone drifts as much as its block: it is the block's drift
                    break
            if carried is not None and len(rows) - len(first) < len(inner):
                notes.append(
                    f"{carried['name']} alone drifts {carried['mean']:.3g}, {carried['mean'] / worst['mean']:.0%} of "
                    f"{worst['name']}'s {worst['mean']:.3g}: it carries that block's drift (its other layers, not "
                    "measured alone, are not needed to explain it)"
                )
            elif affordable < len(inner):
                worst["ranked"] = True  # layers of it went unmeasured: the block still stands for them
                notes.append(
                    f"the budget measured {affordable} of the {len(inner)} layers of {worst['name']} "
                    "(--mlx-explain-budget raises it)"
                )
        whole_stats = summarize(list(whole[:n_s]), texts=texts_of(seqs))
        if whole_stats.mean > 0:  # a lever that changed nothing has nothing to attribute
            notes.extend(run.notes(rows))
    spent = clock.arms
    data = {
        "version": ATTRIBUTION_VERSION,
        "budget": budget,
        "sequences": n_s,
        "whole": {"mean": whole_stats.mean, "mean_ci": _pair(whole_stats.mean_ci), "n": n_s},
        "scopes": rows,
        "residual": residual,
        "notes": notes,
        "cost": {
            "sequence_arms": spent,
            "gate_sequence_arms": 2 * n,
            "seconds": round(clock.seconds(), 2),
            "gate_seconds": round(gate_seconds, 2) if gate_seconds else None,
        },
        "source": "computed",
    }
    if cache is not None and key is not None:
        _store(cache, key, data)
    return Attribution(data)


def _jumps(residual: Mapping[str, Any]) -> dict[int, float]:
    """{layer: its output error over the layer before's} (the first layer: over nothing, so its own)."""
    out: dict[int, float] = {}
    before = 0.0
    for e in residual["layers"]:
        err = float(e["rel_error"])
        out[int(e["layer"])] = err / before if before > 0 else (math.inf if err > 0 else 0.0)
        before = err
    return out


def _scopable_layers(lever: Lever, model: Any) -> tuple[list[int], list[str]]:
    """The layers a scope may hold: for a KV lever the cached layers whose spec the lever changes."""
    n = len(decoder_layers(model))
    if lever.kind != "kv":
        return list(range(n)), []
    every = kv_scoped_plan(lever, model, range(n))["layers"]
    none = kv_scoped_plan(lever, model, ())["layers"]
    changed = [int(i) for i in every if every[i] != none[i]]
    skipped = n - len(changed)
    notes = [f"{skipped} layers keep the same KV cache in both arms (or keep none): not scoped"] if skipped else []
    return changed, notes


class _Clock:
    """The budget and what has been spent, in sequence-arms: counted, or (when the gate's own time is
    known) measured, each second worth what one of the gate's sequence-arms took."""

    #: A scope runs fewer sequences at once than the gate: planned at this many times their share.
    SMALL_BATCH_OVERHEAD = 1.5

    def __init__(self, budget: float, n: int, gate_seconds: float | None) -> None:
        self.units = budget * 2 * n
        self.per_arm = gate_seconds / (2 * n) if gate_seconds and n else None
        self.overhead = self.SMALL_BATCH_OVERHEAD if self.per_arm else 1.0
        self.arms = 0
        self.started = time.perf_counter()

    def count(self, arms: int) -> None:
        self.arms += arms

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def spent(self) -> float:
        return self.seconds() / self.per_arm if self.per_arm else float(self.arms)


class _ScopeRunner:
    """Runs one scope's arm against the reference and summarizes it as a row."""

    def __init__(
        self,
        lever: Lever,
        shape: RunShape,
        seqs: list[TokenSequence],
        refs: list[RefDistributions],
        reference: LoadedModel,
        candidate: LoadedModel,
        workdir: Path,
        say: Callable[[str], None],
    ) -> None:
        self.lever, self.shape, self.seqs, self.refs = lever, shape, seqs, refs
        self.reference, self.candidate, self.workdir, self.say = reference, candidate, workdir, say
        self.calls: dict[str, int] = {}

    def __call__(self, scope: Scope, *, level: int) -> dict[str, Any]:
        self.say(f"attribution: {self.lever.name} on {scope.name} only, {len(self.seqs)} sequences")
        arm = scoped(
            self.lever, scope, reference=self.reference.model, candidate=self.candidate.model, workdir=self.workdir
        )
        scores = run_candidate(arm.model, self.seqs, self.shape, arm.lever, self.refs, counters=ArmCounters())
        self.calls[scope.name] = arm.calls[0]
        stats = summarize(scores, texts=texts_of(self.seqs))
        row: dict[str, Any] = {
            **scope.to_json(),
            "level": level,
            "ranked": True,
            "n": stats.n_prompts,
            "mean": stats.mean,
            "mean_ci": _pair(stats.mean_ci),
            "p99": stats.p99,
            "top1": stats.top1,
        }
        if scope.kind == "type":
            row["by_position"] = kl_profile(scores)["by_position"]
        return row

    def notes(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        """What the scopes cannot show: a patched site never called inside the layers."""
        if self.lever.kind == "patch" and self.calls and not any(self.calls.values()):
            return [
                f"{self.lever.target} is never called inside the decoder layers' forwards: this lever acts "
                "outside them (embedding, final norm, output head) and cannot be scoped by layer"
            ]
        if self.lever.kind in ("env", "context") and rows and all((r["mean"] or 0.0) == 0.0 for r in rows):
            return [
                "no scope shows any drift: the setting is read outside the layers' forwards (at load time, or "
                "by code around them), so this lever cannot be scoped by layer"
            ]
        return []


def residual_error(
    lever: Lever, shape: RunShape, seqs: list[TokenSequence], reference: LoadedModel, candidate: LoadedModel
) -> dict[str, Any]:
    """With the lever everywhere: each layer's output vs the reference arm's, ||h_c - h_r|| / ||h_r||
    per sequence, its mean over the sequences and a 95% interval."""
    ref = _layer_outputs(lever, "reference", shape, seqs, reference.model)
    cand = _layer_outputs(lever, "candidate", shape, seqs, candidate.model)
    types = attention_types(reference.model)
    out = []
    for i in range(len(ref)):
        r, c = ref[i], cand[i]
        per_seq = np.sqrt(((c - r) ** 2).sum(axis=(1, 2))) / np.maximum(np.sqrt((r**2).sum(axis=(1, 2))), 1e-30)
        lo, hi = mean_interval(per_seq)
        out.append({"layer": i, "type": types[i], "rel_error": float(per_seq.mean()), "ci": _pair((lo, hi))})
    return {"sequences": len(seqs), "layers": out}


def _layer_outputs(lever: Lever, arm: Arm, shape: RunShape, seqs: list[TokenSequence], model: Any) -> list[np.ndarray]:
    """Every layer's output over the sequences (sequences x positions x hidden, float32) on `arm`."""
    n_layers = len(decoder_layers(model))
    kept: list[list[Any]] = [[] for _ in range(n_layers)]

    def keep(i: int, forward: Callable[[], Any]) -> Any:
        result = forward()
        kept[i].append(output_of(result))
        return result

    rows: list[list[np.ndarray]] = [[] for _ in range(n_layers)]
    kv = lever.kv_plan(arm)
    # before the layers are wrapped: the plan's check reads the head dimensions from a one-token forward
    # (once per model), whose outputs are no sequence's
    kv.check_against(model)
    with lever.applied(arm), wrapped_layers(model, keep, range(n_layers)):
        batches = [seqs] if shape.path == "serving" and shape.batched else [[s] for s in seqs]
        for batch in batches:
            if shape.path == "serving":
                serving_logits(model, [s.ids for s in batch], shape, kv)
            else:
                sequence_logits(model, batch[0].ids, shape, kv)
            for i in range(n_layers):
                rows[i].append(np.concatenate([_np(x) for x in kept[i]], axis=1))
                kept[i].clear()
    return [np.concatenate(r, axis=0) for r in rows]


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.astype(mx.float32))


def _pair(ci: tuple[float, float]) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in ci]


def _key(base: Mapping[str, Any], lever: Lever, candidate: LoadedModel, budget: float) -> dict[str, Any]:
    return {
        **base,
        "attribution": ATTRIBUTION_VERSION,
        "candidate_lever": lever.key("candidate"),
        "candidate_model": model_identity(candidate),
        "budget": budget,
    }


def _path(cache: ReferenceCache, key: Mapping[str, Any]) -> Path:
    return cache.directory / "attribution" / f"{key_digest(key)}.json"


def _load(cache: ReferenceCache, key: Mapping[str, Any]) -> dict[str, Any] | None:
    def decode(payload: bytes) -> dict[str, Any] | None:
        entry = json.loads(payload)
        return entry["data"] if entry.get("key") == json.loads(canonical_json(key)) else None

    return cache.files.load(_path(cache, key), decode)


def _store(cache: ReferenceCache, key: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    payload = json.dumps({"key": json.loads(canonical_json(key)), "data": data}, allow_nan=False).encode()
    try:
        cache.files.write(_path(cache, key), payload)
    except OSError:
        pass  # a by-product: the next run measures it again
