"""The Capability Score: the unweighted mean of the six tasks, flagged partial when one did not run.

Computed on the controller from the capability records of the run, so standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .model import Record
from .record_capability import Task
from .records import gate_record

__all__ = ["SCORE_NODEID", "capability_score", "score_record"]

#: The node id the run's Capability Score is stored under.
SCORE_NODEID = "mlxgate::capability_score"


def capability_score(task_scores: Mapping[str, float | None], tasks: Sequence[str]) -> tuple[float | None, bool]:
    """Unweighted mean over the expected tasks that ran, and whether any expected task is missing.

    Unweighted so a big task cannot drown a small one; a missing task (absent or None) makes the
    score partial rather than silently comparable to a full one. Tasks outside `tasks` are ignored.
    """
    ran: list[float] = []
    for name in tasks:
        value = task_scores.get(name)
        if value is None:
            continue
        if not math.isfinite(value):
            raise ValueError(f"task {name!r} has a non-finite score {value}")
        ran.append(float(value))
    partial = len(ran) < len(tasks)
    return (sum(ran) / len(ran) if ran else None), partial


def score_record(records: Sequence[Record], tasks: Sequence[str]) -> Record | None:
    """The run's Capability Score as a record of its own, from the latest result of each task."""
    latest: dict[str, Task] = {}  # only the six: a gate author's own tasks are not in the score
    for record in records:
        if record.mode == "capability":
            latest.update({t: v for t, v in record.tasks.items() if t in tasks})
    if not latest:
        return None
    arms = {
        "reference": capability_score({t: latest[t].ref_score if t in latest else None for t in tasks}, tasks),
        "candidate": capability_score({t: latest[t].cand_score if t in latest else None for t in tasks}, tasks),
    }
    per_task = {t: {"reference": v.ref_score, "candidate": v.cand_score, "n": v.n} for t, v in latest.items()}
    partial = arms["candidate"][1]
    return gate_record(
        nodeid=SCORE_NODEID,
        gate="Capability Score",
        mode="score",
        verdict="partial" if partial else "complete",
        stats={},
        capability_score={
            "reference": arms["reference"][0],
            "candidate": arms["candidate"][0],
            "partial": partial,
            "tasks": per_task,
            "missing": [t for t in tasks if t not in latest],
        },
    )
