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

from ..errors import LeverError, VacuousLeverError
from ..levers.patching import patched, resolve_object
from ..levers.reference_ops import low_precision
from ..results.wire import Check
from ..stats.intervals import CONFIDENCE, mean_interval
from ..verdicts.conclude import check
from .arms import sequence_logits

if TYPE_CHECKING:
    from ..levers.lever import Lever
    from .prompts import TokenSequence
    from .shape import RunShape

__all__ = [
    "DEFAULT_SITE_ATOL",
    "FLOAT32_SITE_TOLERANCE",
    "SITE",
    "SITE_FLOAT32",
    "SITE_SEQUENCES",
    "Site",
    "SiteCheck",
    "lever_sites",
    "measure_sites",
]

#: The site rules' keys in a gate's checks: FlashAttention's, and the candidate's logic in float32.
SITE = "site"
SITE_FLOAT32 = "site_f32"
#: The float32 leg's tolerance, relative to the oracle output's largest magnitude: mlx's fused RoPE differs
#: from the composed one by 5e-6 at position 0 and 1.7e-4 at 4,000 (its angles rounded otherwise), fused norms
#: and attention by 0 here; a base, scale or eps a percent off by 7e-3 to 1.0.
FLOAT32_SITE_TOLERANCE = 1e-3
#: The capture: this many of the gate's sequences through the reference arm (a bounded cost, not an arm).
SITE_SEQUENCES = 2
#: The rule's absolute term, relative to the oracle output's largest magnitude: where both errors are ~0 (a call
#: whose outputs the low precision holds exactly) a kernel may differ by about 100 float32 ulps and pass.
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
        raise LeverError(f"lever {lever.name!r}: {value!r} is not a function, so it has no site to judge")
    return fn


@dataclass
class _Call:
    """One call of a site: per position (the output's second-to-last axis) the largest error from the oracle of
    the candidate, the plain low-precision path and the candidate on float32 inputs, each over the position's
    other elements; the mean errors over the whole output; and the oracle output's largest magnitude."""

    site: str
    at: int  # the call's place in its forward (which layer, for a site called once per layer)
    forward: int
    cand: tuple[float, ...]
    plain: tuple[float, ...]
    cand32: tuple[float, ...] | None  # None: the candidate takes no float32 inputs
    cand_mean: float
    plain_mean: float
    scale: float


@dataclass
class SiteCheck:
    """Every captured call's errors from the oracle; the rules are decided over them by `check`/`check_float32`."""

    sequences: int
    calls: list[_Call] = field(default_factory=list)
    seconds: float = 0.0

    def check(self, relative: float, atol: float = DEFAULT_SITE_ATOL) -> Check:
        """FlashAttention's rule as one check: at each position of each call, e = (max|cand - f32| - relative x
        max|plain - f32|) / max|f32|, whose mean per call position (site and layer) must be shown at most
        `atol` at every one of them: a bug in one layer's call is a bug. Decided on 95% bounds over positions
        and forwards, Bonferroni over the call positions (pass: every upper bound clears `atol`; fail: some
        lower bound is beyond it). Positions are the units: each row is its own reduction, its rounding its own."""
        groups = self._groups(lambda c: [(x - relative * y) / c.scale for x, y in zip(c.cand, c.plain, strict=True)])
        made = self._decided(groups, key=SITE, limit=atol, metric=f"site error vs f32 - {relative:g}x plain's")
        made["ratio"] = _ratio(sum(sum(c.cand) for c in self.calls), sum(sum(c.plain) for c in self.calls))
        made["oracle"] = {**made.get("oracle", {}), "relative": relative}
        made["method"] = (
            f"per call position, 95% interval (Bonferroni over {len(groups)}) of (max|cand - f32| - {relative:g} "
            "max|plain - f32|) / max|f32| over positions and forwards, on the reference arm's activations; the worst"
        )
        return made

    def check_float32(self, tolerance: float = FLOAT32_SITE_TOLERANCE) -> Check | None:
        """The candidate's logic, with float32's precise instrument: on the same inputs upcast, its output within
        `tolerance` x max|f32| of the oracle at every call position (the same bounds as `check`). A scale, eps or
        base a percent off hides inside bf16's rounding; here it is orders of magnitude beyond float32's. None
        where the candidate takes no float32 inputs."""
        if any(c.cand32 is None for c in self.calls):
            return None
        groups = self._groups(lambda c: [x / c.scale for x in c.cand32 or ()])
        made = self._decided(groups, key=SITE_FLOAT32, limit=tolerance, metric="site error in float32")
        made["method"] = (
            f"per call position, 95% interval (Bonferroni over {len(groups)}) of max|cand(f32 inputs) - f32| / "
            "max|f32| over positions and forwards: the kernel's logic, not its precision; the worst"
        )
        return made

    def _groups(self, samples: Callable[[_Call], list[float]]) -> dict[tuple[str, int], list[float]]:
        groups: dict[tuple[str, int], list[float]] = {}
        for c in self.calls:
            groups.setdefault((c.site, c.at), []).extend(samples(c))
        return groups

    def _decided(self, groups: dict[tuple[str, int], list[float]], *, key: str, limit: float, metric: str) -> Check:
        confidence = 1 - (1 - CONFIDENCE) / len(groups)
        bounds = {
            where: (float(np.mean(v)), *(mean_interval(np.array(v), confidence) if len(v) > 1 else (-np.inf, np.inf)))
            for where, v in groups.items()
        }
        worst = max(bounds, key=lambda w: bounds[w][2])
        made = check(
            metric=metric,
            key=key,
            value=max(b[0] for b in bounds.values()),
            lower=max(b[1] for b in bounds.values()),
            upper=bounds[worst][2],
            limit=limit,
            direction="max",
            n=sum(len(v) for v in groups.values()),
            method="",
        )
        made["oracle"] = {"worst_site": float(worst[1]), "call_positions": float(len(groups))}
        return made

    def state(self) -> dict[str, Any]:
        """Its calls, as JSON (a proof keeps its known-bad's); `from_state` reads them back."""
        fields = ("site", "at", "forward", "cand", "plain", "cand32", "cand_mean", "plain_mean", "scale")
        return {"sequences": self.sequences, "calls": [[getattr(c, f) for f in fields] for c in self.calls]}

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> SiteCheck:
        """`state`'s JSON back; ValueError where it is not one (a damaged cache entry)."""
        try:
            calls = [
                _Call(
                    str(a), int(b), int(f), _floats(c), _floats(p), None if c32 is None else _floats(c32),
                    float(cm), float(pm), float(sc),
                )
                for a, b, f, c, p, c32, cm, pm, sc in data["calls"]
            ]  # fmt: skip
            made = cls(sequences=int(data["sequences"]), calls=calls)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a site check state: {e}") from None
        if not calls or any(c.scale <= 0 or len(c.cand) != len(c.plain) or not c.cand for c in calls):
            raise ValueError("a site check state with no call, a call without a positive scale, or uneven errors")
        return made

    def to_json(self) -> dict[str, Any]:
        """The record's `site`: per site and call position, the errors' max and mean (scaled by max|f32|)."""
        sites: dict[str, dict[int, list[_Call]]] = {}
        for c in self.calls:
            sites.setdefault(c.site, {}).setdefault(c.at, []).append(c)
        out = []
        for target, by_at in sites.items():
            rows = [_row(at, calls) for at, calls in sorted(by_at.items())]
            out.append({"target": target, "calls": sum(len(calls) for calls in by_at.values()), "by_call": rows})
        return {"sequences": self.sequences, "seconds": round(self.seconds, 3), "sites": out}


