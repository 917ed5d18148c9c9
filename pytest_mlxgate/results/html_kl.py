"""A KL gate's sections of the HTML report: the histogram, KL by position, top-1 flips against near
ties, each prompt's mean KL with its interval, the worst tokens in context, and the drift attribution."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..common.format import DASH, clip
from .attribution_text import attribution_lines
from .html_parts import MAX_POINTS, NOT_RECORDED, TEXT_CHARS, figure, limits_of
from .model import Interval, Record
from .record_kl import Attribution, Histogram, PositionProfile, PromptMeans, Stats, WorstContext
from .summary import format_value
from .svg import Figure, esc, message


def kl_sections(record: Record) -> str:
    stats, profile = record.stats, record.kl_profile
    return "\n".join(
        [
            "<h3>KL distribution</h3>",
            _kl_histogram(record, profile.histogram),
            "<h3>KL by position</h3>",
            _kl_by_position(profile.by_position),
            "<h3>Top-1 flips and near ties</h3>",
            _flips(stats, profile.by_position),
            "<h3>Per-prompt mean KL</h3>",
            _per_prompt(record, profile.prompts),
            "<h3>Worst tokens in their context</h3>",
            _worst_tokens(record, profile.worst_context),
            *_oracle_sections(record),
        ]
    )


def _oracle_sections(record: Record) -> list[str]:
    """Against the float32 oracle (`relative=`): both distances, and the kernel's error at its site per call
    position (which layer), the candidate's beside the plain path's, each as a fraction of the largest output."""
    oracle = record.oracle
    if oracle is None:
        return []
    out = ["<h3>Against the float32 oracle</h3>", f'<p class="oracle">{esc(oracle.words)}</p>']
    if oracle.site_note:
        out.append(f'<p class="note">{esc(oracle.site_note)}</p>')
    for entry in oracle.sites:
        rows = [
            f"<tr><td>{esc(row.at)}</td><td>{esc(row.calls)}</td><td>{_sci(row.cand_max)}</td>"
            f"<td>{_sci(row.plain_max)}</td><td>{_sci(row.cand_mean)}</td><td>{_sci(row.plain_mean)}</td></tr>"
            for row in entry.rows[:MAX_POINTS]
        ]
        out.append(
            f"<h4>{esc(entry.target)}: {esc(entry.calls)} calls</h4>"
            '<table class="site"><thead><tr><th>call in forward</th><th>calls</th><th>max |cand − f32|</th>'
            "<th>max |plain − f32|</th><th>mean |cand − f32|</th><th>mean |plain − f32|</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    return out


def attribution_sections(a: Attribution) -> str:
    """Where the drift comes from: each scope's KL with its interval, each layer's output error, the
    attention types' KL by position, and what it cost (`explain.attribute`)."""
    lines = attribution_lines(a)
    out = [
        "<h3>Where the drift comes from</h3>",
        f'<p class="note">{esc(lines[0])}</p>',
        "<ul>" + "".join(f"<li>{esc(line.strip())}</li>" for line in lines[1:]) + "</ul>",
        _scope_bars(a),
        _residual_curve(a),
    ]
    for scope in a.scopes:
        if scope.kind == "type" and scope.by_position is not None:
            out.append(f"<h4>KL by position, the lever on {esc(scope.name or '')} only</h4>")
            out.append(_kl_by_position(scope.by_position))
    return "\n".join(out)


def _scope_bars(a: Attribution) -> str:
    scopes = [s for s in a.scopes if s.mean is not None][:MAX_POINTS]
    span = _positive_range([s.mean for s in scopes] + [e for s in scopes for e in s.mean_ci] + [a.whole_mean])
    if not scopes or span is None:
        return figure("attribution-scopes", "Each scope's mean KL.", message("no scope shows drift", label="scopes"))
    k = len(scopes)
    fig = Figure(x=(-0.5, k - 0.5), y=span, ylog=True, label="drift by scope", height=260, margin=(56, 12, 14, 90))
    fig.axes(xlabel="", ylabel="mean KL (log)", xticks=[(i, s.name or "") for i, s in enumerate(scopes)])
    if a.whole_mean:
        fig.hline(a.whole_mean, cls="stat", label="lever everywhere")
    fig.points(
        [
            (
                i,
                s.mean,
                s.mean_ci.lower,
                s.mean_ci.upper,
                f"{s.name}: mean KL {_sci(s.mean)} "
                f"[{_sci(s.mean_ci.lower)}, {_sci(s.mean_ci.upper)}] over {s.n} sequences",
            )
            for i, s in enumerate(scopes)
        ],
        unbounded=(False, True),
    )
    return figure(
        "attribution-scopes",
        f"The lever on one scope of layers at a time, the reference everywhere else: each scope's mean KL and "
        f"its 95% interval over {a.sequences} sequences; the line is the lever on every layer.",
        fig.svg(),
    )


