"""Other load while speed is timed: a real busy child process is seen as other processes' CPU time
(this process's own is not), the record says when it was high, and the summary warns then only."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from speed_words import load_warning, speed_lines

from pytest_mlxgate.speed.load import SIBLING_WINDOW_S, CpuSample, load_seen, sample, wait_for_siblings


def test_a_busy_child_process_is_other_load_and_our_own_work_is_not() -> None:
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = sample()
    # a child that spins for ~1 s of CPU on one of our cores
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    after = sample()
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (child.ru_utime - before_children.ru_utime) + (child.ru_stime - before_children.ru_stime)
    seen = load_seen(before, after)
    # everything else on the machine only adds to it; /proc/stat counts in 10 ms ticks per CPU
    assert seen["other_cpu_s"] >= child_cpu - 0.05 * after.cores - 0.05
    assert seen["method"].startswith("per-CPU times (psutil)") and seen["cores"] == len(os.sched_getaffinity(0))

    before = sample()
    t = time.process_time()
    while time.process_time() - t < 1.0:  # this process's own work
        pass
    after = sample()
    assert after.own_s - before.own_s >= 1.0
    mine = load_seen(before, after)
    # our second of CPU is not "other" load: at most what the rest of the machine did meanwhile
    assert mine["other_cpu_s"] <= (after.busy_s - before.busy_s) - 1.0 + 0.05 * after.cores + 0.05  # type: ignore[operator]


def _sample(wall: float, busy: float | None, own: float, cores: int = 4) -> CpuSample:
    return CpuSample(wall=wall, busy_s=busy, own_s=own, loadavg=1.0, cores=cores)


def test_high_is_a_quarter_of_the_cores_and_at_least_half_a_core() -> None:
    # 10 s: we used 20 CPU-s of the 4 cores, others 10 -> 1 core of 4: a quarter, high
    high = load_seen(_sample(0, 100, 5), _sample(10, 130, 25), waited_s=1.25)
    assert (high["other_cpu_s"], high["other_cores"], high["share"], high["high"]) == (10.0, 1.0, 0.25, True)
    assert high["waited_for_lock_s"] == 1.25
    low = load_seen(_sample(0, 100, 5), _sample(10, 129, 25))
    assert low["share"] == 0.225 and low["high"] is False
    one_core = load_seen(_sample(0, 0, 0, cores=1), _sample(10, 4, 0, cores=1))  # 40% of one core: < 0.5 core
    assert one_core["share"] == 0.4 and one_core["high"] is False
    unknown = load_seen(_sample(0, None, 0), _sample(10, None, 5))
    assert unknown["high"] is None and unknown["other_cores"] is None and "getloadavg" in unknown["method"]


def test_the_summary_warns_when_the_record_says_high_and_only_then() -> None:
    speed = {"contexts": {}, "load_seen": {"high": True, "other_cores": 1.0, "cores": 2, "share": 0.5}}
    assert speed_lines(speed)[-1].startswith(
        "⚠ speed timed under load: other processes kept 1.0 of 2 cores busy (50%) during the trials"
    )
    for seen in ({"high": False, "other_cores": 0.1, "cores": 2, "share": 0.05}, {"high": None}, None, "junk"):
        assert load_warning(seen) is None
        assert speed_lines({"contexts": {}, "load_seen": seen}) == []


def test_waiting_for_siblings_ends_at_the_first_quiet_window_and_never_past_its_limit() -> None:
    """Sibling CPU seconds, read once per 0.3 s window: busy (a full core) for three windows, then idle."""
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    def run(readings: list[float | None], limit_s: float = 120.0) -> tuple[float, int]:
        left = iter(readings)
        reads = [0]

        def read() -> float | None:
            reads[0] += 1
            return next(left)

        clock[0] = 0.0
        waited = wait_for_siblings(read=read, clock=lambda: clock[0], sleep=sleep, limit_s=limit_s)
        return waited, reads[0]

    busy_then_idle = [10.0, 10.3, 10.6, 10.9, 10.9]
    waited, reads = run(busy_then_idle)
    assert reads == 5 and waited == pytest.approx(4 * SIBLING_WINDOW_S)  # the quiet window is the fourth
    assert run([5.0, 5.0])[0] == pytest.approx(SIBLING_WINDOW_S)  # parked already: one window
    assert run([None]) == (0.0, 1)  # cannot tell (not Linux): no wait at all
    forever_busy = [float(i) for i in range(1000)]
    waited, _ = run(forever_busy, limit_s=3.0)
    assert 3.0 <= waited < 3.0 + SIBLING_WINDOW_S + 1e-9  # a stall is not waited out
    assert run([4.0, 1.0])[0] == pytest.approx(SIBLING_WINDOW_S)  # a sibling that exited: its seconds left


# A parent that, like the xdist controller, has two children. B waits for A to be ready, spins for SPIN
# seconds (a forward in flight) and then idles (a parked or idle worker); A takes the speed-trial lock
# with the real settle at once. A must have waited out B's spin, and not its idling.
_SIBLINGS = textwrap.dedent("""
    import subprocess, sys
    folder = sys.argv[1]
    spin = (
        "import sys, time\\n"
        "from pathlib import Path\\n"
        "ready = Path(sys.argv[1]) / 'ready'\\n"
        "while not ready.exists(): time.sleep(0.005)\\n"
        "t = time.process_time()\\n"
        "while time.process_time() - t < SPIN: pass\\n"
        "time.sleep(6)\\n"
    )
    holder = (
        "import sys\\n"
        "from pathlib import Path\\n"
        "from pytest_mlxgate.common.watch import Watcher\\n"
        "from pytest_mlxgate.speed.load import wait_for_siblings\\n"
        "folder = Path(sys.argv[1])\\n"
        "w = Watcher(say=None, interval=5.0, limit_s=None, run_dir=folder, settle=wait_for_siblings)\\n"
        "(folder / 'ready').touch()\\n"
        "with w.timing_alone('speed trials') as waited:\\n"
        "    (folder / 'waited').write_text(str(waited))\\n"
    )
    busy = subprocess.Popen([sys.executable, "-c", spin, folder])
    subprocess.run([sys.executable, "-c", holder, folder], check=True)
    busy.kill()
