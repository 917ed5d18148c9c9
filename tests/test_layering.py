"""The package's layering, read from the source (tests/support/import_graph.py): no import cycle, a
controller side that needs nothing but the standard library, a plugin that loads without MLX. Each
rule is also run on a small planted package, so a rule that can no longer fail is seen."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from import_graph import internal_cycle, modules, third_party_reached

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_mlxgate"
HEAVY = ("mlx", "mlx_lm", "numpy", "httpx")


def test_the_package_has_no_import_cycle() -> None:
    cycle = internal_cycle(PACKAGE)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", sorted(m for m in modules(PACKAGE) if m.startswith("pytest_mlxgate.results")))
def test_results_needs_only_the_standard_library(module: str) -> None:
    """The xdist controller imports results/ to write the reports: numpy, mlx or httpx there would load
    them (seconds, GBs on a Mac) into a process that measures nothing."""
    reached = third_party_reached(PACKAGE, module)
    assert not reached, "\n".join(" -> ".join(chain) for chain in reached.values())


def test_the_plugin_loads_without_mlx_or_numpy() -> None:
    reached = third_party_reached(PACKAGE, "pytest_mlxgate.plugin")
    heavy = {m: chain for m, chain in reached.items() if m.split(".")[0] in HEAVY}
    assert not heavy, "\n".join(" -> ".join(chain) for chain in heavy.values())


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", "results/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_a_planted_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"})
    assert internal_cycle(root) == ["pkg.a", "pkg.b", "pkg.a"]
    root = _package(tmp_path / "ok", {"a.py": "from . import b\n", "b.py": "import json\n"})
    assert internal_cycle(root) is None


def test_a_planted_numpy_on_the_controller_side_is_found_with_its_chain(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "results/report.py": "from ..stats import mean\n",
        "stats/__init__.py": "",
        "stats/mean.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mlx\nimport numpy\n",
        "results/lazy.py": "def f():\n    import httpx\n",
        "results/clean.py": "import json\nimport pytest\ndef f():\n    from ..stats import mean\n",
    })
    reached = third_party_reached(root, "pkg.results.report")
    assert set(reached) == {"numpy"}  # mlx only under TYPE_CHECKING: not run
    assert reached["numpy"][-2:] == ["pkg.stats.mean (line 1 of pkg.results.report)",
                                     "numpy (line 4 of pkg.stats.mean)"]
    assert set(third_party_reached(root, "pkg.results.lazy")) == {"httpx"}  # its own, even in a function
    assert third_party_reached(root, "pkg.results.clean") == {}  # a lazy import elsewhere is not run
