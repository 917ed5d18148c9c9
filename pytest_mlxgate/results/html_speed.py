"""The speed and memory sections of the HTML report: tokens/s ratios with intervals per context, peak
memory and KV bytes."""

from __future__ import annotations

from collections.abc import Sequence

from ..common.format import DASH, format_bytes, format_duration
from .html_parts import MAX_POINTS, figure
from .model import Record
from .record_speed import Ratio, Speed, SpeedArm, SpeedContext
from .svg import Figure, esc, message


def speed_sections(record: Record, speed: Speed) -> str:
    contexts = speed.contexts[:MAX_POINTS]
    out = [
        "<h3>Speed and memory</h3>",
        _speed_table(contexts, speed),
        _speed_ratios(record, contexts),
        _memory(contexts),
    ]
    return "\n".join(out)


def _ratio_text(est: Ratio | None) -> str:
    if est is None or est.ratio is None:
        return DASH
    lo, hi = est.ci
    return f"×{est.ratio:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def _tps(v: float | None) -> str:
    return DASH if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _held(ref: SpeedArm, cand: SpeedArm) -> str:
    """The bytes of the positions holding a token, under the allocated ones, when recorded."""
    if ref.kv_held_bytes is None or cand.kv_held_bytes is None:
        return ""
    return f"<br><small>holds {_bytes(ref.kv_held_bytes)} → {_bytes(cand.kv_held_bytes)}</small>"


def _bytes(v: float | None) -> str:
    return DASH if v is None else format_bytes(v)


def _speed_table(contexts: Sequence[SpeedContext], speed: Speed) -> str:
    rows = []
    for ctx in contexts:
        ref, cand = ctx.reference, ctx.candidate
        rows.append(
            f"<tr><td>{ctx.length}</td><td>{_tps(ref.prefill_tps)} → {_tps(cand.prefill_tps)}</td>"
            f"<td>{_ratio_text(ctx.prefill)}</td>"
            f"<td>{_tps(ref.decode_tps)} → {_tps(cand.decode_tps)}</td>"
            f"<td>{_ratio_text(ctx.decode)}</td>"
            f"<td>{_bytes(ref.peak_bytes)} → {_bytes(cand.peak_bytes)}</td>"
            f"<td>{_ratio_text(ctx.peak)}</td>"
            f"<td>{_bytes(ref.kv_bytes)} → {_bytes(cand.kv_bytes)}{_held(ref, cand)}</td></tr>"
        )
    notes = []
    if speed.repetitions is not None:
        pairs = ", ".join(
            f"{c.decode.n} @{c.length}" + (f" ({esc(c.stopped)})" if c.stopped else "")
            for c in speed.contexts
            if c.decode is not None and c.decode.n is not None
        )
        notes.append(
            f"ABBA pairs per context: {pairs or DASH} of at most {speed.repetitions}, "
            f"{esc(speed.decode_tokens)} tokens decoded"
        )
    if speed.memory_method:
        notes.append(f"peak memory: {esc(speed.memory_method)}")
    if speed.weights_reference is not None and speed.weights_reference != speed.weights_candidate:
        notes.append(f"weights {_bytes(speed.weights_reference)} → {_bytes(speed.weights_candidate)}")
    if speed.duration_s is not None:
        notes.append(f"measured in {format_duration(speed.duration_s)}")
    return (
        '<table class="verdicts"><thead><tr><th>context</th><th>prefill tok/s ref → cand</th><th>ratio [95%]</th>'
        "<th>decode tok/s ref → cand</th><th>ratio [95%]</th><th>peak growth ref → cand</th><th>ratio [95%]</th>"
        f"<th>KV cache ref → cand</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        + (f'<p class="note">{" · ".join(notes)}</p>' if notes else "")
    )


