"""The progress bar and the pytest progress lines: throttled, monotonic, safe from many threads."""

from __future__ import annotations

import io
import threading

import pytest

from pytest_mlxgate.common.format import format_bytes, format_clock
from pytest_mlxgate.models.progress import LineProgress, TerminalBar


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_234_567, "1.2 MB"), (5.6e9, "5.6 GB")]
)
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_format_clock() -> None:
    assert [format_clock(s) for s in (0, 59.9, 61, 3725)] == ["0:00", "0:59", "1:01", "1:02:05"]


def test_bar_shows_bytes_rate_eta_and_throttles() -> None:
    clock, out = Clock(), io.StringIO()
    bar = TerminalBar(out, "org/model", interval=0.5, clock=clock)
    bar(0, 100_000_000)
    clock.now += 0.1
    bar(10_000_000, 100_000_000)  # within the interval: no redraw
    assert out.getvalue().count("\r") == 1
    clock.now += 0.9
    bar(20_000_000, 100_000_000)
    last = out.getvalue().split("\r")[-1]
    assert "20%" in last and "20.0 MB / 100.0 MB" in last
    assert "20.0 MB/s" in last and "ETA 0:04" in last
    clock.now += 1
    bar(100_000_000, 100_000_000)  # completion always draws
    assert "100%" in out.getvalue().split("\r")[-1]
    bar.close()
    assert out.getvalue().endswith("\n")


def test_a_late_report_from_another_thread_never_moves_the_bar_back() -> None:
    out = io.StringIO()
    bar = TerminalBar(out, "x", interval=0)
    bar(20_000_000, 100_000_000)
    bar(15_000_000, 100_000_000)
    assert "20.0 MB / 100.0 MB" in out.getvalue().split("\r")[-1]


def test_bar_rate_counts_only_this_runs_bytes_on_resume() -> None:
    clock, out = Clock(), io.StringIO()
    bar = TerminalBar(out, "x", interval=0, clock=clock)
    bar(50_000_000, 100_000_000)  # 50 MB were already on disk
    clock.now += 2
    bar(60_000_000, 100_000_000)
    assert "5.0 MB/s" in out.getvalue().split("\r")[-1]


def test_bar_prints_nothing_when_nothing_was_drawn() -> None:
    out = io.StringIO()
    TerminalBar(out, "x").close()
    assert out.getvalue() == ""


def test_bar_from_many_threads() -> None:
    out = io.StringIO()
    bar = TerminalBar(out, "x", interval=0)
    total = 8 * 1000

    def worker(k: int) -> None:
        for i in range(1, 1001):
            bar(k * 1000 + i, total)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    frames = out.getvalue().rstrip("\n").split("\r")[1:]
    assert frames and all(f.startswith("x [") for f in frames)  # no interleaved half-frames
    assert "100%" in frames[-1]


def test_line_progress_for_pytest() -> None:
    clock, lines = Clock(), list[str]()
    progress = LineProgress(lines.append, "org/model", interval=5, clock=clock)
    progress(0, 10_000_000)
    progress(1_000_000, 10_000_000)
    assert lines == []  # quick downloads print only the summary
    clock.now += 6
    progress(4_000_000, 10_000_000)
    assert lines == ["mlxgate: fetching org/model: 4.0 MB / 10.0 MB at 666.7 kB/s, ETA 0:09"]
    clock.now += 2
    progress(10_000_000, 10_000_000)
    progress.finish()
    assert lines[-1] == "mlxgate: fetched org/model: 10.0 MB in 8.0 s (1.2 MB/s)"
    assert len(lines) == 2


def test_line_progress_silent_when_cached() -> None:
    lines: list[str] = []
    progress = LineProgress(lines.append, "x")
    progress(0, 100)
    progress.finish()
    assert lines == []


def test_counting_files_instead_of_bytes() -> None:
    clock, lines, out = Clock(), list[str](), io.StringIO()
    progress = LineProgress(lines.append, "smollm2-135m", unit="files", clock=clock)
    bar = TerminalBar(out, "smollm2-135m", unit="files", interval=0, clock=clock)
    for i in range(7):
        clock.now += 0.5
        progress(i, 6)
        bar(i, 6)
    progress.finish("built")
    assert lines == ["mlxgate: built smollm2-135m: 6 files in 3.5 s"]  # from the start, not the first file
    assert "6 files / 6 files" in out.getvalue().split("\r")[-1] and "/s" not in out.getvalue()


def test_counting_items_with_their_rate() -> None:
    """Capability arms: `scoring …: 12 items / 40 items at 2 items/s, ETA 0:14`, then one closing line."""
    clock, lines = Clock(), list[str]()
    progress = LineProgress(
        lines.append,
        "capability mmlu (smoke) reference arm",
        unit="items",
        action="scoring",
        count_rate=True,
        clock=clock,
    )
    progress(0, 40)
    clock.now += 6
    progress(12, 40)
    assert lines == [
        "mlxgate: scoring capability mmlu (smoke) reference arm: 12 items / 40 items at 2 items/s, ETA 0:14"
    ]
    clock.now += 14
    progress(40, 40)
    progress.finish("scored")
    assert lines[-1] == "mlxgate: scored capability mmlu (smoke) reference arm: 40 items in 20.0 s (2 items/s)"
