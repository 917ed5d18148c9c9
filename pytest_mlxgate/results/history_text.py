"""What `mlxgate history` and `mlxgate compare` print: each record's key figures, a gate's runs as a
table, and the change from one run to another with its regressions (standard library only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..common.format import DASH, percent_distinct
from .model import Record
from .record_speed import Ratio
from .records import RunInfo
from .runs import StoredRow, parse_row

__all__ = [
    "KeyFigures",
    "Source",
    "commit_text",
    "compare_lines",
    "history_lines",
    "key_figures",
    "short_run_id",
    "when_text",
]


@dataclass(frozen=True)
class Source:
    """One run's results: from the DB or from a JSON report."""

    label: str  # the report's path, or "results DB"
    run: RunInfo
    records: list[Record]
    calibrations: list[dict[str, Any]] = field(default_factory=list)


def short_run_id(run_id: str) -> str:
    return run_id[:8]


@dataclass(frozen=True)
class KeyFigures:
    """What history and compare show of a record."""

    verdict: str
    kl: tuple[float | None, float | None, float | None]  # mean KL, its interval's ends
    top1: tuple[float | None, float | None]  # top-1 agreement, its lower end
    tasks: dict[str, tuple[float | None, float | None]]  # capability per task (and "score"): reference, candidate
    decode: tuple[float | None, float | None, float | None]  # ratios at the longest context, with their intervals
    prefill: tuple[float | None, float | None, float | None]
    kv: float | None
    context: int | None  # the longest context (tokens)


def key_figures(record: Record) -> KeyFigures:
    """What history and compare show of a record: verdict, mean KL with its interval, top-1 with its lower
    bound, capability per task (reference and candidate), decode/prefill/KV ratios at the longest context."""
    stats = record.stats
    ctx = record.speed.longest if record.speed is not None else None
    tasks = {name: (record.tasks[name].ref_score, record.tasks[name].cand_score) for name in sorted(record.tasks)}
    if record.capability_score is not None:
        tasks["score"] = (record.capability_score.reference, record.capability_score.candidate)
    return KeyFigures(
        verdict=record.verdict or DASH,
        kl=(stats.mean, stats.mean_ci.lower, stats.mean_ci.upper),
        top1=stats.agreement,
        tasks=tasks,
        decode=_ratio(ctx.decode if ctx else None),
        prefill=_ratio(ctx.prefill if ctx else None),
        kv=ctx.kv_ratio if ctx else None,
        context=ctx.length if ctx else None,
    )


def _ratio(estimate: Ratio | None) -> tuple[float | None, float | None, float | None]:
    e = estimate or Ratio()
    return e.ratio, e.ci.lower, e.ci.upper


def _kl(x: float | None) -> str:
    return DASH if x is None else "0" if x == 0 else f"{x:.1e}"


def _pct(x: float | None) -> str:
    return DASH if x is None else percent_distinct(x)


def _times(x: float | None, digits: int = 2) -> str:
    return DASH if x is None else f"×{x:.{digits}f}"


def _kl_interval(kl: tuple[float | None, float | None, float | None]) -> str:
    mean, lo, hi = kl
    if mean is None:
        return DASH
    return f"{_kl(mean)} [{_kl(lo)}, {_kl(hi)}]" if lo is not None or hi is not None else _kl(mean)


def _ratio_interval(r: tuple[float | None, float | None, float | None]) -> str:
    value, lo, hi = r
    if value is None:
        return DASH
    return f"×{value:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else f"×{value:.2f}"


def _task_pair(pair: tuple[float | None, float | None]) -> str:
    return f"{_pct(pair[0])} → {_pct(pair[1])}"


def commit_text(run: StoredRow | RunInfo) -> str:
    commit, dirty = run.code_commit, run.code_dirty
    return (str(commit)[:7] if commit else "no git") + ("+" if dirty else "")


