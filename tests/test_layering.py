"""The package's layering, read from the source (tests/support/import_graph.py): no import cycle, a
controller side that needs nothing but the standard library, a plugin that loads without MLX, the
layers' direction (LAYERS), and module-level imports outside the lazy boundaries (LAZY). Each rule
is also run on a small planted package, so a rule that can no longer fail is seen."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from import_graph import function_level, internal_cycle, layer_of, modules, third_party_reached, upward_imports

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_mlxgate"
HEAVY = ("mlx", "mlx_lm", "numpy", "httpx")

#: The layers, bottom first, one folder each: a module may import its own folder and those below it,
#: never one above (every import counts, in functions and under TYPE_CHECKING too). A module that
#: belongs lower than its folder moves to the folder of its floor. Reorder only when the design moves.
LAYERS = (
    "pytest_mlxgate.errors",  # the exception hierarchy (pytest only)
    "pytest_mlxgate.common",  # atomic writes, formatting, keys, redaction, the sealed cache store, the arms' watch
    "pytest_mlxgate.results",  # records and reports, their words, standard library only: the xdist controller's side
    "pytest_mlxgate.verdicts",  # the assertions' one pipeline (conclude) and the calibration rule of their limits
    "pytest_mlxgate.config",  # options, settings, the shard plan they parse
    "pytest_mlxgate.stats",  # the per-token KL and every interval the verdicts read
    "pytest_mlxgate.hub",
    "pytest_mlxgate.models",
    "pytest_mlxgate.serving",  # the KV plans, their caches and the batched loop over them
    "pytest_mlxgate.remote",  # arms served over HTTP: a server asked, its answers checked
    "pytest_mlxgate.levers",
    "pytest_mlxgate.kl",
    "pytest_mlxgate.speed",
    "pytest_mlxgate.capability",
    "pytest_mlxgate.explain",  # drift attribution and the plan search: run the arms the way kl does, scoped
    "pytest_mlxgate.session",
    "pytest_mlxgate.authoring",
    "pytest_mlxgate",  # the public face: __init__, plugin.py, cli.py, plan_cli.py, history_cli.py, compatibility paths
)

#: Where imports are lazy by design: pytest loads the plugin in every run (the xdist controller too),
#: `__init__` re-exports lazily, config/ is read at option-parse time, results/ on the controller.
LAZY_BOUNDARIES = ("pytest_mlxgate.plugin", "pytest_mlxgate.config", "pytest_mlxgate.results")

_ELSEWHERE = "owned elsewhere in this change"
#: Function-level imports kept outside the boundaries: module (or folder) -> (the imported modules,
#: "*" for all, and why they wait for the function). Everything else imports at module level.
LAZY: dict[str, tuple[tuple[str, ...], str]] = {
    "pytest_mlxgate.cli": (
        ("*",),
        "the `mlxgate` console script: each subcommand imports its implementation "
        "when it runs, so `mlxgate history` loads neither mlx nor httpx",
    ),
    "pytest_mlxgate.plan_cli": (
        ("*",),
        "`mlxgate plan kv|weights`: the search (mlx) loads when a plan is asked for, not with `mlxgate history`",
    ),
    "pytest_mlxgate.history_cli": (
        ("*",),
        "`mlxgate history/trend/merge/report`: each loads the readers it uses (the HTML report, merge) when it runs",
    ),
    "pytest_mlxgate.common.watch": (
        ("filelock",),
        "common/ is imported by everything, the controller too: the trial lock loads when an arm first times alone",
    ),
    "pytest_mlxgate.capability.distributed": (
        ("mlx", "numpy", "pytest_mlxgate.capability.runner"),
        "session/state.py asks launch_rank at configure time, on the controller too: mlx, numpy and the runner "
        "(which imports mlx) load when a distributed run starts",
    ),
    "pytest_mlxgate.serving.kv_plan": (
        ("mlx_lm", "pytest_mlxgate.serving.caches"),
        "session/ and authoring/ import levers.lever, and it this, at module level (the controller among them): "
        "a KV plan parses without mlx; its caches (mlx_lm) load when the plan meets a model",
    ),
    "pytest_mlxgate.levers.reference_ops": (
        ("mlx",),
        "gate modules import these kernels while pytest collects (tests/levers/test_levers.py): "
        "loading it loads no mlx",
    ),
    "pytest_mlxgate.levers.weights": (
        ("mlx", "mlx_lm"),
        "levers.lever imports it (the controller too): a weights value parses without mlx, "
        "quantizing a copy of the model needs it",
    ),
    "pytest_mlxgate.models.device": (
        ("mlx",),
        "the controller reads installed_versions and machine_facts for the header and the reports; "
        "mlx_device says 'no mlx' where it is not installed",
    ),
    "pytest_mlxgate.models.embedded": (
        ("pytest_mlxgate.models.gguf", "pytest_mlxgate.models.gemma3_gguf"),
        "the controller publishes the built-in snapshots; the GGUF converters "
        "(numpy, mlx, tokenizers, gguf) load only when they convert",
    ),
    "pytest_mlxgate.models.loaded": (
        ("mlx_lm", "pytest_mlxgate.models.precision"),
        "levers.weights imports it (the controller too); mlx_lm (and mlx, for a model's dtype) load with the "
        "first model "
        "(tests/session/test_plugin.py stands a fake mlx_lm in sys.modules for that load)",
    ),
    "pytest_mlxgate.authoring": (("*",), _ELSEWHERE),
    "pytest_mlxgate.session": (("*",), _ELSEWHERE),
}


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


#: Loaded when their work starts, never by pytest's start-up (every pytest run in a repo with the
#: plugin installed pays for what plugin.py loads): the read model's ~30 dataclasses cost ~80 ms.
NOT_AT_START = (
    "pytest_mlxgate.results.model",
    "pytest_mlxgate.results.record_kl",
    "pytest_mlxgate.results.runs",
    "pytest_mlxgate.results.summary",
    "pytest_mlxgate.results.html_report",
)


def test_pytest_s_start_up_loads_no_reader_of_the_results() -> None:
    """Measured in a real interpreter, beside the static check above: function-level imports count."""
    code = "import sys, pytest_mlxgate.plugin; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "pytest_mlxgate.plugin" in loaded
    assert not loaded & set(NOT_AT_START), sorted(loaded & set(NOT_AT_START))
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}


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
    root = _package(
        tmp_path,
        {
            "results/report.py": "from ..stats import mean\n",
            "stats/__init__.py": "",
            "stats/mean.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mlx\nimport numpy\n",
            "results/lazy.py": "def f():\n    import httpx\n",
            "results/clean.py": "import json\nimport pytest\ndef f():\n    from ..stats import mean\n",
        },
    )
    reached = third_party_reached(root, "pkg.results.report")
    assert set(reached) == {"numpy"}  # mlx only under TYPE_CHECKING: not run
    assert reached["numpy"][-2:] == [
        "pkg.stats.mean (line 1 of pkg.results.report)",
        "numpy (line 4 of pkg.stats.mean)",
    ]
    assert set(third_party_reached(root, "pkg.results.lazy")) == {"httpx"}  # its own, even in a function
    assert third_party_reached(root, "pkg.results.clean") == {}  # a lazy import elsewhere is not run


def _within(name: str, entry: str) -> bool:
    return name == entry or name.startswith(entry + ".")


def test_imports_go_down_the_layers() -> None:
    """A new upward import (results/ reaching into kl/, models/ into session/...) fails here by name."""
    upward = upward_imports(PACKAGE, LAYERS)
    assert not upward, (
        "imports against the layers (tests/test_layering.py LAYERS, bottom first):\n"
        + "\n".join(upward)
        + "\nMove what is imported down a layer, or import it from "
        "where it belongs; reorder LAYERS only when the design changes."
    )


def test_every_layer_names_a_module_or_folder_that_exists() -> None:
    mods = modules(PACKAGE)
    assert [e for e in LAYERS if e not in mods] == []
    assert len(set(LAYERS)) == len(LAYERS)


def test_the_readme_gives_each_folder_its_floor_in_the_layers_order() -> None:
    """The Layout table's floors are LAYERS, bottom first, so what it says a folder may import is what
    this test allows (the exception hierarchy, errors.py, sits under the floors)."""
    readme = (PACKAGE.parent / "README.md").read_text()
    floors = re.findall(r"^\| (\d+) \| `(pytest_mlxgate/(?:\w+/)?)` \|", readme, flags=re.MULTILINE)
    shown = [(int(n), folder.rstrip("/").replace("/", ".")) for n, folder in floors]
    assert shown == list(enumerate([e for e in LAYERS if e != "pytest_mlxgate.errors"], start=1))


def test_every_folder_of_the_package_has_its_place_in_the_layers() -> None:
    """A new folder is placed on purpose, not left to fall into the top layer with plugin.py."""
    folders = {f"pytest_mlxgate.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(folders - set(LAYERS)) == [], "add each to LAYERS in tests/test_layering.py, where its imports put it"


def _lazy_reason(source: str, target: str) -> str | None:
    for entry, (targets, why) in LAZY.items():
        if _within(source, entry) and any(t == "*" or _within(target, t) for t in targets):
            return why
    return None


def _boundary(source: str) -> bool:
    return any(_within(source, b) for b in LAZY_BOUNDARIES) or modules(PACKAGE)[source].name == "__init__.py"


def test_imports_are_at_module_level_outside_the_lazy_boundaries() -> None:
    """An import inside a function hides a dependency (the layering, mypy's import order and the
    reader all see it late): only the boundaries and LAZY's reasons keep one."""
    lazy = [
        f"{imp.source} (line {imp.line}) imports {imp.target} inside a function"
        for imp in function_level(PACKAGE)
        if not _boundary(imp.source) and _lazy_reason(imp.source, imp.target) is None
    ]
    assert not lazy, (
        "\n".join(lazy) + "\nImport it at module level; where the module must load without it "
        "(the controller imports the module, mlx at load time...), add it to LAZY in "
        "tests/test_layering.py with the reason."
    )


