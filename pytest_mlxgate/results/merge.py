"""Joining the JSON reports of shards (`--mlx-shard I/N`) into one run: `mlxgate merge`.

One commit for all of them, or no merge: a report that mixes code is no verdict on either. A gate
found in two reports keeps its worst verdict (error > fail > inconclusive > pass). Shards that say which
of how many they were must all be there, planned alike. Nothing a shard was to run may vanish: a module
its plan lists with no record (unless the shard says it ran without one: all skipped), an interrupted
shard, a verdict mlxgate does not know are the merge's `problems`, and a missing module becomes an error
record of the merged run. Standard library only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import Record
from .record_checks import CheckResult
from .records import RunInfo, error_record
from .runs import RunFacts, Shard, report_contents, run_facts
from .score import SCORE_NODEID
from .tasks import TASK_NAMES
from .verdicts import RECORD_VERDICTS, bounds_verdict, verdict_rank
from .wire import LIMIT_SOURCES

__all__ = [
    "MergeError",
    "Merged",
    "Report",
    "merge_reports",
    "pass_contradicted",
    "read_report",
    "verdict_rank",
    "worst",
]


class MergeError(Exception):
    """The reports cannot be merged as they are; the message says which and why."""


@dataclass(frozen=True)
class Report:
    """One JSON report as read: where from, its run, its records and calibrations."""

    path: str
    run: RunInfo
    gates: list[Record]
    calibrations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def facts(self) -> RunFacts:
        return run_facts(self.run)

    @property
    def shard(self) -> Shard | None:
        return self.facts.shard


def read_report(path: Path) -> Report:
    """A JSON report (`--mlx-report`) of this version; MergeError saying why not."""
    from .json_report import REPORT_VERSION

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise MergeError(f"cannot read the report {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise MergeError(f"{path} is not JSON ({e}): pass the files --mlx-report wrote") from None
    if not isinstance(doc, dict) or "mlxgate_report" not in doc:
        raise MergeError(
            f"{path} is not an mlxgate JSON report (no 'mlxgate_report' key): pass the files --mlx-report wrote"
        )
    if doc["mlxgate_report"] != REPORT_VERSION:
        raise MergeError(
            f"{path} is an mlxgate report of version {doc['mlxgate_report']}, this mlxgate reads "
            f"version {REPORT_VERSION}: run the same pytest-mlxgate that wrote it"
        )
    try:
        info, gates, calibrations = report_contents(doc)
    except KeyError as e:
        raise MergeError(f"{path}: its run lacks {e}; is it cut short?") from None
    return Report(str(path), info, gates, calibrations)


def worst(records: Sequence[Record]) -> Record:
    """The record with the worst verdict; the first of equals."""
    best, best_rank = records[0], verdict_rank(records[0].verdict)
    for record in records[1:]:
        rank = verdict_rank(record.verdict)
        if rank > best_rank:
            best, best_rank = record, rank
    return best


@dataclass(frozen=True)
class Merged:
    run: RunInfo
    records: list[Record]
    calibrations: list[dict[str, Any]]
    notes: list[str]  # what the merge decided that a reader should know
    problems: list[str] = field(default_factory=list)  # why the merged run cannot pass, whatever its records say


def merge_reports(reports: Sequence[Report]) -> Merged:
    """One run from shard reports: the same commit (else MergeError), every gate once (its worst verdict),
    the Capability Score made again over all the capability records."""
    if not reports:
        raise MergeError("no reports to merge")
    commits = {r.run.code_commit for r in reports}
    if len(commits) > 1:
        which = "; ".join(f"{r.path} at {(r.run.code_commit or '')[:12] or 'no git commit'}" for r in reports)
        raise MergeError(
            f"the reports ran different code ({which}): one merged verdict cannot speak for two "
            "commits. Re-run the shards on one commit, or compare the runs: mlxgate compare A B"
        )
    _check_same_run(reports)
    _check_shards(reports)
    notes: list[str] = []
    problems = _problems(reports)
    by_nodeid: dict[str, list[tuple[Record, str]]] = {}
    for report in reports:
        for record in report.gates:
            if record.nodeid != SCORE_NODEID:  # a shard's score covers its own tasks only: made again
                by_nodeid.setdefault(record.nodeid, []).append((record, report.path))
        for module in _missing_modules(report):
            where = f"shard {_shard_name(report)} ({report.path})"
            by_nodeid.setdefault(module, []).append(
                (
                    error_record(
                        nodeid=module,
                        phase="merge",
                        error_type="MissingRecord",
                        message=f"{module} is in the plan of {where}, but that report holds no record of it and "
                        "does not "
                        "say it ran without one: it did not run, or its records were lost. Re-run the shard",
                    ),
                    report.path,
                )
            )
    records: list[Record] = []
    for nodeid in sorted(by_nodeid):
        found = by_nodeid[nodeid]
        kept = worst([record for record, _ in found])
        records.append(kept)
        if len(found) > 1:
            where = ", ".join(f"{record.verdict} in {path}" for record, path in found)
            notes.append(f"{nodeid} is in {len(found)} reports ({where}): kept the worst, {kept.verdict}")
    score = _score(records)
    if score is not None:
        records.append(score)
    calibrations = [c for report in reports for c in report.calibrations]
    return Merged(_merged_run(reports), records, calibrations, notes, problems)


def _shard_name(report: Report) -> str:
    return report.shard.name if report.shard else "(unsharded)"


def _missing_modules(report: Report) -> list[str]:
    """The modules the shard's plan lists with no record in its report, nor said to have run without one."""
    planned = report.shard.modules if report.shard else None
    if planned is None:
        return []  # no plan of modules: nothing to check against
    recorded = {r.nodeid.split("::", 1)[0] for r in report.gates}  # each record's module, as the plan names it
    without = report.facts.without_records
    return [m for m in planned if m not in recorded and m not in without]