def _speed_ratios(record: Record, contexts: Sequence[SpeedContext]) -> str:
    entries: list[tuple[str, Ratio, str, int]] = []  # (label, estimate, goal key, context)
    for ctx in contexts:
        for key, goal, est in (
            ("prefill", "speed.prefill", ctx.prefill),
            ("decode", "speed.decode", ctx.decode),
            ("peak", "speed.memory", ctx.peak),
            ("kv", "speed.kv", ctx.kv),
        ):
            if est is not None and est.ratio is not None:
                entries.append((f"{key} @{ctx.length}", est, goal, ctx.length))
    if not entries:
        return figure("speed-ratios", "Candidate / reference ratios.", message("no ratio measured", label="speed"))
    values = [1.0]
    for _, est, _, _ in entries:
        values += [v for v in (est.ratio, *est.ci) if v is not None and v > 0]
    limits: dict[tuple[str, int | None], float] = {}
    for check in record.checks:
        if check.limit is not None and check.limit > 0 and (check.key or "").startswith("speed."):
            limits[(str(check.key), check.context)] = check.limit
            values.append(check.limit)
    lo, hi = min(values) / 1.15, max(values) * 1.15
    fig = Figure(
        x=(-0.5, len(entries) - 0.5),
        y=(lo, hi),
        ylog=True,
        label="speed and memory ratios",
        width=min(1040, max(640, 90 * len(entries) + 70)),
        margin=(56, 12, 14, 48),
    )
    ticks = [t for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0) if lo <= t <= hi]
    fig.axes(
        ylabel="candidate / reference",
        xticks=[(i, e[0]) for i, e in enumerate(entries)],
        yticks=[(t, f"×{t:g}") for t in ticks] or None,
    )
    fig.hline(1.0, cls="stat", label="×1 (same)")
    pts = []
    for i, (label, est, goal, c) in enumerate(entries):
        lo_ci, hi_ci = est.ci
        pairs = f", {est.n} pairs" if est.n is not None else " (bytes counted: exact)"
        pts.append((i, est.ratio, lo_ci, hi_ci, f"{label}: {_ratio_text(est)}{pairs}"))
        limit = limits.get((goal, c))
        if limit is not None:
            fig.points(
                [(i, limit, None, None, f"{label} limit ×{limit:g}")], cls="limit-mark", r=4, unbounded=(False, False)
            )
    fig.points(pts, cls="point cand", unbounded=(False, False))
    return figure(
        "speed-ratios",
        "Candidate / reference per context: prefill and decode tokens/s (higher is "
        "faster), peak memory growth and KV cache bytes (lower is smaller); the geometric mean of the "
        "paired ratios with its 95% Student-t interval (KV bytes are counted: exact); an open circle marks "
        "an asserted limit.",
        fig.svg(),
    )


def _memory(contexts: Sequence[SpeedContext]) -> str:
    """KV cache bytes and peak growth per arm: a panel each (their sizes differ by orders of magnitude)."""
    panels = []
    for title, kv in (("KV cache", True), ("peak memory growth", False)):
        groups = []
        for ctx in contexts:
            r, k = (
                (ctx.reference.kv_bytes, ctx.candidate.kv_bytes)
                if kv
                else (ctx.reference.peak_bytes, ctx.candidate.peak_bytes)
            )
            if r is not None or k is not None:
                groups.append((f"@{ctx.length}", None if r is None else float(r), None if k is None else float(k)))
        if groups:
            panels.append(_memory_panel(title, groups))
    if not panels:
        return figure("memory", "Memory per arm.", message("no memory figures recorded", label="memory"))
    return figure(
        "memory",
        "KV cache bytes (counted over the cache arrays: exact) and peak memory growth per trial "
        "(median), each arm, per context.",
        "".join(panels),
    )


def _memory_panel(title: str, groups: Sequence[tuple[str, float | None, float | None]]) -> str:
    top = max([v for _, r, k in groups for v in (r, k) if v is not None] + [1.0])
    unit, scale = ("GiB", 1 << 30) if top >= 1 << 30 else ("MiB", 1 << 20) if top >= 1 << 20 else ("KiB", 1 << 10)
    fig = Figure(
        x=(-0.5, len(groups) - 0.5),
        y=(0, top / scale * 1.2),
        width=330,
        height=200,
        label=f"{title} per arm",
        margin=(56, 16, 8, 40),
    )
    fig.axes(xlabel=title, ylabel=unit, xticks=[(i, g[0]) for i, g in enumerate(groups)])
    fig.bars(
        [
            (i - 0.35, i - 0.02, r / scale, f"{title} {g}: reference {_bytes(r)}")
            for i, (g, r, _) in enumerate(groups)
            if r is not None
        ],
        cls="bar ref",
    )
    fig.bars(
        [
            (i + 0.02, i + 0.35, k / scale, f"{title} {g}: candidate {_bytes(k)}")
            for i, (g, _, k) in enumerate(groups)
            if k is not None
        ],
        cls="bar cand",
    )
    fig.legend([("bar ref", "ref"), ("bar cand", "cand")])
    return fig.svg()