def when_text(iso: Any) -> str:
    text = str(iso or "")
    return text.replace("T", " ").removesuffix("Z")[:16] if text else DASH


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Aligned columns; a column no row fills is left out."""
    keep = [i for i in range(len(header)) if i < 4 or any(row[i] != DASH for row in rows)]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in keep]
    return [
        (indent + "  ".join(cells[i].ljust(w) for i, w in zip(keep, widths, strict=True))).rstrip()
        for cells in [header, *rows]
    ]


def history_lines(rows: Sequence[Mapping[str, Any]], *, last: int | None) -> list[str]:
    """Per gate (node id order), its last `last` runs oldest first: when, run, commit and its key figures."""
    by_gate: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_gate.setdefault(str(row["nodeid"]), []).append(row)
    lines: list[str] = []
    header = (
        "when (UTC)",
        "run",
        "commit",
        "verdict",
        "mean KL [95% interval]",
        "top-1 (lower)",
        "capability ref → cand",
        "decode",
        "KV",
    )
    for nodeid in sorted(by_gate):
        entries = by_gate[nodeid][-last:] if last else by_gate[nodeid]
        table = []
        for stored in (parse_row(row) for row in entries):
            f = key_figures(stored.record or Record(nodeid=nodeid))
            top1, top1_lo = f.top1
            table.append(
                (
                    when_text(stored.time),
                    short_run_id(str(stored.run_id)),
                    commit_text(stored),
                    f.verdict,
                    _kl_interval(f.kl),
                    DASH if top1 is None else f"{_pct(top1)} ({_pct(top1_lo)})",
                    ", ".join(f"{t} {_task_pair(p)}" for t, p in f.tasks.items()) or DASH,
                    _ratio_interval(f.decode),
                    _times(f.kv, 3),
                )
            )
        shown = (
            f"last {len(entries)} of {len(by_gate[nodeid])} runs"
            if len(entries) < len(by_gate[nodeid])
            else (f"{len(entries)} run{'s' if len(entries) != 1 else ''}")
        )
        lines.append(f"{nodeid}  ({shown})")
        lines.extend(_table(header, table))
    return lines


def _delta(a: float | None, b: float | None, fmt: Callable[[float], str]) -> str:
    return "" if a is None or b is None else f"   Δ {fmt(b - a)}"


def _gate_change(a: Record, b: Record) -> list[str]:
    fa, fb = key_figures(a), key_figures(b)
    out: list[tuple[str, str]] = []
    ka, kb = fa.kl[0], fb.kl[0]
    if ka is not None or kb is not None:
        times = f" (×{kb / ka:.3g})" if ka and kb is not None else ""
        out.append(
            (
                "mean KL",
                f"{_kl_interval(fa.kl)} → {_kl_interval(fb.kl)}"
                + _delta(ka, kb, lambda d: "0" if d == 0 else f"{d:+.1e}")
                + times,
            )
        )
    if fa.top1[0] is not None or fb.top1[0] is not None:
        out.append(
            (
                "top-1",
                f"{_pct(fa.top1[0])} → {_pct(fb.top1[0])}"
                + _delta(fa.top1[0], fb.top1[0], lambda d: f"{100 * d:+.1f} points"),
            )
        )
    for task in sorted(set(fa.tasks) | set(fb.tasks)):
        pa, pb = fa.tasks.get(task, (None, None)), fb.tasks.get(task, (None, None))
        da = pa[1] - pa[0] if pa[0] is not None and pa[1] is not None else None
        db = pb[1] - pb[0] if pb[0] is not None and pb[1] is not None else None
        out.append(
            (
                task,
                f"ref → cand {_task_pair(pa)} vs {_task_pair(pb)}"
                + _delta(da, db, lambda d: f"cand − ref {100 * d:+.1f} points"),
            )
        )
    for name, ra, rb in (("decode", fa.decode, fb.decode), ("prefill", fa.prefill, fb.prefill)):
        if ra[0] is not None or rb[0] is not None:
            out.append(
                (name, f"{_ratio_interval(ra)} → {_ratio_interval(rb)}" + _delta(ra[0], rb[0], "{:+.2f}".format))
            )
    if fa.kv is not None or fb.kv is not None:
        out.append(("KV", f"{_times(fa.kv, 3)} → {_times(fb.kv, 3)}" + _delta(fa.kv, fb.kv, "{:+.3f}".format)))
    width = max((len(name) for name, _ in out), default=0)
    return [f"  {name.ljust(width)}  {text}" for name, text in out]


def compare_lines(a: Source, b: Source) -> tuple[list[str], list[str]]:
    """The change from run A to run B per gate; and the regressions (gates that went from pass to fail)."""
    ra = {r.nodeid: r for r in a.records}
    rb = {r.nodeid: r for r in b.records}
    lines = [
        f"{side}: run {short_run_id(s.run.run_id)}  started {when_text(s.run.started)}  commit {commit_text(s.run)}  "
        f"{len(s.records)} gates  ({s.label})"
        for side, s in (("A", a), ("B", b))
    ]
    regressions: list[str] = []
    changed = 0
    for nodeid in sorted(set(ra) & set(rb)):
        va, vb = str(ra[nodeid].verdict), str(rb[nodeid].verdict)
        verdict = va if va == vb else f"{va} → {vb}"
        if va != vb:
            changed += 1
        if va == "pass" and vb in ("fail", "error"):
            regressions.append(nodeid)
            verdict += "  REGRESSION"
        lines.append(f"{nodeid}  {verdict}")
        lines.extend(_gate_change(ra[nodeid], rb[nodeid]))
    for side, only in (("A", sorted(set(ra) - set(rb))), ("B", sorted(set(rb) - set(ra)))):
        if only:
            lines.append(
                f"only in {side}: " + ", ".join(f"{n} ({(ra if side == 'A' else rb)[n].verdict})" for n in only)
            )
    both = len(set(ra) & set(rb))
    lines.append(
        f"{both} gate(s) in both runs, {changed} changed verdict; "
        + (
            f"{len(regressions)} regression(s) (pass → fail or error): {', '.join(regressions)}"
            if regressions
            else "no regression (pass → fail or error)"
        )
    )
    return lines, regressions
