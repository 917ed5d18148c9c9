"""`assert_kl_below`: a gate passes only when the confidence bound, not the point value, is in bounds.

Three verdicts, the capability gate's words: *pass* = every limit's 95% bound on the good side
clears it; *fail* = a limit is shown crossed (the interval's other end is beyond it, or the observed
max KL is); otherwise *inconclusive* (the interval straddles a limit, or is undefined with too few
prompts), which never passes and says about how many prompts would tell.

Under `--mlx-aa` the same call checks the other direction: every limit must sit above the A/A noise
floor (the reference against itself), or the gate would fail on noise alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..common.format import percent

if TYPE_CHECKING:
    from .result import KLResult

__all__ = ["assert_kl_below", "kl_checks"]

#: keyword -> (label, direction): "max" means the value must stay at or below the limit.
_METRICS: dict[str, tuple[str, str]] = {
    "mean": ("mean KL", "max"),
    "median": ("median KL", "max"),
    "p90": ("p90 KL", "max"),
    "p95": ("p95 KL", "max"),
    "p99": ("p99 KL", "max"),
    "p999": ("p99.9 KL", "max"),
    "max": ("max KL", "max"),
    "ln_ppl": ("ln PPL ratio", "max"),
    "top1": ("top-1", "min"),
    "same_top": ("same top", "min"),
}


def kl_checks(stats: Mapping[str, Any], bounds: Mapping[str, float]) -> list[dict[str, Any]]:
    """One check per bound: the value, both ends of its interval, the limit, and the verdict."""
    checks = []
    n = int(stats.get("n_prompts") or 0)
    for key, limit in bounds.items():
        label, direction = _METRICS[key]
        value, bound = _value_and_bound(stats, key)
        other = _other_end(stats, key)
        if bound is None or math.isnan(bound):
            verdict = "inconclusive"  # an undefined bound (e.g. one prompt) shows nothing either way
        elif direction == "max":
            verdict = "pass" if bound <= limit else "fail" if other is not None and other > limit else "inconclusive"
        else:
            verdict = "pass" if bound >= limit else "fail" if other is not None and other < limit else "inconclusive"
        needed = _prompts_needed(value, bound, limit, n, direction) if verdict == "inconclusive" else None
        checks.append({"metric": label, "key": key, "value": value, "bound": bound, "other_bound": other,
                       "limit": float(limit), "direction": direction, "n": n, "n_needed": needed,
                       "verdict": verdict, "passed": verdict == "pass"})
    return checks


def _prompts_needed(value: float, bound: float | None, limit: float, n: int, direction: str) -> int | None:
    """About how many prompts would bring the bound inside the limit: the interval narrows as 1/sqrt(n)."""
    if bound is None or math.isnan(bound) or n < 2 or not math.isfinite(value):
        return None
    gap, half = (limit - value, bound - value) if direction == "max" else (value - limit, value - bound)
    if gap <= 0 or half <= 0:
        return None  # the point value itself is at or beyond the limit: more prompts would not show a pass
    return max(n + 1, math.ceil(n * (half / gap) ** 2))


def assert_kl_below(
    result: Any,
    *,
    mean: float | None = None,
    median: float | None = None,
    p90: float | None = None,
    p95: float | None = None,
    p99: float | None = None,
    p999: float | None = None,
    max: float | None = None,  # noqa: A002 - the metric's name is the API
    top1: float | None = None,
    same_top: float | None = None,
    ln_ppl: float | None = None,
) -> KLResult:
    """Fail unless every named KL statistic is within its limit at 95% confidence.

    `mean` and the quantiles (`median`, `p90`, `p95`, `p99`, `p999`) compare the upper end of
    their 95% interval over sequences; `max` the largest per-token KL seen; `top1` the lower end
    of the top-1 agreement (near-tie flips count as agreement; `same_top` counts every flip);
    `ln_ppl` the upper end of ln(PPL_cand / PPL_ref). `result` is the `paired` fixture or a
    `KLResult`. Returns the result, so a gate can go on to look at it.
    """
    __tracebackhide__ = True
    given = {"mean": mean, "median": median, "p90": p90, "p95": p95, "p99": p99, "p999": p999,
             "max": max, "top1": top1, "same_top": same_top, "ln_ppl": ln_ppl}
    bounds = {k: float(v) for k, v in given.items() if v is not None}
    if not bounds:
        raise TypeError("assert_kl_below needs at least one limit, e.g. assert_kl_below(paired, mean=1e-3)")
    for key, value in bounds.items():
        if math.isnan(value) or value < 0 or (_METRICS[key][1] == "min" and value > 1):
            raise ValueError(f"assert_kl_below: {key}={value} is not a usable limit")

    publish = getattr(result, "publish", None)
    kl: KLResult = result.kl() if hasattr(result, "kl") else result
    stats = kl.stats.to_json()
    from ..results.verdicts import overall_verdict, settle_inconclusive

    if kl.aa is not None:
        checks = _floor_checks(kl.aa["floors"], bounds)
        verdict = "floor" if all(c["passed"] for c in checks) else "fail"
    else:
        checks = kl_checks(stats, bounds)
        verdict = overall_verdict(checks)
    rerun = getattr(result, "rerun", "")
    if publish is not None:
        publish(bounds=bounds, checks=checks, verdict=verdict)
    if verdict in ("fail", "inconclusive"):
        message = failure_report(kl, checks, nodeid=getattr(result, "nodeid", ""), rerun=rerun, verdict=verdict)
        speed = result.speed_if_asked() if hasattr(result, "speed_if_asked") else None
        if speed:
            from ..speed.text import speed_lines

            message += "".join(f"\n  {line}" for line in speed_lines(speed))
        if verdict == "fail":
            raise AssertionError(message)
        settle_inconclusive(message, getattr(result, "inconclusive", "fail"))
    return kl


def _value_and_bound(stats: Mapping[str, Any], key: str) -> tuple[float, float | None]:
    if key == "mean":
        return stats["mean"], stats["mean_ci"][1]
    if key in ("median", "p90", "p95", "p99", "p999"):
        return stats[key], stats["quantile_ci"][key][1]
    if key == "max":
        return stats["max"], stats["max"]
    if key == "ln_ppl":
        return stats["ln_ppl_ratio"], stats["ln_ppl_ratio_ci"][1]
    return stats[key], stats[f"{key}_ci"][0]


def _other_end(stats: Mapping[str, Any], key: str) -> float | None:
    """The interval's end on the far side of the limit: beyond it, a crossing is shown."""
    if key == "mean":
        end = stats["mean_ci"][0]
    elif key in ("median", "p90", "p95", "p99", "p999"):
        end = stats["quantile_ci"][key][0]
    elif key == "max":
        end = stats["max"]  # observed, not estimated: a max over the limit is shown
    elif key == "ln_ppl":
        end = stats["ln_ppl_ratio_ci"][0]
    else:
        end = stats[f"{key}_ci"][1]
    return None if end is None or (isinstance(end, float) and math.isnan(end)) else float(end)


