"""This project's gates/ modules imported by plain name, as gate modules import each other (gates/ itself is
not on sys.path): the kernels and known-bad ops that tests check without running a gate."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

GATES = Path(__file__).resolve().parents[2] / "gates"


def load_gate_module(name: str) -> types.ModuleType:
    """gates/NAME.py, once per process (a second call returns the module the first one loaded)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GATES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
