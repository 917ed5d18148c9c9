"""`mlxgate plan weights`' whole search (`search_weights_plan`), and its plan beside what mlx_lm would have
made at the same bytes: its uniform plans, its mixed recipes
(`mlx_lm.convert --quant-predicate mixed_3_6 / mixed_4_6`), and its gradient-sensitivity planner
(`mlx_lm.quant.dynamic_quant`, run offline on the search's own selection sequences).

Each of theirs is measured as it is; ours at its bytes is the last plan on the greedy's path (from every
module at its cheapest option, buying the most drift removed per byte) that fits in them. Both are
scored on the selection sequences and on the gate's own held-out prompts, so a reader sees at equal
bytes whose drift is lower where neither was chosen.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mlx_lm.convert import mixed_quant_predicate_builder
from mlx_lm.quant.dynamic_quant import estimate_sensitivities

from ..levers.weights import quantization_block
from ..stats.kl_stats import KLStats
from .plan_frontier import FULL_REACH, Frontier, PlanWords, Reach, trace_path
from .plan_gate import GateSpec
from .plan_kv import PLAIN_OPTION, Option, greedy_plan
from .plan_verify import round_lines, uniform_lines, verdict_lines
from .plan_weights import (
    WeightArms,
    WeightSensitivities,
    WeightsPlanSearch,
    choose_weights_plan,
    measure_weight_sensitivities,
    modules_by_path,
    start_plan,
    weight_arms,
    weights_spec,
)

__all__ = [
    "RECIPES",
    "compare_with_recipes",
    "comparison_lines",
    "dynamic_quant_plan",
    "recipe_plan",
    "WEIGHT_WORDS",
    "search_weights_frontier",
    "search_weights_plan",
    "weights_summary",
]

#: mlx_lm's mixed recipes the report measures (low bits for most modules, 6 for v_proj/down_proj in the
#: first, last and every third layer, and lm_head).
RECIPES = ("mixed_3_6", "mixed_4_6")
#: (low, high) widths at group 64 given to `dynamic_quant`: it upgrades the most sensitive modules from
#: low to high until the bytes are spent.
DYNAMIC_PAIRS = ((4, 8), (6, 8))


def search_weights_plan(
    model: Any,
    tokenizer: Any,
    gate: GateSpec,
    *,
    compare: bool = True,
    say: Callable[[str], None] = lambda _: None,
    **asked: Any,
) -> WeightsPlanSearch:
    """The search on `model` (`plan_weights`; `asked`: `weight_arms`' options: with `long`, each round's
    plan is measured at that length too); with `compare`, mlx_lm's plans beside it."""

    def search(arms: WeightArms, sens: WeightSensitivities) -> WeightsPlanSearch:
        result = choose_weights_plan(arms, sens, gate.limits)
        if compare:
            result.comparisons = compare_with_recipes(arms, sens, result, say=say)
        return result

    return _timed(model, tokenizer, gate, search, say=say, **asked)


R = TypeVar("R", WeightsPlanSearch, Frontier)


def _timed(
    model: Any, tokenizer: Any, gate: GateSpec, search: Callable[[WeightArms, WeightSensitivities], R], **asked: Any
) -> R:
    """`search(arms, sensitivities)` inside `weight_arms` (`asked`: its options), its selection count and
    seconds (setup included) set."""
    started = time.perf_counter()
    with weight_arms(model, tokenizer, gate, **asked) as arms:
        result = search(arms, measure_weight_sensitivities(arms, gate.limits))
        result.selection = arms.selection
    result.seconds = time.perf_counter() - started
    return result


def _quantization(plan: Mapping[Any, Option]) -> dict[str, Any]:
    return quantization_block(weights_spec(plan, plan))


#: A weight plan's frontier: the model's weight bytes, written as mlx_lm's quantization block.
WEIGHT_WORDS = PlanWords(
    "weight bytes", "weight bytes", "the weights as loaded", "quantization", _quantization, "keep the weights as loaded"
)