def _row(at: int, calls: list[_Call]) -> dict[str, Any]:
    """One call position's errors over its calls: the largest and the mean, each over max|f32|."""
    f32 = [max(c.cand32) / c.scale for c in calls if c.cand32]
    return {
        "at": at,
        "calls": len(calls),
        "cand_max": max(max(c.cand) / c.scale for c in calls),
        "plain_max": max(max(c.plain) / c.scale for c in calls),
        "cand_mean": float(np.mean([c.cand_mean / c.scale for c in calls])),
        "plain_mean": float(np.mean([c.plain_mean / c.scale for c in calls])),
        "cand32_max": max(f32) if len(f32) == len(calls) else None,
    }


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in values)


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
        up_args, up_kwargs = tuple(_up(a) for a in args), {k: _up(v) for k, v in kwargs.items()}
        oracle = site.plain(*up_args, **up_kwargs).astype(mx.float32)
        try:
            cand32: Any = site.candidate(*up_args, **up_kwargs).astype(mx.float32)
        except (RuntimeError, ValueError, TypeError):  # a kernel built for low precision only
            cand32 = None
        parts = [_per_position(cand, oracle), _per_position(plain, oracle)]
        if cand32 is not None:
            parts.append(_per_position(cand32, oracle))
        means = mx.stack(
            [mx.abs(cand.astype(mx.float32) - oracle).mean(), mx.abs(plain.astype(mx.float32) - oracle).mean()]
        )
        mx.eval(parts, means, oracle)
        errors = [_floats(np.asarray(p)) for p in parts]
        cand_mean, plain_mean = (float(x) for x in np.asarray(means))
        scale = float(mx.abs(oracle).max()) or 1.0
        at = forward.next_at(site.target)
        calls.append(
            _Call(
                site.target, at, forward.index, errors[0], errors[1], errors[2] if len(errors) > 2 else None,
                cand_mean, plain_mean, scale,
            )
        )  # fmt: skip
        return out

    return capture


def _per_position(values: Any, oracle: Any) -> Any:
    """The largest error at each position (the output's second-to-last axis: tokens for attention, norms and
    RoPE alike), over every other axis."""
    err = mx.abs(values.astype(mx.float32) - oracle)
    if err.ndim < 2:
        return err.max().reshape(1)
    err = mx.moveaxis(err, -2, 0).reshape(err.shape[-2], -1)
    return err.max(axis=1)


def _up(value: Any) -> Any:
    if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
        return value.astype(mx.float32)
    return value
