"""The cheapest KV plan that passes a gate: per-layer sensitivities, a greedy search by drift saved per
byte, a measured check that backs off, and a verification run of the gate itself on its own prompts.

1. *Selection* sequences, built from prompts the gate's own sequences do not use, so the gate's prompts
   stay held out for the verification.
2. *Sensitivities*: every cached layer alone at the cheapest option (the rest plain), and each option on
   every layer (uniform). A layer's drift at another option is its measured drift at the cheapest, scaled
   by the uniform runs' ratio: measured per layer once, per option once. Every plan decodes from one shared
   prefill of the selection, and the layers alone run side by side in one batch (`plan_rows`); what was
   measured is kept beside the reference for the next search (`plan_cache`).
3. *Greedy*: from every layer at the cheapest option, the upgrade (a layer to a dearer option, or plain)
   that removes the most predicted drift per byte, until the prediction is within `TARGET_SHARE` of the
   gate's mean limit.
4. *Measured, not assumed additive*: the plan runs on the selection sequences and must pass every limit
   of the gate there (mean, p99, top-1...); if it does not, the target halves (from the plan's prediction
   where that is lower) and the greedy goes on from where it stopped (`MAX_ROUNDS`).
5. *Compared*: a uniform plan that passes on the selection sequences and costs no more bytes wins (a mixed
   plan must earn its complexity); none passing and no mixed plan either: "no plan passes" is the answer.
6. *Verified*: the gate module runs under pytest with the plan as its candidate (`--mlx-cand-value`), on
   its own prompts; its record is the verdict. A plan that fails there is reported failed, never passed.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..errors import MlxgateUsageError
from ..kl.arms import run_reference
from ..kl.assertions import kl_checks
from ..kl.shape import ArmCounters, RunShape
from ..levers.lever import Lever
from ..serving.caches import quantized_form
from ..serving.kv_plan import KV_BITS, KV_GROUP_SIZES
from ..stats.kl_stats import KLStats
from .plan_cache import MeasuredPlans, Measurements, SearchCache
from .plan_gate import SELECTION_SEQUENCES, GateSpec, selection_sequences
from .plan_rows import SelectionRuns
from .plan_verify import round_lines, uniform_lines, verdict_lines

__all__ = [
    "SELECTION_SEQUENCES",
    "Option",
    "PlanSearch",
    "SelectionAsk",
    "Settled",
    "greedy_plan",
    "measured_rounds",
    "search_kv_plan",
    "selection_sequences",
]

#: The greedy stops once the predicted mean KL is this share of the gate's mean limit: room for the
#: interval and for drifts that do not add up.
TARGET_SHARE = 0.5
#: A round's plan passes on the selection only with its mean's upper bound within this share of the gate's
#: mean limit: the gate judges it on prompts the selection never saw. Measured: a KV plan at bound 1.74e-3 of
#: 2e-3 on the selection read 2.5e-3 (bound 5.5e-3) on the gate's own prompts.
SELECTION_MARGIN = 0.7
#: Measured rounds on the selection sequences: halving until a plan passes, then bisecting for a cheaper one.
MAX_ROUNDS = 6


@dataclass(frozen=True)
class Option:
    """One way to keep a layer's KV cache: quantized (bits, group size; the values at `value_bits` where
    they have a width of their own), or plain (bits None)."""

    bits: int | None
    group_size: int | None = None
    value_bits: int | None = None  # None: the keys' `bits`

    @property
    def v_bits(self) -> int | None:
        return self.bits if self.value_bits is None else self.value_bits

    @property
    def label(self) -> str:
        if self.bits is None:
            return "plain"
        widths = f"K{self.bits}/V{self.v_bits}" if self.v_bits != self.bits else f"{self.bits}-bit"
        return f"{widths} g{self.group_size}"

    def bytes_per_value(self, itemsize: int) -> float:
        """Bytes per cached value, keys and values alike in number (each layer's K and V heads x head dim
        are equal on every model whose cache a plan quantizes): packed bits, their mean where the two
        widths differ, plus a scale and a bias (model dtype) per group."""
        if self.bits is None or self.group_size is None:
            return float(itemsize)
        return (self.bits + (self.v_bits or self.bits)) / 16 + 2 * itemsize / self.group_size

    def spec(self) -> dict[str, int] | None:
        """The option as a kv_config.json entry (`serving.kv_plan.KVSpec.to_json`'s form)."""
        if self.bits is None:
            return None
        group = int(self.group_size or 64)
        if self.v_bits != self.bits:
            return {"k_bits": self.bits, "v_bits": int(self.v_bits or self.bits), "group_size": group}
        return {"bits": self.bits, "group_size": group}


def search_options(bits: Sequence[int], groups: Sequence[int], dims: set[int], *, apart: bool) -> list[Option]:
    """The options a layer may take: every width at every group size that divides the head dimensions,
    and with `apart` every pair of widths with the keys wider than the values (keys carry the outliers:
    KIVI, KVTuner measure them the more sensitive half)."""
    widths: list[tuple[int, int | None]] = [(b, None) for b in bits]
    if apart:
        widths += [(k, v) for k in bits for v in bits if k > v]
    return [Option(k, g, v) for k, v in widths for g in groups if all(d % g == 0 for d in dims)]


PLAIN_OPTION = Option(None)


@dataclass
class PlanSearch:
    """The search's outcome: the plan, its bytes against the uniform options, the rounds, and the cost."""

    layers: dict[int, Option]
    bytes_per_token: float
    plain_bytes_per_token: float
    uniform: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    sensitivity: dict[int, float]
    passed_selection: bool
    chosen: str  # "mixed" | "uniform <label>" | "none"
    seconds: float
    selection: int
    verification: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """A plan is the answer: one was chosen and the gate passed it on its own prompts (only with the
        verification skipped, `--no-verify`, the selection's pass stands in, and the output says so)."""
        if self.chosen == "none":
            return False
        return bool(self.verification["verified"]) if self.verification is not None else self.passed_selection

    def kv_config(self) -> dict[str, Any]:
        return {"default": None, "layers": {str(i): o.spec() for i, o in sorted(self.layers.items())}}

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_config": self.kv_config(),
            "bytes_per_token": self.bytes_per_token,
            "plain_bytes_per_token": self.plain_bytes_per_token,
            "chosen": self.chosen,
            "uniform": self.uniform,
            "rounds": self.rounds,
            "sensitivity": {str(k): v for k, v in sorted(self.sensitivity.items())},
            "passed_selection": self.passed_selection,
            "selection_sequences": self.selection,
            "seconds": round(self.seconds, 1),
            "verification": self.verification,
            "notes": self.notes,
        }


