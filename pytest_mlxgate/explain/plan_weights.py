"""`mlxgate plan weights`: the cheapest per-module weight quantization that passes a weights gate.

The search is `plan_kv`'s, on the modules mlx_lm's converter quantizes (every projection and the
embedding; a model's own `quant_predicate` keeps what it keeps float): selection sequences the gate's
prompts never use, a sensitivity per module, the greedy by drift removed per byte, the plan measured and
backed off, then compared with the uniform plans and verified by the gate itself on its own prompts.

What differs is the drift model. KL grows with the power of the noise a quantization adds to a weight,
so each module is measured alone at one *probe* option (the cheapest whose uniform run still drifts less
than `PROBE_MEAN`: past that, drifts stop adding up), and its drift at any other option is that, scaled
by the ratio of the module's own squared quantization errors (`Σ(W - dequantize(quantize(W)))²` at each
option, computed, not run). Measuring runs a *fake-quantized* model: each planned module's weights
quantized and dequantized back, so the search's forwards use the float matmul (BLAS on a CPU), and match
the real quantized model to ~1e-9 relative (`tests/explain/test_plan_weights.py` holds them together);
the verification quantizes for real, as `mlx_lm.convert` does.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Collection, Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import MlxgateUsageError
from ..kl.arms import run_candidate, run_reference
from ..kl.prompts import build_sequences, default_prompts, texts_of
from ..kl.shape import ArmCounters, RunShape
from ..levers.lever import Lever
from ..levers.weights import WeightsSpec, quantization_block
from ..stats.kl_stats import KLStats, summarize
from .plan_cache import MeasuredPlans, SearchCache
from .plan_gate import GateSpec, selection_sequences
from .plan_kv import (
    PLAIN_OPTION,
    Option,
    _bytes,
    against_uniform,
    check_search_options,
    measured_rounds,
    selection_verdict,
    settle,
)

__all__ = [
    "WEIGHT_BITS",
    "WEIGHT_GROUPS",
    "WEIGHT_SELECTION",
    "Unit",
    "WeightArms",
    "WeightsPlanSearch",
    "check_weight_options",
    "probe_option",
    "quantizable_units",
    "weights_spec",
]

#: The widths and group sizes mlx_lm loads (affine).
WEIGHT_BITS = (2, 3, 4, 6, 8)
WEIGHT_GROUPS = (32, 64, 128)
#: Selection sequences: as many as the weights gates' own prompts (8), so their intervals are as tight.
WEIGHT_SELECTION = 8
#: The probe option's uniform mean KL stays below this (nats): past it the model is far enough gone that
#: drifts stop adding up, and a module's drift alone there says little of its drift at 8 bits.
PROBE_MEAN = 1.0


@dataclass(frozen=True)
class Unit:
    """One module a weight plan quantizes: its path (as mlx_lm's config names it) and its weight's shape."""

    path: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def allows(self, o: Option) -> bool:
        """mlx_lm quantizes a module only where the group size divides its rows (else it stays float)."""
        return o.group_size is None or self.shape[-1] % o.group_size == 0


def quantizable_units(model: Any) -> tuple[dict[str, Unit], int, int]:
    """{path: unit} of what mlx_lm's converter would quantize, the weights' item size, and the bytes of
    every other parameter (norms, biases: what no plan changes)."""
    own = getattr(model, "quant_predicate", None)
    units: dict[str, Unit] = {}
    itemsize = 4
    for path, module in modules_by_path(model).items():
        if not hasattr(module, "to_quantized") or "weight" not in module:
            continue
        if own is not None and own(path, module) is False:
            continue
        units[path] = Unit(path, tuple(int(d) for d in module.weight.shape))
        itemsize = module.weight.dtype.size
    params: Any = tree_flatten(model.parameters())
    total = sum(int(v.nbytes) for _, v in params)
    fixed = total - sum(u.size * itemsize for u in units.values())
    return units, itemsize, fixed


def modules_by_path(model: Any) -> dict[str, Any]:
    """{path: module} as mlx_lm's config names them (`model.layers.0.mlp.down_proj`)."""
    return {str(path): module for path, module in model.named_modules()}


def weights_spec(plan: Mapping[str, Option], units: Container[str]) -> WeightsSpec:
    """A plan as a per-module `WeightsSpec`: the most common option its default, every module its own entry
    (plain: kept as loaded), so the quantization block names each module once and exactly."""
    counts: dict[Option, int] = {}
    for o in plan.values():
        if o.bits is not None:
            counts[o] = counts.get(o, 0) + 1
    default = max(counts, key=lambda o: counts[o]) if counts else Option(8, 64)
    layers = tuple(
        sorted(
            (p, None if o.bits is None else (o.bits, int(o.group_size or 64))) for p, o in plan.items() if p in units
        )
    )
    return WeightsSpec(int(default.bits or 8), int(default.group_size or 64), layers)


def check_weight_options(bits: Sequence[int], groups: Sequence[int], selection: int) -> None:
    """Refuse, by the option's name, widths or groups mlx_lm cannot load, before the model loads."""
    check_search_options(
        bits,
        groups,
        selection,
        allowed=(WEIGHT_BITS, WEIGHT_GROUPS),
        what="mlx_lm loads weights at",
        default_selection=WEIGHT_SELECTION,
    )


def _qdq(w: mx.array, o: Option) -> mx.array:
    """`w` quantized at `o` and dequantized back: what the quantized module computes with."""
    assert o.bits is not None and o.group_size is not None
    q, scales, biases = mx.quantize(w, group_size=o.group_size, bits=o.bits)
    return mx.dequantize(q, scales, biases, group_size=o.group_size, bits=o.bits).astype(w.dtype)


@dataclass
class WeightArms:
    """The model with its planned modules fake-quantized in place (`apply`), their float weights kept, and
    a plan's statistics on the selection sequences (`measure`) or on the gate's own prompts (`held_out`)."""

    model: Any
    units: dict[str, Unit]
    itemsize: int
    fixed_bytes: int
    options: list[Option]
    selection: int
    measure: Callable[[Mapping[str, Option], str], KLStats]
    held_out: Callable[[Mapping[str, Option], str], KLStats]
    data: mx.array  # the selection sequences' ids, (n, tokens + 1): what mlx_lm's dynamic_quant is given
    floats: dict[str, mx.array]  # each unit's weights as loaded (the model's own may be fake-quantized now)
    apply: Callable[[Mapping[str, Option]], None]  # fake-quantize the model to a plan (only what changes)
    at_length: Callable[[Mapping[str, Option], str], KLStats] | None = None  # on selection sequences at `long`

    def restore(self) -> None:
        """Every module's weights as loaded again."""
        self.apply({})

    def plan_bytes(self, plan: Mapping[str, Option]) -> float:
        """The model's parameter bytes under `plan` (fixed parameters included)."""
        return self.fixed_bytes + _bytes(plan, self.sizes, self.itemsize)

    @property
    def sizes(self) -> dict[str, float]:
        return {p: float(u.size) for p, u in self.units.items()}

    def uniform(self, o: Option) -> dict[str, Option]:
        """Every module at `o`, as mlx_lm's converter would: a module whose rows `o`'s group does not divide
        stays float."""
        return {p: o if u.allows(o) else PLAIN_OPTION for p, u in self.units.items()}


@contextmanager
def weight_arms(
    model: Any,
    tokenizer: Any,
    gate: GateSpec,
    *,
    bits: Sequence[int] = WEIGHT_BITS,
    groups: Sequence[int] = WEIGHT_GROUPS,
    selection: int = WEIGHT_SELECTION,
    long: int | None = None,
    say: Callable[[str], None] = lambda _: None,
    cache: SearchCache | None = None,
) -> Iterator[WeightArms]:
    """The reference arm on the selection sequences and on the gate's own prompts (run once, here), and
    measurements of any plan against them; with `long`, on selection sequences of that many tokens too
    (none of them the gate's at that length). The model's float weights are back in place on exit. With
    `cache`, the reference arms and every plan measured are read where an earlier search left them, and
    kept there (`plan_cache`)."""
    check_weight_options(bits, groups, selection)
    units, itemsize, fixed = quantizable_units(model)
    if not units:
        raise MlxgateUsageError("this model has no module mlx_lm quantizes (no Linear or Embedding weights)")
    options = [Option(b, g) for b in bits for g in groups if any(u.allows(Option(b, g)) for u in units.values())]
    if not options:
        raise MlxgateUsageError(f"no group size among {list(groups)} divides any quantizable module's rows")
    modules = modules_by_path(model)
    floats = {p: modules[p].weight for p in units}
    current: dict[str, Option] = {p: PLAIN_OPTION for p in units}

    def apply(plan: Mapping[str, Option]) -> None:
        changed = [p for p in units if plan.get(p, PLAIN_OPTION) != current[p]]
        for p in changed:
            o = plan.get(p, PLAIN_OPTION)
            modules[p].weight = floats[p] if o.bits is None else _qdq(floats[p], o)
            current[p] = o
        mx.eval([modules[p].weight for p in changed])

    shape = RunShape(gate.lever.path, gate.tokens, gate.decode if gate.lever.path == "serving" else 0)

    def scored(
        on: Sequence[Any], against: Sequence[Any], at: RunShape, kind: str
    ) -> Callable[[Mapping[str, Option], str], KLStats]:
        def measure(plan: Mapping[str, Option], what: str) -> KLStats:
            hit = measured.get(kind, plan)
            say(f"plan weights: {what}{' (measured before: read, not run)' if hit is not None else ''}")
            if hit is not None:
                return hit
            apply(plan)
            scores = run_candidate(model, on, at, as_loaded, against, counters=ArmCounters())
            stats = summarize(scores, texts=texts_of(on))
            measured.put(kind, [(plan, stats)])
            return stats

        return measure

    as_loaded = Lever("plan", "weights", None, None, None, path=gate.lever.path)

    def reference(on: Sequence[Any], at: RunShape, what: str) -> tuple[list[Any], dict[str, Any]]:
        def compute() -> list[Any]:
            say(f"plan weights: reference arm on {what}")
            return run_reference(model, on, at, as_loaded, counters=ArmCounters())

        if cache is None:
            return compute(), {}
        refs, key, read = cache.reference_arm(as_loaded, at, on, compute)
        if read:
            say(f"plan weights: the reference arm on {what} read from the reference cache")
        return refs, key

    seqs = selection_sequences(tokenizer, gate, selection, reserve=long)
    gate_seqs = build_sequences(default_prompts(), tokenizer, n=gate.prompts, tokens=gate.tokens)
    refs, key = reference(seqs, shape, f"{len(seqs)} selection sequences")
    gate_refs, gate_key = reference(gate_seqs, shape, f"the gate's {len(gate_seqs)} prompts (held out)")
    keys = {"selection": key, "held_out": gate_key}
    long_arm = None
    if long:
        long_shape = replace(shape, tokens=long)
        long_seqs = selection_sequences(tokenizer, replace(gate, tokens=long), selection, reserve=long)
        long_refs, keys["long"] = reference(long_seqs, long_shape, f"{len(long_seqs)} selection sequences of {long}")
        long_arm = (long_seqs, long_refs, long_shape)
    this = sys.modules[__name__]  # its quantize-dequantize decides a plan's numbers
    measured = cache.measured(keys, code=(this,)) if cache is not None else MeasuredPlans(None, {}, None)
    at_length = scored(*long_arm, "long") if long_arm is not None else None

    try:
        yield WeightArms(
            model,
            units,
            itemsize,
            fixed,
            options,
            len(seqs),
            scored(seqs, refs, shape, "selection"),
            scored(gate_seqs, gate_refs, shape, "held-out"),
            mx.array([list(s.ids) for s in seqs]),
            floats,
            apply,
            at_length,
        )
    finally:
        apply({})


@dataclass
class WeightSensitivities:
    """Each option uniform, each module alone at the probe option, and each module's squared quantization
    error at every option it may take; `drift` predicts a module's drift at any option from them."""

    probe: Option
    uniform: list[dict[str, Any]]
    uniform_stats: dict[Option, KLStats]
    sensitivity: dict[str, float]
    errors: dict[tuple[str, Option], float]

    def drift(self, path: str, o: Option) -> float:
        """The module's drift alone at the probe, scaled by its quantization error at `o` over the probe's
        (plain: 0; an option it cannot take: inf, which the greedy never buys)."""
        if o.bits is None:
            return 0.0
        err = self.errors.get((path, o))
        if err is None:
            return math.inf
        return self.sensitivity[path] * err / max(self.errors[(path, self.probe)], 1e-30)


def measure_weight_sensitivities(arms: WeightArms, limits: Mapping[str, float]) -> WeightSensitivities:
    """The uniform plans, the errors (computed), the probe, and every module alone at it (measured)."""
    uniform: list[dict[str, Any]] = []
    stats_of: dict[Option, KLStats] = {}
    for o in arms.options:
        plan = arms.uniform(o)
        stats = stats_of[o] = arms.measure(plan, f"uniform {o.label}")
        uniform.append(
            {
                "option": o.label,
                "mean": stats.mean,
                "mean_ci": list(stats.mean_ci),
                "passes": selection_verdict(stats, limits) == "pass",
                "bytes": arms.plan_bytes(plan),
            }
        )
    errors: dict[tuple[str, Option], float] = {}
    for p, u in arms.units.items():
        w = arms.floats[p]
        for o in arms.options:
            if u.allows(o):
                errors[(p, o)] = float(mx.sum(mx.square(w - _qdq(w, o))))
    probe = probe_option(arms.options, arms.units.values(), {o: s.mean for o, s in stats_of.items()}, arms.itemsize)
    sensitivity = {
        p: arms.measure({p: probe}, f"module {k + 1}/{len(arms.units)} alone at {probe.label}: {p}").mean
        for k, p in enumerate(arms.units)
        if arms.units[p].allows(probe)
    }
    return WeightSensitivities(probe, uniform, stats_of, sensitivity, errors)


def probe_option(
    options: Sequence[Option], units: Collection[Unit], means: Mapping[Option, float], itemsize: int
) -> Option:
    """The option each module is measured alone at: the cheapest whose uniform plan's mean KL is at most
    `PROBE_MEAN`, among those every module may take (any, where none is); none that calm, the dearest (the
    least drift there is)."""
    whole = [o for o in options if all(u.allows(o) for u in units)] or list(options)
    calm = [o for o in whole if means[o] <= PROBE_MEAN]
    price = lambda o: o.bytes_per_value(itemsize)  # noqa: E731
    return min(calm, key=price) if calm else max(whole, key=price)


@dataclass
class WeightsPlanSearch:
    """The search's outcome: the plan, its bytes against the uniform plans, the rounds, the comparisons
    with mlx_lm's own recipes at equal bytes, and the cost."""

    plan: dict[str, Option]
    spec: WeightsSpec
    bytes: float
    plain_bytes: float
    uniform: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    probe: str
    passed_selection: bool
    chosen: str  # "mixed" | "uniform <label>" | "none"
    selection: int = 0
    seconds: float = 0.0
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """A plan was chosen and the gate passed it on its own prompts (`--no-verify`: the selection's pass)."""
        if self.chosen == "none":
            return False
        return bool(self.verification["verified"]) if self.verification is not None else self.passed_selection

    def config(self) -> dict[str, Any]:
        """What `weights_config.json` holds: mlx_lm's quantization block, an entry per module."""
        return quantization_block(self.spec)

    def to_json(self) -> dict[str, Any]:
        return {
            "quantization": self.config(),
            "bytes": self.bytes,
            "plain_bytes": self.plain_bytes,
            "chosen": self.chosen,
            "probe": self.probe,
            "uniform": self.uniform,
            "rounds": self.rounds,
            "comparisons": self.comparisons,
            "passed_selection": self.passed_selection,
            "selection_sequences": self.selection,
            "sensitivity": dict(sorted(self.sensitivity.items())),
            "seconds": round(self.seconds, 1),
            "verification": self.verification,
            "notes": self.notes,
        }


def start_plan(arms: WeightArms) -> dict[str, Option]:
    """Every module at the cheapest option it may take."""
    return {
        p: min(
            (o for o in arms.options if u.allows(o)),
            key=lambda o: o.bytes_per_value(arms.itemsize),
            default=PLAIN_OPTION,
        )
        for p, u in arms.units.items()
    }


def choose_weights_plan(arms: WeightArms, sens: WeightSensitivities, limits: Mapping[str, float]) -> WeightsPlanSearch:
    """The greedy with its measured back-off from `sens`, and the comparison with the uniform plans."""
    plan, rounds, passed = measured_rounds(
        arms.sizes,
        arms.options,
        sens.drift,
        arms.itemsize,
        limits,
        arms.measure,
        start=start_plan(arms),
        at_length=arms.at_length,
    )
    for r in rounds:  # the model's bytes, not the planned modules' alone
        r["bytes"] = r.pop("bytes_per_token") + arms.fixed_bytes
    result = WeightsPlanSearch(
        plan=plan,
        spec=weights_spec(plan, arms.units),
        bytes=arms.plan_bytes(plan),
        plain_bytes=arms.plan_bytes({p: PLAIN_OPTION for p in arms.units}),
        uniform=sens.uniform,
        rounds=rounds,
        probe=sens.probe.label,
        passed_selection=passed,
        chosen="mixed",
        sensitivity=sens.sensitivity,
    )
    verdict, o = against_uniform(sens.uniform, "bytes", result.bytes, arms.options, passed, plan)
    if o is not None:
        result.plan = arms.uniform(o)
        result.spec = weights_spec(result.plan, arms.units)
        result.bytes = arms.plan_bytes(result.plan)
    settle(
        result,
        verdict,
        o,
        f"no plan among {', '.join(o.label for o in arms.options)} per module passed the gate's limits on the "
        f"selection sequences{' but every module as loaded' if passed else ''}; keep the weights as loaded, or "
        "widen the options (--bits, --group-sizes)",
    )
    return result