def _floor_checks(floors: Mapping[str, float], bounds: Mapping[str, float]) -> list[dict[str, Any]]:
    """A/A: each limit must leave room above the noise floor (below it, for agreement rates)."""
    checks = []
    for key, limit in bounds.items():
        label, direction = _METRICS[key]
        floor = floors.get(key)
        passed = floor is not None and (limit > floor if direction == "max" else limit < floor)
        checks.append({"metric": f"{label} floor", "key": key, "value": floor, "bound": floor,
                       "limit": float(limit), "direction": direction, "passed": bool(passed)})
    return checks


def failure_report(kl: KLResult, checks: list[dict[str, Any]], *, nodeid: str, rerun: str,
                   verdict: str = "fail") -> str:
    """The assertion message: a small report that says what failed, where, on what, and how to re-run."""
    s = kl.stats.to_json()
    name = nodeid.split("/")[-1] if nodeid else "gate"
    if kl.aa is not None:
        lines = [f"KL gate bounds sit below the A/A noise floor: {name}"]
        for c in checks:
            if not c["passed"]:
                rel = "≤" if c["direction"] == "max" else "≥"
                lines.append(f"  {c['key']} limit {_fmt(c['limit'])} {rel} A/A floor {_fmt(c['value'])} "
                             f"(reference vs itself, prefill chunk {kl.aa['chunk']}): the gate would fail on noise")
    else:
        head = "failed (a limit shown crossed)" if verdict == "fail" else "inconclusive (an interval straddles a limit)"
        lines = [f"KL gate {head}: {name}"]
        n = f"over {s['n_prompts']} prompts, {s['n_tokens']} tokens"
        for c in checks:
            mark = {"pass": "", "fail": "  ✗ fail", "inconclusive": "  ? inconclusive"}.get(
                c.get("verdict", "pass" if c["passed"] else "fail"), "")
            if c["key"] == "mean":
                lo, hi = s["mean_ci"]
                text = f"mean KL {_fmt(s['mean'])} (95% interval {_fmt(lo)}–{_fmt(hi)} {n})"
            elif c["key"] in ("top1", "same_top"):
                lo, hi = s[f"{c['key']}_ci"]
                text = (f"{c['metric']} {percent(c['value'])} (95% interval {percent(lo)}–{percent(hi)} {n}; "
                        f"{s['flips']} flips, {s['near_tie_flips']} near-tie flips)")
            elif c["key"] == "max":
                text = f"max KL {_fmt(c['value'])}"
            else:
                text = f"{c['metric']} {_fmt(c['value'])} (95% upper bound {_fmt(c['bound'])})"
            rel = ("≤" if c["passed"] else ">") if c["direction"] == "max" else ("≥" if c["passed"] else "<")
            limit = percent(c["limit"]) if c["direction"] == "min" else _fmt(c["limit"])
            lines.append(f"  {text} {rel} limit {limit}{mark}")
            if c.get("verdict") == "inconclusive":
                need = (f"about {c['n_needed']} prompts at the observed spread would tell" if c.get("n_needed")
                        else "more prompts would not bring it inside the limit" if s["n_prompts"] > 1
                        else "one prompt gives no interval: use at least 2 (--mlx-kl-prompts)")
                lines.append(f"    the 95% interval straddles the limit: {need}")
        for w in s.get("worst", [])[:3]:
            i = w["prompt"]
            preview = kl.previews[i] if i < len(kl.previews) else ""
            lines.append(
                f"  worst: prompt {i} ({preview!r}), position {w['position']}, next token {kl.token(w['token_id'])!r}: "
                f"KL {_fmt(w['kl'])}, p {w['p_ref']:.3g} → {w['p_cand']:.3g}; top-1 {kl.token(w['ref_top1'])!r} → "
                f"{kl.token(w['cand_top1'])!r}"
            )
    lever = kl.lever
    shape = kl.shape
    serving = f" · decode {shape.decode} of {shape.tokens}" if shape.path == "serving" else ""
    lines.append(f"  arms: {lever.name}={lever.describe_value('reference')} vs "
                 f"{lever.name}={lever.describe_value('candidate')} · path={shape.path}{serving}")
    model = kl.candidate.get("pinned")
    if kl.reference_model:
        model = f"{kl.reference_model.get('pinned')} (reference) vs {model}"
    lines.append(f"  model: {model} · reference arm: {kl.reference_source}")
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
