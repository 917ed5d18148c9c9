"""The controller's end-of-run table: one block per gate, its checks with value, bound and limit."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ..common.format import DASH, clip, format_duration, percent, percent_distinct
from .attribution_text import top_line
from .fields import number
from .model import Record
from .record_capability import CapabilityScore
from .record_checks import CheckResult
from .record_kl import Stats
from .runs import Interrupted, interrupted_of

__all__ = [
    "LIMITS_NOT_SHOWN",
    "format_limit",
    "format_value",
    "interrupted_line",
    "limits_text",
    "n_parts",
    "speed_parts",
    "summary_lines",
]

_PERCENT_KEYS = frozenset({"top1", "same_top", "top1_lo", "same_top_lo"})
_KL_KEYS = frozenset({"mean", "median", "p90", "p95", "p99", "p999", "max"})
_SIGNED_KEYS = frozenset({"ln_ppl_ratio", "delta_p"})
_COUNT_KEYS = frozenset({"n_prompts", "n_sequences", "n_tokens", "flips", "near_tie_flips", "near_ties"})


def _is_kl(key: str) -> bool:
    return key in _KL_KEYS or "kl" in key.lower()


def format_value(metric_key: str, value: Any) -> str:
    """A metric's value for the summary: KL in scientific form, top-1 agreement in percent."""
    v = number(value)
    if v is None:
        return DASH
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "inf"
    if metric_key in _PERCENT_KEYS:
        return percent_distinct(v)
    if metric_key.startswith("speed."):
        return f"×{v:.3f}"
    if metric_key in _COUNT_KEYS and v == int(v):
        return str(int(v))
    if metric_key in _SIGNED_KEYS or metric_key.startswith("delta_p"):
        return "0" if v == 0 else f"{v:+.1e}"
    if _is_kl(metric_key):
        return "0" if v == 0 else f"{v:.1e}"
    return f"{v:.3g}"


def format_limit(key: str, value: Any) -> str:
    """A limit is a number somebody typed: `1e-03`, not `1.0e-03` (which claims a measured digit)."""
    text = format_value(key, value)
    v = number(value)
    if v is None or not math.isfinite(v) or key in _PERCENT_KEYS or "e" not in text:
        return text
    mantissa, exponent = f"{v:.2e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


_Row = tuple[str, str, str, str, str]  # metric, value, bound, limit, verdict


def _bound(direction: str | None, key: str, value: float | None) -> str:
    text = format_value(key, value)
    if text == DASH:
        return text
    sign = {"max": "≤ ", "min": "≥ "}.get(str(direction), "")
    return sign + text


def _check_rows(checks: Sequence[CheckResult]) -> list[_Row]:
    rows: list[_Row] = []
    for c in checks:
        key = c.key or ""
        verdict = _verdict_label(c.verdict) if c.verdict is not None else DASH
        if verdict == "INCONCLUSIVE" and c.n_needed is not None:
            verdict += f" (n≈{c.n_needed})"
        rows.append(
            (
                c.label,
                format_value(key, c.value),
                _bound(c.direction, key, c.bound),
                format_limit(key, c.limit),
                verdict,
            )
        )
    return rows


def _measured_rows(stats: Stats, verdict: str) -> list[_Row]:
    """Without checks: what the gate measured, with the CI side a bound would use."""
    spec = (
        ("mean KL", "mean", "max", stats.mean_ci.upper),
        ("p99 KL", "p99", "max", stats.quantile_interval("p99").upper),
        ("max KL", "max", "max", None),
        ("same-top", "same_top", "min", stats.same_top_ci.lower),
    )
    return [
        (metric, format_value(key, stats.figure(key)), _bound(direction, key, bound), DASH, verdict)
        for metric, key, direction, bound in spec
        if stats.has(key)
    ]


def _floor_rows(floors: Mapping[str, float | None]) -> list[_Row]:
    order = [k for k in ("mean", "p99", "max") if k in floors] + sorted(
        k for k in floors if k not in ("mean", "p99", "max")
    )
    names = {"mean": "mean KL", "p99": "p99 KL", "max": "max KL"}
    return [(names.get(k, k), format_value(k, floors[k]), DASH, DASH, "floor") for k in order]


def _score_pair(reference: float | None, candidate: float | None) -> str:
    """`ref% → cand%` for the Capability Score rows."""
    return f"{percent(reference, missing=DASH)} → {percent(candidate, missing=DASH)}"


def _verdict_label(verdict: str | None) -> str:
    v = verdict or ""
    return {
        "fail": "FAIL",
        "error": "ERROR",
        "pass": "pass",
        "measured": "measured",
        "inconclusive": "INCONCLUSIVE",
    }.get(v, v or DASH)


