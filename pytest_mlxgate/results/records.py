"""Making a gate record, and carrying it: the one constructor (`gate_record`, `error_record`), the name
it travels under, and the run it belongs to.

A record is a `model.Record` from the moment it is made. It crosses to the controller as its strict JSON
text (`Record.to_json`, `wire.GateRecord`) on the teardown report (`session/transport.py`; under xdist
reports cross processes), named `mlxgate.record`, the name of its JUnit property too, and is parsed
back once (`records_in`); the JSON report, the sqlite history, the summary and the CI outputs read the
Record. Standard library only: the controller imports this and must not import numpy or mlx.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fields import dumps, jsonable
from .model import Record, parse_record
from .wire import GateRecord, Mode, json_object

__all__ = [
    "CALIBRATION_PROPERTY",
    "ERROR_CHARS",
    "ERROR_LINES",
    "RECORD_PROPERTY",
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
) -> Record:
    """The one constructor of a record: the fields every record has, then the measurement's own (the keys
    of `wire.GateRecord`, as JSON values: a NaN is null, as on the wire). Checks in the version-1 shape
    (`bound`, `other_bound`, `passed`) are made current (`wire.migrate_record`), so every record made is
    of RECORD_VERSION."""
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
    return parse_record(jsonable(record))


#: An error record keeps this much of the error's message: its first lines, for the summary and reports.
ERROR_LINES, ERROR_CHARS = 12, 2000


def error_record(*, nodeid: str, phase: str, error_type: str, message: str, **fields: Any) -> Record:
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


def carried(name: str, payload: Mapping[str, Any] | Record) -> tuple[str, str]:
    """`(name, strict JSON text)`: what a report carries (a record: its wire form); NaN and inf become null."""
    return name, dumps(payload.to_json() if isinstance(payload, Record) else payload)


def _payloads(entries: Sequence[Sequence[object]], wanted: str) -> list[dict[str, Any]]:
    found = (json_object(entry[1]) for entry in entries if len(entry) == 2 and entry[0] == wanted)
    return [value for value in found if value is not None]


def records_in(entries: Sequence[Sequence[object]]) -> list[Record]:
    """The gate records among a report's carried `(name, JSON text)` entries, parsed."""
    return [parse_record(r) for r in _payloads(entries, RECORD_PROPERTY)]


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