def _problems(reports: Sequence[Report]) -> list[str]:
    """Why the merged run cannot pass, whatever its records say: shards interrupted, planned modules
    without a record, verdicts mlxgate does not know (or none)."""
    out: list[str] = []
    for report in reports:
        where = f"{report.path}" + (f" (shard {_shard_name(report)})" if report.shard else "")
        interrupted = report.facts.interrupted
        if interrupted is not None:
            out.append(
                f"{where} was interrupted ({interrupted.reason or 'interrupted'})"
                + (f"; did not run: {', '.join(interrupted.not_run)}" if interrupted.not_run else "")
            )
        missing = _missing_modules(report)
        if missing:
            empty = " (its report has no gates at all)" if not report.gates else ""
            out.append(f"{where}: planned module(s) without a record{empty}: {', '.join(missing)}")
        for record in report.gates:
            if record.verdict not in RECORD_VERDICTS:
                out.append(
                    f"{where}: {record.nodeid} has verdict {record.verdict!r}, not one mlxgate writes "
                    f"({', '.join(RECORD_VERDICTS)}): no pass"
                )
            contradiction = pass_contradicted(record, require_proof=_setting(report.run.config, "gate.require_proof"))
            if contradiction is not None:
                out.append(f"{where}: {record.nodeid} reads pass, but {contradiction}: no pass")
    return out


#: The record modes whose pass rests on checks: a pass of theirs with none showed nothing.
_CHECKED_MODES = frozenset({"gate", "capability", "speed"})


def pass_contradicted(record: Record, *, require_proof: object = False) -> str | None:
    """Why a record's pass is not what its own checks and its `limits_from` show, derived again from them; None
    when they show it (or the record is no pass). A shard's verdict is its word; its checks are the evidence,
    and so is where its limits come from: refuted limits never pass, nor unproven ones in a run that required
    proof (`--mlx-require-proof`, as its settings say)."""
    if record.verdict != "pass":
        return None
    if record.mode in _CHECKED_MODES and not record.checks:
        return "it has no checks"
    for check in record.checks:
        why = _check_contradicted(check)
        if why is not None:
            return f"its check {check.label} {why}"
    return _limits_contradicted(record, require_proof is True)


