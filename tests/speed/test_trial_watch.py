"""Speed trials under their watch, on real forwards of the tiny model: the run's trial mark and lock
are held for exactly the trials (seen from inside a forward), a progress line per trial counts them
all, the record says what other load was seen, and trials past the time limit stop with the error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.common.watch import TIMING_LOCK, TIMING_MARK, Watcher
from pytest_mlxgate.errors import ArmTimeoutError
from pytest_mlxgate.levers.parsing import lever_from_marker
from pytest_mlxgate.speed.measure import ArmModel, measure_speed
from pytest_mlxgate.speed.shape import SpeedShape

IDS = list(range(200, 520))
SHAPE = SpeedShape(contexts=(16,), decode=2, repetitions=3)


@pytest.fixture(scope="module")
def tiny(tiny_kv_model_dir: Path) -> Any:
    from mlx_lm import load

    return load(str(tiny_kv_model_dir))[0]


def _lever() -> Any:
    return lever_from_marker(
        pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1").mark, base_dir=Path.cwd()
    )


@contextmanager
def _each_forward(model: Any, see: Any) -> Iterator[None]:
    cls = type(model)
    original = cls.__call__

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        see()
        return original(self, *args, **kwargs)

    cls.__call__ = call
    try:
        yield
    finally:
        cls.__call__ = original


def _lock_is_free(run_dir: Path) -> bool:
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(run_dir / TIMING_LOCK)).acquire(timeout=0):
            return True
    except Timeout:
        return False


def test_the_trials_hold_the_run_lock_and_mark_and_count_every_trial(tiny: Any, tmp_path: Path) -> None:
    lines: list[str] = []
    seen: list[tuple[bool, bool]] = []
    watcher = Watcher(say=lines.append, interval=0.0, limit_s=None, run_dir=tmp_path)
    with _each_forward(tiny, lambda: seen.append(((tmp_path / TIMING_MARK).exists(), _lock_is_free(tmp_path)))):
        found = measure_speed(
            lever=_lever(),
            reference=ArmModel(tiny, "reference"),
            candidate=ArmModel(tiny, "candidate"),
            token_ids=IDS,
            shape=SHAPE,
            watch=watcher,
        )
    assert seen and all(marked and not free for marked, free in seen)  # every forward of every trial
    assert not (tmp_path / TIMING_MARK).exists() and _lock_is_free(tmp_path)  # released after
    trials = 2 * (SHAPE.warmup + SHAPE.repetitions)
    progress = [line for line in lines if line.startswith("timing speed trials")]
    assert progress[0].startswith(f"timing speed trials (both arms, ABBA): 1 / {trials} trials at ")
    assert len(progress) == trials - 1 and lines[-1].startswith(
        f"timed speed trials (both arms, ABBA): {trials} trials"
    )
    record = found.to_json()["load_seen"]
    assert record["waited_for_lock_s"] == 0.0 and record["wall_s"] > 0 and "high" in record


def test_trials_past_the_limit_stop_with_the_error(tiny: Any) -> None:
    clock = iter(range(0, 10**6, 10))  # every look at the clock: 10 s later

    watcher = Watcher(say=None, interval=5.0, limit_s=25.0, clock=lambda: float(next(clock)))
    with pytest.raises(
        ArmTimeoutError,
        match=r"the speed trials \(both arms, ABBA\) ran past the arm time limit: "
        r"0 of 8 trials done in .* \(limit 25 s",
    ):
        measure_speed(
            lever=_lever(),
            reference=ArmModel(tiny, "reference"),
            candidate=ArmModel(tiny, "candidate"),
            token_ids=IDS,
            shape=SHAPE,
            watch=watcher,
        )
