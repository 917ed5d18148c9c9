"""A model loaded through `mlx_lm.load`, with the verified snapshot it came from."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import ModelUnavailableError
from .device import installed_versions
from .readable import unreadable_file

if TYPE_CHECKING:
    from ..results.wire import ModelRef
    from .materialize import ResolvedSnapshot

__all__ = ["LoadedModel", "load_mlx"]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model with the snapshot it came from."""

    model: Any
    tokenizer: Any
    snapshot: ResolvedSnapshot

    def describe(self) -> ModelRef:
        s = self.snapshot
        return {"name": s.name, "repo_id": s.repo_id, "commit": s.commit, "pinned": s.pinned, "dtype": self.dtype}

    @cached_property
    def dtype(self) -> str:
        """The precision it computes in: its first floating parameter's dtype (`precision.model_dtype`)."""
        from .precision import model_dtype

        return model_dtype(self.model)


def load_mlx(snapshot: ResolvedSnapshot, role: str = "candidate") -> tuple[Any, Any]:
    """(model, tokenizer) from `mlx_lm.load`; whatever it raises becomes a `ModelUnavailableError`
    naming the file that cannot be read and the fix, never a traceback from inside mlx_lm."""
    import mlx_lm

    try:
        loaded = mlx_lm.load(snapshot.path)
    except Exception as e:  # mlx raises RuntimeError, ValueError, KeyError, OSError...: all mean "can't load"
        raise ModelUnavailableError(load_failure(snapshot, role, e)) from e
    return loaded[0], loaded[1]


def load_failure(snapshot: ResolvedSnapshot, role: str, error: Exception) -> str:
    """What could not be loaded, which file and why (read from the files themselves), and the fix."""
    named = f"'{snapshot.name}'" + (
        f" ({snapshot.path})" if snapshot.kind == "local" else f" ({snapshot.pinned} at {snapshot.path})"
    )
    bad = unreadable_file(snapshot.dir)
    if bad is None:
        version = installed_versions(("mlx-lm",))["mlx-lm"]
        return (
            f"mlxgate: mlx_lm.load could not load the {role} {named}: {type(error).__name__}: {error}. "
            f"Its files read whole, so mlx-lm {version} does not take this model as it is: check its "
            "config.json (model_type, sizes) against the weights, or upgrade mlx-lm"
        )
    name, why = bad
    if snapshot.kind == "local":
        fix = (
            f"copy or convert the model into {snapshot.path} again (mlx_lm.convert writes a whole one), "
            f"or point --mlx-{role} at another directory"
        )
    else:
        fix = (
            f"`mlxgate verify {snapshot.name} --repair` re-hashes the snapshot and sets damaged blobs aside, "
            f"then `mlxgate get {snapshot.name}` fetches them again; if it verifies, the hub's copy itself is "
            "broken: pin another revision"
        )
    return (
        f"mlxgate: cannot load the {role} {named}: {name}: {why}. No gate can run on weights that cannot "
        f"be read. Fix: {fix}"
    )
