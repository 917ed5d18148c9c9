"""pytest-mlxgate: the quality gate for MLX inference performance work.

KL drift and capability between a reference arm and a candidate arm, on verified model snapshots.
Importing this package imports neither mlx, mlx_lm nor httpx: every name below loads its module
on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .authoring.known_bad import assert_known_bad_fails
    from .capability.assertions import assert_capability_at_least
    from .capability.base import Budget
    from .capability.user_tasks import jsonl_task, register_task
    from .config.names import CandidateSpec, parse_name
    from .errors import (
        InconclusiveGateWarning,
        MlxgateError,
        MlxgateUsageError,
        MlxgateWarning,
        ModelNameError,
        ModelUnavailableError,
    )
    from .hub import HubError, snapshot_download, verify_snapshot
    from .kl.assertions import assert_kl_below
    from .kl.result import KLResult
    from .levers.lever import Lever
    from .models.device import blas_in_use, mlx_device
    from .models.materialize import ResolvedSnapshot, materialize
    from .session.paired import Paired
    from .speed.assertions import assert_faster

#: public name -> the module that defines it
_LAZY: dict[str, str] = {
    "Budget": "capability.base",
    "CandidateSpec": "config.names",
    "InconclusiveGateWarning": "errors",
    "KLResult": "kl.result",
    "Lever": "levers.lever",
    "Paired": "session.paired",
    "assert_capability_at_least": "capability.assertions",
    "assert_faster": "speed.assertions",
    "assert_kl_below": "kl.assertions",
    "assert_known_bad_fails": "authoring.known_bad",
    "jsonl_task": "capability.user_tasks",
    "register_task": "capability.user_tasks",
    "HubError": "hub",
    "MlxgateError": "errors",
    "MlxgateUsageError": "errors",
    "MlxgateWarning": "errors",
    "ModelNameError": "errors",
    "ModelUnavailableError": "errors",
    "ResolvedSnapshot": "models.materialize",
    "blas_in_use": "models.device",
    "materialize": "models.materialize",
    "mlx_device": "models.device",
    "parse_name": "config.names",
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
