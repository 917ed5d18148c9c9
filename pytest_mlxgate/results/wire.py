"""A gate record's wire form: its JSON shape (the TypedDicts below document each key), the version of
that shape and the one migration of older ones, and the one parse of a record's JSON text.

The typed record (`model.Record`) is parsed from this form and writes it back (`Record.to_json`); a
record crosses processes, and lands in reports and the results DB, only in this form. Standard library
only: the controller imports it and must not import numpy or mlx.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, Required, TypedDict

from .fields import real
from .verdicts import VERDICTS

__all__ = [
    "Check",
    "GateRecord",
    "LIMIT_SOURCES",
    "LimitsFrom",
    "ModelRef",
    "Mode",
    "RECORD_VERSION",
    "json_object",
    "migrate_check",
    "migrate_record",
]

Mode = Literal["gate", "aa", "capability", "score", "speed", "error"]  # "error": raised before it measured


class ModelRef(TypedDict):
    """Which model an arm ran: its name as given and where that resolved to."""

    name: str
    repo_id: str | None
    commit: str
    pinned: str
    dtype: NotRequired[str]  # the precision its arms computed in (bfloat16, float32, ...); older records lack it


class Check(TypedDict, total=False):
    """One limit of an assertion. `lower` and `upper` are the two ends of the confidence interval of
    `value`, in the metric's own units, the same meaning whatever the direction (None: no such end).
    "max": must stay at or below `limit` (pass iff upper <= limit, fail iff lower > limit); "min": at or
    above it (pass iff lower >= limit, fail iff upper < limit); otherwise inconclusive. A reader's
    "passed" is verdict == "pass". Records before `record_version` 2 carried `bound`, `other_bound` and
    `passed` instead: `migrate_check` reads them."""

    metric: Required[str]
    key: Required[str]
    value: Required[float | None]
    lower: Required[float | None]
    upper: Required[float | None]
    limit: Required[float]
    direction: Required[Literal["max", "min"]]
    verdict: Required[Literal["pass", "fail", "inconclusive"]]
    n: Required[int]  # items or prompts the verdict rests on
    n_needed: Required[int | None]  # inconclusive: about how many would tell
    method: Required[str]
    p_value: float | None
    context: int  # a speed or memory check: the context (tokens) it holds at
    ratio: float | None  # the relative rule (`kl.oracle`): the candidate's KL from the float32 oracle / the plain's
    oracle: dict[str, float]  # the relative rule: both arms' mean KL from the oracle and the `relative` asked


#: Where a gate's limits were shown to work on the judged model and backend (`LimitsFrom.status`):
#: *calibrated* (a calibration file of this model on this backend covers the module), *proven* (this run
#: showed the module's KNOWN_BAD fails them here), *unproven* (neither: no known-bad, --mlx-prove off, a
#: check no known-bad speaks for), *refuted* (the known-bad passes them here: the gate is an error).
LIMIT_SOURCES = ("calibrated", "proven", "unproven", "refuted")


class LimitsFrom(TypedDict, total=False):
    """Where a gate's limits come from, on the model and backend it judged (`authoring.proof` makes it)."""

    status: Required[Literal["calibrated", "proven", "unproven", "refuted"]]
    model: Required[str]  # the judged model: a built-in alias, else repo@commit
    backend: Required[str]  # cpu, metal, cuda
    dtype: str  # the precision the judged model computed in (bfloat16, float32, ...); older records lack it
    file: str  # the calibration file (calibrated), or the one that would cover it (`--mlx-calibrate` writes it)
    stale_file: str  # why that file, though beside the module, does not show these limits (another module's, ...)
    models_entry: str  # the `models=` entry whose limits replaced the gate's on this model
    why: str  # unproven / refuted: the reason, in words
    known_bad: dict[str, Any]  # the proof's known-bad: value, verdict against these limits, its figures
    floors: dict[str, float]  # this model's A/A floor (a proof run measured it)
    inside_floor: list[str]  # the limits within the rule's multiple of that floor: their checks read inconclusive
    precision_floor: dict[str, float]  # a low-precision run: the plain path's own distance from float32
    inside_precision: list[str]  # the limits below it: they read rounding (inconclusive), never proven
    set_aside: bool  # those limits left the verdict to the oracle's rules (the assertion names relative=)
    note: str  # what kind of limit this is: a drop margin in points (model-independent), a speed goal (not)


