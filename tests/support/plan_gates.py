"""A weights gate as a plan search reads it, without a gate module: the tiny llama's 8-bit weights gate
(3 prompts of 12 tokens, prefill, mean limit 0.05), for tests of the weights search itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def weights_gate_spec(folder: Path) -> Any:
    from pytest_mlxgate.explain.plan_gate import GateSpec
    from pytest_mlxgate.levers.lever import Lever

    return GateSpec(
        path=folder / "gate.py",
        lever=Lever("weights", "weights", None, None, {"bits": 8}),
        prompts=3,
        tokens=12,
        decode=0,
        limits={"mean": 0.05},
        kl_tests=("test_drift",),
    )