#: What a plan gives an option to: a cached layer's index (KV plans), a module's path (weight plans).
U = TypeVar("U", bound=Hashable)


def greedy_plan(
    sizes: Mapping[U, float],
    options: Sequence[Option],
    drift: Callable[[U, Option], float],
    *,
    target: float,
    start: Mapping[U, Option] | None = None,
    itemsize: int,
    path: list[dict[U, Option]] | None = None,
) -> dict[U, Option]:
    """From `start` (default: every layer at the cheapest option), upgrade the layer whose next dearer
    option removes the most predicted drift per byte, until the predicted total is <= `target`.
    `sizes`: values per token per layer (weights per module); `drift(layer, option)`: its predicted drift
    (plain: 0; an option a layer cannot take: inf, never bought); `path` receives the plan after each
    upgrade (the predicted frontier, `explain.plan_frontier`)."""
    choices = sorted([*options, PLAIN_OPTION], key=lambda o: o.bytes_per_value(itemsize))
    plan = dict(start) if start is not None else {i: choices[0] for i in sizes}

    def total() -> float:
        return sum(drift(i, o) for i, o in plan.items())

    while total() > target:
        best: tuple[float, U, Option] | None = None
        for i, now in plan.items():
            cost_now, drift_now = now.bytes_per_value(itemsize) * sizes[i], drift(i, now)
            for o in choices:
                extra = o.bytes_per_value(itemsize) * sizes[i] - cost_now
                saved = drift_now - drift(i, o)
                if extra > 0 and saved > 0 and (best is None or saved / extra > best[0]):
                    best = (saved / extra, i, o)
        if best is None:
            break  # every layer plain, or nothing dearer saves drift
        plan[best[1]] = best[2]
        if path is not None:
            path.append(dict(plan))
    return plan


