"""Was the machine busy with other work while speed was timed?

Speed ratios assume both arms had the machine to themselves; another xdist worker's arms, a build or
a browser on the same cores slow whichever trial they overlap. Before and after the trials this
reads the CPU time every process spent on the cores this one may use (Linux: /proc/stat, per CPU,
restricted to the process's affinity) and this process's own CPU time: the difference is what
others used. Elsewhere only the load average is recorded, which counts this process too, so no
verdict is drawn from it.

Under xdist another worker of the run parks at the trial mark only between its forwards
(session/watch.py), so one in flight when the trials start would run beside them (measured: a
long-context capability batch kept 1.0 of 2 cores busy through a weights gate's trials: decode
x0.61 [0.39, 0.94], usually [0.46, 0.55]). `wait_for_siblings` waits, before the first trial, until
the run's other workers (this process's siblings under the xdist controller) use under a tenth of a
core for a window. It reads only them, so unrelated load never holds the trials up. Linux reads
/proc; elsewhere it cannot tell and waits for nothing. Standard library only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HIGH_SHARE", "CpuSample", "load_seen", "sample", "sibling_cpu_seconds", "wait_for_siblings"]

#: Other processes' load is "high" from a quarter of the cores (and at least half a core) on average.
HIGH_SHARE = 0.25
_MIN_CORES = 0.5
#: /proc/stat's columns that are work: user nice system (idle iowait) irq softirq steal.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
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


def sibling_cpu_seconds(proc: Path = Path("/proc")) -> float | None:
    """CPU seconds (user + system) used so far by this process's siblings: the other processes whose
    parent is ours (under xdist: the run's other workers). None where /proc cannot tell (not Linux)."""
    me, parent = os.getpid(), os.getppid()
    if not (proc / "self" / "stat").exists():
        return None
    ticks = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # exited while we looked
        # pid (comm) state ppid ... utime stime: comm may hold spaces and parentheses, so split after it
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 12 and fields[1] == str(parent):
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


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
