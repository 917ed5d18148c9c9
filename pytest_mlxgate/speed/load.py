"""Was the machine busy with other work while speed was timed?

Speed ratios assume both arms had the machine to themselves; another xdist worker's arms, a build or
a browser on the same cores slow whichever trial they overlap. Before and after the trials this
reads the CPU time every process spent on the cores this one may use (psutil's per-CPU times:
/proc/stat on Linux, the kernel's processor info on macOS; restricted to the process's affinity
where the system has one) and this process's own CPU time: the difference is what others used.
Where psutil cannot read them only the load average is recorded, which counts this process too, so
no verdict is drawn from it.

Under xdist another worker of the run parks at the trial mark only between its forwards
(common/watch.py), so one in flight when the trials start would run beside them (measured: a
long-context capability batch kept 1.0 of 2 cores busy through a weights gate's trials: decode
x0.61 [0.39, 0.94], usually [0.46, 0.55]). `wait_for_siblings` waits, before the first trial, until
the run's other workers (this process's siblings under the xdist controller) use under a tenth of a
core for a window. It reads only them (psutil, Linux and macOS alike), so unrelated load never holds
the trials up; where it cannot tell it waits for nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["HIGH_SHARE", "CpuSample", "load_seen", "sample", "sibling_cpu_seconds", "wait_for_siblings"]

#: Other processes' load is "high" from a quarter of the cores (and at least half a core) on average.
HIGH_SHARE = 0.25
_MIN_CORES = 0.5
#: The per-CPU times that are work (idle and iowait are not; Linux counts guest time inside user).
#: macOS has only user, nice, system (and idle).
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
#: The run's other workers are parked when, over one window, they used under a tenth of a core
#: (a parked worker polls its lock file; an idle one blocks on the controller's next test).
SIBLING_WINDOW_S = 0.3
SIBLING_QUIET_CORES = 0.1
#: At most this long: a forward that runs longer is a stall the trials do not wait out (their load
#: figures then say they ran under load).
SIBLING_WAIT_LIMIT_S = 120.0


@dataclass(frozen=True)
class CpuSample:
    """One reading: wall clock, CPU seconds all processes spent on our cores (None: no /proc), ours."""

    wall: float
    busy_s: float | None
    own_s: float
    loadavg: float | None
    cores: int


def _cores() -> set[int] | None:
    """The CPUs this process may run on; None where the system has no affinity (macOS): all of them."""
    try:
        return set(psutil.Process().cpu_affinity())
    except (AttributeError, NotImplementedError, psutil.Error, OSError):
        return None


def busy_of(times: Any) -> float:
    """The seconds of one CPU's times (psutil's `scputimes`, whatever the system's fields) that were work."""
    return float(sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS))


def _busy_seconds(cores: set[int] | None) -> float | None:
    """CPU seconds spent working on `cores` (every process) since boot; None where psutil cannot tell."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (AttributeError, NotImplementedError, psutil.Error, OSError):
        return None
    picked = [busy_of(t) for index, t in enumerate(per_cpu) if cores is None or index in cores]
    return sum(picked) if picked else None


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
    the ratios then measure that contention too; None where it cannot be told (no per-CPU times)."""
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
        "method": "per-CPU times (psutil) on this process's CPUs minus its own CPU time",
        "other_cpu_s": round(other, 3),
        "other_cores": round(other_cores, 3),
        "share": round(share, 3),
        "high": share >= HIGH_SHARE and other_cores >= _MIN_CORES,
    }


def sibling_cpu_seconds() -> float | None:
    """CPU seconds (user + system) used so far by this process's siblings: the other processes whose
    parent is ours (under xdist: the run's other workers). None where psutil cannot list them."""
    try:
        siblings = [p for p in psutil.Process(os.getppid()).children() if p.pid != os.getpid()]
    except (psutil.Error, OSError):
        return None
    total = 0.0
    for process in siblings:
        try:
            times = process.cpu_times()
        except (psutil.Error, OSError):
            continue  # exited while we looked
        total += times.user + times.system
    return total


def wait_for_siblings(
    *,
    window_s: float = SIBLING_WINDOW_S,
    quiet_cores: float = SIBLING_QUIET_CORES,
    limit_s: float = SIBLING_WAIT_LIMIT_S,
    read: Callable[[], float | None] = sibling_cpu_seconds,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Seconds waited until the run's other workers used under `quiet_cores` for one `window_s`
    (at most `limit_s`; 0.0 at once where `read` cannot tell). Called once the trial mark is up, so
    they are on their way to parking: this waits out the forward each has in flight."""
    started = clock()
    before = read()
    if before is None:
        return 0.0
    while True:
        sleep(window_s)
        after = read()
        if after is None:
            return clock() - started
        # an exited sibling takes its seconds with it: negative use is no use
        if max(0.0, after - before) < quiet_cores * window_s or clock() - started >= limit_s:
            return clock() - started
        before = after