def _gate_rows(record: Record) -> list[_Row]:
    verdict = record.verdict
    rows: list[_Row]
    if record.error is not None:
        rows = [(f"error in {record.error.phase or 'call'}", DASH, DASH, DASH, "ERROR")]  # the words: under it
    elif record.mode == "score":
        score = record.capability_score or CapabilityScore()
        rows = [(t, _score_pair(v.reference, v.candidate), DASH, DASH, "ran") for t, v in score.tasks.items()]
        rows.append(
            (
                "score",
                _score_pair(score.reference, score.candidate),
                DASH,
                DASH,
                "partial" if score.partial else "complete",
            )
        )
    elif record.mode == "aa" and record.checks:
        # A/A with limits: each limit against the noise floor it must sit above
        rows = [
            (m, v, DASH, lim, "above floor" if verdict_ == "pass" else verdict_)
            for m, v, _, lim, verdict_ in _check_rows(record.checks)
        ]
    elif record.mode == "aa":
        rows = _floor_rows(record.floors)
    elif record.checks:
        rows = _check_rows(record.checks)
    else:
        rows = _measured_rows(record.stats, _verdict_label(verdict or "measured"))
    if verdict in ("fail", "error", "inconclusive") and not any(
        r[4].startswith(("FAIL", "ERROR", "INCONCLUSIVE")) for r in rows
    ):
        rows.append(("verdict", DASH, DASH, DASH, _verdict_label(verdict)))  # never show all-pass
    if not rows:
        rows.append((DASH, DASH, DASH, DASH, _verdict_label(verdict)))
    return rows


def n_parts(record: Record) -> list[str]:
    """What the verdict rests on, in words: pairs, prompts or items, tokens, the reference's source, time."""
    parts: list[str] = []
    speed = record.speed
    if record.mode == "speed" and speed is not None and speed.repetitions is not None:
        parts.append(f"{speed.repetitions} pairs per context, {speed.decode_tokens} decoded")
    if record.n_prompts is not None:
        parts.append(f"{record.n_prompts} {'items' if record.mode == 'capability' else 'prompts'}")
        windows = record.stats.n_sequences
        if windows is not None and windows != record.n_prompts:
            parts[-1] += f" ({windows} windows of them: n = {record.n_prompts})"
    if record.stats.n_tokens is not None:
        parts.append(f"{record.stats.n_tokens} tokens")
    if record.mode == "gate" and record.stats.identical:
        calls = record.lever_calls
        seen = f" ({calls:,} lever calls seen)" if calls else ""
        parts.append(f"identical on this backend{seen}")  # every distribution equal: nothing to bound
    if record.oracle is not None:
        parts.append(record.oracle.words)
    if record.reference_source:
        parts.append(f"ref: {record.reference_source}")
    if record.total_s is not None:
        parts.append(format_duration(record.total_s))
    return parts


def speed_parts(record: Record, shown: set[str]) -> list[str]:
    """A module's speed lines, under the first of its records that carries them (its gates share one
    measurement, `shown` holds the ids already said)."""
    from .speed_text import speed_lines

    speed = record.speed
    if speed is None:
        return []
    ident = speed.id or str(id(speed))  # no id: this record's own (the caller holds every record it shows)
    if ident in shown:
        return []
    shown.add(ident)
    return speed_lines(speed)


def _error_parts(record: Record) -> list[str]:
    """An error record's type and message under its block, line by line (at most 6: the reports keep the
    rest). pytest.fail's `Failed` is left out: its message is the whole story."""
    if record.error is None:
        return []
    kind = record.error.type or ""
    lines = [line for line in (record.error.message or "").splitlines() if line.strip()]
    if lines and kind and kind != "Failed":
        lines[0] = f"{kind}: {lines[0]}"
    return lines[:6] + (["…"] if len(lines) > 6 else [])


def _attribution_parts(record: Record) -> list[str]:
    """A KL gate's top drift contributors, when its drift was attributed (--mlx-explain, or a failure)."""
    return [top_line(record.attribution)] if record.attribution is not None else []


#: What marks limits that were not shown to work on the judged model and backend (unproven, refuted).
LIMITS_NOT_SHOWN = "⚠"


def limits_text(record: Record) -> str | None:
    """Where the gate's limits were shown to work (`LimitsFrom.words`), marked where they were not: a
    pass on limits nobody showed can catch anything here must not read like one on proven limits."""
    limits = record.limits_from
    if limits is None:
        return None
    return limits.words if limits.shown else f"{LIMITS_NOT_SHOWN} {limits.words}"


def _limits_parts(record: Record) -> list[str]:
    text = limits_text(record)
    return [text] if text is not None else []


def _server_parts(record: Record) -> list[str]:
    """A candidate served over HTTP: where, and that its KL is a lower bound from its top-k."""
    return [record.server.words] if record.server is not None else []


