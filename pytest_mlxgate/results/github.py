"""GitHub Actions: the job summary (markdown) and the annotations (workflow commands) of a run's gates.

Pure functions over gate records, standard library only (the xdist controller renders them);
`session/state.py` writes the summary to `$GITHUB_STEP_SUMMARY` and prints the commands when
`GITHUB_ACTIONS=true`. GitHub keeps at most 1 MiB of one step's summary and shows at most 10
annotations of each kind per step, so the summary is cut to fit (saying how many gates it left
out) and the annotations stop at 10 per kind, then one notice counts the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common.format import DASH
from .model import Record
from .record_capability import CapabilityScore
from .record_checks import CheckResult, parse_check
from .summary import format_limit, format_value, limits_text, n_parts, speed_parts
from .wire import migrate_check

__all__ = [
    "ANNOTATIONS_PER_KIND",
    "STEP_SUMMARY_LIMIT",
    "annotation_lines",
    "check_text",
    "def_line",
    "escape_data",
    "escape_property",
    "gate_line",
    "gate_location",
    "step_summary",
    "workflow_command",
]

#: GitHub's limit on one step's job summary, in bytes.
STEP_SUMMARY_LIMIT = 1024 * 1024
#: GitHub shows at most this many annotations of each kind (error, warning, notice) per step.
ANNOTATIONS_PER_KIND = 10

_SEVERITY = {"fail": 0, "error": 0, "inconclusive": 1}


# -- workflow commands ---------------------------------------------------------------------------


def escape_data(text: str) -> str:
    """A command's message, as actions/toolkit escapes it: `%`, CR and LF."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A command's property value (file, title): the message's escapes plus `:` and `,`."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(kind: str, message: str, **properties: Any) -> str:
    """`::error file=a.py,line=3,title=T::message`; properties that are None are left out."""
    props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items() if v is not None)
    return f"::{kind}{' ' + props if props else ''}::{escape_data(message)}"


# -- a gate in words -----------------------------------------------------------------------------


def _figure(key: str, metric: str, value: float | None, lower: float | None, upper: float | None) -> str:
    """`mean KL 3.1e-04 [2.5e-04, 4.0e-04]` (no interval when there is none, or the figure is exact)."""
    interval = ""
    if lower is not None and upper is not None and lower != upper:
        interval = f" [{format_value(key, lower)}, {format_value(key, upper)}]"
    return f"{metric} {format_value(key, value)}{interval}"


def check_text(check: CheckResult | Mapping[str, Any]) -> str:
    """`mean KL 3.1e-04 [2.5e-04, 4.0e-04] vs limit ≤ 1e-03: fail` (a check of a record, read or as written)."""
    c = check if isinstance(check, CheckResult) else _read_check(check)
    key = c.key or ""
    text = _figure(key, c.label, c.value, c.lower, c.upper)
    if c.limit is not None:
        rel = "≥" if c.direction == "min" else "≤"
        text += f" vs limit {rel} {format_limit(key, c.limit)}"
    verdict = c.verdict or "fail"
    if verdict == "inconclusive" and c.n_needed:
        verdict += f" (n≈{c.n_needed})"
    return f"{text}: {verdict}"


def _read_check(check: Mapping[str, Any]) -> CheckResult:
    return parse_check(migrate_check(check))


def _figures(record: Record) -> list[str]:
    """The record's key figures, what decided the verdict first, and where its limits come from: first when
    the limits were refuted (that is the error), else after the figures they judged."""
    figures = _measured(record)
    limits, words = record.limits_from, limits_text(record)
    if limits is None or words is None:
        return figures
    return [words, *figures] if limits.status == "refuted" else [*figures, words]


