"""What readers need besides a record: a results-DB row, the run facts from a run's config (interrupted,
shard, merge), a queued run, a JSON report's contents. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import integer, mapping, real, sequence, text
from .model import Record, parse_record
from .records import RunInfo
from .wire import json_object

__all__ = [
    "Interrupted",
    "RunFacts",
    "Shard",
    "StoredRow",
    "calibration_module",
    "interrupted_of",
    "parse_row",
    "pending_entry",
    "report_contents",
    "row_run",
    "run_facts",
    "run_info_of",
    "stored_record",
]


@dataclass(frozen=True)
class StoredRow:
    """One results-DB row as history readers use it: when, which run and commit, and the record."""

    run_id: str | None = None
    time: str | None = None
    verdict: str | None = None
    code_commit: str | None = None
    code_dirty: bool | None = None
    mean_kl: float | None = None
    decode_ratio: float | None = None
    record: Record | None = None  # None where its record_json cannot be read


def parse_row(row: Mapping[str, Any]) -> StoredRow:
    """A results-DB row (`ResultsDB.rows`; any subset of its columns): its columns, and its record parsed."""
    record = stored_record(row)
    dirty = row.get("code_dirty")
    return StoredRow(
        run_id=text(row.get("run_id")),
        time=text(row.get("time")),
        verdict=text(row.get("verdict")),
        code_commit=text(row.get("code_commit")),
        code_dirty=None if dirty is None else bool(dirty),
        mean_kl=real(row.get("mean_kl")),
        decode_ratio=real(row.get("decode_ratio")),
        record=record,
    )


def stored_record(row: Mapping[str, Any]) -> Record | None:
    """The record a DB row stores whole (record_json); None where it cannot be read."""
    stored = json_object(row.get("record_json"))
    return parse_record(stored) if stored is not None else None


@dataclass(frozen=True)
class Interrupted:
    """A run stopped before its end: why, and the modules that never ran."""

    reason: str | None = None
    not_run: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shard:
    """--mlx-shard I/N: which piece of how many, of which plan, and the modules it was to run."""

    index: int | None = None
    count: int | None = None
    plan: str | None = None
    modules: tuple[str, ...] | None = None  # None: the shard lists no plan of modules
    total_modules: int | None = None  # the modules of the whole plan, every shard's together

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class RunFacts:
    """What readers need of a run beside its records: its identity, machine and config facts."""

    run_id: str | None = None
    started: str | None = None
    code_commit: str | None = None
    code_dirty: bool | None = None
    machine: Mapping[str, str] = field(default_factory=dict)
    interrupted: Interrupted | None = None
    shard: Shard | None = None
    without_records: frozenset[str] = frozenset()  # planned modules that ran without a record (all skipped)
    merged_from: int | None = None  # a merged run: how many reports
    inconclusive_policy: str = "fail"


def interrupted_of(value: Any) -> Interrupted | None:
    """A run config's `interrupted` (None when the run was not)."""
    i = mapping(value)
    if not i:
        return None
    return Interrupted(reason=text(i.get("reason")) or None, not_run=tuple(str(m) for m in sequence(i.get("not_run"))))


def run_facts(run: RunInfo | Mapping[str, Any] | None) -> RunFacts:
    """A run's facts, from its `RunInfo` (or its dict, `RunInfo.to_dict`); empty for None."""
    if run is None:
        return RunFacts()
    d = run if isinstance(run, Mapping) else run.to_dict()
    config = mapping(d.get("config"))
    shard = mapping(config.get("shard"))
    modules = shard.get("modules")
    dirty = d.get("code_dirty")
    merged = config.get("merged")
    return RunFacts(
        run_id=text(d.get("run_id")),
        started=text(d.get("started")),
        code_commit=text(d.get("code_commit")),
        code_dirty=None if dirty is None else bool(dirty),
        machine={str(k): str(v) for k, v in mapping(d.get("machine")).items() if v is not None},
        interrupted=interrupted_of(config.get("interrupted")),
        shard=Shard(
            index=integer(shard.get("index")),
            count=integer(shard.get("count")),
            plan=text(shard.get("plan")),
            modules=tuple(str(m) for m in modules) if isinstance(modules, list) else None,
            total_modules=integer(shard.get("total_modules")),
        )
        if shard
        else None,
        without_records=frozenset(str(m) for m in mapping(config.get("without_records"))),
        merged_from=len(merged) if isinstance(merged, list) else None,
        inconclusive_policy=str(mapping(config.get("gate")).get("inconclusive") or "fail"),
    )


def run_info_of(run: Mapping[str, Any]) -> RunInfo:
    """A `RunInfo` from its dict (a JSON report's `run`, a queued run, a DB row's columns and config_json);
    KeyError when it lacks `run_id` or `started`."""
    dirty = run.get("code_dirty")
    commit = run.get("code_commit")
    return RunInfo(
        run_id=str(run["run_id"]),
        started=str(run["started"]),
        code_commit=None if commit is None else str(commit),
        code_dirty=None if dirty is None else bool(dirty),
        argv=[str(a) for a in sequence(run.get("argv"))],
        config=dict(mapping(run.get("config"))),
        machine={str(k): v for k, v in mapping(run.get("machine")).items()},
    )


def row_run(row: Mapping[str, Any]) -> RunInfo:
    """The run a stored row belongs to, whole: its columns and its config_json (config, machine, argv)."""
    try:
        extra = json.loads(row.get("config_json") or "{}")
    except (TypeError, ValueError):
        extra = {}
    return run_info_of(
        {
            **mapping(extra),
            "run_id": row["run_id"],
            "started": row["started"],
            "code_commit": row.get("code_commit"),
            "code_dirty": row.get("code_dirty"),
        }
    )


def pending_entry(raw: bytes) -> tuple[RunInfo, list[Record]] | None:
    """One line of `<db>.pending.jsonl` (a run a locked DB could not take): its run and records; None
    where the line cannot be read (it stays in the file)."""
    try:
        doc = json.loads(raw)
        info = run_info_of(mapping(doc.get("run")))
        records = [parse_record(r) for r in sequence(doc.get("records")) if isinstance(r, dict)]
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    return info, records


def report_contents(doc: Mapping[str, Any]) -> tuple[RunInfo, list[Record], list[dict[str, Any]]]:
    """A JSON report's run, records and calibrations; KeyError when its run is cut short."""
    run = run_info_of(mapping(doc.get("run")))
    gates = [parse_record(g) for g in sequence(doc.get("gates")) if isinstance(g, dict)]
    calibrations = [c for c in sequence(doc.get("calibrations")) if isinstance(c, dict)]
    return run, gates, calibrations


def calibration_module(calibration: Mapping[str, Any]) -> str:
    """The module a --mlx-calibrate measurement is of (the JSON report sorts them by it)."""
    return str(calibration.get("module"))