def _pack(parts: Sequence[str], width: int, sep: str = " · ") -> list[str]:
    """Join parts into lines of at most `width`, breaking only between parts (clipping a lone giant)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(clip(part, width))
    return lines


def _name_lines(name: str, width: int) -> list[str]:
    """A gate name too wide for its column, whole, on lines of its own above its rows: on one line when it
    fits the width, else broken after its `::` (the module, then the test name under it, as pytest's -rA
    lists them) and a part still too long cut every `width` characters. Never shortened: a name clipped in
    the middle cannot tell two gates apart."""
    step = max(1, width)
    if len(name) <= step:
        return [name]
    return [part[i : i + step] for part in re.split(r"(?<=::)", name) if part for i in range(0, len(part), step)]


_GAP = "  "
_MIN_GATE_WIDTH = 12


def summary_lines(records: Sequence[Record], *, width: int = 120) -> list[str]:
    """The controller's end-of-run table: a header, then one block per gate, columns aligned."""
    read = sorted(records, key=lambda r: r.nodeid)
    confidences = {r.stats.confidence for r in read} - {None}
    bound_title = "bound"
    if len(confidences) == 1:
        (c,) = confidences
        assert c is not None
        bound_title = f"{c * 100:g}% bound"
    header: tuple[str, str, str, str, str, str] = ("gate", "metric", "value", bound_title, "limit", "verdict")

    blocks: list[tuple[str, list[_Row], list[str], list[str], list[str]]] = []
    speeds_shown: set[str] = set()
    for record in read:
        blocks.append(
            (
                record.name or DASH,
                _gate_rows(record),
                n_parts(record),
                speed_parts(record, speeds_shown),
                _error_parts(record) + _server_parts(record) + _limits_parts(record) + _attribution_parts(record),
            )
        )

    cols = [[row[i] for _, rows, _, _, _ in blocks for row in rows] for i in range(5)]
    widths = [max([len(header[i + 1])] + [len(v) for v in cols[i]]) for i in range(5)]
    widths[0] = max(widths[0], len("n"))
    rest = sum(widths) + len(_GAP) * 5
    gate_width = max([len(header[0])] + [len(name) for name, _, _, _, _ in blocks])
    gate_width = min(gate_width, max(_MIN_GATE_WIDTH, width - rest))

    def line(cells: Sequence[str]) -> str:
        # a detail line has fewer cells than columns
        padded = [c.ljust(w) for c, w in zip(cells, [gate_width, *widths], strict=False)]
        return _GAP.join(padded).rstrip()

    lines = [line(header)]
    detail_start = gate_width + len(_GAP) + widths[0] + len(_GAP)
    for name, rows, details, speed, error in blocks:
        in_column = len(name) <= gate_width
        if not in_column:
            lines.extend(_name_lines(name, width))
        for i, row in enumerate(rows):
            lines.append(line((name if i == 0 and in_column else "", *row)))
        for text in error:  # the error's words, where the limits come from, the drift's sources: wrapped
            lines.extend(
                textwrap.wrap(
                    text,
                    max(20, width - len(_SPEED_INDENT)),
                    initial_indent=_SPEED_INDENT,
                    subsequent_indent=_SPEED_INDENT + "  ",
                    break_on_hyphens=False,
                )
                or [""]
            )
        for i, detail in enumerate(_pack(details, max(len(DASH), width - detail_start))):
            lines.append(line(("", "n" if i == 0 else "", detail)))
        for text in speed:  # under the block at full width: a speed line has too much for the n column
            head, sep, body = text.partition(": ")
            if not sep:
                lines.append(_SPEED_INDENT + clip(text, width - len(_SPEED_INDENT)))
                continue
            indent = " " * (len(_SPEED_INDENT) + len(head) + 2)
            for i, part in enumerate(_pack(body.split(" · "), max(len(DASH), width - len(indent)))):
                lines.append((f"{_SPEED_INDENT}{head}: " if i == 0 else indent) + part)
    return lines


_SPEED_INDENT = "  "


def interrupted_line(interrupted: Mapping[str, Any] | Interrupted) -> str:
    """A run's `interrupted` (its config's): `INTERRUPTED (KeyboardInterrupt): 2 module(s) did not run: a.py, b.py`."""
    facts = interrupted if isinstance(interrupted, Interrupted) else interrupted_of(interrupted) or Interrupted()
    not_run = facts.not_run
    shown = ", ".join(not_run[:10]) + (f" and {len(not_run) - 10} more" if len(not_run) > 10 else "")
    return f"INTERRUPTED ({facts.reason or 'interrupted'}): " + (
        f"{len(not_run)} module(s) did not run: {shown}" if not_run else "every collected test had run"
    )