def _measured(record: Record) -> list[str]:
    if record.error is not None:  # a gate that raised: its error, first line (the JSON report keeps the rest)
        error = record.error
        first = next((line for line in (error.message or "").splitlines() if line.strip()), "")
        return [f"{error.type or 'error'} in {error.phase or 'call'}: {first}".rstrip(": ")]
    if record.mode == "score":
        score = record.capability_score or CapabilityScore()
        return [f"Capability Score {_pct(score.reference)} → {_pct(score.candidate)}"]
    if record.checks:
        return [check_text(c) for c in sorted(record.checks, key=lambda c: _SEVERITY.get(c.verdict or "fail", 2))]
    stats = record.stats
    if stats.has("mean"):  # measured, nothing asserted
        return [_figure("mean", "mean KL", stats.mean, stats.mean_ci.lower, stats.mean_ci.upper)]
    return []


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else DASH


def gate_line(r: Record) -> str:
    """One line: `FAIL test_kv::test_drift: mean KL … · 16 prompts · 2048 tokens · re-run: pytest …`."""
    verdict = r.verdict or DASH
    parts = [*_figures(r), *n_parts(r)]
    if r.rerun:
        parts.append(f"re-run: {r.rerun}")
    return f"{verdict.upper()} {r.name}: " + " · ".join(parts)


# -- annotations ---------------------------------------------------------------------------------


def def_line(path: Path, lineno: int) -> int:
    """The 1-based line of the `def` a test item reports (pytest's 0-based line is the first decorator's)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return lineno + 1
    if not (0 <= lineno < len(lines)) or not lines[lineno].lstrip().startswith("@"):
        return lineno + 1
    for i in range(lineno, min(len(lines), lineno + 200)):
        if re.match(r"\s*(async\s+)?def\s", lines[i]):
            return i + 1
    return lineno + 1


def gate_location(root: Path, location: Sequence[Any], workspace: Path | None = None) -> tuple[str, int]:
    """(path, line) for an annotation: a report's `location` (relative to pytest's rootdir, 0-based line)
    as GitHub wants it: relative to the checkout (`$GITHUB_WORKSPACE`), the line of the `def`."""
    relative = str(location[0])
    absolute = Path(root, relative)
    lineno = location[1] if isinstance(location[1], int) else 0
    line = def_line(absolute, lineno)
    if workspace is not None:
        try:
            return absolute.resolve().relative_to(workspace.resolve()).as_posix(), line
        except ValueError:
            pass  # outside the checkout: the path pytest gave
    return Path(relative).as_posix(), line


def annotation_lines(
    records: Sequence[Record], locations: Mapping[str, tuple[str, int]], *, per_kind: int = ANNOTATIONS_PER_KIND
) -> list[str]:
    """`::error` per failing gate, `::warning` per inconclusive one, at its test function; at most
    `per_kind` of each, then a `::notice` counting the rest. Gates without a location are left out."""
    worst: dict[str, Record] = {}
    for record in records:
        if record.nodeid not in locations or str(record.verdict) not in _SEVERITY:
            continue
        if record.nodeid not in worst or _severity(record) < _severity(worst[record.nodeid]):
            worst[record.nodeid] = record
    lines: list[str] = []
    kinds = (("error", "failing", ("fail", "error")), ("warning", "inconclusive", ("inconclusive",)))
    for kind, words, verdicts in kinds:
        chosen = [r for n, r in sorted(worst.items()) if r.verdict in verdicts]
        for record in chosen[:per_kind]:
            path, line = locations[record.nodeid]
            title = f"mlxgate {record.verdict}: {record.name}"
            lines.append(workflow_command(kind, gate_line(record), file=path, line=line, title=title))
        if len(chosen) > per_kind:
            rest = len(chosen) - per_kind
            lines.append(
                workflow_command(
                    "notice",
                    f"{rest} more {words} gate{'s' if rest > 1 else ''} not annotated (GitHub shows "
                    f"{per_kind} per kind); the job summary and the JSON report list every gate",
                    title="mlxgate",
                )
            )
    return lines


def _severity(record: Record) -> int:
    return _SEVERITY.get(str(record.verdict), 2)


# -- the job summary -----------------------------------------------------------------------------

_LABELS = {
    "fail": "❌ fail",
    "error": "❌ error",
    "inconclusive": "⚠️ inconclusive",
    "pass": "✅ pass",
    "floor": "✅ above A/A floor",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _row(record: Record) -> str:
    verdict = record.verdict or DASH
    figures = "<br>".join(_cell(f) for f in _figures(record)) or DASH
    n = _cell(" · ".join(n_parts(record))) or DASH
    return f"| {_cell(_code(record.name))} | {_LABELS.get(verdict, verdict)} | {figures} | {n} |"


def _speed_items(records: Sequence[Record]) -> list[str]:
    """One bullet per module's speed measurement (its gates share one), under the first gate carrying it."""
    items, shown = [], set[str]()
    for record in records:
        lines = speed_parts(record, shown)
        if lines:
            items.append(f"- {_code(record.name)}: " + "; ".join(lines))
    return items