def test_every_lazy_entry_is_still_needed() -> None:
    """LAZY shrinks with the code: an entry no import uses any more goes."""
    used = [(imp.source, imp.target) for imp in function_level(PACKAGE)]
    mods = modules(PACKAGE)
    stale = []
    for entry, (targets, _) in LAZY.items():
        assert any(_within(m, entry) for m in mods), f"LAZY names {entry}, which is no module or folder"
        for t in targets:
            if not any(_within(s, entry) and (t == "*" or _within(g, t)) for s, g in used):
                stale.append(f"{entry}: {t}")
    assert not stale, "LAZY entries no function-level import needs any more: " + ", ".join(stale)


def test_a_planted_upward_import_is_named_with_the_rule(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import x\n",
            "high.py": "from . import low\n",
            "mid/__init__.py": "",
            "mid/base.py": "from .. import low\n",
            "mid/top.py": "from . import base\n",
        },
    )
    layers = ("pkg.low", "pkg.mid.base", "pkg.mid", "pkg")
    assert layer_of("pkg.mid.top", layers) == 2 and layer_of("pkg.mid.base", layers) == 1
    assert upward_imports(root, layers) == [
        "pkg.low (line 3) imports pkg.high: layer 0 (pkg.low) may import its own layer and those below it, "
        "not layer 3 (pkg)"
    ]  # TYPE_CHECKING counts; `from . import low` is pkg.low, not pkg itself
    assert upward_imports(root, ("pkg.low", "pkg.high", "pkg")) != []
    clean = _package(tmp_path / "ok", {"low.py": "import json\n", "high.py": "from . import low\n"})
    assert upward_imports(clean, ("pkg.low", "pkg")) == []