def search_weights_frontier(
    model: Any, tokenizer: Any, gate: GateSpec, reach: Reach = FULL_REACH, **asked: Any
) -> Frontier:
    """`plan weights --frontier`: the sensitivities, then `plan_frontier.trace_path` over the modules, every
    plan priced in the model's weight bytes; the answer is the cheapest that passes on the selection (or the
    least drift within `budget_bytes`)."""

    def search(arms: WeightArms, sens: WeightSensitivities) -> Frontier:
        return trace_path(
            arms.sizes,
            arms.options,
            arms.itemsize,
            gate.limits,
            arms.measure,
            drift=sens.drift,
            uniform={o: (arms.uniform(o), sens.uniform_stats[o]) for o in arms.options},
            start=start_plan(arms),
            price=arms.plan_bytes,
            plain=arms.plan_bytes({p: PLAIN_OPTION for p in arms.units}),
            sensitivity=sens.sensitivity,
            points=reach.points,
            budget_bytes=reach.budget_bytes,
            words=WEIGHT_WORDS,
        )

    return _timed(model, tokenizer, gate, search, **asked)


def recipe_plan(arms: WeightArms, recipe: str, group_size: int = 64) -> dict[str, Option]:
    """mlx_lm's `recipe` as a plan over the search's modules (ValueError where the model lacks its keys)."""
    predicate: Any = mixed_quant_predicate_builder(recipe, arms.model, group_size)
    modules = modules_by_path(arms.model)
    plan: dict[str, Option] = {}
    for path, unit in arms.units.items():
        got = predicate(path, modules[path])
        o = Option(int(got["bits"]), int(got["group_size"])) if isinstance(got, dict) else Option(None)
        plan[path] = o if unit.allows(o) else Option(None)
    return plan


def dynamic_quant_plan(
    arms: WeightArms, low: int, high: int, budget: float, *, group_size: int = 64
) -> tuple[dict[str, Option], dict[str, float]]:
    """`mlx_lm.quant.dynamic_quant`'s plan within `budget` bytes: its sensitivities (the gradient of the KL
    to the float model, on the selection sequences, against the low-to-high weight change), then its rule
    (a module above the threshold takes `high`), the threshold set where the bytes fit (its own search
    sizes bits per weight; this sizes the same plan's bytes)."""
    arms.restore()  # the float weights: its sensitivities are measured from them
    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar, between our own progress lines
        found = dict(estimate_sensitivities(arms.model, arms.data, low, group_size, high, group_size))
    lo, hi = Option(low, group_size), Option(high, group_size)
    plan = {p: lo if u.allows(lo) else Option(None) for p, u in arms.units.items()}
    for path in sorted(arms.units, key=lambda p: -found.get(p, float("-inf"))):
        if not arms.units[path].allows(hi):
            continue
        trial = {**plan, path: hi}
        if arms.plan_bytes(trial) > budget:
            break
        plan = trial
    return plan, {p: float(v) for p, v in found.items()}


