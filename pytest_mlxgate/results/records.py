"""The gate record: one typed definition of what a gate hands the controller, built in one place.

A record crosses to the controller as strict JSON text on the teardown report (`session/transport.py`;
under xdist reports cross processes), named `mlxgate.record`, the name of its JUnit property too, and
is read by the JSON report, the sqlite history, the summary and the CI outputs. Standard library
only: the controller imports this and must not import numpy or mlx.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Required, TypedDict

from .fields import dumps, real
from .verdicts import VERDICTS

__all__ = [
    "Check",
    "GateRecord",
    "LIMIT_SOURCES",
    "LimitsFrom",
    "ModelRef",
    "CALIBRATION_PROPERTY",
    "ERROR_CHARS",
    "ERROR_LINES",
    "RECORD_PROPERTY",
    "RECORD_VERSION",
    "Mode",
    "RunInfo",
    "calibrations_in",
    "carried",
    "error_record",
    "gate_name",
    "gate_record",
    "json_object",
    "migrate_check",
    "migrate_record",
    "records_in",
    "utc_now",
]

#: The name a record travels under, as JSON text: on the report, and as its JUnit property.
RECORD_PROPERTY = "mlxgate.record"
#: The name a --mlx-calibrate measurement travels under (not a gate record: it has no verdict), as JSON text.
CALIBRATION_PROPERTY = "mlxgate.calibration"

Mode = Literal["gate", "aa", "capability", "score", "speed", "error"]  # "error": raised before it measured


class ModelRef(TypedDict):
    """Which model an arm ran: its name as given and where that resolved to."""

    name: str
    repo_id: str | None
    commit: str
    pinned: str


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
    file: str  # the calibration file (calibrated), or the one that would cover it (`--mlx-calibrate` writes it)
    models_entry: str  # the `models=` entry whose limits replaced the gate's on this model
    why: str  # unproven / refuted: the reason, in words
    known_bad: dict[str, Any]  # the proof's known-bad: value, verdict against these limits, its figures
    floors: dict[str, float]  # this model's A/A floor (a proof run measured it)
    inside_floor: list[str]  # the limits within the rule's multiple of that floor: their checks read inconclusive
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


def utc_now(at: float | None = None) -> str:
    """ISO-8601 UTC to the second: the one timestamp format of records, reports and rows."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def gate_name(nodeid: str) -> str:
    """`gates/test_kv_cache.py::test_drift` -> `test_kv_cache::test_drift`."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).stem}::{rest}" if rest else Path(path).stem


def gate_record(
    *,
    nodeid: str,
    mode: Mode,
    verdict: str,
    checks: Sequence[Mapping[str, Any]] = (),
    bounds: Mapping[str, Any] | None = None,
    gate: str | None = None,
    **fields: Any,
) -> GateRecord:
    """The one constructor of a record: the fields every record has, then the measurement's own. Checks
    in the version-1 shape (`bound`, `other_bound`, `passed`) are written in the current one
    (`migrate_record`), so every record written is of RECORD_VERSION."""
    unknown = set(fields) - set(GateRecord.__annotations__) | ({"record_version"} & set(fields))
    if unknown:
        raise TypeError(f"gate_record: not record fields: {sorted(unknown)}")
    record: dict[str, Any] = {
        "nodeid": nodeid,
        "gate": gate if gate is not None else gate_name(nodeid),
        "mode": mode,
        **fields,
        "bounds": dict(bounds or {}),
        "checks": [dict(c) for c in checks],
        "verdict": verdict,
        "time": utc_now(),
    }
    return migrate_record(record)


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


#: An error record keeps this much of the error's message: its first lines, for the summary and reports.
ERROR_LINES, ERROR_CHARS = 12, 2000


def error_record(*, nodeid: str, phase: str, error_type: str, message: str, **fields: Any) -> GateRecord:
    """The record of a gate that raised instead of deciding (verdict "error", `results.verdicts.ERROR`):
    the error's type, its message's first lines and the phase it happened in. Never a pass."""
    lines = message.strip().splitlines()
    text = "\n".join(lines[:ERROR_LINES]) + ("\n…" if len(lines) > ERROR_LINES else "")
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS - 1] + "…"
    return gate_record(
        nodeid=nodeid,
        mode=fields.pop("mode", "error"),
        verdict="error",
        error={"type": error_type, "message": text, "phase": phase},
        **fields,
    )


def carried(name: str, payload: Mapping[str, Any]) -> tuple[str, str]:
    """`(name, strict JSON text)`: what a report carries; NaN and inf become null, as in the JSON report."""
    return name, dumps(payload)


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


def _payloads(entries: Sequence[Sequence[object]], wanted: str) -> list[dict[str, Any]]:
    found = (json_object(entry[1]) for entry in entries if len(entry) == 2 and entry[0] == wanted)
    return [value for value in found if value is not None]


def records_in(entries: Sequence[Sequence[object]]) -> list[GateRecord]:
    """The gate records among a report's carried `(name, JSON text)` entries, parsed."""
    return _payloads(entries, RECORD_PROPERTY)  # type: ignore[return-value]  # built by gate_record


def calibrations_in(entries: Sequence[Sequence[object]]) -> list[dict[str, Any]]:
    """The --mlx-calibrate measurements among a report's carried entries, parsed."""
    return _payloads(entries, CALIBRATION_PROPERTY)


@dataclass(frozen=True)
class RunInfo:
    """What one pytest run was: the same for every gate in it, so stored once per row, not per record."""

    run_id: str  # uuid4 hex, made once per run on the controller
    started: str  # ISO-8601 UTC
    code_commit: str | None  # git commit of the code under test; None outside a git checkout
    code_dirty: bool | None
    argv: list[str]
    config: dict[str, Any]  # the run's mlxgate settings
    machine: dict[str, str]  # device, blas, mlx, mlx_lm, python, platform

    @classmethod
    def new(
        cls,
        root: Path,
        *,
        argv: Sequence[str],
        config: Mapping[str, Any],
        machine: Mapping[str, str],
        started: float | None = None,
    ) -> RunInfo:
        """A fresh run id, the start time (default: now) and the git state of `root`: what the
        controller makes once per run. Credentials in argv and config are masked here, once, so no
        report or history row ever holds them."""
        from ..common.redact import redact_argv, redact_data
        from .git import git_state

        commit, dirty = git_state(root)
        return cls(
            run_id=uuid.uuid4().hex,
            started=utc_now(started),
            code_commit=commit,
            code_dirty=dirty,
            argv=redact_argv(argv),
            config=redact_data(dict(config)),
            machine=dict(machine),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
