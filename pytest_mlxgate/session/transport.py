"""How a gate's record reaches the controller: staged on the item, carried by its teardown report.

A record is staged as `(name, strict JSON text)` on the item's stash and copied onto the teardown
report's `mlxgate` attribute, which pytest serializes with the report, so it crosses xdist (and
lands in `pytest-reportlog` lines) as plain strings. Not `user_properties`: pytest's junitxml writes
every user property into the `<testcase>`, which `junit_family=xunit2` (pytest's default) does not
allow; the controller puts the JUnit properties where the run's family allows them
(`results/junit.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ..results.records import carried

__all__ = ["REPORT_ATTRIBUTE", "attach", "carried_by", "stage"]

#: The teardown report's attribute holding the carried `(name, JSON text)` entries.
REPORT_ATTRIBUTE = "mlxgate"

_STAGED = pytest.StashKey[list[tuple[str, str]]]()


def stage(item: pytest.Item, name: str, payload: Mapping[str, Any]) -> None:
    """Stage a record (`RECORD_PROPERTY`) or a calibration (`CALIBRATION_PROPERTY`) for the controller."""
    item.stash.setdefault(_STAGED, []).append(carried(name, payload))


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
