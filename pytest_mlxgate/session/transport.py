"""How a gate's record reaches the controller: staged on the item, carried by its teardown report.

A record is staged as `(name, strict JSON text)` on the item's stash and copied onto the teardown
report's `mlxgate` attribute, which pytest serializes with the report, so it crosses xdist (and
lands in `pytest-reportlog` lines) as plain strings. Not `user_properties`: pytest's junitxml writes
every user property into the `<testcase>`, which `junit_family=xunit2` (pytest's default) does not
allow; the controller puts the JUnit properties where the run's family allows them
(`results/junit.py`).

A gate that raises instead of deciding (in setup, call or teardown: a model that cannot load,
NaN logits, a lever that raises, a timeout) gets its error record here, in one place
(`stage_error`, from the makereport hook), so it takes the same road as every other record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ..results.model import Record
from ..results.records import carried, records_in

__all__ = ["REPORT_ATTRIBUTE", "attach", "carried_by", "stage", "stage_error", "staged_records"]

#: The teardown report's attribute holding the carried `(name, JSON text)` entries.
REPORT_ATTRIBUTE = "mlxgate"

_STAGED = pytest.StashKey[list[tuple[str, str]]]()


def stage(item: pytest.Item, name: str, payload: Mapping[str, Any] | Record) -> None:
    """Stage a record (`RECORD_PROPERTY`) or a calibration (`CALIBRATION_PROPERTY`) for the controller."""
    item.stash.setdefault(_STAGED, []).append(carried(name, payload))


def staged_records(item: pytest.Item) -> list[Record]:
    """The gate records the item has staged so far (parsed back from their JSON text)."""
    staged: list[tuple[str, str]] = item.stash.get(_STAGED, [])
    return records_in(staged)


def stage_error(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """A gate's failed setup, call or teardown that no failing record explains becomes an error record.

    A gate is a test that asks for `paired` or staged a record. A failure its own record explains (a
    fail or inconclusive verdict raising AssertionError) adds nothing; skips and xfails are not
    failures. Anything else (NonFiniteLogitsError, a model that cannot load, a lever that raises, a
    plain assert after a passing gate) would otherwise leave the gate reading as absent, or as pass."""
    from ..results.records import RECORD_PROPERTY, error_record
    from ..results.verdicts import verdict_rank

    staged = staged_records(item)
    if not report.failed or not ("paired" in getattr(item, "fixturenames", ()) or staged):
        return
    if any(verdict_rank(r.verdict) >= verdict_rank("inconclusive") for r in staged):
        return  # its record already says it failed (or could not tell): that is why the test failed
    if call.excinfo is not None:
        error_type, message = call.excinfo.typename, str(call.excinfo.value)
    else:  # a failure without an exception here (an XPASS(strict)): the report's text
        error_type, message = "Failed", report.longreprtext
    from ..common.redact import redact

    stage(
        item,
        RECORD_PROPERTY,
        error_record(
            nodeid=item.nodeid,
            phase=report.when or "call",
            error_type=error_type,
            message=redact(message.strip() or error_type),
            **_what_ran(item),
        ),
    )


def _what_ran(item: pytest.Item) -> dict[str, Any]:
    """What an error record can say of the gate besides the error: its re-run command, and the model
    and lever when its `paired` value was made (a setup error comes before it)."""
    from ..config.rerun import rerun_command

    fields: dict[str, Any] = {}
    try:
        fields["rerun"] = rerun_command(item.config, item.nodeid)
    except Exception:  # noqa: BLE001 - the error record matters more than its re-run line
        pass
    paired = getattr(item, "funcargs", {}).get("paired")
    run = getattr(paired, "run", None)
    try:
        if run is not None:
            fields["candidate"] = run.candidate.describe()
            fields["lever"] = run.lever.to_json()
            fields["path"] = run.shape.path
    except Exception:  # noqa: BLE001 - a half-made run: the error is the news
        fields = {k: v for k, v in fields.items() if k == "rerun"}
    return fields


def attach(item: pytest.Item, report: pytest.TestReport) -> None:
    """Put what the item staged onto its teardown report (the last one: teardown publishes too)."""
    if report.when == "teardown" and _STAGED in item.stash:
        setattr(report, REPORT_ATTRIBUTE, [list(entry) for entry in item.stash[_STAGED]])


def carried_by(report: pytest.TestReport) -> list[list[object]]:
    """The entries a report carries; none on a report from another plugin version or a non-gate test."""
    entries = getattr(report, REPORT_ATTRIBUTE, None)
    if not isinstance(entries, list):
        return []
    return [list(e) for e in entries if isinstance(e, (list, tuple))]
