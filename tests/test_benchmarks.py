"""`./dev bench NAME` runs `benchmarks/NAME.py`'s main: every name the runner lists must be such a module
(a name left behind by a removed benchmark made `./dev bench`, all of them, die on import)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS


def test_every_listed_benchmark_is_a_module_with_a_main() -> None:
    for name in BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(getattr(module, "main", None)), name
        assert (module.__doc__ or "").strip(), f"benchmarks/{name}.py says what it measures in its docstring"


def test_the_gates_benchmark_runs_the_workers_dev_gates_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It times what `./dev gates` runs: the worker count comes from the script, never a copy of it."""
    from benchmarks.gates import dev_gates_workers, workers_args

    monkeypatch.delenv("MLXGATE_GATES_WORKERS", raising=False)
    dev = tmp_path / "dev"
    dev.write_text('workers="${MLXGATE_GATES_WORKERS:-3}"\n')
    assert workers_args(dev_gates_workers(dev)) == ["-n", "3"]
    monkeypatch.setenv("MLXGATE_GATES_WORKERS", "0")
    assert workers_args(dev_gates_workers(dev)) == []  # one process, as ./dev gates runs it then
    dev.write_text("exec python -m pytest gates/\n")
    with pytest.raises(SystemExit, match="no MLXGATE_GATES_WORKERS default"):
        dev_gates_workers(dev)
    monkeypatch.delenv("MLXGATE_GATES_WORKERS")
    assert dev_gates_workers() >= 1  # this repository's ./dev gates: read from it, under xdist