def compare_with_recipes(
    arms: WeightArms,
    sens: WeightSensitivities,
    result: WeightsPlanSearch,
    *,
    say: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Each of mlx_lm's plans, and ours at its bytes, on the selection and on the gate's held-out prompts."""
    path: list[dict[str, Option]] = [start_plan(arms)]
    greedy_plan(arms.sizes, arms.options, sens.drift, target=0.0, start=path[0], itemsize=arms.itemsize, path=path)

    def ours_within(budget: float) -> dict[str, Option] | None:
        fitting = [p for p in path if arms.plan_bytes(p) <= budget]
        return max(fitting, key=arms.plan_bytes) if fitting else None

    theirs: list[tuple[str, dict[str, Option]]] = []
    for bits in (4, 6, 8):
        o = Option(bits, 64)
        if o in arms.options:
            theirs.append((f"uniform {o.label}", arms.uniform(o)))
    for recipe in RECIPES:
        try:
            theirs.append((f"mlx_lm {recipe}", recipe_plan(arms, recipe)))
        except ValueError as e:  # a model without down_proj: mlx_lm's recipe does not apply
            result.notes.append(f"mlx_lm {recipe}: not measured ({e})")
    # dynamic_quant at the mixed plan's bytes; a uniform answer is one of its own plans, so then halfway
    # between uniform 6- and 8-bit, where a planner has choices to make
    budget = result.bytes
    if result.chosen != "mixed":
        budget = sum(arms.plan_bytes(arms.uniform(Option(b, 64))) for b in (6, 8)) / 2
    for low, high in DYNAMIC_PAIRS:
        if Option(low, 64) in arms.options and Option(high, 64) in arms.options:
            say(f"plan weights: mlx_lm dynamic_quant {low}->{high} bits within {budget:,.0f} bytes")
            plan, _ = dynamic_quant_plan(arms, low, high, budget)
            theirs.append((f"mlx_lm dynamic_quant {low}/{high}", plan))
    rows = []
    for name, plan in theirs:
        spent = arms.plan_bytes(plan)
        mine = ours_within(spent)
        row: dict[str, Any] = {"name": name, "bytes": spent, **_scores(arms, plan, name)}
        if mine is not None:
            row["ours"] = {"bytes": arms.plan_bytes(mine), **_scores(arms, mine, f"ours within {name}'s bytes")}
        rows.append(row)
    return rows


def _scores(arms: WeightArms, plan: Mapping[str, Option], name: str) -> dict[str, Any]:
    return {
        "selection": _figures(arms.measure(plan, f"compare: {name} (selection)")),
        "held_out": _figures(arms.held_out(plan, f"compare: {name} (the gate's prompts)")),
    }


def _figures(stats: KLStats) -> dict[str, Any]:
    return {"mean": stats.mean, "mean_ci": [float(x) for x in stats.mean_ci]}


def comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons in words: theirs, then ours at their bytes, on the gate's held-out prompts."""
    lines = []
    for r in rows:
        held = r["held_out"]
        line = f"  {r['name']}: {r['bytes']:,.0f} B, mean KL {held['mean']:.3g} on the gate's prompts"
        ours = r.get("ours")
        if ours is not None:
            mine = ours["held_out"]
            ratio = mine["mean"] / held["mean"] if held["mean"] > 0 else float("nan")
            word = "lower" if ratio < 0.95 else "higher" if ratio > 1.05 else "the same (a tie)"
            line += f" · ours within its bytes: {ours['bytes']:,.0f} B, {mine['mean']:.3g} ({ratio:.2f}x, {word})"
        else:
            line += " · ours: no plan on the path fits in its bytes"
        lines.append(line)
    return lines


def weights_summary(result: WeightsPlanSearch) -> list[str]:
    """The search in words: the plan, its bytes against the weights as loaded and the uniform plans, the
    rounds, mlx_lm's plans beside it, and the verdict."""
    counts: dict[str, int] = {}
    for o in result.plan.values():
        label = "as loaded" if o.bits is None else o.label
        counts[label] = counts.get(label, 0) + 1
    share = result.bytes / result.plain_bytes if result.plain_bytes else math.nan
    lines = [
        f"plan ({result.chosen}): "
        + ", ".join(f"{n} module{'s' * (n != 1)} {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        + f" · {result.bytes:,.0f} weight bytes ({share:.1%} of the weights as loaded)",
        f"  sensitivities: each module alone at {result.probe}, scaled by its own quantization error per option",
    ]
    lines.extend(uniform_lines(result.uniform, result.bytes, key="bytes"))
    lines.extend(round_lines(result.rounds, result.selection))
    if result.comparisons:
        lines.append("  beside mlx_lm's plans, at their bytes (mean KL on the gate's own prompts):")
        lines.extend("  " + line for line in comparison_lines(result.comparisons))
    lines.extend(f"  note: {n}" for n in result.notes)
    lines.extend(verdict_lines(result.verification, result.chosen, result.seconds))
    return lines
