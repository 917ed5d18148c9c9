"""A gate's history over commits in the HTML report: its key figures as sparklines, run by run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..common.format import DASH
from .html_parts import HISTORY_RUNS, figure, limits_of
from .model import Record
from .runs import RunFacts, StoredRow, parse_row
from .svg import esc, message, sparkline


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


def history_section(record: Record, history: Mapping[str, Sequence[Mapping[str, Any]]] | None, run: RunFacts) -> str:
    head = "<h3>History</h3>"
    if history is None:
        return head + figure(
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
        return head + figure(
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
    limits = dict(limits_of(record, "mean")) if record.mode in ("gate", "aa") else {}
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
        return head + figure("history", "This gate over commits.", message("no figure to follow", label="history"))
    first, last = rows[0], rows[-1]
    caption = (
        f"The last {len(rows)} runs of this gate in the results DB, oldest first: "
        f"{esc((first.code_commit or DASH)[:10])} ({esc(first.time or DASH)}) → "
        f"{esc((last.code_commit or DASH)[:10])} ({esc(last.time or DASH)}); a dot's colour "
        "is that run's verdict, the last (largest) is the latest; dashed: the limit."
    )
    return head + figure("history", caption, "".join(parts))


def _history_value(v: float | None, log: bool) -> str:
    return DASH if v is None else f"{v:.2e}" if log and v < 0.01 else f"{v:.3g}"
