"""The kernel's own float32 oracle: a low-precision kernel judged where it runs, on real activations.

A whole-model comparison resolves a kernel defect only once it adds about as much error as all of
bfloat16 does (most of bf16's distance from float32 is the rounding of activations *between* kernels),
so a kernel is also judged at the lever's site: each call of the patched function in a bounded capture
of the reference arm (its first sequences, on the gate's path) is answered three times on the same
inputs: by the candidate's function; by the plain low-precision path (the reference arm's function, or
where that is one of `reference_ops`' float32-inside references, its twin in the inputs' precision:
`reference_ops.low_precision`); and by the reference arm's function with every floating input upcast to
float32, the oracle. FlashAttention's rule then reads
|candidate - oracle| <= `relative` x |plain - oracle| + atol (max abs error per call, scaled by the
oracle output's largest magnitude so layers compare), decided on a 95% bound over calls and reported
per call position (which layer) with the max and mean of both errors.

A lever has sites when it patches a function (`patch=`) or its context factory names them (a `sites`
attribute: `reference_ops.fast_ops` does); an environment flag or `mx.compile` has none, and the record
says only the model-level check (`kl.oracle`) applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from ..errors import VacuousLeverError
from ..levers.patching import patched, resolve_object
from ..levers.reference_ops import low_precision
from ..results.wire import Check
from ..stats.intervals import mean_interval
from ..verdicts.conclude import check
from .arms import sequence_logits

if TYPE_CHECKING:
    from ..levers.lever import Lever
    from .prompts import TokenSequence
    from .shape import RunShape

__all__ = ["DEFAULT_SITE_ATOL", "SITE", "SITE_SEQUENCES", "Site", "SiteCheck", "lever_sites", "measure_sites"]

#: The site rule's key in a gate's checks.
SITE = "site"
#: The capture: this many of the gate's sequences through the reference arm (a bounded cost, not an arm).
SITE_SEQUENCES = 2
#: The rule's absolute term, relative to the oracle output's largest magnitude: where both errors are ~0
#: (a float32 run) a kernel may differ by about 100 float32 ulps and pass.
DEFAULT_SITE_ATOL = 1e-5


@dataclass(frozen=True)
class Site:
    """One patched function: what the reference arm runs there (`plain`) and what the candidate runs."""

    target: str
    plain: Callable[..., Any]
    candidate: Callable[..., Any]


def lever_sites(lever: Lever) -> list[Site] | None:
    """The functions the lever swaps, each with both arms' versions; None when it swaps none it can name (an
    environment flag, a KV plan, weights, `mx.compile`): only the model-level check applies then."""
    if lever.kind == "patch" and lever.target is not None:
        original = resolve_object(lever.target, what=f"lever {lever.name!r} patch target")[2]
        plain, cand = (_function(lever, lever.value(arm), original) for arm in ("reference", "candidate"))
        return [Site(lever.target, plain, cand)] if plain is not cand else []
    if lever.kind == "context" and lever.target is not None:
        factory = resolve_object(lever.target, what=f"lever {lever.name!r} context factory")[2]
        named = getattr(factory, "sites", None)
        if named is None:
            return None
        return [Site(t, p, c) for t, p, c in named(lever.value("reference"), lever.value("candidate")) if p is not c]
    return None


def _function(lever: Lever, value: object, original: object) -> Callable[..., Any]:
    fn = value if value is not None else original
    if isinstance(fn, str):
        fn = resolve_object(fn, what=f"lever {lever.name!r} patch value")[2]
    if not callable(fn):
        raise TypeError(f"lever {lever.name!r}: {value!r} is not a function")
    return fn


@dataclass
class _Call:
    site: str
    at: int  # the call's place in its forward (which layer, for a site called once per layer)
    forward: int
    cand_max: float
    plain_max: float
    cand_mean: float
    plain_mean: float
    scale: float  # the oracle output's largest magnitude


@dataclass
class SiteCheck:
    """Every captured call's errors from the oracle; the rule is decided over them by `check`."""

    sequences: int
    calls: list[_Call] = field(default_factory=list)
    seconds: float = 0.0

    def check(self, relative: float, atol: float = DEFAULT_SITE_ATOL) -> Check:
        """The rule as one check: per call e = (max|cand - oracle| - relative x max|plain - oracle|) / scale,
        whose 95% upper bound over calls must be at most `atol` (fail: its lower bound above it)."""
        excess = np.array([(c.cand_max - relative * c.plain_max) / c.scale for c in self.calls])
        lower, upper = mean_interval(excess)
        made = check(
            metric=f"site error vs f32 - {relative:g}x plain's",
            key=SITE,
            value=float(excess.mean()),
            lower=lower,
            upper=upper,
            limit=atol,
            direction="max",
            n=len(self.calls),
            method=(
                f"95% interval over {len(self.calls)} calls of (max|cand - f32| - {relative:g} max|plain - f32|)"
                " / max|f32|, at the lever's site on the reference arm's activations"
            ),
        )
        worst = max(self.calls, key=lambda c: c.cand_max / c.scale)
        made["ratio"] = _ratio(sum(c.cand_max for c in self.calls), sum(c.plain_max for c in self.calls))
        made["oracle"] = {"worst_at": float(worst.at), "relative": relative}
        return made

    def state(self) -> dict[str, Any]:
        """Its calls, as JSON (a proof keeps its known-bad's); `from_state` reads them back."""
        fields = ("site", "at", "forward", "cand_max", "plain_max", "cand_mean", "plain_mean", "scale")
        return {"sequences": self.sequences, "calls": [[getattr(c, f) for f in fields] for c in self.calls]}

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> SiteCheck:
        """`state`'s JSON back; ValueError where it is not one (a damaged cache entry)."""
        try:
            calls = [
                _Call(str(a), int(b), int(c), float(d), float(e), float(f), float(g), float(h))
                for a, b, c, d, e, f, g, h in data["calls"]
            ]
            made = cls(sequences=int(data["sequences"]), calls=calls)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a site check state: {e}") from None
        if not calls or any(c.scale <= 0 for c in calls):
            raise ValueError("a site check state with no call, or a call without a positive scale")
        return made

    def to_json(self) -> dict[str, Any]:
        """The record's `site`: per site and call position, both errors' max and mean (scaled), and the rule."""
        sites: dict[str, dict[int, list[_Call]]] = {}
        for c in self.calls:
            sites.setdefault(c.site, {}).setdefault(c.at, []).append(c)
        out = []
        for target, by_at in sites.items():
            rows = [
                {
                    "at": at,
                    "calls": len(calls),
                    "cand_max": max(c.cand_max / c.scale for c in calls),
                    "plain_max": max(c.plain_max / c.scale for c in calls),
                    "cand_mean": float(np.mean([c.cand_mean / c.scale for c in calls])),
                    "plain_mean": float(np.mean([c.plain_mean / c.scale for c in calls])),
                }
                for at, calls in sorted(by_at.items())
            ]
            out.append({"target": target, "calls": sum(r["calls"] for r in rows), "by_call": rows})
        return {
            "sequences": self.sequences,
            "seconds": round(self.seconds, 3),
            "sites": out,
        }


