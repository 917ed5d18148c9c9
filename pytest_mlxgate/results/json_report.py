"""The JSON report (`--mlx-report`): the run and one record per gate, strict JSON, written atomically."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.atomic import atomic_write_bytes
from .fields import dumps
from .runs import calibration_module, run_facts

if TYPE_CHECKING:
    from .model import Record
    from .records import RunInfo

__all__ = ["REPORT_VERSION", "write_json_report"]

#: `mlxgate_report` in the JSON report: bump when a reader would misread the new shape.
REPORT_VERSION = 1


def write_json_report(
    path: Path, run: RunInfo, records: Sequence[Record], calibrations: Sequence[Mapping[str, Any]] = ()
) -> None:
    """Write the run's report atomically: readers see the old file or the whole new one, never half.

    Strict JSON (NaN/inf become null) so that any JSON parser, not only Python's, can read it.
    `calibrations` (--mlx-calibrate) go under their own key: they are measurements, not verdicts.
    At the top, for scripts: `verdict`, the run's word (`results.verdicts.run_verdict`: error when
    interrupted, "none" without a gate record, else its worst record's), and `interrupted` (with
    `not_run`, the modules that never ran, when true), both from the run's config.
    """
    from .verdicts import run_verdict

    path = Path(path)
    interrupted = run_facts(run).interrupted
    read = sorted(records, key=lambda r: r.nodeid)
    doc: dict[str, Any] = {
        "mlxgate_report": REPORT_VERSION,
        "verdict": run_verdict((r.verdict for r in read if r.mode != "score"), interrupted=interrupted is not None),
        "interrupted": interrupted is not None,
        "run": run.to_dict(),
        "gates": [record.to_json() for record in read],
    }
    if interrupted is not None:
        doc["not_run"] = list(interrupted.not_run)
    if calibrations:
        doc["calibrations"] = sorted(calibrations, key=calibration_module)
    data = (dumps(doc, indent=2) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data, new_mode=0o644)  # a report is for everyone, not mkstemp's 0600
