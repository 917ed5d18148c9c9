"""`--mlx-shard I/N`: which gate modules this run keeps, the same answer in every process.

A whole module per shard: a gate module shares one PairedRun across its tests, so splitting one would
load and run its arms twice. Modules are balanced by their last recorded durations (greedy, longest
first) when the history has them; a module without one counts as the median. Ties go by sha256 of the
node id, never Python's `hash()` (salted per process), so every shard, worker and re-run agrees.
Standard library only: the xdist controller reads the history for its workers.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Shard", "ShardPlan", "module_durations", "module_of", "parse_shard", "plan_shards", "unbalanced"]

_UNIT = 1.0  # every module's weight when the history knows none


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`, both 1-based as written: `2/3`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(value: str) -> Shard:
    """`I/N` with 1 <= I <= N; ValueError whose message says what to write instead."""
    text = value.strip()
    head, sep, tail = text.partition("/")
    if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
        raise ValueError(
            f"'{value}' is not a shard: write I/N, this run's shard I of N (1-based), e.g. "
            "--mlx-shard 1/4 ... --mlx-shard 4/4"
        )
    index, count = int(head), int(tail)
    if count < 1:
        raise ValueError(f"'{value}': N must be at least 1 (N is how many shards there are), e.g. 1/2")
    if not 1 <= index <= count:
        raise ValueError(f"'{value}': I counts from 1 to N, so with N={count} write 1/{count} ... {count}/{count}")
    return Shard(index, count)


def module_of(nodeid: str) -> str:
    """`gates/test_kv.py::test_drift[x]` -> `gates/test_kv.py`: the unit a shard takes whole."""
    return nodeid.split("::", 1)[0]


def _tiebreak(module: str) -> str:
    return hashlib.sha256(module.encode("utf-8")).hexdigest()


def _greedy(weights: Mapping[str, float], count: int) -> dict[str, int]:
    """Longest first, each onto the least-loaded shard (the lowest-numbered of equals)."""
    loads = [0.0] * count
    out: dict[str, int] = {}
    for module in sorted(weights, key=lambda m: (-weights[m], _tiebreak(m))):
        shard = min(range(count), key=lambda s: (loads[s], s))
        out[module] = shard
        loads[shard] += weights[module]
    return out


def unbalanced(modules: Iterable[str], count: int) -> dict[str, int]:
    """The split without a history: modules in sha256 order dealt round-robin (0-based shards)."""
    return _greedy({m: _UNIT for m in set(modules)}, count)


def _makespan(plan: Mapping[str, int], weights: Mapping[str, float], count: int) -> float:
    loads = [0.0] * count
    for module, shard in plan.items():
        loads[shard] += weights[module]
    return max(loads, default=0.0)


@dataclass(frozen=True)
class ShardPlan:
    """Every module's shard (0-based), and how the plan was made."""

    assignment: dict[str, int]
    count: int
    timed: int  # modules whose duration the history had
    balanced: bool  # weighed by recorded durations (False: no history, the round-robin split)

    def modules(self, shard: Shard) -> list[str]:
        return sorted(m for m, s in self.assignment.items() if s == shard.index - 1)

    @property
    def digest(self) -> str:
        """The same plan gives the same digest wherever it was made: shards planned from different
        histories (another results DB) would not partition the modules, and this shows it."""
        text = json.dumps(sorted(self.assignment.items()), separators=(",", ":"))
        return hashlib.sha256(f"{self.count}:{text}".encode()).hexdigest()[:16]

    def describe(self, shard: Shard) -> str:
        how = (
            f"balanced by recorded durations ({self.timed} of {len(self.assignment)} modules timed)"
            if self.balanced
            else "no recorded durations: split by node id"
        )
        return f"shard {shard}: {len(self.modules(shard))} of {len(self.assignment)} modules, {how}"

    def to_json(self, shard: Shard) -> dict[str, Any]:
        return {
            "index": shard.index,
            "count": shard.count,
            "plan": self.digest,
            "modules": self.modules(shard),
            "total_modules": len(self.assignment),
            "timed": self.timed,
            "balanced": self.balanced,
        }


def plan_shards(modules: Iterable[str], durations: Mapping[str, float], count: int) -> ShardPlan:
    """Each module in exactly one of `count` shards, balanced by `durations` (seconds per module).

    Modules without a duration weigh the median of those with one. Greedy longest-first is within 4/3
    of the best split, not always better than the plain round-robin one; the plan is whichever of the
    two has the smaller largest shard by those weights (greedy on ties), so balancing never makes the
    slowest shard slower than not balancing.
    """
    names = set(modules)
    known = {m: float(durations[m]) for m in names if m in durations and float(durations[m]) >= 0}
    plain = unbalanced(names, count)
    if not known:
        return ShardPlan(plain, count, 0, False)
    fill = statistics.median(known.values())
    weights = {m: known.get(m, fill) for m in names}
    greedy = _greedy(weights, count)
    best = plain if _makespan(plain, weights, count) < _makespan(greedy, weights, count) else greedy
    return ShardPlan(best, count, len(known), True)


def module_durations(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each module's seconds in the last run that recorded it, from history rows (`run_id`, `started`,
    `nodeid`, `total_s`, `config_json`).

    Rows of sharded runs do not count: shards run one after another against one history must all see
    the same durations, or their plans would differ (a merged run's rows do count). A module's records
    share one measurement where their totals are equal, so equal totals count once.
    """
    latest: dict[str, tuple[str, str]] = {}  # module -> (started, run_id) of its latest unsharded run
    totals: dict[tuple[str, str], set[float]] = {}  # (module, run_id) -> its records' totals
    for row in rows:
        if _sharded(row.get("config_json")):
            continue
        total = row.get("total_s")
        if not isinstance(total, (int, float)) or isinstance(total, bool) or total != total or total < 0:
            continue
        nodeid = str(row.get("nodeid") or "")
        if not nodeid or nodeid.startswith("mlxgate::"):
            continue  # the run's Capability Score: not a module of gates
        module, run = module_of(nodeid), str(row.get("run_id") or "")
        key = (str(row.get("started") or ""), run)
        if module not in latest or key > latest[module]:
            latest[module] = key
        totals.setdefault((module, run), set()).add(float(total))
    return {m: sum(totals[(m, run)]) for m, (_, run) in latest.items()}


def _sharded(config_json: Any) -> bool:
    try:
        doc = json.loads(config_json) if isinstance(config_json, str) else {}
    except ValueError:
        return False
    config = doc.get("config") if isinstance(doc, dict) else None
    return isinstance(config, dict) and isinstance(config.get("shard"), dict)
