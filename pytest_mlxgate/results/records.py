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

from .fields import dumps

__all__ = [
    "Check",
    "GateRecord",
    "ModelRef",
    "CALIBRATION_PROPERTY",
    "ERROR_CHARS",
    "ERROR_LINES",
    "RECORD_PROPERTY",
    "Mode",
    "RunInfo",
    "calibrations_in",
    "carried",
    "error_record",
    "gate_name",
    "gate_record",
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
    """One limit of an assertion: the value, the confidence bound compared, the limit, the verdict."""

    metric: Required[str]
    key: Required[str]
    value: Any
    bound: Any  # the bound on the passing side: compared with the limit for a pass
    lower: Any  # a drop's lower bound (a regression is shown when it is above the limit)
    upper: Any  # a score's upper bound (shown under a floor when below it)
    other_bound: Any  # KL: the interval's far end
    limit: Any
    direction: str  # "max": must stay at or below the limit; "min": at or above
    verdict: str  # "pass" | "fail" | "inconclusive" (results.verdicts)
    n: int  # items or prompts the verdict rests on
    n_needed: int | None  # inconclusive: about how many would tell
    method: str
    p_value: float | None
    passed: Required[bool]  # verdict == "pass"


class GateRecord(TypedDict, total=False):
    """What one gate measured and decided. KL gates fill `stats`/`aa`/`tokens`; capability gates
    `tasks`/`skipped`; the run's Capability Score `capability_score`; speed (any gate) `speed`."""

    nodeid: Required[str]
    gate: Required[str]
    mode: Required[Mode]
    verdict: Required[str]
    time: Required[str]
    candidate: ModelRef | None
    reference_model: ModelRef | None
    lever: dict[str, Any]
    path: str
    sizes: dict[str, Any]
    stats: dict[str, Any]
    bounds: dict[str, Any]
    checks: list[Check]
    durations: dict[str, float]
    rerun: str
    # KL gates
    reference_source: str
    forwards: dict[str, int]
    lever_calls: dict[str, int]  # a patch lever: calls of the patched site per arm that ran here (0 is refused)
    aa: dict[str, Any] | None
    tokens: dict[str, str]
    # What the HTML report plots (`stats/kl_profile.py`; records from before it lack it, and the plots
    # say "not recorded"). Capped whatever the gate's size, floats to 4 significant digits (under 16 KB):
    #   version: 1
    #   histogram: {decades: [-8, 2], per_decade: 4, counts: [40 ints] (bin i: [10**(lo+i/4), 10**(lo+(i+1)/4))),
    #               zero, under, over: tokens with KL exactly 0, below 10**lo, at or above 10**hi}
    #   by_position: per bucket of neighbouring positions (at most 128): first, last (positions), n (tokens),
    #                median, p90 (KL over prompts), flips, near_tie_flips (top-1 changes outside / at near ties)
    #   prompts: per prompt (at most 128; beyond that the largest means): index, mean, ci ([lo, hi], t over
    #            floor(sqrt(T)) block means; null ends: no interval), n_tokens; total (prompts with tokens),
    #            confidence, method
    #   worst_context: per stats.worst entry: prompt, position, before (<= 16 tokens, <= 200 chars),
    #                  token (the text's token there), after (<= 4 tokens, <= 200 chars)
    kl_profile: dict[str, Any]
    # capability gates; each task's entry also holds `flipped`: {total, items: the first 20 items whose
    # score changed, losses first, each {id, prompt (its tail, <= 600 chars), reference, candidate:
    # {output (<= 400 chars), score, verdict}}}
    tasks: dict[str, Any]
    skipped: dict[str, str]
    # the run's Capability Score
    capability_score: dict[str, Any]
    # speed and memory of both arms (speed gates, and any gate whose module asks for speed)
    speed: dict[str, Any]
    # a gate that raised (verdict "error", `error_record`): {type, message (its first lines), phase
    # (setup, call or teardown)}
    error: dict[str, Any]


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
    """The one constructor of a record: the fields every record has, then the measurement's own."""
    unknown = set(fields) - set(GateRecord.__annotations__)
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
    return record  # type: ignore[return-value]  # keys checked against GateRecord above


#: An error record keeps this much of the error's message: its first lines, for the summary and reports.
ERROR_LINES, ERROR_CHARS = 12, 2000


def error_record(*, nodeid: str, phase: str, error_type: str, message: str, **fields: Any) -> GateRecord:
    """The record of a gate that raised instead of deciding (verdict "error", `results.verdicts.ERROR`):
    the error's type, its message's first lines and the phase it happened in. Never a pass."""
    lines = message.strip().splitlines()
    text = "\n".join(lines[:ERROR_LINES]) + ("\n…" if len(lines) > ERROR_LINES else "")
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS - 1] + "…"
    return gate_record(nodeid=nodeid, mode=fields.pop("mode", "error"), verdict="error",
                       error={"type": error_type, "message": text, "phase": phase}, **fields)


def carried(name: str, payload: Mapping[str, Any]) -> tuple[str, str]:
    """`(name, strict JSON text)`: what a report carries; NaN and inf become null, as in the JSON report."""
    return name, dumps(payload)


def _payloads(entries: Sequence[Sequence[object]], wanted: str) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        if len(entry) != 2 or entry[0] != wanted or not isinstance(entry[1], str):
            continue
        try:
            value = json.loads(entry[1])
        except ValueError:
            continue  # not ours, or cut short: a reader never crashes on it
        if isinstance(value, dict):
            out.append(value)
    return out


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
    def new(cls, root: Path, *, argv: Sequence[str], config: Mapping[str, Any],
            machine: Mapping[str, str], started: float | None = None) -> RunInfo:
        """A fresh run id, the start time (default: now) and the git state of `root`: what the
        controller makes once per run. Credentials in argv and config are masked here, once, so no
        report or history row ever holds them."""
        from ..common.redact import redact_argv, redact_data
        from .git import git_state

        commit, dirty = git_state(root)
        return cls(run_id=uuid.uuid4().hex, started=utc_now(started), code_commit=commit, code_dirty=dirty,
                   argv=redact_argv(argv), config=redact_data(dict(config)), machine=dict(machine))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
