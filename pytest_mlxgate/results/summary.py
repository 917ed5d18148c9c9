"""The controller's end-of-run table: one block per gate, its checks with value, bound and limit."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ..common.format import DASH, format_duration, percent, percent_distinct
from .fields import as_map, integer, interval_end, nodeid_of, number, real
from .records import GateRecord
from .verdicts import check_verdict

__all__ = ["format_limit", "format_value", "interrupted_line", "n_parts", "summary_lines"]

_PERCENT_KEYS = frozenset({"top1", "same_top", "top1_lo", "same_top_lo"})
_KL_KEYS = frozenset({"mean", "median", "p90", "p95", "p99", "p999", "max"})
_SIGNED_KEYS = frozenset({"ln_ppl_ratio", "delta_p"})
_COUNT_KEYS = frozenset({"n_prompts", "n_tokens", "flips", "near_tie_flips", "near_ties"})


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


def _bound(direction: Any, key: str, value: Any) -> str:
    text = format_value(key, value)
    if text == DASH:
        return text
    sign = {"max": "≤ ", "min": "≥ "}.get(str(direction), "")
    return sign + text


def _check_rows(checks: Sequence[Any]) -> list[_Row]:
    rows: list[_Row] = []
    for check in checks:
        c = as_map(check)
        key = str(c.get("key") or "")
        metric = str(c.get("metric") or key or DASH)
        verdict = _verdict_label(check_verdict(c)) if ("verdict" in c or "passed" in c) else DASH
        if verdict == "INCONCLUSIVE" and integer(c.get("n_needed")) is not None:
            verdict += f" (n≈{integer(c.get('n_needed'))})"
        rows.append((metric, format_value(key, c.get("value")), _bound(c.get("direction"), key, c.get("bound")),
                     format_limit(key, c.get("limit")), verdict))
    return rows


def _measured_rows(stats: Mapping[str, Any], verdict: str) -> list[_Row]:
    """Without checks: what the gate measured, with the CI side a bound would use."""
    qci = as_map(stats.get("quantile_ci"))
    spec = (
        ("mean KL", "mean", "max", interval_end(stats.get("mean_ci"), 1)),
        ("p99 KL", "p99", "max", interval_end(qci.get("p99"), 1)),
        ("max KL", "max", "max", None),
        ("same-top", "same_top", "min", interval_end(stats.get("same_top_ci"), 0)),
    )
    return [(metric, format_value(key, stats.get(key)), _bound(direction, key, bound), DASH, verdict)
            for metric, key, direction, bound in spec if key in stats]


def _floor_rows(aa: Mapping[str, Any]) -> list[_Row]:
    floors = as_map(aa.get("floors"))
    order = [k for k in ("mean", "p99", "max") if k in floors] + sorted(k for k in floors
                                                                       if k not in ("mean", "p99", "max"))
    names = {"mean": "mean KL", "p99": "p99 KL", "max": "max KL"}
    return [(names.get(k, str(k)), format_value(k, floors[k]), DASH, DASH, "floor") for k in order]


def _score_pair(d: Mapping[str, Any]) -> str:
    """`ref% → cand%` for the Capability Score rows."""
    ref, cand = real(d.get("reference")), real(d.get("candidate"))
    return f"{percent(ref, missing=DASH)} → {percent(cand, missing=DASH)}"


def _verdict_label(verdict: Any) -> str:
    v = str(verdict or "")
    return {"fail": "FAIL", "error": "ERROR", "pass": "pass", "measured": "measured",
            "inconclusive": "INCONCLUSIVE"}.get(v, v or DASH)


def _gate_rows(record: GateRecord) -> list[_Row]:
    stats = as_map(record.get("stats"))
    checks = record.get("checks")
    verdict = record.get("verdict")
    rows: list[_Row]
    has_checks = isinstance(checks, Sequence) and not isinstance(checks, str) and bool(checks)
    error = as_map(record.get("error"))
    if error:
        rows = [(f"error in {error.get('phase') or 'call'}", DASH, DASH, DASH, "ERROR")]  # the words: under it
    elif record.get("mode") == "score":
        score = as_map(record.get("capability_score"))
        rows = [(str(t), _score_pair(as_map(v)), DASH, DASH, "ran") for t, v in as_map(score.get("tasks")).items()]
        rows.append(("score", _score_pair(score), DASH, DASH, "partial" if score.get("partial") else "complete"))
    elif record.get("mode") == "aa" and has_checks:
        # A/A with limits: each limit against the noise floor it must sit above
        rows = [(m, v, DASH, lim, "above floor" if verdict_ == "pass" else verdict_)
                for m, v, _, lim, verdict_ in _check_rows(checks)]  # type: ignore[arg-type]
    elif record.get("mode") == "aa":
        rows = _floor_rows(as_map(record.get("aa")))
    elif isinstance(checks, Sequence) and not isinstance(checks, str) and checks:
        rows = _check_rows(checks)
    else:
        rows = _measured_rows(stats, _verdict_label(verdict or "measured"))
    if verdict in ("fail", "error", "inconclusive") and not any(
            r[4].startswith(("FAIL", "ERROR", "INCONCLUSIVE")) for r in rows):
        rows.append(("verdict", DASH, DASH, DASH, _verdict_label(verdict)))  # never show all-pass
    if not rows:
        rows.append((DASH, DASH, DASH, DASH, _verdict_label(verdict)))
    return rows


def n_parts(record: GateRecord) -> list[str]:
    stats = as_map(record.get("stats"))
    sizes = as_map(record.get("sizes"))
    parts: list[str] = []
    if record.get("mode") == "speed":
        shape = as_map(as_map(record.get("speed")).get("shape"))
        if integer(shape.get("repetitions")) is not None:
            parts.append(f"{shape['repetitions']} pairs per context, {shape.get('decode')} decoded")
    n_prompts = integer(stats.get("n_prompts", sizes.get("prompts")))
    if n_prompts is not None:
        parts.append(f"{n_prompts} {'items' if record.get('mode') == 'capability' else 'prompts'}")
    n_tokens = integer(stats.get("n_tokens"))
    if n_tokens is not None:
        parts.append(f"{n_tokens} tokens")
    if record.get("mode") == "gate" and real(stats.get("max")) == 0.0 and real(stats.get("same_top")) == 1.0:
        calls = integer(as_map(record.get("lever_calls")).get("candidate"))
        seen = f" ({calls:,} lever calls seen)" if calls else ""
        parts.append(f"identical on this backend{seen}")  # every distribution equal: nothing to bound
    if record.get("reference_source"):
        parts.append(f"ref: {record['reference_source']}")
    total = real(as_map(record.get("durations")).get("total_s"))
    if total is not None:
        parts.append(format_duration(total))
    return parts


def _speed_parts(record: GateRecord, shown: set[str]) -> list[str]:
    """A module's speed lines, under the first of its records that carries them (its gates share one
    measurement)."""
    from ..speed.text import speed_lines

    speed = as_map(record.get("speed"))
    if not speed:
        return []
    ident = str(speed.get("id") or id(speed))
    if ident in shown:
        return []
    shown.add(ident)
    return speed_lines(speed)


def _error_parts(record: GateRecord) -> list[str]:
    """An error record's type and message under its block, line by line (at most 6: the reports keep the
    rest). pytest.fail's `Failed` is left out: its message is the whole story."""
    error = as_map(record.get("error"))
    kind = str(error.get("type") or "")
    lines = [line for line in str(error.get("message") or "").splitlines() if line.strip()]
    if lines and kind and kind != "Failed":
        lines[0] = f"{kind}: {lines[0]}"
    return lines[:6] + (["…"] if len(lines) > 6 else [])


