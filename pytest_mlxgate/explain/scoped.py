"""The candidate applied to one scope of layers, the reference everywhere else: each lever kind's way.

- kv: a plan with the candidate's spec on the scope's cached layers and the reference's elsewhere
  (written as a kv_config.json, so it is a plan like any other);
- weights, model: the reference model with the scope's layers taken from the candidate's model;
- patch, env, context: the reference arm, with the candidate's value in force only while the scope's
  layers run their forward (each layer's `__call__` wrapped). A patched function the layers never call,
  or a setting read once at load time, cannot be scoped: `Scoped.unscopable` says which.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from ..levers.lever import Arm, Lever
from ..levers.patching import counted, patched, resolve_object
from ..serving.caches import attention_type, quantized_form
from .layers import decoder_layers, inside, layers_from

__all__ = ["Scope", "Scoped", "kv_scoped_plan", "scoped"]


@dataclass(frozen=True)
class Scope:
    """Layers the candidate is applied to together: one layer, a block, or an attention type."""

    name: str  # "layer 3", "layers 0-4", "sliding layers"
    layers: tuple[int, ...]
    kind: str  # "layer" | "block" | "type" | "rest" (everything but the layers: embedding, final norm, head)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "layers": list(self.layers), "kind": self.kind}


@dataclass
class Scoped:
    """What to run for one scope: this model, under this lever's 'candidate' arm."""

    model: Any
    lever: Lever
    calls: list[int]  # patch levers: the patched site's calls inside the scope (else stays [0], unused)


def kv_scoped_plan(lever: Lever, model: Any, layers: Sequence[int]) -> dict[str, Any]:
    """The kv_config the scope runs: the candidate's spec on `layers`, the reference's on every other
    cached layer (by each cache's attention type), as JSON."""
    ref, cand = lever.kv_plan("reference"), lever.kv_plan("candidate")
    chosen = set(layers)
    out: dict[str, Any] = {}
    for i, c in enumerate(make_prompt_cache(model)):
        if quantized_form(c) is None:
            continue
        spec = (cand if i in chosen else ref).for_layer(i, attention_type(c))
        out[str(i)] = None if spec is None else spec.to_json()
    return {"default": None, "layers": out}


def scoped(lever: Lever, scope: Scope, *, reference: Any, candidate: Any, workdir: Path) -> Scoped:
    """The scope's arm. `reference`/`candidate`: the two arms' models (the same object but for
    weights and model levers); `workdir` holds the scope's kv_config.json."""
    name = f"{lever.name}@{scope.name}"
    if lever.kind == "kv":
        path = workdir / f"scope-{'-'.join(map(str, scope.layers)) or 'none'}.json"
        path.write_text(json.dumps(kv_scoped_plan(lever, reference, scope.layers), indent=1))
        return Scoped(reference, Lever(name, "kv", None, lever.ref, str(path), path="serving"), [0])
    every = range(len(decoder_layers(reference)))
    if lever.two_models:
        if scope.kind == "rest":  # the candidate's model with every layer the reference's
            return Scoped(candidate, _context_lever(name, lever, lambda: layers_from(candidate, reference, every)), [0])
        return Scoped(
            reference, _context_lever(name, lever, lambda: layers_from(reference, candidate, scope.layers)), [0]
        )
    calls = [0]

    def count() -> None:
        calls[0] += 1

    rest = scope.kind == "rest"
    outer_arm: Arm = "candidate" if rest else "reference"
    inner_arm: Arm = "reference" if rest else "candidate"
    inner_values = _arm_values(lever) if lever.kind == "patch" else {}

    def in_layers() -> AbstractContextManager[Any]:
        if lever.kind == "patch":  # each arm's own function, resolved before anything was patched
            assert lever.target is not None
            return patched(lever.name, lever.target, counted(inner_values[inner_arm], count, lever.name))
        return lever.applied(inner_arm)

    @contextmanager
    def arm() -> Iterator[None]:
        with lever.applied(outer_arm), inside(reference, every if rest else scope.layers, in_layers):
            yield

    return Scoped(reference, _context_lever(name, lever, arm), calls)


def _arm_values(lever: Lever) -> dict[str, object]:
    """A patch lever's function on each arm, "original" resolved now: inside a patched arm the target
    names the patch, and restoring "the original" there would run the other arm's code."""
    assert lever.target is not None
    original = resolve_object(lever.target, what=f"lever {lever.name!r} patch target")[2]
    out: dict[str, object] = {}
    for arm in ("reference", "candidate"):
        value = lever.ref if arm == "reference" else lever.cand
        if isinstance(value, str):
            value = resolve_object(value, what=f"lever {lever.name!r} patch value")[2]
        out[arm] = original if value is None else value
    return out


def _context_lever(name: str, lever: Lever, arm: Callable[[], AbstractContextManager[Any]]) -> Lever:
    """A context lever whose candidate value enters `arm()` (its reference value: nothing)."""

    @contextmanager
    def factory(value: object) -> Iterator[None]:
        if value:
            with arm():
                yield
        else:
            yield

    return Lever(name, "context", f"scoped:{name}", False, True, path=lever.path, factory=factory)
