"""Was the machine busy with other work while speed was timed?

Speed ratios assume both arms had the machine to themselves; another xdist worker's arms, a build or
a browser on the same cores slow whichever trial they overlap. Before and after the trials this
reads the CPU time every process spent on the cores this one may use (Linux: /proc/stat, per CPU,
restricted to the process's affinity) and this process's own CPU time: the difference is what
others used. Elsewhere only the load average is recorded, which counts this process too, so no
verdict is drawn from it. Standard library only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["HIGH_SHARE", "CpuSample", "load_seen", "sample"]

#: Other processes' load is "high" from a quarter of the cores (and at least half a core) on average.
HIGH_SHARE = 0.25
_MIN_CORES = 0.5
#: /proc/stat's columns that are work: user nice system (idle iowait) irq softirq steal.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuSample:
    """One reading: wall clock, CPU seconds all processes spent on our cores (None: no /proc), ours."""

    wall: float
    busy_s: float | None
    own_s: float
    loadavg: float | None
    cores: int


def _cores() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    return set(getter(0)) if getter is not None else None


def _busy_seconds(cores: set[int] | None) -> float | None:
    """CPU seconds spent working on `cores` since boot (every process), from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = 0
    seen = False
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            index = int(name[3:])
        except ValueError:
            continue
        if cores is not None and index not in cores:
            continue
        values = rest.split()
        ticks += sum(int(values[i]) for i in _BUSY_COLUMNS if i < len(values))
        seen = True
    if not seen:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def sample() -> CpuSample:
    cores = _cores()
    try:
        loadavg: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        loadavg = None
    return CpuSample(
        wall=time.monotonic(),
        busy_s=_busy_seconds(cores),
        own_s=time.process_time(),
        loadavg=loadavg,
        cores=len(cores) if cores else (os.cpu_count() or 1),
    )


def load_seen(before: CpuSample, after: CpuSample, *, waited_s: float = 0.0) -> dict[str, Any]:
    """What other processes did on our cores between the two samples, for the speed record.

    `high` is True when they kept at least a quarter of the cores (and half a core) busy on average:
    the ratios then measure that contention too; None where it cannot be told (no /proc/stat)."""
    wall = max(after.wall - before.wall, 1e-9)
    out: dict[str, Any] = {
        "cores": after.cores,
        "wall_s": round(wall, 3),
        "loadavg_1m": [before.loadavg, after.loadavg],
        "waited_for_lock_s": round(waited_s, 3),
    }
    if before.busy_s is None or after.busy_s is None:
        return {
            **out,
            "method": "os.getloadavg (counts this process too: no verdict)",
            "other_cores": None,
            "share": None,
            "high": None,
        }
    other = max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s))
    other_cores = other / wall
    share = other_cores / after.cores
    return {
        **out,
        "method": "/proc/stat on this process's CPUs minus its own CPU time",
        "other_cpu_s": round(other, 3),
        "other_cores": round(other_cores, 3),
        "share": round(share, 3),
        "high": share >= HIGH_SHARE and other_cores >= _MIN_CORES,
    }
