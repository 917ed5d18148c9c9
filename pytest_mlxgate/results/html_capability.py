"""A capability gate's sections of the HTML report: each task's scores and drop with intervals, and
the flipped items (prompt, both outputs)."""

from __future__ import annotations

from collections.abc import Mapping

from ..common.format import DASH, clip, percent
from .html_parts import MAX_FLIPPED_SHOWN, MAX_POINTS, NOT_RECORDED, TEXT_CHARS, figure, verdict_badge
from .model import Interval, Record
from .record_capability import Task
from .svg import Figure, esc, message


def capability_sections(record: Record) -> str:
    tasks = record.tasks
    out = [
        "<h3>Capability per task</h3>",
        _capability_table(tasks),
        _capability_scores(tasks, record.bounds_floor),
        _capability_drop(tasks, record.bounds_max_drop),
    ]
    if record.skipped:
        out.append(
            '<p class="note">Skipped: '
            + "; ".join(f"{esc(t)} ({esc(why)})" for t, why in record.skipped.items())
            + "</p>"
        )
    out.append("<h3>Flipped items</h3>")
    out.extend(_flipped(task) for task in tasks.values())
    return "\n".join(out)


def _pct_interval(value: float | None, ci: Interval) -> str:
    lo, hi = ci
    interval = f" [{percent(lo)}, {percent(hi)}]" if lo is not None and hi is not None else ""
    return percent(value, missing=DASH) + interval


def _capability_table(tasks: Mapping[str, Task]) -> str:
    rows = []
    for task, t in tasks.items():
        drop, floor = t.drop_check, t.floor_check
        drop_text = DASH
        if drop is not None:
            drop_text = f"{_points(drop.value)} [{_points(drop.lower)}, {_points(drop.upper)}] ≤ {_points(drop.limit)}"
        verdicts = " ".join(verdict_badge(v.verdict) for v in (drop, floor) if v is not None) or DASH
        rows.append(
            f"<tr><td>{esc(task)}</td><td>{esc(t.n if t.n is not None else DASH)}</td>"
            f"<td>{_pct_interval(t.ref_score, t.ref_ci)}</td>"
            f"<td>{_pct_interval(t.cand_score, t.cand_ci)}</td><td>{drop_text}</td>"
            f"<td>{esc(t.method or DASH)}</td><td>{verdicts}</td></tr>"
        )
    return (
        '<table class="verdicts"><thead><tr><th>task</th><th>n</th><th>reference [95%]</th>'
        "<th>candidate [95%]</th><th>drop [bounds] vs limit</th><th>method</th><th>verdict</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _points(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:+.1f} pt"


def _capability_scores(tasks: Mapping[str, Task], floor: float | None) -> str:
    names = list(tasks)[:MAX_POINTS]
    if not names:
        return figure("capability-scores", "Both arms' score per task.", message("no task ran", label="scores"))
    fig = Figure(x=(-0.5, len(names) - 0.5), y=(0, 1), label="capability scores per task")
    fig.axes(
        ylabel="score", xticks=[(i, n) for i, n in enumerate(names)], yticks=[(v / 4, f"{25 * v:g}%") for v in range(5)]
    )
    if floor is not None:
        fig.hline(floor, cls="limit", label="floor")
    for arm, dx, cls in (("ref", -0.12, "point ref"), ("cand", 0.12, "point cand")):
        pts = []
        for i, task in enumerate(names):
            t = tasks[task]
            (lo, hi), score = (t.ref_ci, t.ref_score) if arm == "ref" else (t.cand_ci, t.cand_score)
            who = "reference" if arm == "ref" else "candidate"
            pts.append((i + dx, score, lo, hi, f"{task} {who}: {percent(score)} [{percent(lo)}, {percent(hi)}]"))
        fig.points(pts, cls=cls, unbounded=(False, False))
    fig.legend([("point ref", "reference"), ("point cand", "candidate")])
    return figure(
        "capability-scores",
        "Each arm's score per task with its 95% interval (Wilson for pass/fail "
        "tasks, bootstrap for graded ones), over the very same items.",
        fig.svg(),
    )


def _capability_drop(tasks: Mapping[str, Task], limit: float | None) -> str:
    drops = {name: t.drop_check for name, t in list(tasks.items())[:MAX_POINTS] if t.drop_check is not None}
    if not drops:
        return figure(
            "capability-drop",
            "The paired drop per task.",
            message("no drop limit asserted (max_drop=)", label="capability drop"),
        )
    values = [v for d in drops.values() for v in (d.value, d.lower, d.upper)] + [0.0, limit]
    known = [v for v in values if v is not None]
    lo, hi = min(known), max(known)
    pad = (hi - lo) * 0.1 or 0.05
    fig = Figure(x=(-0.5, len(drops) - 0.5), y=(lo - pad, hi + pad), label="capability drop per task")
    fig.axes(ylabel="drop (ref − cand)", xticks=[(i, n) for i, n in enumerate(drops)], yfmt=lambda v: f"{100 * v:g} pt")
    fig.hline(0.0, cls="stat")
    if limit is not None:
        fig.hline(limit, cls="limit", label="max_drop")
    fig.points(
        [
            (
                i,
                d.value,
                d.lower,
                d.upper,
                f"{t}: drop {_points(d.value)} [{_points(d.lower)}, {_points(d.upper)}], {d.verdict}",
            )
            for i, (t, d) in enumerate(drops.items())
        ],
        cls="point cand",
        unbounded=(False, False),
    )
    return figure(
        "capability-drop",
        "The paired drop (reference score − candidate score) with the bounds its "
        "verdict used, against the max_drop limit.",
        fig.svg(),
    )


def _flipped(task: Task) -> str:
    if task.flipped is None:
        return f'<p class="note">{esc(task.name)}: flipped items {esc(NOT_RECORDED)}</p>'
    items = task.flipped.items[:MAX_FLIPPED_SHOWN]
    total = task.flipped.total or len(items)
    if not total:
        return f'<p class="note">{esc(task.name)}: no item changed its score between the arms.</p>'
    losses = sum(1 for i in items if (i.candidate.score or 0) < (i.reference.score or 0))
    shown = f", the first {len(items)} shown" if len(items) < total else ""
    entries = []
    for i in items:
        ref, cand = i.reference, i.candidate
        prompt_html = (
            f'<pre class="prompt">{esc(clip(i.prompt, TEXT_CHARS, keep="end"))}</pre>'
            if i.prompt is not None
            else f'<p class="note">prompt {esc(NOT_RECORDED)}</p>'
        )
        entries.append(
            f'<div class="item"><p><code>{esc(i.id)}</code>: reference {esc(ref.verdict)} '
            f"({esc(ref.score)}) → candidate {esc(cand.verdict)} ({esc(cand.score)})</p>"
            f'{prompt_html}<div class="outs"><div><h4>reference</h4><pre>{esc(clip(ref.output or "", TEXT_CHARS))}'
            f"</pre></div><div><h4>candidate</h4><pre>{esc(clip(cand.output or '', TEXT_CHARS))}</pre></div></div>"
            "</div>"
        )
    return (
        f"<details open><summary>{esc(task.name)}: {total} item{'s' if total != 1 else ''} flipped ({losses} of "
        f"those shown lost by the candidate{shown})</summary>{''.join(entries)}</details>"
    )
