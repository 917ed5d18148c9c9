"""`mlxgate plan kv --frontier` (and `plan weights --frontier`): the plans cheapest at each level of drift,
every point measured.

One plan answers one limit; a kernel engineer choosing a KV budget wants the whole trade: bytes against
drift, to pick the knee. The greedy's path (`plan_kv.greedy_plan`), from every layer at the cheapest
option to every layer plain, buying at each step the upgrade that removes the most predicted drift per
byte, is the *predicted* frontier. Plans are taken along it at `points` levels of predicted drift
(geometric between its cheapest plan's and a thousandth of it) and each is *measured* on the selection
sequences (mean KL and its interval, p99, top-1, the gate's verdict there), beside the uniform plans the
sensitivities measured anyway. The frontier is the measured plans no other measured plan beats on both
bytes and the mean's upper bound. The answer is the cheapest frontier plan that passes the gate's limits
on the selection, or with `budget_bytes` the least drift within that size; the CLI then has the gate
verify it on its own prompts, as `plan kv` does. A weight plan's frontier is traced the same way
(`trace_path`), its bytes the model's and its points written as mlx_lm's quantization block (`PlanWords`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, Unpack

from ..results.html_parts import figure
from ..results.html_report import html_page
from ..results.svg import Figure, esc, message
from ..stats.kl_stats import KLStats
from .plan_gate import GateSpec
from .plan_kv import (
    PLAIN_OPTION,
    Measure,
    MeasureMany,
    Option,
    SearchSpace,
    SelectionAsk,
    _bytes,
    greedy_plan,
    measure_sensitivities,
    selection_verdict,
    timed_search,
)
from .plan_verify import verification_lines

__all__ = [
    "DEFAULT_POINTS",
    "KV_WORDS",
    "Frontier",
    "FrontierPoint",
    "PlanWords",
    "Reach",
    "frontier_levels",
    "frontier_page",
    "frontier_table",
    "on_frontier",
    "search_frontier",
    "trace",
    "trace_path",
]

#: Plans measured along the greedy's path (besides the uniform ones).
DEFAULT_POINTS = 8
#: The path is sampled down to this share of its cheapest plan's predicted drift.
DEEPEST = 1e-3


@dataclass(frozen=True)
class Reach:
    """How far a frontier search goes: `points` plans along the path, and with `budget_bytes` the answer is
    the least drift within that size (`plan kv/weights --frontier --points --budget-bytes`)."""

    points: int = DEFAULT_POINTS
    budget_bytes: float | None = None


#: `--frontier` alone.
FULL_REACH = Reach()


def _kv_config(layers: Mapping[Any, Option]) -> dict[str, Any]:
    return {"default": None, "layers": {str(i): o.spec() for i, o in sorted(layers.items())}}


@dataclass(frozen=True)
class PlanWords:
    """What a frontier's plans are, for its reader: what their bytes count, what "plain" is, and the file
    a point is written as (its key in the record, and the writer)."""

    bytes_label: str  # a column head: "KV bytes/token"
    bytes_unit: str  # after a figure: "KV bytes per token"
    plain: str  # what the shares are of: "the plain cache"
    config_key: str  # "kv_config"
    config_of: Callable[[Mapping[Any, Option]], dict[str, Any]]
    keep: str  # what to keep when nothing passes: "keep the plain cache"


KV_WORDS = PlanWords(
    "KV bytes/token", "KV bytes per token", "the plain cache", "kv_config", _kv_config, "keep the plain cache"
)


@dataclass(frozen=True)
class FrontierPoint:
    """One measured plan: where it came from, its bytes, and its drift on the selection sequences."""

    source: str  # "uniform 8-bit g64", or "path step 17" (the greedy's 17th upgrade)
    layers: Mapping[Any, Option]
    bytes_per_token: float  # a weight plan's: the model's weight bytes
    predicted: float | None  # the greedy's prediction of its mean KL (None: a uniform plan, measured only)
    mean: float
    mean_ci: tuple[float, float]
    p99: float | None
    top1: float | None
    verdict: str  # against the gate's limits, on the selection sequences
    frontier: bool = False  # no other measured plan has fewer bytes and a lower mean bound

    @classmethod
    def measured(
        cls,
        source: str,
        layers: Mapping[Any, Option],
        stats: KLStats,
        *,
        bytes_per_token: float,
        predicted: float | None,
        limits: Mapping[str, float],
    ) -> FrontierPoint:
        j = stats.to_json()
        return cls(
            source=source,
            layers=dict(layers),
            bytes_per_token=bytes_per_token,
            predicted=predicted,
            mean=stats.mean,
            mean_ci=(float(stats.mean_ci[0]), float(stats.mean_ci[1])),
            p99=_number(j.get("p99")),
            top1=_number(j.get("top1")),
            verdict=selection_verdict(stats, limits),
        )

    def kv_config(self) -> dict[str, Any]:
        return _kv_config(self.layers)

    def counts(self) -> str:
        """`20 × 8-bit g64, 10 × K8/V4 g64`: the plan in one line."""
        counts: dict[str, int] = {}
        for o in self.layers.values():
            counts[o.label] = counts.get(o.label, 0) + 1
        return ", ".join(f"{n} × {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_json(self, words: PlanWords = KV_WORDS) -> dict[str, Any]:
        return {
            "source": self.source,
            "plan": self.counts(),
            "bytes_per_token": self.bytes_per_token,
            "predicted": self.predicted,
            "mean": self.mean,
            "mean_ci": list(self.mean_ci),
            "p99": self.p99,
            "top1": self.top1,
            "verdict": self.verdict,
            "frontier": self.frontier,
            words.config_key: words.config_of(self.layers),
        }


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


@dataclass
class Frontier:
    """The measured points, the answer among them, and what the search cost."""

    points: list[FrontierPoint]
    answer: FrontierPoint | None
    plain_bytes_per_token: float
    limits: Mapping[str, float]
    budget_bytes: float | None = None
    sensitivity: dict[Any, float] = field(default_factory=dict)
    selection: int = 0
    seconds: float = 0.0
    verification: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    words: PlanWords = KV_WORDS

    @property
    def succeeded(self) -> bool:
        """An answer exists and the gate passed it on its own prompts (without a verification, `--no-verify`,
        its pass on the selection stands in, and the output says so)."""
        if self.answer is None:
            return False
        return bool(self.verification["verified"]) if self.verification is not None else self.answer.verdict == "pass"

    def kv_config(self) -> dict[str, Any]:
        """The answer's plan file (a KV plan's kv_config, a weight plan's quantization block)."""
        return self.words.config_of(self.answer.layers if self.answer is not None else {})

    def to_json(self) -> dict[str, Any]:
        return {
            "frontier": [p.to_json(self.words) for p in self.points],
            "answer": None if self.answer is None else self.points.index(self.answer),
            self.words.config_key: self.kv_config(),
            "plain_bytes_per_token": self.plain_bytes_per_token,
            "limits": dict(self.limits),
            "budget_bytes": self.budget_bytes,
            "sensitivity": {str(k): v for k, v in sorted(self.sensitivity.items())},
            "selection_sequences": self.selection,
            "seconds": round(self.seconds, 1),
            "verification": self.verification,
            "notes": self.notes,
        }