def _ratio(a: float, b: float) -> float | None:
    if b > 0:
        return a / b
    return None if a > 0 else 1.0


# -- the capture ------------------------------------------------------------------------------------------


def measure_sites(
    model: Any,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    sites: Sequence[Site],
    *,
    limit: int = SITE_SEQUENCES,
) -> SiteCheck:
    """The reference arm over the first `limit` sequences (one at a time, on the gate's path), every call of
    each site answered by the plain function as the arm runs it, and also by the candidate's and by the
    float32 oracle on the same inputs."""
    found = SiteCheck(sequences=min(limit, len(sequences)))
    started = time.perf_counter()
    forward = _Forwards()
    kv = lever.kv_plan("reference")
    with ExitStack() as stack:
        for site in sites:
            stack.enter_context(patched(lever.name, site.target, _capturing(site, forward, found.calls)))
        for seq in sequences[:limit]:
            sequence_logits(forward.wrap(model), seq.ids, shape, kv)
    found.seconds = time.perf_counter() - started
    if not found.calls:
        raise VacuousLeverError(
            f"lever {lever.name!r}: none of {', '.join(s.target for s in sites)} was called in the reference arm's "
            f"{shape.path} path, so no kernel could be judged at its site; the gate would pass without testing it. "
            "Fix: patch the function the model calls (its module path as the model file imports it)"
        )
    return found


class _Forwards:
    """Counts the model's forwards, so each site call knows its place within one (its layer)."""

    def __init__(self) -> None:
        self.index = -1
        self.calls_in: dict[str, int] = {}

    def wrap(self, model: Any) -> Any:
        forwards = self

        class Counted:
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                forwards.index += 1
                forwards.calls_in = {}
                return model(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(model, name)

        return Counted()

    def next_at(self, target: str) -> int:
        at = self.calls_in.get(target, 0)
        self.calls_in[target] = at + 1
        return at


def _capturing(site: Site, forward: _Forwards, calls: list[_Call]) -> Callable[..., Any]:
    plain_low = low_precision(site.plain)

    def capture(*args: Any, **kwargs: Any) -> Any:
        out = site.plain(*args, **kwargs)
        cand = site.candidate(*args, **kwargs)
        plain = out if plain_low is site.plain else plain_low(*args, **kwargs)
        oracle = site.plain(*(_up(a) for a in args), **{k: _up(v) for k, v in kwargs.items()}).astype(mx.float32)
        plain_err = mx.abs(plain.astype(mx.float32) - oracle)
        cand_err = mx.abs(cand.astype(mx.float32) - oracle)
        stats = mx.stack([cand_err.max(), plain_err.max(), cand_err.mean(), plain_err.mean(), mx.abs(oracle).max()])
        cm, pm, cmean, pmean, scale = (float(x) for x in np.asarray(stats))
        at = forward.next_at(site.target)
        calls.append(_Call(site.target, at, forward.index, cm, pm, cmean, pmean, scale or 1.0))
        return out

    return capture


def _up(value: Any) -> Any:
    if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
        return value.astype(mx.float32)
    return value