def _limits_contradicted(record: Record, require_proof: bool) -> str | None:
    """Why a KL gate's `limits_from` denies its pass (None: it does not)."""
    limits = record.limits_from
    if record.mode != "gate":
        return None  # capability and speed limits are not proven by a known-bad (`authoring.proof`)
    if limits is None:
        return "it says nowhere where its limits come from, and the run required proof" if require_proof else None
    if limits.status not in LIMIT_SOURCES:
        return f"its limits_from status {limits.status!r} is not one mlxgate writes ({', '.join(LIMIT_SOURCES)})"
    if limits.status == "refuted":
        return f"its limits are refuted ({limits.words})"
    bad = limits.known_bad_verdict
    if limits.status == "proven" and bad != "fail":
        return f"its limits read proven, but its known-bad's verdict against them is {bad or 'not given'}"
    if limits.status == "unproven" and require_proof:
        return f"its limits are unproven ({limits.words}) and the run required proof (--mlx-require-proof)"
    return None


def _check_contradicted(check: CheckResult) -> str | None:
    """Why a check's pass is not what its value, interval and limit show (None: they show it)."""
    if check.verdict != "pass":
        return f"says {check.verdict or 'nothing'}"
    if check.limit is None or check.direction not in ("max", "min"):
        return "has no limit to clear"
    shown = bounds_verdict(check.lower, check.upper, check.limit, check.direction)  # type: ignore[arg-type]
    if shown != "pass":
        return f"shows {shown} (95% interval [{check.lower}, {check.upper}], limit {check.limit:g})"
    inside = check.value is None or (
        (check.lower is None or check.lower <= check.value) and (check.upper is None or check.value <= check.upper)
    )
    return None if inside else f"has its value {check.value} outside its own interval [{check.lower}, {check.upper}]"


#: The settings that decide what a gate measured and how it is judged: every shard of one run has the same.
_SAME_SETTINGS = ("candidate", "reference")
_SAME_GATE_SETTINGS = (
    "lever",
    "ref_value",
    "cand_value",
    "kl_prompts",
    "kl_tokens",
    "kl_decode",
    "kl_prompts_ini",
    "kl_tokens_ini",
    "kl_decode_ini",
    "tier",
    "max_new_tokens",
    "speed",
    "speed_contexts",
    "speed_decode",
    "speed_reps",
    "aa",
    "calibrate",
    "allow_untrained",
    "prove",
    "require_proof",
    "cand_server",
    "ref_server",
    "server_top_k",
)


def _check_same_run(reports: Sequence[Report]) -> None:
    """MergeError when the reports ran another model, lever values or sizes: gates judged on different arms
    are no one run, whatever each verdict says."""
    for name in (*_SAME_SETTINGS, *(f"gate.{k}" for k in _SAME_GATE_SETTINGS)):
        seen = {r.path: _setting(r.run.config, name) for r in reports}
        if len({json.dumps(v, sort_keys=True, default=str) for v in seen.values()}) > 1:
            which = "; ".join(f"{path}: {value!r}" for path, value in seen.items())
            raise MergeError(
                f"the reports ran with different {name} ({which}): their gates measured other arms, so one merged "
                "verdict cannot speak for them. Re-run the shards with the same options"
            )
    models = {
        model.label: r.path
        for r in reports
        for model in (g.candidate for g in r.gates)
        if model is not None and model.label
    }
    if len(models) > 1:
        which = "; ".join(f"{label} in {path}" for label, path in models.items())
        raise MergeError(f"the reports judged different models ({which}): re-run the shards on one model")


def _setting(config: Any, name: str) -> Any:
    value = config
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _check_shards(reports: Sequence[Report]) -> None:
    shards = [(r, r.shard) for r in reports if r.shard]
    if not shards:
        return
    counts = {s.count for _, s in shards}
    plans = {s.plan for _, s in shards}
    named = "; ".join(f"{r.path} is shard {s.name} (plan {s.plan})" for r, s in shards)
    if len(counts) > 1:
        raise MergeError(f"the shards were cut in different numbers of pieces: {named}")
    if len(plans) > 1:
        raise MergeError(
            f"the shards were planned from different histories, so they need not cover every module "
            f"exactly once: {named}. Give every shard the same --mlx-db file (or none) and re-run"
        )
    indices = [s.index for _, s in shards]
    (count,) = counts
    repeated = sorted({i for i in indices if indices.count(i) > 1}, key=lambda i: (i is None, i or 0))
    if repeated:
        raise MergeError(f"shard {', '.join(f'{i}/{count}' for i in repeated)} given twice: {named}")
    missing = [i for i in range(1, int(count) + 1) if i not in indices] if isinstance(count, int) else []
    if missing:
        raise MergeError(
            f"shard {', '.join(f'{i}/{count}' for i in missing)} missing: a merged run without it "
            f"would pass gates that never ran. Given: {named}"
        )
    _check_plans_cover(shards)