def _pack(parts: Sequence[str], width: int, sep: str = " · ") -> list[str]:
    """Join parts into lines of at most `width`, breaking only between parts (clipping a lone giant)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(_clip(part, width))
    return lines


def _name_lines(name: str, width: int) -> list[str]:
    """A gate name too wide for its column, whole, on lines of its own above its rows: cut every `width`
    characters, never shortened (a name clipped in the middle cannot tell two gates apart)."""
    return [name[i:i + width] for i in range(0, len(name), max(1, width))]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


_GAP = "  "
_MIN_GATE_WIDTH = 12


def summary_lines(records: Sequence[GateRecord], *, width: int = 120) -> list[str]:
    """The controller's end-of-run table: a header, then one block per gate, columns aligned."""
    confidences = {real(as_map(r.get("stats")).get("confidence")) for r in records} - {None}
    bound_title = "bound"
    if len(confidences) == 1:
        (c,) = confidences
        assert c is not None
        bound_title = f"{c * 100:g}% bound"
    header: tuple[str, str, str, str, str, str] = ("gate", "metric", "value", bound_title, "limit", "verdict")

    blocks: list[tuple[str, list[_Row], list[str], list[str], list[str]]] = []
    speeds_shown: set[str] = set()
    for record in sorted(records, key=nodeid_of):
        name = str(record.get("gate") or record.get("nodeid") or DASH)
        blocks.append((name, _gate_rows(record), n_parts(record), _speed_parts(record, speeds_shown),
                       _error_parts(record)))

    cols = [[row[i] for _, rows, _, _, _ in blocks for row in rows] for i in range(5)]
    widths = [max([len(header[i + 1])] + [len(v) for v in cols[i]]) for i in range(5)]
    widths[0] = max(widths[0], len("n"))
    rest = sum(widths) + len(_GAP) * 5
    gate_width = max([len(header[0])] + [len(name) for name, _, _, _, _ in blocks])
    gate_width = min(gate_width, max(_MIN_GATE_WIDTH, width - rest))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells, [gate_width, *widths])]
        return _GAP.join(padded).rstrip()

    lines = [line(header)]
    detail_start = gate_width + len(_GAP) + widths[0] + len(_GAP)
    for name, rows, details, speed, error in blocks:
        in_column = len(name) <= gate_width
        if not in_column:
            lines.extend(_name_lines(name, width))
        for i, row in enumerate(rows):
            lines.append(line((name if i == 0 and in_column else "", *row)))
        for text in error:  # the error's own words, wrapped under the block
            lines.extend(textwrap.wrap(text, max(20, width - len(_SPEED_INDENT)), initial_indent=_SPEED_INDENT,
                                       subsequent_indent=_SPEED_INDENT + "  ", break_on_hyphens=False) or [""])
        for i, detail in enumerate(_pack(details, max(len(DASH), width - detail_start))):
            lines.append(line(("", "n" if i == 0 else "", detail)))
        for text in speed:  # under the block at full width: a speed line has too much for the n column
            head, sep, body = text.partition(": ")
            if not sep:
                lines.append(_SPEED_INDENT + _clip(text, width - len(_SPEED_INDENT)))
                continue
            indent = " " * (len(_SPEED_INDENT) + len(head) + 2)
            for i, part in enumerate(_pack(body.split(" · "), max(len(DASH), width - len(indent)))):
                lines.append((f"{_SPEED_INDENT}{head}: " if i == 0 else indent) + part)
    return lines


_SPEED_INDENT = "  "


def interrupted_line(interrupted: Mapping[str, Any]) -> str:
    """A run's `interrupted` (its config's): `INTERRUPTED (KeyboardInterrupt): 2 module(s) did not run: a.py, b.py`."""
    not_run = [str(m) for m in interrupted.get("not_run") or []]
    shown = ", ".join(not_run[:10]) + (f" and {len(not_run) - 10} more" if len(not_run) > 10 else "")
    return (f"INTERRUPTED ({interrupted.get('reason') or 'interrupted'}): "
            + (f"{len(not_run)} module(s) did not run: {shown}" if not_run else "every collected test had run"))