def _residual_curve(a: Attribution) -> str:
    rows = [e for e in a.residual if e.layer is not None][:MAX_POINTS]
    span = _positive_range([e.rel_error for e in rows] + [x for e in rows for x in e.ci])
    if not rows or span is None:
        return figure(
            "attribution-residual",
            "Each layer's output error.",
            message("no layer's output differs", label="output error"),
        )
    fig = Figure(x=(-0.5, len(rows) - 0.5), y=span, ylog=True, label="output error by layer")
    fig.axes(xlabel="layer", ylabel="relative error (log)")
    fig.line([(float(e.layer or 0), e.rel_error) for e in rows], cls="line median", tip="relative error")
    fig.points(
        [
            (
                float(e.layer or 0),
                e.rel_error,
                e.ci.lower,
                e.ci.upper,
                f"layer {e.layer} ({e.type or 'attention'}): {_sci(e.rel_error)} of the reference's norm",
            )
            for e in rows
        ],
        unbounded=(False, True),
    )
    return figure(
        "attribution-residual",
        f"With the lever on every layer: each layer's output against the reference arm's, ||h_c - h_r|| / ||h_r|| "
        f"over {a.residual_sequences} sequences. A step is where error enters; steady growth is compounding.",
        fig.svg(),
    )


def _sci(v: float | None) -> str:
    return DASH if v is None else "0" if v == 0 else f"{v:.2e}"


def _kl_histogram(record: Record, hist: Histogram) -> str:
    stats = record.stats
    counts = list(hist.counts[:MAX_POINTS])
    per = hist.per_decade
    if not counts or hist.decades is None or per <= 0:
        return figure("kl-histogram", "Per-token KL, log scale.", message(NOT_RECORDED, label="KL histogram"))
    lo_e = hist.decades[0]
    extra = (
        f"{hist.zero} tokens with KL exactly 0 · {hist.under} below 1e{lo_e} · {hist.over} at or above the last edge"
    )
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return figure(
            "kl-histogram",
            esc(extra),
            message("every token's KL is 0 (or outside the edges): nothing to draw", label="KL histogram"),
        )
    first, last = max(0, used[0] - 1), min(len(counts), used[-1] + 2)

    def edge(i: int) -> float:
        return float(10.0 ** (lo_e + i / per))

    marks = [v for v in (stats.mean, stats.p99) if v is not None and v > 0]
    limits = [(m, v) for m, v in limits_of(record, "mean", "p99", "max", "p90", "p95", "median", "p999") if v > 0]
    x_lo = min([edge(first)] + [v / 1.5 for v in marks] + [v / 1.5 for _, v in limits])
    x_hi = max([edge(last)] + [v * 1.5 for v in marks] + [v * 1.5 for _, v in limits])
    if math.log10(x_hi / x_lo) < 2:  # at least two decades, so the axis has ticks to read
        x_lo, x_hi = x_lo / 10, x_hi * 10
    top = max(counts)
    fig = Figure(x=(x_lo, x_hi), y=(0, top * 1.12), xlog=True, label="KL histogram")
    fig.axes(xlabel="per-token KL (nats, log scale)", ylabel="tokens")
    fig.bars(
        [
            (edge(i), edge(i + 1), c, f"KL in [{edge(i):.2e}, {edge(i + 1):.2e}): {c} tokens")
            for i, c in enumerate(counts)
            if c
        ]
    )
    for key, v in (("mean", stats.mean), ("p99", stats.p99)):
        if v is not None and v > 0:
            fig.vline(v, cls="stat", label=key)
    for metric, limit in limits:
        fig.vline(limit, cls="limit", label=f"{metric} limit")
    return figure(
        "kl-histogram", f"Per-token KL over every scored token, bins of a quarter decade. {esc(extra)}.", fig.svg()
    )