class GateRecord(TypedDict, total=False):
    """What one gate measured and decided, as JSON (the wire form; `gate_record` builds it). KL gates fill
    `stats`/`aa`/`tokens`/`kl_profile`; capability gates `tasks`/`skipped`; the run's Capability Score
    `capability_score`; speed (any gate) `speed`; a gate that raised `error`. Readers never read these
    dicts: `model.parse_record` turns a record into the typed read model (`model.Record`), whose classes
    document each part (`Stats`, `KLProfile`, `Task`, `Speed`, …)."""

    nodeid: Required[str]
    gate: Required[str]
    mode: Required[Mode]
    oracle: dict[str, Any]  # both arms' KL from the float32 oracle (`kl.oracle.OracleDistances.to_json`)
    server: dict[str, Any]  # a candidate served over HTTP: where, and what its lower-bound KL rests on
    verdict: Required[str]
    time: Required[str]
    record_version: int  # RECORD_VERSION; none: a version-1 record (`migrate_record` reads it)
    candidate: ModelRef | None
    reference_model: ModelRef | None
    lever: dict[str, Any]
    path: str
    sizes: dict[str, Any]
    stats: dict[str, Any]  # model.Stats
    bounds: dict[str, Any]
    limits_for: str  # the model whose own limits (`models=`) replaced the gate's: absent when none did
    limits_from: LimitsFrom  # where the limits were shown to work on this model and backend
    checks: list[Check]
    durations: dict[str, float]
    phases: dict[str, float]  # seconds of this record's own share of its module's work, per phase (session/phases.py)
    rerun: str
    # KL gates
    reference_source: str
    forwards: dict[str, int]
    lever_calls: dict[str, int]  # a patch lever: calls of the patched site per arm that ran here (0 is refused)
    aa: dict[str, Any] | None  # model.AA
    tokens: dict[str, str]
    kl_profile: dict[str, Any]  # model.KLProfile; capped whatever the gate's size (stats/kl_profile.py)
    attribution: dict[str, Any]  # model.Attribution: where the drift comes from (explain/attribute.py)
    # capability gates: per task model.Task (with `flipped`: the first 20 items whose score changed)
    tasks: dict[str, Any]
    skipped: dict[str, str]
    capability_score: dict[str, Any]  # the run's Capability Score: model.CapabilityScore
    speed: dict[str, Any]  # speed and memory of both arms: model.Speed
    error: dict[str, Any]  # a gate that raised (verdict "error", `error_record`): model.ErrorInfo


# -- older records ---------------------------------------------------------------------------------

#: `record_version` of the records `gate_record` writes. Records without it are version 1: their checks
#: carried `bound` (the end compared), `other_bound` and `passed`; `migrate_record` reads them.
RECORD_VERSION = 2


def migrate_check(check: Mapping[str, Any]) -> Check:
    """A check in the current shape: `lower`/`upper` the ends of the value's interval, `verdict` one of
    pass/fail/inconclusive. A version-1 check carried `bound` (the end on the passing side: the upper
    end of a "max" metric, the lower of a "min" one), the far end in `other_bound` (KL, speed) or in
    `lower`/`upper` (capability), and `passed` (the only verdict of the oldest records)."""
    out = {k: v for k, v in check.items() if k not in ("bound", "other_bound", "passed")}
    if "bound" in check or "other_bound" in check:
        far = check.get("other_bound")
        if check.get("direction") == "min":
            out["lower"], out["upper"] = check.get("bound"), far if far is not None else check.get("upper")
        else:
            out["lower"], out["upper"] = far if far is not None else check.get("lower"), check.get("bound")
    if check.get("verdict") not in VERDICTS and ("verdict" in check or "passed" in check):
        out["verdict"] = "pass" if check.get("passed") is True else "fail"
    return out  # type: ignore[return-value]  # the current shape, from what the check holds


def _flipped_from_items(items: Sequence[Any]) -> dict[str, Any]:
    """Records from before `flipped`: the items whose score changed, from the task's paired items
    (losses first, without their prompts)."""
    pairs = [i for i in items if isinstance(i, Mapping)]

    def score(item: Mapping[str, Any], arm: str) -> float | None:
        answer = item.get(arm)
        return real(answer.get("score")) if isinstance(answer, Mapping) else None

    changed = [i for i in pairs if score(i, "reference") != score(i, "candidate")]
    changed.sort(key=lambda i: (score(i, "candidate") or 0) - (score(i, "reference") or 0))
    return {"total": len(changed), "items": changed}


def migrate_record(record: Mapping[str, Any]) -> GateRecord:
    """Any record, old or current, in the current shape (`record_version` RECORD_VERSION): checks as
    `migrate_check` has them; a capability task without `flipped` gets it from its paired `items`. Read
    from what the record holds, not only its version, so a hand-made record reads the same. A shallow
    copy: the caller's record is not changed."""
    out = dict(record)
    out["record_version"] = RECORD_VERSION
    if "checks" in record:
        out["checks"] = [migrate_check(c) if isinstance(c, Mapping) else c for c in _items(record.get("checks"))]
    tasks = record.get("tasks")
    if isinstance(tasks, Mapping) and any(_without_flipped(t) for t in tasks.values()):
        out["tasks"] = {
            name: {**t, "flipped": _flipped_from_items(_items(t.get("items")))} if _without_flipped(t) else t
            for name, t in tasks.items()
        }
    return out  # type: ignore[return-value]  # the record's own keys, in the current shape


def _without_flipped(task: Any) -> bool:
    """A capability task from before `flipped` (or one that lost it), with the paired items to make it from."""
    return isinstance(task, Mapping) and not _mapping(task.get("flipped")) and bool(_items(task.get("items")))


def _items(value: Any) -> list[Any] | tuple[Any, ...]:
    return value if isinstance(value, (list, tuple)) else ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def json_object(text: object) -> dict[str, Any] | None:
    """The one parse of a record's JSON text (carried by a report, stored in a DB row): the object it
    holds, or None where it holds none (not text, not ours, cut short): a reader never crashes on it."""
    if not isinstance(text, (str, bytes)):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