""")
SPIN = 1.5


@pytest.mark.slow  # three Python processes, one importing the package
def test_speed_trials_wait_for_a_sibling_workers_forward_in_flight_and_not_for_its_idling(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(_SIBLINGS.replace("SPIN", repr(SPIN)))
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=60)
    waited = float((tmp_path / "waited").read_text())
    # B's spin is CPU time: on a loaded machine it takes longer in wall time, never shorter; its 6 s idle
    # after it must not be waited for
    assert SPIN - 0.5 <= waited < SPIN + 4.0, waited


def test_the_macos_shape_of_the_readings_is_counted_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS has no CPU affinity and its per-CPU times are user, nice, system, idle only: the same code
    reads them (all CPUs, the three work fields), so the load warning works there too."""
    from collections import namedtuple

    import psutil

    from pytest_mlxgate.speed import load

    darwin = namedtuple("scputimes", ["user", "nice", "system", "idle"])
    linux = psutil.cpu_times(percpu=True)[0]
    assert load.busy_of(darwin(3.0, 1.0, 2.0, 50.0)) == 6.0  # idle is not work
    assert load.busy_of(linux) == pytest.approx(
        linux.user + linux.nice + linux.system + linux.irq + linux.softirq + linux.steal
    )  # iowait and guest (inside user) are not added
    monkeypatch.delattr(psutil.Process, "cpu_affinity", raising=False)
    monkeypatch.setattr(
        psutil, "cpu_times", lambda percpu=False: [darwin(3.0, 1.0, 2.0, 9.0), darwin(1.0, 0.0, 1.0, 9.0)]
    )
    got = load.sample()
    assert got.busy_s == 8.0 and got.cores == (os.cpu_count() or 1)


def test_the_run_s_other_workers_are_this_process_s_siblings(tmp_path: Path) -> None:
    """Two children of one parent: one spins 0.6 s of CPU, then says so and idles; the other then reads
    its sibling's CPU seconds (psutil, one path on every system), not its own."""
    spin = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.6: pass\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(30)\n"
    )
    read = (
        "import os, sys, time\n"
        "from pytest_mlxgate.speed.load import sibling_cpu_seconds\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
        "print(sibling_cpu_seconds())\n"
    )
    done = tmp_path / "spun"
    parent = (
        "import subprocess, sys\n"
        f"busy = subprocess.Popen([sys.executable, '-c', {spin!r}, {str(done)!r}])\n"
        f"out = subprocess.run([sys.executable, '-c', {read!r}, {str(done)!r}], capture_output=True, text=True)\n"
        "busy.kill()\n"
        "print(out.stdout.strip() or out.stderr)\n"
    )
    seen = float(subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60).stdout)
    assert 0.55 <= seen < 3.0, seen  # the sibling's spin (and its start), not the reader's own import