def frontier_levels(cheapest: float, points: int) -> list[float]:
    """`points` levels of predicted drift, geometric from the cheapest plan's down to `DEEPEST` of it."""
    if points < 1 or not cheapest > 0:
        return []
    if points == 1:
        return [cheapest]
    return [cheapest * DEEPEST ** (k / (points - 1)) for k in range(points)]


def on_frontier(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points with `frontier` set where no other point has bytes <= and a mean bound <= theirs, one of
    them strictly (ties: the first such point stands)."""
    out = []
    for k, p in enumerate(points):
        beaten = any(
            q.bytes_per_token <= p.bytes_per_token
            and q.mean_ci[1] <= p.mean_ci[1]
            and (q.bytes_per_token < p.bytes_per_token or q.mean_ci[1] < p.mean_ci[1] or j < k)
            for j, q in enumerate(points)
            if j != k
        )
        out.append(replace(p, frontier=not beaten))
    return out


def search_frontier(
    model: Any, tokenizer: Any, gate: GateSpec, reach: Reach = FULL_REACH, **asked: Unpack[SelectionAsk]
) -> Frontier:
    """`trace` on `model`, each plan measured on the selection sequences (`asked`: `plan_kv.selection_arms`'
    options)."""
    return timed_search(
        model,
        tokenizer,
        gate,
        lambda space, measure: trace(
            space.sizes,
            space.options,
            space.itemsize,
            gate.limits,
            measure,
            points=reach.points,
            budget_bytes=reach.budget_bytes,
            many=space.measure_many,
        ),
        **asked,
    )


def trace(
    sizes: Mapping[int, float],
    options: Sequence[Option],
    itemsize: int,
    limits: Mapping[str, float],
    measure: Measure,
    *,
    points: int = DEFAULT_POINTS,
    budget_bytes: float | None = None,
    many: MeasureMany | None = None,
) -> Frontier:
    """A KV plan's frontier: the sensitivities (`plan_kv.measure_sensitivities`), then `trace_path`."""
    sens = measure_sensitivities(SearchSpace(sizes, itemsize, options, 0, many), limits, measure)
    return trace_path(
        sizes,
        options,
        itemsize,
        limits,
        measure,
        drift=sens.drift,
        uniform={o: ({i: o for i in sizes}, sens.uniform_stats[o]) for o in options},
        start={i: sens.cheapest for i in sizes},
        price=lambda plan: _bytes(plan, sizes, itemsize),
        plain=PLAIN_OPTION.bytes_per_value(itemsize) * sum(sizes.values()),
        sensitivity=sens.sensitivity,
        points=points,
        budget_bytes=budget_bytes,
    )


U = TypeVar("U", bound=Hashable)


def trace_path(
    sizes: Mapping[U, float],
    options: Sequence[Option],
    itemsize: int,
    limits: Mapping[str, float],
    measure: Callable[[Mapping[U, Option], str], KLStats],
    *,
    drift: Callable[[U, Option], float],
    uniform: Mapping[Option, tuple[Mapping[U, Option], KLStats]],
    start: Mapping[U, Option],
    price: Callable[[Mapping[U, Option]], float],
    plain: float,
    sensitivity: Mapping[U, float],
    points: int = DEFAULT_POINTS,
    budget_bytes: float | None = None,
    words: PlanWords = KV_WORDS,
) -> Frontier:
    """The greedy's whole path from `start` by `drift`, `points` plans along it and every uniform plan (each
    already measured: its plan and statistics) measured, the frontier among them, and the answer (see the
    module's docstring). `price(plan)`: its bytes; `plain`: the bytes of every layer plain."""
    measured = [
        FrontierPoint.measured(
            f"uniform {o.label}", plan, stats, bytes_per_token=price(plan), predicted=None, limits=limits
        )
        for o, (plan, stats) in uniform.items()
    ]
    path = [dict(start)]
    greedy_plan(sizes, options, drift, target=0.0, start=start, itemsize=itemsize, path=path)
    predicted = [sum(drift(i, o) for i, o in plan.items()) for plan in path]
    chosen: list[int] = []
    for level in frontier_levels(predicted[0], points + 1)[1:]:  # the cheapest plan itself is uniform
        step = next((k for k, p in enumerate(predicted) if p <= level), None)
        uniform_step = step is not None and len(set(path[step].values())) == 1  # measured above (or plain)
        if step is not None and step not in chosen and not uniform_step:
            chosen.append(step)
    for step in chosen:
        plan = path[step]
        what = f"frontier: path step {step} (predicted mean KL {predicted[step]:.3g})"
        measured.append(
            FrontierPoint.measured(
                f"path step {step}",
                plan,
                measure(plan, what),
                bytes_per_token=price(plan),
                predicted=predicted[step],
                limits=limits,
            )
        )
    ordered = on_frontier(sorted(measured, key=lambda p: (p.bytes_per_token, p.mean_ci[1])))
    frontier = Frontier(
        points=ordered,
        answer=None,
        plain_bytes_per_token=plain,
        limits=dict(limits),
        budget_bytes=budget_bytes,
        sensitivity=dict(sensitivity),
        words=words,
    )
    frontier.answer = _answer(frontier)
    return frontier


def _answer(frontier: Frontier) -> FrontierPoint | None:
    """The cheapest point that passes on the selection; within `budget_bytes`, the least drift (the mean's
    bound) that fits, pass or not (the gate's verification says whether it is good enough)."""
    points = frontier.points
    if frontier.budget_bytes is not None:
        fits = [p for p in points if p.bytes_per_token <= frontier.budget_bytes]
        if not fits:
            cheapest = min(p.bytes_per_token for p in points)
            frontier.notes.append(
                f"no measured plan fits in {frontier.budget_bytes:,.0f} {frontier.words.bytes_unit} (the cheapest "
                f"takes {cheapest:,.0f}): raise --budget-bytes, or add cheaper options (--bits)"
            )
            return None
        return min(fits, key=lambda p: (p.mean_ci[1], p.bytes_per_token))
    passing = [p for p in points if p.verdict == "pass"]
    if not passing:
        frontier.notes.append(
            f"no measured plan passes the gate's limits on the selection sequences: {frontier.words.keep}, or "
            "widen the options (--bits, --group-sizes, --apart)"
        )
        return None
    return min(passing, key=lambda p: (p.bytes_per_token, p.mean_ci[1]))


def frontier_table(frontier: Frontier) -> list[str]:
    """The frontier in words: a row per measured point, cheapest first (`*`: on the frontier, `>`: the
    answer), then the verification."""
    plain = frontier.plain_bytes_per_token
    lines = [
        f"frontier: {len(frontier.points)} plans measured on {frontier.selection} selection sequences "
        f"(limits: {', '.join(f'{k} {v:g}' for k, v in frontier.limits.items())})",
        f"     {frontier.words.bytes_label:>14} {'of plain':>8}  {'mean KL [95% CI]':<30} {'p99':>8} {'top-1':>6}  "
        f"{'selection':<12} plan",
    ]
    for p in frontier.points:
        mark = (">" if p is frontier.answer else " ") + ("*" if p.frontier else " ")
        share = p.bytes_per_token / plain if plain else math.nan
        interval = f"{p.mean:.3g} [{p.mean_ci[0]:.3g}, {p.mean_ci[1]:.3g}]"
        p99 = f"{p.p99:.3g}" if p.p99 is not None else "-"
        top1 = f"{p.top1:.3f}" if p.top1 is not None else "-"
        lines.append(
            f"  {mark} {p.bytes_per_token:>14,.0f} {share:>8.1%}  {interval:<30} {p99:>8} {top1:>6}  "
            f"{p.verdict:<12} {p.source}: {p.counts()}"
        )
    lines.append("  (* on the frontier: no measured plan has fewer bytes and a lower mean bound; > the answer)")
    lines.extend(f"  note: {n}" for n in frontier.notes)
    if frontier.verification is not None:
        lines.extend(verification_lines(frontier.verification))
    elif frontier.answer is not None:
        lines.append("  not verified (--no-verify): measured on the selection only; run the gate on it before use")
    lines.append(f"  took {frontier.seconds:.0f} s")
    return lines


def frontier_page(frontier: Frontier, *, title: str = "mlxgate plan kv --frontier") -> str:
    """The frontier as an HTML page: each measured plan's bytes (share of plain) against its mean
    KL and interval, the frontier joined by a line, the answer marked, the gate's mean limit across; then
    the table of `frontier_table`'s figures."""
    plain = frontier.plain_bytes_per_token or 1.0
    points = frontier.points
    ys = [y for p in points for y in (p.mean, p.mean_ci[0], p.mean_ci[1]) if y > 0]
    limit = frontier.limits.get("mean")
    if limit is not None:
        ys.append(limit)
    if not points or not ys:
        plot = figure("frontier", "No plan was measured.", message("no plan measured", label="frontier"))
    else:
        fig = Figure(
            x=(0.0, max(p.bytes_per_token for p in points) / plain * 1.08),
            y=(min(ys) / 2, max(ys) * 2),
            ylog=True,
            height=300,
            label=f"{frontier.words.bytes_unit} against drift",
        )
        fig.axes(
            xlabel=f"{frontier.words.bytes_unit}, share of {frontier.words.plain}",
            ylabel="mean KL (log)",
            xfmt=lambda v: f"{v:.0%}",
        )
        if limit is not None:
            fig.hline(limit, cls="limit", label=f"the gate's mean limit {limit:g}")
        fig.line(
            [(p.bytes_per_token / plain, p.mean) for p in points if p.frontier and p.mean > 0], cls="line frontier"
        )
        for p in points:
            cls = "point answer" if p is frontier.answer else "point" if p.frontier else "point off"
            tip = (
                f"{p.source}: {p.counts()}; {p.bytes_per_token:,.0f} {frontier.words.bytes_unit}; mean KL {p.mean:.3g} "
                f"[{p.mean_ci[0]:.3g}, {p.mean_ci[1]:.3g}]; {p.verdict} on the selection"
            )
            low = p.mean_ci[0] if p.mean_ci[0] > 0 else None
            mark = [(p.bytes_per_token / plain, p.mean if p.mean > 0 else None, low, p.mean_ci[1], tip)]
            fig.points(mark, cls=cls, r=5.0 if p is frontier.answer else 3.0)
        plot = figure(
            "frontier",
            f"Each plan measured on {frontier.selection} selection sequences: mean KL and its 95% interval against "
            f"its {frontier.words.bytes_unit}; the line joins the frontier (no plan has fewer bytes and a lower "
            "bound), grey points are beaten, the answer is green.",
            fig.svg(),
        )
    rows = "".join(
        f"<tr><td>{'answer' if p is frontier.answer else ''}{' · ' if p is frontier.answer and p.frontier else ''}"
        f"{'frontier' if p.frontier else ''}</td><td>{p.bytes_per_token:,.0f}</td>"
        f"<td>{p.bytes_per_token / plain:.1%}</td><td>{p.mean:.3g} [{p.mean_ci[0]:.3g}, {p.mean_ci[1]:.3g}]</td>"
        f"<td>{'-' if p.p99 is None else f'{p.p99:.3g}'}</td><td>{'-' if p.top1 is None else f'{p.top1:.3f}'}</td>"
        f"<td>{esc(p.verdict)}</td><td>{esc(p.source)}: {esc(p.counts())}</td></tr>"
        for p in points
    )
    table = (
        f'<table class="frontier"><tr><th></th><th>{esc(frontier.words.bytes_label)}</th><th>of plain</th>'
        "<th>mean KL [95% CI]</th>"
        f"<th>p99</th><th>top-1</th><th>selection</th><th>plan</th></tr>{rows}</table>"
    )
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in frontier.notes)
    return html_page(title, [f"<header><h1>{esc(title)}</h1></header>", plot, table, notes])