def check_search_options(
    bits: Sequence[int],
    groups: Sequence[int],
    selection: int,
    *,
    allowed: tuple[Sequence[int], Sequence[int]] = (KV_BITS, KV_GROUP_SIZES),
    what: str = "mlx quantizes a KV cache with",
    default_selection: int = SELECTION_SEQUENCES,
) -> None:
    """Refuse, by the option's name, what the search could only fail on later (or silently drop): widths
    and groups outside `allowed` (`what` says whose), fewer than 2 selection sequences."""
    for flag, values, choices in (("--bits", bits, allowed[0]), ("--group-sizes", groups, allowed[1])):
        wrong = [v for v in values if v not in choices]
        if wrong or not values:
            raise MlxgateUsageError(
                f"{flag} {','.join(map(str, values))}: {', '.join(map(str, wrong)) or 'nothing'} is not a choice "
                f"{what}; give some of {','.join(map(str, choices))}"
            )
    if isinstance(selection, bool) or not isinstance(selection, int) or selection < 2:
        raise MlxgateUsageError(
            f"--selection {selection}: the search judges each plan by an interval over the selection sequences, "
            f"and fewer than 2 give none; give 2 or more (default {default_selection})"
        )


class SelectionAsk(TypedDict, total=False):
    """`selection_arms`' options as a search passes them on (each with `selection_arms`' default)."""

    bits: Sequence[int]
    groups: Sequence[int]
    selection: int
    apart: bool
    say: Callable[[str], None]
    cache: SearchCache | None


def search_kv_plan(model: Any, tokenizer: Any, gate: GateSpec, **asked: Unpack[SelectionAsk]) -> PlanSearch:
    """The search on `model`: its layers' sizes, the selection sequences and their reference arm, then
    `choose_plan` with a measurement of each plan on those sequences. `asked`: `selection_arms`' options
    (`apart`: keys and values may take widths of their own, `search_options`)."""
    return timed_search(
        model,
        tokenizer,
        gate,
        lambda space, measure: choose_plan(
            space.sizes, space.options, space.itemsize, gate.limits, measure, space.measure_many
        ),
        **asked,
    )


class Searched(Protocol):
    """What a search returns (`PlanSearch`, `plan_frontier.Frontier`): it says how it was judged and timed."""

    selection: int
    seconds: float


S = TypeVar("S", bound=Searched)


def timed_search(
    model: Any,
    tokenizer: Any,
    gate: GateSpec,
    search: Callable[[SearchSpace, Measure], S],
    **asked: Unpack[SelectionAsk],
) -> S:
    """`search(space, measure)` inside `selection_arms` (`asked`: its options), its selection count and
    seconds (setup included) set."""
    started = time.perf_counter()
    with selection_arms(model, tokenizer, gate, **asked) as arms:
        result = search(*arms)
        result.selection = arms[0].selection
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True)
class SearchSpace:
    """What a search prices and chooses from: each cached layer's K and V values per token, the cache's
    item size, the options a layer may take, and how many selection sequences judge a plan."""

    sizes: Mapping[int, float]
    itemsize: int
    options: Sequence[Option]
    selection: int
    measure_many: MeasureMany | None = None  # plans side by side (the sensitivities: `plan_rows`)


#: `measure(plan, what)`: the plan's statistics on the selection sequences (`what`: said while it runs).
Measure = Callable[[Mapping[int, Option], str], KLStats]
#: `measure_many(plans, what)`: many plans' statistics at once, a fake-quant of each (`plan_rows`).
MeasureMany = Callable[[Sequence[Mapping[int, Option]], str], list[KLStats]]