def _positive_range(values: Iterable[float | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not known:
        return None
    lo, hi = min(known), max(known)
    return (lo / 2, hi * 2) if lo < hi else (lo / 10, hi * 10)


def _kl_by_position(bp: PositionProfile) -> str:
    first, last = bp.first[:MAX_POINTS], bp.last[:MAX_POINTS]
    median, p90 = list(bp.median[:MAX_POINTS]), list(bp.p90[:MAX_POINTS])
    if not first or len(median) != len(first) or len(p90) != len(first):
        return figure(
            "kl-by-position",
            "Median and p90 of KL over prompts at each position.",
            message(NOT_RECORDED, label="KL by position"),
        )
    span = _positive_range(median + p90)
    if span is None:
        return figure(
            "kl-by-position",
            "Median and p90 of KL over prompts at each position.",
            message("KL is 0 at every position", label="KL by position"),
        )
    ends = last if len(last) == len(first) else first
    xs = [((a or 0) + (b or 0)) / 2 for a, b in zip(first, ends, strict=True)]
    x_lo, x_hi = (xs[0] - 0.5, xs[-1] + 0.5)
    fig = Figure(x=(x_lo, x_hi), y=span, ylog=True, label="KL by position")
    fig.axes(xlabel="position in the sequence", ylabel="KL (log)")
    fig.line(list(zip(xs, p90, strict=True)), cls="line p90", tip="p90 over prompts")
    fig.line(list(zip(xs, median, strict=True)), cls="line median", tip="median over prompts")
    fig.legend([("line median", "median"), ("line p90", "p90")])
    pooled = any(a != b for a, b in zip(first, ends, strict=True))
    caption = (
        "Median and p90 of per-token KL over prompts at each position"
        + (" (neighbouring positions pooled into buckets)" if pooled else "")
        + "; a zero shows on the bottom edge."
    )
    return figure("kl-by-position", caption, fig.svg())


def _count(n: int | None) -> str:
    return str(n) if n is not None else DASH


def _flips(stats: Stats, bp: PositionProfile) -> str:
    totals = (
        f"{_count(stats.flips)} top-1 flips outside near ties · "
        f"{_count(stats.near_tie_flips)} at near ties (of {_count(stats.near_ties)} near ties: "
        f"the reference's top-2 gap below the logits' resolution) · {_count(stats.n_tokens)} tokens · "
        f"top-1 agreement {format_value('top1', stats.top1)}, "
        f"same top {format_value('same_top', stats.same_top)}"
    )
    first, last = bp.first[:MAX_POINTS], bp.last[:MAX_POINTS]
    f_by = [v or 0 for v in bp.flips[:MAX_POINTS]]
    t_by = [v or 0 for v in bp.near_tie_flips[:MAX_POINTS]]
    if not first or len(f_by) != len(first) or len(t_by) != len(first):
        return figure(
            "top1-flips",
            esc(totals) + ".",
            message("flips by position " + NOT_RECORDED, label="top-1 flips by position"),
        )
    ends = last if len(last) == len(first) else first
    top = max([a + b for a, b in zip(f_by, t_by, strict=True)] + [1])
    x_lo, x_hi = (first[0] or 0) - 0.5, (ends[-1] or 0) + 0.5
    fig = Figure(x=(x_lo, x_hi), y=(0, top * 1.15), label="top-1 flips by position", height=180)
    fig.axes(xlabel="position in the sequence", ylabel="tokens", yticks=[(v, f"{v:g}") for v in _int_ticks(top)])
    bars_f, bars_t = [], []
    for a, b, f, t in zip(first, ends, f_by, t_by, strict=True):
        x0, x1 = (a or 0) - 0.4, (b or 0) + 0.4
        if f:
            bars_f.append((x0, x1, f, f"positions {a}–{b}: {f} flips"))
        if t:
            bars_t.append((x0, x1, f + t, f"positions {a}–{b}: {t} near-tie flips"))
    fig.bars(bars_t, cls="bar tie")
    fig.bars(bars_f, cls="bar flip")
    fig.legend([("bar flip", "flip"), ("bar tie", "near-tie flip")])
    if not bars_f and not bars_t:
        fig.text((fig.left + fig.right) / 2, (fig.top + fig.bottom) / 2, "no top-1 changes", anchor="middle")
    return figure("top1-flips", esc(totals) + ".", fig.svg())


def _int_ticks(top: int) -> list[int]:
    step = max(1, math.ceil(top / 4))
    return list(range(0, top + 1, step))


def _per_prompt(record: Record, prompts: PromptMeans) -> str:
    index, means, cis = prompts.index[:MAX_POINTS], list(prompts.mean[:MAX_POINTS]), prompts.ci[:MAX_POINTS]
    ntok = prompts.n_tokens[:MAX_POINTS]
    if not index or len(means) != len(index):
        return figure(
            "kl-per-prompt",
            "Each prompt's mean KL with its interval.",
            message(NOT_RECORDED, label="per-prompt mean KL"),
        )
    ends = list(cis) + [Interval()] * (len(index) - len(cis))
    mean = record.stats.mean
    span = _positive_range(
        means + [e for pair in ends for e in pair] + [mean] + [limit for _, limit in limits_of(record, "mean")]
    )
    if span is None:
        return figure(
            "kl-per-prompt",
            "Each prompt's mean KL with its interval.",
            message("every prompt's mean KL is 0", label="per-prompt mean KL"),
        )
    k = len(index)
    fig = Figure(x=(-0.5, k - 0.5), y=span, ylog=True, label="per-prompt mean KL")
    every = max(1, math.ceil(k / 12))
    fig.axes(xlabel="prompt", ylabel="mean KL (log)", xticks=[(i, str(index[i])) for i in range(0, k, every)])
    if mean is not None and mean > 0:
        fig.hline(mean, cls="stat", label="gate mean")
    for metric, limit in limits_of(record, "mean"):
        if limit > 0:
            fig.hline(limit, cls="limit", label=f"{metric} limit")
    pts = []
    for i, (p, m, (lo, hi)) in enumerate(zip(index, means, ends, strict=False)):
        tokens = f", {ntok[i]} tokens" if i < len(ntok) else ""
        pts.append(
            (i, m, lo, hi, f"prompt {p}: mean KL {_sci(m)} [{_sci(lo)}, {_sci(hi) if hi is not None else '∞'}]{tokens}")
        )
    fig.points(pts, unbounded=(False, True))
    total = prompts.total
    shown = f" The {k} prompts with the largest means, of {total}." if total is not None and total > k else ""
    method = esc(prompts.method or "")
    return figure(
        "kl-per-prompt",
        f"Each prompt's mean per-token KL; the bar is its 95% interval ({method}; "
        f"dashed: unbounded, too few tokens).{esc(shown)}",
        fig.svg(),
    )


def _token(record: Record, token_id: int | None) -> str:
    text = record.token_text(token_id)
    return f"<code>{esc(text)}</code>" if text is not None else f"<code>&lt;{esc(token_id)}&gt;</code>"


def _worst_tokens(record: Record, contexts: Sequence[WorstContext]) -> str:
    worst = record.stats.worst[:MAX_POINTS]
    if not worst:
        return '<p class="note">No worst tokens in this record.</p>'
    by_place = {(c.prompt, c.position): c for c in contexts}
    rows = []
    for rank, w in enumerate(worst, 1):
        ctx = by_place.get((w.prompt, w.position))
        if ctx is not None:
            context = (
                f'<span class="ctx">{esc(clip(ctx.before or "", TEXT_CHARS, keep="end"))}<mark>'
                f"{esc(ctx.token or '')}</mark>{esc(clip(ctx.after or '', TEXT_CHARS))}</span>"
            )
        else:
            context = f'<span class="note">context {esc(NOT_RECORDED)}</span>'
        rows.append(
            f"<tr><td>{rank}</td><td>{esc(w.prompt)}</td><td>{esc(w.position)}</td>"
            f"<td>{_sci(w.kl)}</td><td>{_token(record, w.token_id)}</td>"
            f"<td>{_prob(w.p_ref)} → {_prob(w.p_cand)}</td>"
            f"<td>{_token(record, w.ref_top1)} → {_token(record, w.cand_top1)}</td>"
            f"<td>{context}</td></tr>"
        )
    return (
        '<table class="worst"><thead><tr><th>#</th><th>prompt</th><th>position</th><th>KL</th>'
        "<th>next token</th><th>p(next) ref → cand</th><th>top-1 ref → cand</th><th>context (the token marked)</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _prob(v: float | None) -> str:
    return DASH if v is None else f"{v:.3g}"
