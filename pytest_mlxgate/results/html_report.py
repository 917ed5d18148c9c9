"""The HTML report (`--mlx-html PATH`): one self-contained file, a section per gate, plots as inline SVG.

`html_report(records, history=, run=)` is a pure function of stored data (the records, the results
history's rows), so a report can be rendered again from a JSON report or the DB. Per gate: the verdict
table; for KL gates the histogram (log x), KL by position (median and p90 over prompts), top-1 flips
against near ties, each prompt's mean KL with its interval, the worst tokens in their context; for
capability gates each task's scores and drop with intervals and the flipped items (prompt, both
outputs); speed and memory with intervals; the gate's history over commits as a sparkline. A plot
whose data an older record lacks says "not recorded".

No network: no script, no external stylesheet, font or image, and a Content-Security-Policy that
forbids loading anything (`default-src 'none'`), so a browser opening the file fetches nothing. Every
text from a record is escaped. Standard library only (the xdist controller renders it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.atomic import atomic_write_bytes
from ..common.format import DASH, clip, format_bytes, format_duration, percent
from .attribution_text import attribution_lines
from .model import (
    Attribution,
    CapabilityScore,
    Histogram,
    Interval,
    PositionProfile,
    PromptMeans,
    Ratio,
    Record,
    RunFacts,
    Speed,
    SpeedArm,
    SpeedContext,
    Stats,
    StoredRow,
    Task,
    WorstContext,
    parse_record,
    parse_row,
    run_facts,
)
from .summary import LIMITS_NOT_SHOWN, format_limit, format_value, n_parts
from .svg import Figure, esc, message, sparkline

if TYPE_CHECKING:
    from .records import GateRecord, RunInfo

__all__ = [
    "HISTORY_RUNS",
    "MAX_FLIPPED_SHOWN",
    "MAX_POINTS",
    "PLOTS",
    "history_rows",
    "html_report",
    "write_html_report",
]

#: The runs of a gate a sparkline shows: the latest, oldest first.
HISTORY_RUNS = 30
#: A plot draws at most this many points per series, whatever a record holds (records cap theirs too).
MAX_POINTS = 256
#: Flipped capability items shown per task.
MAX_FLIPPED_SHOWN = 20
_TEXT_CHARS = 1201  # a prompt or an output shown: 1200 characters and an ellipsis where clipped

#: The plots (`data-plot` of each `<figure>`) a gate's section holds, by what the record carries.
PLOTS = {
    "kl": ("kl-histogram", "kl-by-position", "top1-flips", "kl-per-prompt"),
    "capability": ("capability-scores", "capability-drop"),
    "speed": ("speed-ratios", "memory"),
    "history": ("history",),
    "attribution": ("attribution-scopes", "attribution-residual"),  # a gate whose drift was attributed
}

_NOT_RECORDED = "not recorded (a record from before this plot's data was kept)"
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# -- the page ------------------------------------------------------------------------------------


def html_report(
    records: Sequence[GateRecord],
    *,
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    run: RunInfo | Mapping[str, Any] | None = None,
    title: str = "mlxgate report",
) -> str:
    """The report as one HTML document. `history`: per node id, the results DB's rows of that gate, oldest
    first (`history_rows`); None when the DB is off. `run`: the run's `RunInfo` (or its dict)."""
    facts = run_facts(run)
    ordered = sorted(
        (parse_record(r) for r in records),
        key=lambda r: (r.mode == "score", _SEVERITY.get(str(r.verdict), 3), r.nodeid),
    )
    gates = [r for r in ordered if r.mode != "score"]
    body = [f"<header><h1>{esc(title)}</h1>{_run_line(facts)}{_interrupted(facts)}{_tally(gates)}</header>"]
    if ordered:
        body.append(_contents(ordered))
    speeds_shown: dict[str, str] = {}
    for i, record in enumerate(ordered):
        body.append(_gate_section(record, f"g{i}", history, facts, speeds_shown))
    if not ordered:
        body.append('<p class="note">No gate records in this run.</p>')
    body.append(
        "<footer>Written by pytest-mlxgate. Intervals are 95% unless a table says otherwise; hover a "
        "point or bar for its figures.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_html_report(
    path: Path,
    records: Sequence[GateRecord],
    *,
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    run: RunInfo | Mapping[str, Any] | None = None,
) -> None:
    """Write the report atomically (readers see the old file or the whole new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = html_report(records, history=history, run=run).encode("utf-8")
    atomic_write_bytes(path, data, new_mode=0o644)  # a report is for everyone, not mkstemp's 0600


def history_rows(db: Path, nodeids: Iterable[str], *, last: int = HISTORY_RUNS) -> dict[str, list[dict[str, Any]]]:
    """Per node id, its latest `last` rows of the results DB (oldest first); {} when there is no DB file."""
    from .history import ResultsDB

    if not Path(db).is_file():
        return {}
    results = ResultsDB(db)
    return {nodeid: results.rows(nodeid=nodeid)[-last:] for nodeid in sorted(set(nodeids))}


_SEVERITY = {"fail": 0, "error": 0, "inconclusive": 1, "pass": 2}
_LABEL = {"fail": "FAIL", "error": "ERROR", "inconclusive": "INCONCLUSIVE", "pass": "pass", "skipped": "skipped"}


def _verdict_badge(verdict: str | None) -> str:
    v = verdict or "measured"
    return f'<span class="badge v-{esc(v)}">{esc(_LABEL.get(v, v))}</span>'


def _run_line(run: RunFacts) -> str:
    if run == RunFacts():
        return ""
    commit = run.code_commit
    parts = [
        f"run {esc((run.run_id or DASH)[:12])}",
        f"started {esc(run.started or DASH)}",
        "code "
        + (f"<code>{esc(commit[:12])}</code>" + (" (dirty)" if run.code_dirty else "") if commit else "not in git"),
    ]
    parts += [
        f"{esc(k)} {esc(run.machine[k])}" for k in ("device", "blas", "mlx", "mlx_lm", "python") if run.machine.get(k)
    ]
    return f'<p class="run">{" · ".join(parts)}</p>'


def _interrupted(run: RunFacts) -> str:
    """The banner of a run that stopped before its end: why, and which modules never ran."""
    if run.interrupted is None:
        return ""
    from .summary import interrupted_line

    return (
        f'<p class="banner interrupted" role="alert"><strong>Interrupted</strong>: '
        f"{esc(interrupted_line(run.interrupted))}. "
        "This run did not test everything it collected: it is no pass, whatever the gates below say.</p>"
    )


def _tally(gates: Sequence[Record]) -> str:
    counts: dict[str, int] = {}
    for r in gates:
        counts[str(r.verdict)] = counts.get(str(r.verdict), 0) + 1
    items = " ".join(
        f"{_verdict_badge(v)} {n}" for v, n in sorted(counts.items(), key=lambda kv: (_SEVERITY.get(kv[0], 3), kv[0]))
    )
    return f'<p class="tally">{len(gates)} gate{"s" if len(gates) != 1 else ""}: {items or "none"}</p>'


def _contents(records: Sequence[Record]) -> str:
    rows = "".join(
        f'<tr><td><a href="#g{i}">{esc(r.name)}</a></td><td>{esc(r.mode or DASH)}</td>'
        f"<td>{_verdict_badge(r.verdict)}{_limits_badge(r)}</td><td>{esc(' · '.join(n_parts(r)) or DASH)}</td></tr>"
        for i, r in enumerate(records)
    )
    return (
        '<nav><table class="contents"><thead><tr><th>gate</th><th>mode</th><th>verdict</th><th>n</th></tr>'
        f"</thead><tbody>{rows}</tbody></table></nav>"
    )


def _figure(name: str, caption: str, svg: str) -> str:
    return f'<figure class="plot" data-plot="{esc(name)}">{svg}<figcaption>{caption}</figcaption></figure>'


# -- one gate ------------------------------------------------------------------------------------


def _gate_section(
    record: Record,
    anchor: str,
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    run: RunFacts,
    speeds_shown: dict[str, str],
) -> str:
    mode = record.mode or ""
    verdict = record.verdict or "measured"
    out = [
        f'<section class="gate v-{esc(verdict)}" id="{anchor}" data-mode="{esc(mode)}">',
        f"<h2>{esc(record.name)} {_verdict_badge(verdict)}</h2>",
        _meta(record),
        _limits_line(record),
        "<h3>Verdict</h3>",
        _verdict_table(record),
    ]
    error = record.error
    if error is not None:  # a gate that raised: its error's words, escaped like every record text
        out.append(
            f'<h3>Error in {esc(error.phase or "call")}</h3><pre class="error">'
            f"{esc(error.type or 'error')}: {esc(error.message or '')}</pre>"
        )
    if mode == "score":
        out.append(_score_table(record.capability_score or CapabilityScore()))
    if mode in ("gate", "aa") and record.stats.present:
        out.append(_kl_sections(record))
    if record.attribution is not None:
        out.append(_attribution_sections(record.attribution))
    if mode == "capability":
        out.append(_capability_sections(record))
    speed = record.speed
    if speed is not None:
        ident = speed.id or ""
        if ident and ident in speeds_shown:
            out.append(
                f'<h3>Speed and memory</h3><p class="note">The same measurement as '
                f'<a href="#{speeds_shown[ident]}">its module\'s first gate</a> (one per module).</p>'
            )
        else:
            if ident:
                speeds_shown[ident] = anchor
            out.append(_speed_sections(record, speed))
    if mode != "score":
        out.append(_history_section(record, history, run))
    out.append("</section>")
    return "\n".join(out)


def _meta(record: Record) -> str:
    lever = record.lever
    parts = [f"<code>{esc(record.nodeid)}</code>"]
    model = record.candidate.label if record.candidate else None
    if model:
        ref = record.reference_model.label if record.reference_model else None
        parts.append(f"model <code>{esc(model)}</code>" + (f" vs reference <code>{esc(ref)}</code>" if ref else ""))
    if lever.name:
        parts.append(f"lever {esc(lever.name)}: {esc(_short(lever.ref))} → {esc(_short(lever.cand))}")
    if record.path:
        parts.append(f"path {esc(record.path)}")
    parts += [esc(p) for p in n_parts(record)]
    rerun = f'<p class="rerun">re-run: <code>{esc(record.rerun)}</code></p>' if record.rerun else ""
    return f'<p class="meta">{" · ".join(parts)}</p>{rerun}'


def _limits_line(record: Record) -> str:
    """Where the gate's limits were shown to work (`LimitsFrom.words`); limits not shown (unproven,
    refuted) are marked and coloured so a pass on them does not read like one on proven limits."""
    limits = record.limits_from
    if limits is None:
        return ""
    status = esc(limits.status)
    if limits.shown:
        return f'<p class="limits shown l-{status}" data-limits="{status}">{esc(limits.words)}</p>'
    return (
        f'<p class="limits not-shown l-{status}" data-limits="{status}" role="note">'
        f"<strong>{LIMITS_NOT_SHOWN} {esc(limits.words)}</strong></p>"
    )


def _limits_badge(record: Record) -> str:
    """In the contents: a badge beside the verdict of a gate whose limits were not shown to work here."""
    limits = record.limits_from
    if limits is None or limits.shown:
        return ""
    status = esc(limits.status)
    return f' <span class="badge limits not-shown l-{status}">limits {status}</span>'


def _short(value: str | None, n: int = 80) -> str:
    """A lever's value as text (None: JSON's null), clipped."""
    text = value if value is not None else "null"
    return text if len(text) <= n else text[: n - 1] + "…"


# -- the verdict table ---------------------------------------------------------------------------


def _interval_text(key: str, lo: float | None, hi: float | None) -> str:
    if lo is None and hi is None:
        return DASH
    return f"[{format_value(key, lo) if lo is not None else '−∞'}, {format_value(key, hi) if hi is not None else '∞'}]"


def _verdict_table(record: Record) -> str:
    stats = record.stats
    conf = stats.confidence
    head = f"{conf * 100:g}% interval" if conf is not None else "95% interval"
    n_default = record.n_prompts
    rows = []
    for c in record.checks:
        key = c.key or ""
        rel = "≥ " if c.direction == "min" else "≤ "
        verdict = c.verdict or "measured"
        note = f" (n≈{c.n_needed})" if verdict == "inconclusive" and c.n_needed else ""
        n = c.n if c.n is not None else n_default
        rows.append(
            (
                c.label,
                format_value(key, c.value),
                _interval_text(key, c.lower, c.upper),
                rel + format_limit(key, c.limit) if c.limit is not None else DASH,
                _verdict_badge(verdict) + esc(note),
                str(n) if n is not None else DASH,
            )
        )
    if not record.checks and stats.present:
        for metric, key, ci in (
            ("mean KL", "mean", stats.mean_ci),
            ("p99 KL", "p99", stats.quantile_interval("p99")),
            ("max KL", "max", Interval()),
            ("top-1", "top1", stats.top1_ci),
        ):
            if stats.has(key):
                rows.append(
                    (
                        metric,
                        format_value(key, stats.figure(key)),
                        _interval_text(key, ci.lower, ci.upper),
                        DASH,
                        _verdict_badge(record.verdict or "measured"),
                        str(n_default or DASH),
                    )
                )
    for key, floor in record.floors.items():
        rows.append((f"A/A floor {key}", format_value(key, floor), DASH, DASH, "floor", str(n_default or DASH)))
    if not rows:
        rows.append((DASH, DASH, DASH, DASH, _verdict_badge(record.verdict), DASH))
    cells = "".join(
        "<tr>" + "".join(f"<td>{c if i == 4 else esc(c)}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return (
        '<table class="verdicts"><thead><tr><th>metric</th><th>value</th>'
        f"<th>{esc(head)}</th><th>limit</th><th>verdict</th><th>n</th></tr></thead><tbody>{cells}</tbody></table>"
    )


def _score_table(score: CapabilityScore) -> str:
    rows = "".join(
        f"<tr><td>{esc(t)}</td><td>{percent(v.reference, missing=DASH)}</td>"
        f"<td>{percent(v.candidate, missing=DASH)}</td></tr>"
        for t, v in score.tasks.items()
    )
    total = (
        f"<tr><th>score</th><th>{percent(score.reference, missing=DASH)}</th>"
        f"<th>{percent(score.candidate, missing=DASH)}</th></tr>"
    )
    return (
        '<table class="verdicts"><thead><tr><th>task</th><th>reference</th><th>candidate</th></tr></thead>'
        f"<tbody>{rows}{total}</tbody></table>"
        + ('<p class="note">Partial: not every task ran.</p>' if score.partial else "")
    )


def _limits(record: Record, *keys: str) -> list[tuple[str, float]]:
    """(metric, limit) of the record's checks on these keys."""
    return [(c.metric or str(c.key), c.limit) for c in record.checks if str(c.key) in keys and c.limit is not None]