@contextmanager
def selection_arms(
    model: Any,
    tokenizer: Any,
    gate: GateSpec,
    *,
    bits: Sequence[int] = (4, 6, 8),
    groups: Sequence[int] = (32, 64),
    selection: int = SELECTION_SEQUENCES,
    apart: bool = False,
    say: Callable[[str], None] = lambda _: None,
    cache: SearchCache | None = None,
) -> Iterator[tuple[SearchSpace, Measure]]:
    """The search space on `model`, and a measurement of any plan on selection sequences the gate's own
    prompts never use, against their reference arm (run once, here). With `cache`, the reference arm and
    every plan measured are read from beside the reference where an earlier search left them, and kept
    there (`plan_cache`)."""
    check_search_options(bits, groups, selection)
    sizes, itemsize, dims = _layer_sizes(model)
    options = search_options(bits, groups, dims, apart=apart)
    if not options:
        raise MlxgateUsageError(
            f"no group size among {list(groups)} divides this model's head dimensions {sorted(dims)}"
        )
    shape = RunShape("serving", gate.tokens, gate.decode)
    seqs = selection_sequences(tokenizer, gate, selection)
    plain = Lever("plan", "kv", None, None, None, path="serving")

    def reference() -> list[Any]:
        say(f"plan kv: reference arm on {len(seqs)} selection sequences (the gate's {gate.prompts} prompts held out)")
        return run_reference(model, seqs, shape, plain, counters=ArmCounters())

    refs, key, read = cache.reference_arm(plain, shape, seqs, reference) if cache else (reference(), {}, False)
    if read:
        say(f"plan kv: the reference arm on {len(seqs)} selection sequences read from the reference cache")
    measured = cache.measured(key) if cache is not None else MeasuredPlans(None, {}, None)
    runs = SelectionRuns(model, seqs, shape, refs)  # the selection's prefill, once: every plan decodes from it
    with tempfile.TemporaryDirectory(prefix="mlxgate-plan-") as tmp:
        plans = Measurements(runs, measured, Path(tmp), say)
        yield SearchSpace(sizes, itemsize, options, len(seqs), plans.many), plans.real


@dataclass
class Sensitivities:
    """Step 2's measurements: each option uniform on every layer, each layer alone at the cheapest option;
    `drift` predicts a layer's drift at any option from them."""

    cheapest: Option
    uniform: list[dict[str, Any]]  # per option: its label, mean and interval, verdict, bytes per token
    uniform_stats: dict[Option, KLStats]
    sensitivity: dict[int, float]

    def drift(self, i: int, o: Option) -> float:
        """Layer `i`'s predicted drift at `o`: its drift alone at the cheapest option, scaled by the uniform
        runs' ratio (plain: 0; a uniform mean of 0 counts as 1e-12, not a division by zero)."""
        if o.bits is None:
            return 0.0
        mean, cheapest = (max(self.uniform_stats[x].mean, 1e-12) for x in (o, self.cheapest))
        return self.sensitivity[i] * mean / cheapest


def measure_sensitivities(space: SearchSpace, limits: Mapping[str, float], measure: Measure) -> Sensitivities:
    """Every option uniform, then every layer alone at the cheapest option (step 2): with the space's
    `measure_many`, the layers side by side (a prediction: the rounds measure the real plan)."""
    sizes, options, itemsize, many = space.sizes, space.options, space.itemsize, space.measure_many
    cheapest = min(options, key=lambda o: o.bytes_per_value(itemsize))
    uniform: list[dict[str, Any]] = []
    stats_of: dict[Option, KLStats] = {}
    for o in options:
        stats = stats_of[o] = measure({i: o for i in sizes}, f"uniform {o.label}")
        uniform.append(
            {
                "option": o.label,
                "mean": stats.mean,
                "mean_ci": list(stats.mean_ci),
                "passes": selection_verdict(stats, limits) == "pass",
                "bytes_per_token": o.bytes_per_value(itemsize) * sum(sizes.values()),
            }
        )
    if many is not None:
        alone = many([{i: cheapest} for i in sizes], f"each of {len(sizes)} layers alone at {cheapest.label}")
        sensitivity = {i: s.mean for i, s in zip(sizes, alone, strict=True)}
    else:
        sensitivity = {i: measure({i: cheapest}, f"layer {i} alone at {cheapest.label}").mean for i in sizes}
    return Sensitivities(cheapest, uniform, stats_of, sensitivity)