def _check_plans_cover(shards: Sequence[tuple[Report, Shard]]) -> None:
    """Every shard lists the modules it was to run, no module in two, and together as many as the plan
    holds: a shard whose list was cut short would hide the records it dropped."""
    unlisted = [f"{r.path} (shard {s.name})" for r, s in shards if s.modules is None]
    if unlisted:
        raise MergeError(
            f"{', '.join(unlisted)} list no modules of the plan, so a module it dropped could not be seen. "
            "Re-run that shard with this version of mlxgate (its report lists them)"
        )
    seen: dict[str, str] = {}
    for _, s in shards:
        for module in s.modules or ():
            if module in seen:
                raise MergeError(f"{module} is planned in both shard {seen[module]} and shard {s.name}: not one plan")
            seen[module] = s.name
    totals = {s.total_modules for _, s in shards}
    if totals == {None}:
        return  # no shard says how many the plan holds: each one's list is all there is to check
    if len(totals) > 1:
        raise MergeError(f"the shards disagree on how many modules the plan holds ({sorted(map(str, totals))})")
    (total,) = totals  # a number: None alone returned above, None beside a number disagrees
    if total is not None and total != len(seen):
        raise MergeError(
            f"the plan holds {total} modules, but the shards list {len(seen)}: {total - len(seen)} planned "
            "module(s) are in no shard's list, so their records could vanish unseen. Re-run every shard on one plan"
        )


def _score(records: Sequence[Record]) -> Record | None:
    from .score import score_record

    capability = sorted((r for r in records if r.mode == "capability"), key=lambda r: (r.time or "", r.nodeid))
    score = score_record(capability, TASK_NAMES)
    if score is not None and capability:  # the merge, made again, is the same
        score = dataclasses.replace(score, time=max(r.time or "" for r in capability))
    return score


def _merged_run(reports: Sequence[Report]) -> RunInfo:
    first = reports[0].run
    ids = sorted(r.run.run_id for r in reports)
    run_id = hashlib.sha256(("merge:" + ",".join(ids)).encode()).hexdigest()[:32]  # the same shards, the same id
    dirty = [r.run.code_dirty for r in reports]
    code_dirty = True if True in dirty else None if None in dirty else False
    config = {k: v for k, v in first.config.items() if k not in ("shard", "interrupted", "without_records")}
    stopped = [(r, i) for r in reports if (i := r.facts.interrupted) is not None]
    if stopped:  # the merged run did not run everything either
        config["interrupted"] = {
            "reason": "; ".join(f"{r.path}: {i.reason or 'interrupted'}" for r, i in stopped),
            "not_run": sorted({m for _, i in stopped for m in i.not_run}),
        }
    if "gate" in config and isinstance(config["gate"], dict):
        config["gate"] = {**config["gate"], "shard": None, "report": None}
    config["merged"] = [
        {
            "run_id": r.run.run_id,
            "started": r.run.started,
            "report": r.path,
            "shard": r.shard.name if r.shard else None,
            "argv": list(r.run.argv),
        }
        for r in reports
    ]
    machine: dict[str, str] = {}
    for key in first.machine:
        values = list(dict.fromkeys(str(r.run.machine[key]) for r in reports if r.run.machine.get(key)))
        machine[key] = " | ".join(values)
    return RunInfo(
        run_id=run_id,
        started=min(r.run.started for r in reports),
        code_commit=first.code_commit,
        code_dirty=code_dirty,
        argv=_without_shard(first.argv),
        config=config,
        machine=machine,
    )


def _without_shard(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--mlx-shard":
            skip = True
            continue
        if arg.startswith("--mlx-shard="):
            continue
        out.append(arg)
    return out
