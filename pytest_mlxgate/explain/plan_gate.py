"""What a plan search needs of a gate module (a KV gate for `plan kv`, a weights gate for `plan weights`): its
lever, its sizes and its KL limits (`read_gate`), shared by the searches (`plan_kv`, `plan_frontier`,
`plan_weights`) and the verification that runs the gate (`plan_verify`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..common.gate_calls import declared_limits
from ..errors import MlxgateUsageError
from ..levers.lever import Lever
from ..levers.parsing import lever_from_marker

__all__ = ["GateSpec", "read_gate"]


@dataclass(frozen=True)
class GateSpec:
    """What the search needs of a gate module: its lever, sizes and mean/p99/top-1 limits."""

    path: Path
    lever: Lever
    prompts: int
    tokens: int
    decode: int
    limits: Mapping[str, float]
    kl_tests: tuple[str, ...]


#: What each plan kind searches, the lever kind its gate must have, and an example gate.
_PLANNED: dict[str, tuple[str, str]] = {
    "kv": ("KV", "gates/test_kv_cache.py"),
    "weights": ("weight", "gates/test_weights_8bit.py"),
}


def read_gate(path: Path, *, model: str | None = None, kind: Literal["kv", "weights"] = "kv") -> GateSpec:
    """Import the gate module and read its `mlx_lever`/`mlx_kl` marks and `assert_kl_below` limits (a
    `models=` entry for `model` replaces the gate's own). MlxgateUsageError when its lever is not of `kind`,
    or its reference arm is not what the plans are priced against (the plain cache, the weights as loaded)."""
    what, example = _PLANNED[kind]
    if not path.is_file():
        raise MlxgateUsageError(f"--gate {path}: no such file; give a gate module, e.g. {example}")
    spec = importlib.util.spec_from_file_location(f"_mlxgate_plan_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    lever_mark = next((m.mark for m in marks if getattr(m, "name", "") == "mlx_lever"), None)
    if lever_mark is None:
        raise MlxgateUsageError(f"{path} declares no mlx_lever: give a {what} gate module, e.g. {example}")
    lever = lever_from_marker(lever_mark, base_dir=path.parent)
    if lever.kind != kind:
        raise MlxgateUsageError(
            f"{path}'s lever {lever.name!r} is a {lever.kind} lever: `plan {kind}` searches {what} plans; give a "
            f"{what} gate module, e.g. {example}"
        )
    if kind == "kv" and not lever.kv_plan("reference").is_plain:
        raise MlxgateUsageError(f"{path}'s reference arm is not the plain cache: the search prices plans against it")
    if kind == "weights" and lever.weights_spec("reference") is not None:
        raise MlxgateUsageError(
            f"{path}'s reference arm is not the weights as loaded: the search prices plans against them"
        )
    kl_mark = next((m.mark for m in marks if getattr(m, "name", "") == "mlx_kl"), None)
    sizes = dict(kl_mark.kwargs) if kl_mark is not None else {}
    found, _ = declared_limits(path, {"assert_kl_below"})
    limits: dict[str, float] = {}
    for limit in found:
        if limit.model is None:
            limits.setdefault(limit.key, limit.value)
    for limit in found:
        if limit.model is not None and limit.model == model:
            limits[limit.key] = limit.value
    if "mean" not in limits:
        raise MlxgateUsageError(f"{path} asserts no mean KL limit (assert_kl_below(paired, mean=...)): nothing to meet")
    return GateSpec(
        path=path,
        lever=lever,
        prompts=int(sizes.get("prompts", 64)),
        tokens=int(sizes.get("tokens", 256)),
        decode=int(sizes.get("decode", 32)),
        limits=limits,
        kl_tests=tuple(sorted({limit.test for limit in found})),
    )