def choose_plan(
    sizes: Mapping[int, float],
    options: Sequence[Option],
    itemsize: int,
    limits: Mapping[str, float],
    measure: Measure,
    many: MeasureMany | None = None,
) -> PlanSearch:
    """Steps 2-5: sensitivities, the greedy with its measured back-off, and the comparison with the
    uniform plans; `measure(plan, what)` is the plan's statistics on the selection sequences."""
    sens = measure_sensitivities(SearchSpace(sizes, itemsize, options, 0, many), limits, measure)
    uniform = sens.uniform
    plan, rounds, passed = measured_rounds(sizes, options, sens.drift, itemsize, limits, measure)
    result = PlanSearch(
        layers=plan,
        bytes_per_token=_bytes(plan, sizes, itemsize),
        plain_bytes_per_token=PLAIN_OPTION.bytes_per_value(itemsize) * sum(sizes.values()),
        uniform=uniform,
        rounds=rounds,
        sensitivity=sens.sensitivity,
        passed_selection=passed,
        chosen="mixed",
        seconds=0.0,
        selection=0,
    )
    verdict, o = against_uniform(uniform, "bytes_per_token", result.bytes_per_token, options, passed, plan)
    if o is not None:
        result.layers = {i: o for i in sizes}
        result.bytes_per_token = o.bytes_per_value(itemsize) * sum(sizes.values())
    settle(
        result,
        verdict,
        o,
        f"no plan among {', '.join(o.label for o in options)} per layer passed the gate's limits on the selection "
        f"sequences in {len(rounds)} measured round{'s' * (len(rounds) != 1)}"
        f"{' but every layer plain' if passed else ''}; keep the plain cache, or widen the options (--bits, "
        "--group-sizes)",
    )
    return result


class Settled(Protocol):
    """What `settle` writes on (`PlanSearch`, `plan_weights.WeightsPlanSearch`): the choice, whether the
    selection passed it, and the notes that say why."""

    chosen: str
    passed_selection: bool
    notes: list[str]


def settle(result: Settled, verdict: str, uniform: Option | None, nothing_passed: str) -> None:
    """`against_uniform`'s verdict and option on a search's result (whose plan the caller has set to the
    `uniform` one where that won): chosen, passed where a uniform plan passed, and the note that says why."""
    if uniform is not None:
        result.chosen = verdict
        result.passed_selection = True
        result.notes.append(f"no mixed plan found costs fewer bytes than {verdict}, which passes")
    elif verdict == "none":
        result.chosen = "none"
        result.notes.append(nothing_passed)


def against_uniform(
    uniform: Sequence[Mapping[str, Any]],
    key: str,
    plan_bytes: float,
    options: Sequence[Option],
    passed: bool,
    plan: Mapping[Any, Option],
) -> tuple[str, Option | None]:
    """Step 5: ("uniform <label>", its option) where a uniform plan passes at no more bytes (`key`) than the
    mixed plan, or the mixed plan did not pass; ("none", None) where nothing passed, or only every layer
    plain (no quantized plan); else ("mixed", None)."""
    passing = [u for u in uniform if u["passes"]]
    best = min(passing, key=lambda u: u[key]) if passing else None
    if best is not None and (not passed or best[key] <= plan_bytes):
        o = next(o for o in options if o.label == best["option"])
        return f"uniform {o.label}", o
    if not passed or all(o.bits is None for o in plan.values()):
        return "none", None
    return "mixed", None


