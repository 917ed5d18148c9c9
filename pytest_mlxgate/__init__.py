"""pytest-mlxgate: the quality gate for MLX inference performance work.

KL drift and capability between a reference arm and a candidate arm, on verified model snapshots.
Importing this package imports neither mlx, mlx_lm nor httpx: every name below loads its module
on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `name as name`: the names a type checker sees exported (mypy --strict in gates too)
    from .authoring.known_bad import assert_known_bad_fails as assert_known_bad_fails
    from .capability.assertions import assert_capability_at_least as assert_capability_at_least
    from .capability.base import Budget as Budget
    from .capability.user_tasks import jsonl_task as jsonl_task
    from .capability.user_tasks import register_task as register_task
    from .config.names import CandidateSpec as CandidateSpec
    from .config.names import parse_name as parse_name
    from .errors import (
        InconclusiveGateWarning as InconclusiveGateWarning,
    )
    from .errors import (
        MlxgateError as MlxgateError,
    )
    from .errors import (
        MlxgateUsageError as MlxgateUsageError,
    )
    from .errors import (
        MlxgateWarning as MlxgateWarning,
    )
    from .errors import (
        ModelNameError as ModelNameError,
    )
    from .errors import (
        ModelUnavailableError as ModelUnavailableError,
    )
    from .hub import HubError as HubError
    from .hub import snapshot_download as snapshot_download
    from .hub import verify_snapshot as verify_snapshot
    from .kl.assertions import assert_kl_below as assert_kl_below
    from .kl.result import KLResult as KLResult
    from .levers.lever import Lever as Lever
    from .models.device import blas_in_use as blas_in_use
    from .models.device import mlx_device as mlx_device
    from .models.materialize import ResolvedSnapshot as ResolvedSnapshot
    from .models.materialize import materialize as materialize
    from .session.paired import Paired as Paired
    from .speed.assertions import assert_faster as assert_faster
    from .speed.assertions import assert_smaller as assert_smaller

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
    "assert_smaller": "speed.assertions",
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
