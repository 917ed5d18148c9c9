"""pytest-mlxgate: the quality gate for MLX inference performance work.

KL drift and capability between a reference arm and a candidate arm, on verified model snapshots.
Importing this package imports neither mlx, mlx_lm nor httpx: every name below loads its module
on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import assert_kl_below
    from .capability.assertions import assert_capability_at_least
    from .device import blas_in_use, mlx_device
    from .errors import (
        MlxgateError,
        MlxgateUsageError,
        MlxgateWarning,
        ModelNameError,
        ModelUnavailableError,
    )
    from .hub import HubError, snapshot_download, verify_snapshot
    from .levers import Lever
    from .names import CandidateSpec, parse_name
    from .paired import KLResult, Paired
    from .snapshots import ResolvedSnapshot, materialize

#: public name -> the module that defines it
_LAZY: dict[str, str] = {
    "CandidateSpec": "names",
    "KLResult": "paired",
    "Lever": "levers",
    "Paired": "paired",
    "assert_capability_at_least": "capability.assertions",
    "assert_kl_below": "assertions",
    "HubError": "hub",
    "MlxgateError": "errors",
    "MlxgateUsageError": "errors",
    "MlxgateWarning": "errors",
    "ModelNameError": "errors",
    "ModelUnavailableError": "errors",
    "ResolvedSnapshot": "snapshots",
    "blas_in_use": "device",
    "materialize": "snapshots",
    "mlx_device": "device",
    "parse_name": "names",
    "snapshot_download": "hub",
    "verify_snapshot": "hub",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
