"""`./dev bench NAME` runs `benchmarks/NAME.py`'s main: every name the runner lists must be such a module
(a name left behind by a removed benchmark made `./dev bench`, all of them, die on import)."""

from __future__ import annotations

import importlib

from benchmarks.__main__ import BENCHMARKS


def test_every_listed_benchmark_is_a_module_with_a_main() -> None:
    for name in BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(getattr(module, "main", None)), name
        assert (module.__doc__ or "").strip(), f"benchmarks/{name}.py says what it measures in its docstring"
