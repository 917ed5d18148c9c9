"""A model's decoder layers as attribution sees them: the list that holds them, each layer's attention
type, and the two ways to make one layer behave differently for a while (a wrapped `__call__`, a layer
taken from another model). Every change is undone on exit, raise or not."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from ..errors import LeverError
from ..serving.caches import attention_type

__all__ = ["attention_types", "decoder_layers", "inside", "layers_from", "output_of", "wrapped_layers"]


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers (mlx_lm's `Model.layers`), the list itself so entries can be swapped."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise LeverError(
            f"{type(model).__module__}.{type(model).__name__} has no `layers` list (mlx_lm models expose their "
            "decoder layers as `model.layers`): drift cannot be attributed to its layers"
        )
    return layers


def attention_types(model: Any) -> list[str | None]:
    """Each layer's attention ("sliding_attention", "full_attention"), from the model's own `layer_types`
    or, for the layers that keep a cache, its prompt cache; None where neither says."""
    n = len(decoder_layers(model))
    args = getattr(model, "args", None)
    declared = getattr(args, "layer_types", None) or getattr(getattr(args, "text_config", None), "layer_types", None)
    if isinstance(declared, (list, tuple)) and len(declared) >= n:
        return [str(t) if t in ("sliding_attention", "full_attention") else None for t in declared[:n]]
    cache = make_prompt_cache(model)
    return [attention_type(cache[i]) if i < len(cache) else None for i in range(n)]


_SUBCLASSES: dict[type, type] = {}


def _wrapping(cls: type) -> type:
    """`cls` with a `__call__` that runs through the instance's `_mlxgate_wrap` (Python finds special
    methods on the type, so an instance attribute could not do it)."""
    sub = _SUBCLASSES.get(cls)
    if sub is None:

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            return object.__getattribute__(self, "_mlxgate_wrap")(lambda: cls.__call__(self, *args, **kwargs))

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
        _SUBCLASSES[cls] = sub
    return sub


@contextmanager
def wrapped_layers(model: Any, wrap: Callable[[int, Callable[[], Any]], Any], which: Sequence[int]) -> Iterator[None]:
    """While inside: layer i (of `which`) runs `wrap(i, forward)` instead of `forward()`."""
    layers = decoder_layers(model)
    done: list[tuple[Any, type]] = []
    try:
        for i in which:
            layer = layers[i]
            cls = type(layer)
            object.__setattr__(layer, "_mlxgate_wrap", lambda forward, i=i: wrap(i, forward))
            layer.__class__ = _wrapping(cls)
            done.append((layer, cls))
        yield
    finally:
        for layer, cls in reversed(done):
            layer.__class__ = cls
            object.__delattr__(layer, "_mlxgate_wrap")


def inside(model: Any, which: Sequence[int], context: Callable[[], AbstractContextManager[Any]]) -> Any:
    """A context manager under which each layer of `which` runs its forward inside `context()`."""

    def wrap(_: int, forward: Callable[[], Any]) -> Any:
        with context():
            return forward()

    return wrapped_layers(model, wrap, which)


@contextmanager
def layers_from(model: Any, donor: Any, which: Sequence[int]) -> Iterator[None]:
    """While inside: `model`'s layers in `which` are `donor`'s (same architecture, e.g. its quantized copy)."""
    mine, theirs = decoder_layers(model), decoder_layers(donor)
    if len(mine) != len(theirs) or any(type(a) is not type(b) for a, b in zip(mine, theirs, strict=True)):
        raise LeverError(
            f"the two arms' models have different layers ({len(mine)} vs {len(theirs)}, or other layer classes): "
            "one model's layer cannot stand in for the other's, so this lever cannot be scoped by layer"
        )
    saved = {i: mine[i] for i in which}
    try:
        for i in which:
            mine[i] = theirs[i]
        yield
    finally:
        for i, layer in saved.items():
            mine[i] = layer


def output_of(result: Any) -> Any:
    """A layer's hidden-state output: the array itself, or the first of a tuple (gemma-4 returns
    (h, kvs, offset))."""
    return result[0] if isinstance(result, tuple) else result