def measured_rounds(
    sizes: Mapping[U, float],
    options: Sequence[Option],
    drift: Callable[[U, Option], float],
    itemsize: int,
    limits: Mapping[str, float],
    measure: Callable[[Mapping[U, Option], str], KLStats],
    *,
    start: Mapping[U, Option] | None = None,
    at_length: Callable[[Mapping[U, Option], str], KLStats] | None = None,
) -> tuple[dict[U, Option], list[dict[str, Any]], bool]:
    """Steps 3-4: the greedy to `TARGET_SHARE` of the mean limit, measured (a pass: every limit, and the mean's
    bound within `SELECTION_MARGIN` of its limit); while no plan has passed, the
    target halves (below the last plan's own prediction); once one has, the target bisects (geometrically)
    between the lowest that failed and the highest that passed, for a cheaper plan that still passes;
    `MAX_ROUNDS` in all. The cheapest plan that passed (else the last), the rounds (each: target,
    prediction, measured mean and interval, verdict, bytes) and whether one passed. The greedy's path is
    one path, so a target's plan is its prefix at that drift. `at_length`: the plan measured again on
    selection sequences at the verification's long context; a round passes only where both pass."""
    target = limits["mean"] * TARGET_SHARE
    rounds: list[dict[str, Any]] = []
    failed_at: float | None = None  # the lowest target whose plan did not pass
    passed_at: float | None = None  # the highest target whose plan passed
    best: dict[U, Option] | None = None
    plan: dict[U, Option] = dict(start) if start is not None else {}
    seen: list[dict[U, Option]] = []
    for _ in range(MAX_ROUNDS):
        plan = greedy_plan(sizes, options, drift, target=target, start=start, itemsize=itemsize)
        if plan in seen:
            break  # the bisection has narrowed to plans already measured
        seen.append(plan)
        stats = measure(plan, f"the plan found for a predicted mean KL <= {target:.3g}")
        verdict = selection_verdict(stats, limits)
        checks: dict[str, str] = {c["key"]: c["verdict"] for c in kl_checks(stats.to_json(), dict(limits))}
        if verdict != _verdicts(stats, limits):
            checks["mean"] = f"within the limit but not {SELECTION_MARGIN:.0%} of it"
        rounds.append(
            {
                "target": target,
                "predicted": sum(drift(i, o) for i, o in plan.items()),
                "mean": stats.mean,
                "mean_ci": list(stats.mean_ci),
                "verdict": verdict,
                "checks": checks,
                "bytes_per_token": _bytes(plan, sizes, itemsize),
            }
        )
        if verdict == "pass" and at_length is not None:
            longer = at_length(plan, "the same plan at the long context")
            verdict = rounds[-1]["verdict"] = selection_verdict(longer, limits)
            rounds[-1]["long"] = {"mean": longer.mean, "mean_ci": list(longer.mean_ci), "verdict": verdict}
        if verdict == "pass":
            if best is None or _bytes(plan, sizes, itemsize) < _bytes(best, sizes, itemsize):
                best = plan
            passed_at = target
            if failed_at is None:
                break  # passed at the first ask: the search aims no higher than TARGET_SHARE
            target = math.sqrt(failed_at * passed_at)
        else:
            failed_at = target
            # below what this plan predicted: a target it already meets would measure the same plan again
            target = (
                math.sqrt(target * passed_at) if passed_at is not None else min(target, rounds[-1]["predicted"]) / 2
            )
    return (best if best is not None else plan), rounds, best is not None


def selection_verdict(stats: KLStats, limits: Mapping[str, float]) -> str:
    """A plan's verdict on the selection sequences: the gate's, except that a pass whose mean bound reaches
    past `SELECTION_MARGIN` of the mean limit is inconclusive (too little room for the gate's own prompts)."""
    verdict = _verdicts(stats, limits)
    if verdict == "pass" and stats.mean_ci[1] > SELECTION_MARGIN * limits["mean"]:
        return "inconclusive"
    return verdict


def _verdicts(stats: KLStats, limits: Mapping[str, float]) -> str:
    checks = kl_checks(stats.to_json(), dict(limits))
    verdicts = {c["verdict"] for c in checks}
    return "fail" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "pass"


def _bytes(plan: Mapping[U, Option], sizes: Mapping[U, float], itemsize: int) -> float:
    return sum(o.bytes_per_value(itemsize) * sizes[i] for i, o in plan.items())


def _layer_sizes(model: Any) -> tuple[dict[int, float], int, set[int]]:
    """{cached layer: K and V values per token}, the cache's item size, and the head dimensions."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    sizes: dict[int, float] = {}
    itemsize, dims = 2, set()
    for i, c in enumerate(cache):
        if quantized_form(c) is None or c.keys is None:
            continue
        k, v = c.keys, c.values
        sizes[i] = float(k.shape[1] * k.shape[-1] + v.shape[1] * v.shape[-1])
        itemsize = k.dtype.size
        dims |= {int(k.shape[-1]), int(v.shape[-1])}
    return sizes, itemsize, dims


def plan_summary(result: PlanSearch) -> list[str]:
    """The search in words: the plan, its bytes against plain and the uniform plans, the rounds, the verdict."""
    counts: dict[str, int] = {}
    for o in result.layers.values():
        counts[o.label] = counts.get(o.label, 0) + 1
    share = result.bytes_per_token / result.plain_bytes_per_token if result.plain_bytes_per_token else math.nan
    lines = [
        f"plan ({result.chosen}): "
        + ", ".join(f"{n} layers {label}" for label, n in sorted(counts.items()))
        + f" · {result.bytes_per_token:,.0f} KV bytes per token ({share:.1%} of plain)",
    ]
    lines.extend(uniform_lines(result.uniform, result.bytes_per_token, key="bytes_per_token"))
    lines.extend(round_lines(result.rounds, result.selection))
    lines.extend(f"  note: {n}" for n in result.notes)
    lines.extend(verdict_lines(result.verification, result.chosen, result.seconds))
    return lines