def step_summary(
    records: Sequence[Record], *, reports: Sequence[tuple[str, str]] = (), limit: int = STEP_SUMMARY_LIMIT
) -> str:
    """The run's job summary in markdown, at most `limit` UTF-8 bytes ("" when not even its head fits).

    Failing gates first, then inconclusive ones, then the rest; what does not fit is counted in a
    closing line. `reports`: (what, path) of the files written, e.g. ("JSON report", "results/gates.json").
    """
    ordered = sorted(records, key=lambda r: (r.mode == "score", _severity(r), r.nodeid))
    gates = [r for r in ordered if r.mode != "score"]
    counts: dict[str, int] = {}
    for r in gates:
        counts[str(r.verdict)] = counts.get(str(r.verdict), 0) + 1
    tally = " · ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: (_SEVERITY.get(kv[0], 2), kv[0])))
    head = [
        f"### mlxgate: {len(gates)} gate{'s' if len(gates) != 1 else ''} — {tally or 'none'}",
        "",
        "| gate | verdict | figures: value [95% interval] vs limit | n |",
        "|---|---|---|---|",
    ]
    foot: list[str] = []
    models = sorted({m for r in gates if r.candidate and (m := r.candidate.label)})
    references = sorted({m for r in gates if r.reference_model and (m := r.reference_model.label)})
    if models:
        foot.append(
            "Model: "
            + ", ".join(_code(m) for m in models)
            + (" · reference: " + ", ".join(_code(m) for m in references) if references else "")
        )
    for what, path in reports:
        foot.append(f"{what}: {_code(path)}")
    foot = [f"{line}  " for line in foot]  # a markdown line break after each
    rows = [_row(r) for r in ordered]
    speed = _speed_items(gates)

    def size(lines: Sequence[str]) -> int:
        return sum(len(line.encode("utf-8")) + 1 for line in lines)

    reserve = 400  # the closing count line and the section breaks
    budget = limit - size(head) - size(foot) - reserve
    if budget < 0:
        return ""
    kept_rows = _fit(rows, budget, size)
    budget -= size(kept_rows)
    kept_speed = _fit(speed, budget - size(["", "**Speed and memory**", ""]), size) if speed else []
    left_out = len(rows) - len(kept_rows)
    lines = [*head, *kept_rows]
    if left_out:
        lines.append(
            f"| … | {left_out} more gate{'s' if left_out > 1 else ''} left out | to stay under GitHub's "
            f"{limit // 1024} KiB step-summary limit | … |"
        )
    if kept_speed:
        lines += ["", "**Speed and memory**", "", *kept_speed]
    if len(kept_speed) < len(speed):
        lines.append(f"- … {len(speed) - len(kept_speed)} more left out (size limit)")
    if foot:
        lines += ["", *foot]
    text = "\n".join(lines) + "\n"
    assert len(text.encode("utf-8")) <= limit, "step summary over its limit"
    return text


def _fit(lines: Sequence[str], budget: int, size: Any) -> list[str]:
    """The leading lines that fit in `budget` bytes (order kept: what matters most comes first)."""
    kept: list[str] = []
    used = 0
    for line in lines:
        cost = size([line])
        if used + cost > budget:
            break
        kept.append(line)
        used += cost
    return kept