# -- KL ------------------------------------------------------------------------------------------


def _kl_sections(record: Record) -> str:
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
        ]
    )


def _attribution_sections(a: Attribution) -> str:
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
        return _figure("attribution-scopes", "Each scope's mean KL.", message("no scope shows drift", label="scopes"))
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
    return _figure(
        "attribution-scopes",
        f"The lever on one scope of layers at a time, the reference everywhere else: each scope's mean KL and "
        f"its 95% interval over {a.sequences} sequences; the line is the lever on every layer.",
        fig.svg(),
    )


def _residual_curve(a: Attribution) -> str:
    rows = [e for e in a.residual if e.layer is not None][:MAX_POINTS]
    span = _positive_range([e.rel_error for e in rows] + [x for e in rows for x in e.ci])
    if not rows or span is None:
        return _figure(
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
    return _figure(
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
        return _figure("kl-histogram", "Per-token KL, log scale.", message(_NOT_RECORDED, label="KL histogram"))
    lo_e = hist.decades[0]
    extra = (
        f"{hist.zero} tokens with KL exactly 0 · {hist.under} below 1e{lo_e} · {hist.over} at or above the last edge"
    )
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return _figure(
            "kl-histogram",
            esc(extra),
            message("every token's KL is 0 (or outside the edges): nothing to draw", label="KL histogram"),
        )
    first, last = max(0, used[0] - 1), min(len(counts), used[-1] + 2)

    def edge(i: int) -> float:
        return float(10.0 ** (lo_e + i / per))

    marks = [v for v in (stats.mean, stats.p99) if v is not None and v > 0]
    limits = [(m, v) for m, v in _limits(record, "mean", "p99", "max", "p90", "p95", "median", "p999") if v > 0]
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
    return _figure(
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
        return _figure(
            "kl-by-position",
            "Median and p90 of KL over prompts at each position.",
            message(_NOT_RECORDED, label="KL by position"),
        )
    span = _positive_range(median + p90)
    if span is None:
        return _figure(
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
    return _figure("kl-by-position", caption, fig.svg())


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
        return _figure(
            "top1-flips",
            esc(totals) + ".",
            message("flips by position " + _NOT_RECORDED, label="top-1 flips by position"),
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
    return _figure("top1-flips", esc(totals) + ".", fig.svg())


def _int_ticks(top: int) -> list[int]:
    step = max(1, math.ceil(top / 4))
    return list(range(0, top + 1, step))


def _per_prompt(record: Record, prompts: PromptMeans) -> str:
    index, means, cis = prompts.index[:MAX_POINTS], list(prompts.mean[:MAX_POINTS]), prompts.ci[:MAX_POINTS]
    ntok = prompts.n_tokens[:MAX_POINTS]
    if not index or len(means) != len(index):
        return _figure(
            "kl-per-prompt",
            "Each prompt's mean KL with its interval.",
            message(_NOT_RECORDED, label="per-prompt mean KL"),
        )
    ends = list(cis) + [Interval()] * (len(index) - len(cis))
    mean = record.stats.mean
    span = _positive_range(
        means + [e for pair in ends for e in pair] + [mean] + [limit for _, limit in _limits(record, "mean")]
    )
    if span is None:
        return _figure(
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
    for metric, limit in _limits(record, "mean"):
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
    return _figure(
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
                f'<span class="ctx">{esc(clip(ctx.before or "", _TEXT_CHARS, keep="end"))}<mark>'
                f"{esc(ctx.token or '')}</mark>{esc(clip(ctx.after or '', _TEXT_CHARS))}</span>"
            )
        else:
            context = f'<span class="note">context {esc(_NOT_RECORDED)}</span>'
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


# -- capability ----------------------------------------------------------------------------------


def _capability_sections(record: Record) -> str:
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
        verdicts = " ".join(_verdict_badge(v.verdict) for v in (drop, floor) if v is not None) or DASH
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
        return _figure("capability-scores", "Both arms' score per task.", message("no task ran", label="scores"))
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
    return _figure(
        "capability-scores",
        "Each arm's score per task with its 95% interval (Wilson for pass/fail "
        "tasks, bootstrap for graded ones), over the very same items.",
        fig.svg(),
    )


def _capability_drop(tasks: Mapping[str, Task], limit: float | None) -> str:
    drops = {name: t.drop_check for name, t in list(tasks.items())[:MAX_POINTS] if t.drop_check is not None}
    if not drops:
        return _figure(
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
    return _figure(
        "capability-drop",
        "The paired drop (reference score − candidate score) with the bounds its "
        "verdict used, against the max_drop limit.",
        fig.svg(),
    )


def _flipped(task: Task) -> str:
    if task.flipped is None:
        return f'<p class="note">{esc(task.name)}: flipped items {esc(_NOT_RECORDED)}</p>'
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
            f'<pre class="prompt">{esc(clip(i.prompt, _TEXT_CHARS, keep="end"))}</pre>'
            if i.prompt is not None
            else f'<p class="note">prompt {esc(_NOT_RECORDED)}</p>'
        )
        entries.append(
            f'<div class="item"><p><code>{esc(i.id)}</code>: reference {esc(ref.verdict)} '
            f"({esc(ref.score)}) → candidate {esc(cand.verdict)} ({esc(cand.score)})</p>"
            f'{prompt_html}<div class="outs"><div><h4>reference</h4><pre>{esc(clip(ref.output or "", _TEXT_CHARS))}'
            f"</pre></div><div><h4>candidate</h4><pre>{esc(clip(cand.output or '', _TEXT_CHARS))}</pre></div></div>"
            "</div>"
        )
    return (
        f"<details open><summary>{esc(task.name)}: {total} item{'s' if total != 1 else ''} flipped ({losses} of "
        f"those shown lost by the candidate{shown})</summary>{''.join(entries)}</details>"
    )


# -- speed and memory ----------------------------------------------------------------------------


def _speed_sections(record: Record, speed: Speed) -> str:
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
        return _figure("speed-ratios", "Candidate / reference ratios.", message("no ratio measured", label="speed"))
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
    return _figure(
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
        return _figure("memory", "Memory per arm.", message("no memory figures recorded", label="memory"))
    return _figure(
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


# -- history -------------------------------------------------------------------------------------


def _history_values(record: Record, row: StoredRow) -> list[tuple[str, float | None, bool]]:
    """(series, value, log scale) of one stored row: what the gate's sparkline follows."""
    if record.mode in ("gate", "aa"):
        return [("mean KL", row.mean_kl, True)]
    if record.mode == "speed":
        return [("decode ×", row.decode_ratio, False)]
    if record.mode == "capability":
        stored = row.record.tasks if row.record is not None else {}
        return [(f"{t} candidate score", stored[t].cand_score if t in stored else None, False) for t in record.tasks]
    return []


def _history_section(record: Record, history: Mapping[str, Sequence[Mapping[str, Any]]] | None, run: RunFacts) -> str:
    head = "<h3>History</h3>"
    if history is None:
        return head + _figure(
            "history",
            "This gate over commits.",
            message("no history: the results DB is off (--mlx-db off)", label="history"),
        )
    rows = [
        parse_row(r if isinstance(r, Mapping) else {})
        for r in (history[record.nodeid] if record.nodeid in history else [])
    ][-HISTORY_RUNS:]
    longest = record.speed.longest if record.speed is not None else None
    current = StoredRow(
        run_id=run.run_id,
        time=record.time,
        verdict=record.verdict,
        code_commit=run.code_commit,
        code_dirty=run.code_dirty,
        mean_kl=record.stats.mean,
        decode_ratio=longest.decode.ratio if longest is not None and longest.decode else None,
        record=record,
    )
    if not any(r.run_id == run.run_id for r in rows) or not run.run_id:
        rows = (rows + [current])[-HISTORY_RUNS:]
    if len(rows) < 2:
        return head + _figure(
            "history",
            "This gate over commits.",
            message("no earlier runs of this gate in the results DB yet", label="history"),
        )
    series: dict[str, list[float | None]] = {}
    log = True
    for r in rows:
        for name, value, is_log in _history_values(record, r):
            series.setdefault(name, []).append(value)
            log = log and is_log
    tips, classes = [], []
    for r in rows:
        commit = (r.code_commit or "no commit")[:10] + (" (dirty)" if r.code_dirty else "")
        this = " · this run" if r.run_id == run.run_id and run.run_id else ""
        tips.append(f"{commit} · {r.time or DASH} · {r.verdict or DASH}{this}")
        classes.append(f"v-{r.verdict or 'none'}")
    parts = []
    limits = dict(_limits(record, "mean")) if record.mode in ("gate", "aa") else {}
    for name, values in list(series.items())[:8]:
        reference = next(iter(limits.values()), None) if name == "mean KL" else None
        tip_values = [f"{t} · {name} {_history_value(v, log)}" for t, v in zip(tips, values, strict=False)]
        parts.append(
            f'<div class="spark-row"><span class="spark-name">{esc(name)}</span>'
            + sparkline(
                values, tips=tip_values, classes=classes, log=log, label=f"{name} over runs", reference=reference
            )
            + f'<span class="spark-last">{esc(_history_value(values[-1], log))}</span></div>'
        )
    if not parts:
        return head + _figure("history", "This gate over commits.", message("no figure to follow", label="history"))
    first, last = rows[0], rows[-1]
    caption = (
        f"The last {len(rows)} runs of this gate in the results DB, oldest first: "
        f"{esc((first.code_commit or DASH)[:10])} ({esc(first.time or DASH)}) → "
        f"{esc((last.code_commit or DASH)[:10])} ({esc(last.time or DASH)}); a dot's colour "
        "is that run's verdict, the last (largest) is the latest; dashed: the limit."
    )
    return head + _figure("history", caption, "".join(parts))


def _history_value(v: float | None, log: bool) -> str:
    return DASH if v is None else f"{v:.2e}" if log and v < 0.01 else f"{v:.3g}"


# -- style ---------------------------------------------------------------------------------------

_CSS = """
:root{--fg:#1d2430;--muted:#5b6472;--line:#d5dae1;--pass:#1a7f37;--fail:#cf222e;--unsure:#b35900;
--ref:#4565a8;--cand:#d9480f;--bg:#fff;--soft:#f5f7fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg);
margin:0 auto;max-width:1100px;padding:16px 20px}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;margin:0 0 4px}h3{font-size:15px;margin:18px 0 6px}
h4{font-size:12px;margin:0 0 2px;color:var(--muted)}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-word;background:var(--soft);padding:6px 8px;margin:4px 0;border-radius:4px;
max-height:18em;overflow:auto}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--soft)}
.run,.meta,.note,.rerun,figcaption,footer{color:var(--muted)}
.note{font-style:italic}
.banner{border:1px solid var(--fail);border-left:5px solid var(--fail);border-radius:6px;padding:8px 12px;
color:var(--fail)}
pre.error{border-left:3px solid var(--fail)}
p.limits{margin:4px 0}p.limits.shown{color:var(--muted)}
.limits.not-shown{color:var(--unsure);border-color:var(--unsure)}
p.limits.not-shown{border-left:3px solid;padding-left:8px}
.limits.l-refuted{color:var(--fail);border-color:var(--fail)}
section.gate{border:1px solid var(--line);border-left:5px solid var(--line);border-radius:6px;padding:12px 16px;
margin:18px 0}
section.v-pass{border-left-color:var(--pass)}section.v-fail,section.v-error{border-left-color:var(--fail)}
section.v-inconclusive{border-left-color:var(--unsure)}
.badge{display:inline-block;font-size:11px;font-weight:600;padding:1px 7px;border-radius:9px;background:var(--soft);
border:1px solid var(--line);vertical-align:middle}
.badge.v-pass{color:var(--pass);border-color:var(--pass)}
.badge.v-fail,.badge.v-error{color:#fff;background:var(--fail);border-color:var(--fail)}
.badge.v-inconclusive{color:#fff;background:var(--unsure);border-color:var(--unsure)}
figure{margin:6px 0 12px}figcaption{font-size:12px;max-width:760px}
svg.plot{display:block;max-width:100%;height:auto;background:var(--bg)}
svg .axis line{stroke:#8a929e;stroke-width:1}svg .axis line.grid{stroke:#e9ecf0}
svg text{font-size:11px;fill:var(--muted)}svg text.label{fill:var(--fg)}
svg .bar{fill:#7d97c9}svg .bar.flip{fill:var(--fail)}svg .bar.tie{fill:#b8bfc9}
svg .bar.ref,svg .ref.swatch{fill:var(--ref)}svg .bar.cand,svg .cand.swatch{fill:var(--cand)}
svg .line{fill:none;stroke-width:1.6}svg .line.median{stroke:var(--ref)}svg .line.p90{stroke:var(--cand)}
svg .median.swatch{fill:var(--ref)}svg .p90.swatch{fill:var(--cand)}svg .flip.swatch{fill:var(--fail)}
svg .tie.swatch{fill:#b8bfc9}
svg .point{fill:var(--cand)}svg .point.ref{fill:var(--ref)}
svg .err{stroke:#59616d;stroke-width:1.2}svg .err.open{stroke-dasharray:3 2}
svg .limit{stroke:var(--fail);stroke-width:1.3;stroke-dasharray:5 3}svg .limit-label{fill:var(--fail)}
svg .limit-mark{fill:none;stroke:var(--fail);stroke-width:1.5}
svg .stat{stroke:#59616d;stroke-width:1;stroke-dasharray:2 2}svg .stat-label{fill:#59616d}
svg rect.empty{fill:var(--soft);stroke:var(--line)}svg text.note{font-style:italic;font-size:12px}
svg .spark{fill:none;stroke:#8a929e;stroke-width:1.3}svg .spot{fill:#8a929e}
svg .spot.v-pass{fill:var(--pass)}svg .spot.v-fail,svg .spot.v-error{fill:var(--fail)}
svg .spot.v-inconclusive{fill:var(--unsure)}
.spark-row{display:flex;align-items:center;gap:10px}.spark-name{min-width:150px;color:var(--muted)}
.spark-row svg.plot,figure[data-plot=memory] svg.plot{display:inline-block;margin-right:12px}
table.worst td:nth-child(-n+7),table.verdicts td{white-space:nowrap}
.ctx{white-space:pre-wrap;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
mark{background:#ffd8a8;padding:0 1px;border-radius:2px}
.outs{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.item{border-top:1px dashed var(--line);padding:6px 0}
details summary{cursor:pointer;margin:4px 0}
nav table.contents td:first-child{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
"""
