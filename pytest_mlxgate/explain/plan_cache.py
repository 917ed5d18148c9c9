"""A plan search's measurements, kept beside the reference so the next search on the same model and gate
starts where this one stopped: the selection's reference arm (an entry of the reference cache, keyed as a
gate's reference is) and every plan measured on it (one JSON entry, keyed by that reference's key and the
code that measures a plan). Another `--frontier`, other `--points`, a search after `--no-verify` or after a
verification that failed: the uniform plans, the layers alone and any round already measured are read,
not run again.

A plan's statistics do not depend on the gate's limits (the verdicts are drawn from them afresh), so the
same entry serves every limit. The key holds the source of what serves a plan (the quantized caches, the
plan's parsing, the batched rows): an edit there is a miss, never a stale figure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..common.keys import canonical_json, key_digest
from ..common.refstore import store_or_warn
from ..kl.measure import reference_key
from ..kl.prompts import sequences_digest
from ..kl.refcache import ReferenceCache
from ..levers.lever import Lever
from ..levers.naming import source_digest
from ..serving import attention, caches, kv_plan
from ..stats.kl_stats import KLStats
from . import plan_rows
from .plan_rows import SelectionRuns

if TYPE_CHECKING:
    from ..kl.shape import RunShape
    from ..models.loaded import LoadedModel
    from ..stats.divergence import RefDistributions

__all__ = ["MEASURED_FORMAT", "MeasuredPlans", "Measurements", "SearchCache"]

#: The measured plans' entry format: a change in what an entry holds or means is a new number.
MEASURED_FORMAT = 1


@dataclass(frozen=True)
class SearchCache:
    """Where a search keeps what it measured: the reference cache `cache`, for `loaded` on `machine`."""

    cache: ReferenceCache
    loaded: LoadedModel
    machine: Mapping[str, str]

    def reference_arm(
        self, lever: Lever, shape: RunShape, sequences: Sequence[Any], compute: Callable[[], list[RefDistributions]]
    ) -> tuple[list[RefDistributions], dict[str, Any], bool]:
        """(the reference arm on `sequences`, its key, whether it was read): read where an earlier search (or a
        gate: the same key) stored it, else `compute()`d and stored."""
        digest = sequences_digest(sequences)
        key = reference_key(model=self.loaded, lever=lever, shape=shape, sequences_digest=digest, machine=self.machine)
        refs = self.cache.load(key, len(sequences))
        if refs is not None:
            return refs, key, True
        refs = compute()
        store_or_warn(self.cache, key, refs)
        return refs, key, False

    def measured(self, reference: Mapping[str, Any], code: Sequence[ModuleType] = ()) -> MeasuredPlans:
        """The plans measured on the sequences whose reference arms are keyed `reference`; `code`: the modules
        besides the KV serving code whose source decides a plan's numbers (a weights plan's quantization)."""
        key = {
            "measured": MEASURED_FORMAT,
            "reference": key_digest(reference),
            "code": {m.__name__: source_digest(m) for m in (attention, caches, kv_plan, plan_rows, *code)},
        }
        path = self.cache.directory / "plans" / f"{key_digest(key)}.json"

        def decode(payload: bytes) -> dict[str, Any] | None:
            entry = json.loads(payload)
            return entry["plans"] if entry.get("key") == json.loads(canonical_json(key)) else None

        return MeasuredPlans(self, key, path, dict(self.cache.files.load(path, decode) or {}))


@dataclass
class MeasuredPlans:
    """Plans' statistics on one selection by the plan's canonical text, `real` (its quantized caches) and
    `fake` (its fake-quant, side by side: `plan_rows`) apart; `put` writes the entry again."""

    owner: SearchCache | None
    key: Mapping[str, Any]
    path: Path | None
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, kind: str, plan: Mapping[Any, Any]) -> KLStats | None:
        hit = self.plans.get(_name(kind, plan))
        return KLStats.from_json(hit) if hit is not None else None

    def put(self, kind: str, results: Sequence[tuple[Mapping[Any, Any], KLStats]]) -> None:
        for plan, stats in results:
            self.plans[_name(kind, plan)] = stats.to_json()
        if self.owner is None or self.path is None:
            return
        payload = json.dumps({"key": json.loads(canonical_json(self.key)), "plans": self.plans}, allow_nan=False)
        try:
            self.owner.cache.files.write(self.path, payload.encode())
        except OSError:
            pass  # storing is a by-product (as the attribution's): the next search measures it again


class Measurements:
    """A search's two measurements on its selection, each read from `measured` where it was measured before
    (by this search or an earlier one) and kept there: `real`, a plan on its quantized caches; `many`, plans
    side by side (their fake-quant, `plan_rows`). `folder`: where a plan's kv_config.json is written."""

    def __init__(self, runs: SelectionRuns, measured: MeasuredPlans, folder: Path, say: Callable[[str], None]):
        self.runs, self.measured, self.folder, self.say = runs, measured, folder, say

    def real(self, layers: Mapping[int, Any], what: str) -> KLStats:
        hit = self.measured.get("real", layers)
        self.say(f"plan kv: {what}{' (measured before: read, not run)' if hit is not None else ''}")
        if hit is not None:
            return hit
        path = self.folder / "plan.json"
        path.write_text(json.dumps({"default": None, "layers": {str(i): o.spec() for i, o in layers.items()}}))
        stats = self.runs.measure(Lever("plan", "kv", None, None, str(path), path="serving"))
        self.measured.put("real", [(layers, stats)])
        return stats

    def many(self, plans: Sequence[Mapping[int, Any]], what: str) -> list[KLStats]:
        hits = [self.measured.get("fake", p) for p in plans]
        missing = [p for p, h in zip(plans, hits, strict=True) if h is None]
        read = f", {len(plans) - len(missing)} measured before: read, not run" if len(missing) < len(plans) else ""
        self.say(f"plan kv: {what} (fake-quant, {len(missing)} plans batched{read})")
        fresh = iter(self.runs.measure_many(missing) if missing else [])
        stats = [h if h is not None else next(fresh) for h in hits]
        self.measured.put("fake", [(p, s) for p, s, h in zip(plans, stats, hits, strict=True) if h is None])
        return stats


def _name(kind: str, plan: Mapping[Any, Any]) -> str:
    """`real 0=8-bit g64;1=plain`: a plan's entry name, its layers in order (a weights plan's hundreds of module
    paths: their sha256, so the entry holds each plan's statistics, not its text)."""
    layers = sorted(plan.items(), key=lambda kv: str(kv[0]))
    text = ";".join(f"{k}={getattr(o, 'label', o)}" for k, o in layers)
    return f"{kind} " + (text if len(text) <= 200 else "sha256:" + hashlib.sha256(text.encode()).hexdigest())