def test_a_planted_function_level_import_is_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "import json\ndef f():\n    import numpy\n    g = lambda: __import__('x')\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\ntry:\n    import mlx\n"
            "except ImportError:\n    mlx = None\nclass C:\n    def m(self):\n        from . import a\n",
        },
    )
    found = sorted((imp.source, imp.target, imp.line) for imp in function_level(root))
    assert found == [("pkg.a", "numpy", 3), ("pkg.b", "pkg.a", 10)]  # not TYPE_CHECKING, not a module-level try


def test_the_real_check_fails_on_a_planted_lazy_import() -> None:
    """The allowlist is not a blanket: a function-level import in a module of no boundary is reported."""
    assert _lazy_reason("pytest_mlxgate.kl.arms", "mlx.core") is None
    assert not _boundary("pytest_mlxgate.kl.arms")
    assert _lazy_reason("pytest_mlxgate.serving.kv_plan", "mlx_lm.models.cache") is not None
    assert _lazy_reason("pytest_mlxgate.serving.kv_plan", "numpy") is None
    assert _boundary("pytest_mlxgate.results.summary") and _boundary("pytest_mlxgate.hub")


#: A module a reader can hold in mind at once: a larger one is two concerns, split by what each is for.
MOST_LINES = 600


def test_no_module_is_a_big_room() -> None:
    big = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert big == {}, f"over {MOST_LINES} lines: {big}"
