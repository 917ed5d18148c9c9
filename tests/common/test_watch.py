"""An arm's watch: throttled progress lines with rate and ETA, the time limit (a clock that is moved
by hand, never a timing assert), and the run lock that keeps speed trials alone, across real
processes ordered by a log."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_mlxgate.common.watch import TIMING_MARK, Watcher, progress_interval
from pytest_mlxgate.errors import ArmTimeoutError, GateRunError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watcher(
    clock: Clock, lines: list[str], *, interval: float = 5.0, limit: float | None = None, run_dir: Path | None = None
) -> Watcher:
    return Watcher(say=lines.append, interval=interval, limit_s=limit, run_dir=run_dir, clock=clock)


def test_lines_come_once_per_interval_with_rate_and_eta_and_a_closing_line() -> None:
    clock, lines = Clock(), []
    arm = _watcher(clock, lines).arm("KL candidate arm (norm=fused)", 100, unit="positions")
    clock.now += 2
    arm.advance(10)
    assert lines == []  # under one interval in: a short arm prints nothing
    clock.now += 3
    arm.advance(10)  # 20 of 100 after 5 s: 4 positions/s, 80 left -> 20 s
    clock.now += 1
    arm.advance(10)  # throttled: one line per interval
    assert lines == ["running KL candidate arm (norm=fused): 20 / 100 positions at 4 positions/s, ETA 0:20"]
    clock.now += 4
    arm.advance(70)
    arm.finish()
    assert lines[-1] == "ran KL candidate arm (norm=fused): 100 positions in 10.0 s (10.0 positions/s)"
    assert len(lines) == 2  # the last advance finished the arm: no "100 / 100" progress line


def test_a_short_arm_ends_silently_unless_its_watch_always_closes() -> None:
    clock, lines = Clock(), []
    watcher = _watcher(clock, lines)
    quiet = watcher.arm("KL reference arm", 10, unit="positions")
    quiet.advance(10)
    quiet.finish()
    assert lines == []
    closing = watcher.arm(
        "capability mmlu (smoke) reference arm", 3, unit="items", action="scoring", verb="scored", closing=True
    )
    closing(0, 3)
    clock.now += 2
    closing(3, 3)
    closing.finish()
    assert lines == ["scored capability mmlu (smoke) reference arm: 3 items in 2.0 s (1.5 items/s)"]


def test_the_interval_is_the_option_else_5_s_on_a_terminal_and_30_s_in_a_log() -> None:
    assert progress_interval(None, live=True) == 5.0
    assert progress_interval(None, live=False) == 30.0
    assert progress_interval(0.0, live=False) == 0.0
    clock, lines = Clock(), []
    arm = _watcher(clock, lines, interval=0.0).arm("speed trials", 4, unit="trials", action="timing")
    arm.advance()
    arm.advance()
    assert len(lines) == 2 and lines[0].startswith("timing speed trials: 1 / 4 trials")


def test_an_arm_past_its_limit_raises_saying_which_how_far_and_how_to_raise_it() -> None:
    clock, lines = Clock(), []
    arm = _watcher(clock, lines, limit=60).arm("KL candidate arm (sleepy=on)", 72, unit="positions")
    clock.now += 59
    arm.advance(24)  # inside the limit
    clock.now += 2
    with pytest.raises(ArmTimeoutError) as info:
        arm.advance(24)
    message = str(info.value)
    assert isinstance(info.value, GateRunError)
    assert (
        "the KL candidate arm (sleepy=on) ran past the arm time limit: 48 of 72 positions done in 1 m 01 s" in message
    )
    assert "(limit 60 s, --mlx-arm-timeout)" in message
    assert "--mlx-arm-timeout SECONDS" in message and "0 or none: no limit" in message


def test_check_alone_keeps_the_limit_inside_a_timed_span_and_no_limit_never_raises() -> None:
    clock, lines = Clock(), []
    arm = _watcher(clock, lines, limit=1).arm("speed trials", 2, unit="trials")
    clock.now += 1.5
    with pytest.raises(ArmTimeoutError, match="0 of 2 trials"):
        arm.check()
    unlimited = _watcher(clock, lines, limit=None).arm("speed trials", 2, unit="trials")
    clock.now += 10**6
    unlimited.check()
    unlimited.advance()


def test_a_stale_trial_mark_is_cleared_at_the_next_look(tmp_path: Path) -> None:
    """The mark left by a worker that died while timing: the lock is free, so the next look clears it."""
    clock, lines = Clock(), []
    (tmp_path / TIMING_MARK).write_text("gw7 (speed trials), pid 999999999\n")
    watcher = _watcher(clock, lines, limit=10, run_dir=tmp_path)
    arm = watcher.arm("KL reference arm", 10, unit="positions")
    arm.advance(1)
    assert not (tmp_path / TIMING_MARK).exists()
    assert lines == ["KL reference arm: paused while gw7 (speed trials), pid 999999999 times its speed trials"]
    arm.advance(1)
    assert len(lines) == 1  # nobody times now: no more pauses


# Three real processes share one run folder. A holds the trial lock and does not leave it until B says
# it is about to ask for it and C that it is about to run a forward, then 2 s more; the log says in
# which order things happened. A lock that locks nothing puts "B start" before "A end"; an arm that
# does not pause puts "C forward" there. C's arm has a 1 s limit: its 2 s wait must not count.
_PROCESS = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from pytest_mlxgate.common.watch import Watcher

    role, folder = sys.argv[1], Path(sys.argv[2])
    log = folder / "log.txt"

    def say(event):
        with open(log, "a") as f:
            f.write(f"{role} {event}\\n")

    def wait_for(name):
        while not (folder / name).exists():
            time.sleep(0.01)

    os.environ["PYTEST_XDIST_WORKER"] = f"gw-{role}"
    watcher = Watcher(say=None, interval=5.0, limit_s=1.0 if role == "C" else None, run_dir=folder)
    if role == "A":
        with watcher.timing_alone("speed trials"):
            say("start")
            (folder / "a-started").touch()
            wait_for("b-trying")
            wait_for("c-trying")
            time.sleep(2.0)  # room for a broken lock to let B in: it is the order that is checked
            say("end")
    elif role == "B":
        wait_for("a-started")
        (folder / "b-trying").touch()
        with watcher.timing_alone("speed trials"):
            say("start")
            say("end")
    else:
        wait_for("a-started")
        arm = watcher.arm("KL candidate arm", 2, unit="positions")
        (folder / "c-trying").touch()
        arm.advance(1)
        say("forward")
""")


@pytest.mark.slow  # three Python processes, each importing the package
def test_speed_trials_of_two_processes_never_overlap_and_a_third_ones_arm_waits(tmp_path: Path) -> None:
    script = tmp_path / "process.py"
    script.write_text(_PROCESS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), role, str(run_dir)]) for role in ("A", "B", "C")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    log = (run_dir / "log.txt").read_text().split("\n")[:-1]
    assert sorted(log) == ["A end", "A start", "B end", "B start", "C forward"]
    assert log.index("A end") < log.index("B start") < log.index("B end")
    assert log.index("A end") < log.index("C forward")
    assert not (run_dir / TIMING_MARK).exists()  # the mark goes with the lock
