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

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.atomic import atomic_write_bytes
from ..common.format import DASH, percent
from .html_capability import capability_sections
from .html_history import history_section
from .html_kl import attribution_sections, kl_sections
from .html_parts import HISTORY_RUNS, verdict_badge
from .html_speed import speed_sections
from .model import Interval, Record
from .record_capability import CapabilityScore
from .runs import RunFacts, run_facts
from .summary import LIMITS_NOT_SHOWN, format_limit, format_value, n_parts
from .svg import esc

if TYPE_CHECKING:
    from .records import RunInfo

__all__ = [
    "PLOTS",
    "history_rows",
    "html_page",
    "html_report",
    "write_html_report",
]

#: The plots (`data-plot` of each `<figure>`) a gate's section holds, by what the record carries.
PLOTS = {
    "kl": ("kl-histogram", "kl-by-position", "top1-flips", "kl-per-prompt"),
    "capability": ("capability-scores", "capability-drop"),
    "speed": ("speed-ratios", "memory"),
    "history": ("history",),
    "attribution": ("attribution-scopes", "attribution-residual"),  # a gate whose drift was attributed
}

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# -- the page ------------------------------------------------------------------------------------


def html_report(
    records: Sequence[Record],
    *,
    history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    run: RunInfo | Mapping[str, Any] | None = None,
    title: str = "mlxgate report",
) -> str:
    """The report as one HTML document. `history`: per node id, the results DB's rows of that gate, oldest
    first (`history_rows`); None when the DB is off. `run`: the run's `RunInfo` (or its dict)."""
    facts = run_facts(run)
    ordered = sorted(
        records,
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
    return html_page(title, body)


def html_page(title: str, body: Sequence[str]) -> str:
    """One self-contained HTML document: the report's styles, a policy that loads nothing, `body` in order."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_html_report(
    path: Path,
    records: Sequence[Record],
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
        f"{verdict_badge(v)} {n}" for v, n in sorted(counts.items(), key=lambda kv: (_SEVERITY.get(kv[0], 3), kv[0]))
    )
    return f'<p class="tally">{len(gates)} gate{"s" if len(gates) != 1 else ""}: {items or "none"}</p>'


def _contents(records: Sequence[Record]) -> str:
    rows = "".join(
        f'<tr><td><a href="#g{i}">{esc(r.name)}</a></td><td>{esc(r.mode or DASH)}</td>'
        f"<td>{verdict_badge(r.verdict)}{_limits_badge(r)}</td><td>{esc(' · '.join(n_parts(r)) or DASH)}</td></tr>"
        for i, r in enumerate(records)
    )
    return (
        '<nav><table class="contents"><thead><tr><th>gate</th><th>mode</th><th>verdict</th><th>n</th></tr>'
        f"</thead><tbody>{rows}</tbody></table></nav>"
    )


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
        f"<h2>{esc(record.name)} {verdict_badge(verdict)}</h2>",
        _meta(record),
        _server_line(record),
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
        out.append(kl_sections(record))
    if record.attribution is not None:
        out.append(attribution_sections(record.attribution))
    if mode == "capability":
        out.append(capability_sections(record))
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
            out.append(speed_sections(record, speed))
    if mode != "score":
        out.append(history_section(record, history, run))
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


def _server_line(record: Record) -> str:
    """A candidate served over HTTP: its KL figures are lower bounds from the server's top-k."""
    if record.server is None:
        return ""
    return f'<p class="server" data-bound="{esc(record.server.bound or "")}">{esc(record.server.words)}</p>'


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
                verdict_badge(verdict) + esc(note),
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
                        verdict_badge(record.verdict or "measured"),
                        str(n_default or DASH),
                    )
                )
    for key, floor in record.floors.items():
        rows.append((f"A/A floor {key}", format_value(key, floor), DASH, DASH, "floor", str(n_default or DASH)))
    if not rows:
        rows.append((DASH, DASH, DASH, DASH, verdict_badge(record.verdict), DASH))
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
svg .point{fill:var(--cand)}svg .point.ref{fill:var(--ref)}svg .point.off{fill:#b8bfc9}
svg .point.answer{fill:var(--pass);stroke:var(--fg)}svg .line.frontier{stroke:var(--cand)}
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
