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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..common.format import percent
from ..config.names import DEFAULT_CANDIDATE, model_keys
from ..errors import OracleNotMeasuredError
from ..results.attribution_text import attribution_lines
from ..results.record_speed import parse_speed
from ..results.speed_text import speed_lines
from ..results.verdicts import Direction, overall_verdict
from ..results.wire import Check
from ..verdicts.conclude import Conclusion, Target, check, conclude, given_limits
from .oracle import DEFAULT_RELATIVE_ATOL, RELATIVE, inside_precision, relative_check
from .result import KLResult
from .site import SITE, SITE_FLOAT32

__all__ = ["KLSubject", "assert_kl_below", "kl_checks"]

#: keyword -> (label, direction): "max" means the value must stay at or below the limit.
_METRICS: dict[str, tuple[str, Direction]] = {
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
_METHOD = "95% interval over prompts"


class KLSubject(Target, Protocol):
    """What `assert_kl_below` needs of the `paired` fixture (`session.paired.Paired` is one)."""

    def kl(self) -> KLResult: ...

    def speed_if_asked(self) -> dict[str, Any] | None: ...

    def explanation(self, kl: KLResult, verdict: str) -> dict[str, Any] | None: ...


def _usable(key: str, value: float) -> bool:
    """A KL limit is >= 0; an agreement rate (top-1) at most 1; the oracle's ratio (`relative`) above 0."""
    if key == RELATIVE:
        return value > 0
    return value >= 0 and not (_METRICS[key][1] == "min" and value > 1)


def _models_table(models: Mapping[str, Mapping[str, float]] | None) -> dict[str, dict[str, float]]:
    """`models=`, every entry's limits checked as the gate's are (before anything is measured, whichever
    model runs): {model: {metric: limit}}."""
    if not models:
        return {}
    if not isinstance(models, Mapping):
        raise TypeError(f"assert_kl_below(models=...) takes {{model: {{metric: limit}}}}, got {type(models).__name__}")
    if DEFAULT_CANDIDATE in models:
        raise ValueError(
            f"assert_kl_below(models={{{DEFAULT_CANDIDATE!r}: ...}}): the embedded model's limits are the gate's own "
            "keywords (its calibration file is calibration/<module>.json); models= is for other models"
        )
    checked = {}
    for model, table in models.items():
        unknown = sorted(set(table) - set(_METRICS)) if isinstance(table, Mapping) else None
        if unknown is None or unknown:
            raise ValueError(
                f"assert_kl_below(models={{{model!r}: ...}}): give {{metric: limit}} with metrics among "
                f"{', '.join(_METRICS)}" + (f" (not {', '.join(unknown)})" if unknown else "")
            )
        checked[model] = given_limits("assert_kl_below", dict(table), example=f"a limit for {model!r}", usable=_usable)
    return checked


def _for_model(
    bounds: dict[str, float], models: Mapping[str, Mapping[str, float]], candidate: Mapping[str, Any] | None
) -> tuple[dict[str, float], str | None]:
    """The limits for this candidate: the gate's, with those of its entry in `models` (by built-in
    alias, the name given, or repo id: `config.names.model_keys`) in their place; and that entry's name."""
    ref = candidate or {}
    for key in model_keys(ref.get("name"), ref.get("repo_id")):
        if key in models:
            return {**bounds, **models[key]}, key
    return bounds, None


def kl_checks(stats: Mapping[str, Any], bounds: Mapping[str, float]) -> list[Check]:
    """One check per bound: the value, both ends of its interval, the limit, and the verdict."""
    checks = []
    n = int(stats.get("n_prompts") or 0)
    for key, limit in bounds.items():
        label, direction = _METRICS[key]
        value, lower, upper = _interval(stats, key)
        made = check(
            metric=label,
            key=key,
            value=value,
            lower=lower,
            upper=upper,
            limit=limit,
            direction=direction,
            n=n,
            method="observed maximum" if key == "max" else _METHOD,
        )
        if made["verdict"] == "inconclusive":
            made["n_needed"] = _prompts_needed(
                value, made["upper"] if direction == "max" else made["lower"], limit, n, direction
            )
        checks.append(made)
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
    result: KLSubject | KLResult,
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
    relative: float | None = None,
    relative_atol: float = DEFAULT_RELATIVE_ATOL,
    models: Mapping[str, Mapping[str, float]] | None = None,
) -> KLResult:
    """Fail unless every named KL statistic is within its limit at 95% confidence.

    `mean` and the quantiles (`median`, `p90`, `p95`, `p99`, `p999`) compare the upper end of
    their 95% interval over sequences; `max` the largest per-token KL seen; `top1` the lower end
    of the top-1 agreement (near-tie flips count as agreement; `same_top` counts every flip);
    `ln_ppl` the upper end of ln(PPL_cand / PPL_ref). `result` is the `paired` fixture or a
    `KLResult`. Returns the result, so a gate can go on to look at it.

    `models`: `{"gemma3-270m": {"p99": 0.5}}`, a model's own limits (from its calibration file), which
    replace the gate's on that candidate (`_for_model`; the record's `limits_for` names it).

    `relative`: the precision-aware limit (`kl.oracle`, `kl.site`): the candidate's KL from the float32 oracle
    at most `relative` times the plain reference arm's (+ `relative_atol`), and where the lever swaps a
    function, the kernel's error at its site likewise; the module's source must name `relative=`.
    """
    __tracebackhide__ = True
    given = dict(mean=mean, median=median, p90=p90, p95=p95, p99=p99, p999=p999, max=max, top1=top1)
    given.update(same_top=same_top, ln_ppl=ln_ppl, relative=relative)
    example = "at least one limit, e.g. assert_kl_below(paired, mean=1e-3)"
    bounds = given_limits("assert_kl_below", given, example=example, usable=_usable)
    ratio = bounds.pop("relative", None)
    per_model = _models_table(models)
    subject = None if isinstance(result, KLResult) else result
    kl = result if isinstance(result, KLResult) else result.kl()
    bounds, limits_for = _for_model(bounds, per_model, kl.candidate)
    conclusion = _concluded(kl, bounds, ratio, relative_atol)
    attribution = subject.explanation(kl, _explained(conclusion, kl)) if subject is not None else None
    extra: dict[str, Any] = {"limits_for": limits_for} if limits_for is not None else {}
    if attribution is not None:
        extra["attribution"] = attribution
    conclusion = replace(conclusion, fields={**conclusion.fields, **extra}) if extra else conclusion
    speed = subject.speed_if_asked() if subject is not None else None

    def message(*, verdict: str, nodeid: str, rerun: str, checks: Sequence[Check]) -> str:
        text = failure_report(kl, checks, nodeid=nodeid, rerun=rerun, verdict=verdict)
        if attribution is not None:
            text += "".join(f"\n  {line}" for line in attribution_lines(attribution))
        if speed:
            text += "".join(f"\n  {line}" for line in speed_lines(parse_speed(speed)))
        return text

    conclude(subject, conclusion, message)
    return kl


def _concluded(kl: KLResult, bounds: dict[str, float], ratio: float | None, atol: float) -> Conclusion:
    """The checks of every limit (A/A: against the noise floor) and, with `relative`, the oracle's two."""
    if kl.aa is not None:
        checks = _floor_checks(kl.aa["floors"], bounds, kl.stats.n_prompts)
        floor = "floor" if all(c["verdict"] == "pass" for c in checks) else "fail"
        return kl.conclusion(bounds=bounds, checks=checks, verdict=floor)
    checks = kl_checks(kl.stats.to_json(), bounds)
    if ratio is None:
        return kl.conclusion(bounds=bounds, checks=checks)
    if not (math.isfinite(atol) and atol >= 0):
        raise ValueError(f"assert_kl_below: relative_atol={atol} is not a usable KL (a finite number >= 0)")
    relative = _oracle_check(kl, ratio, atol)
    assert kl.oracle is not None  # `_oracle_check` refused a measurement without one
    # limits below plain low precision's own distance from float32 read its rounding: the oracle's rules judge
    aside = [] if kl.oracle.same else inside_precision(bounds, kl.oracle.plain_figures)
    checks = [c for c in checks if c["key"] not in aside] + [relative]
    if kl.site is not None:
        checks.append(kl.site.check(ratio))
        logic = kl.site.check_float32()
        if logic is not None:
            checks.append(logic)
    made = kl.conclusion(bounds={**bounds, RELATIVE: ratio}, checks=checks)
    if not aside:
        return made
    return replace(made, fields={**made.fields, "oracle": {**made.fields["oracle"], "set_aside": aside}})


def _explained(conclusion: Conclusion, kl: KLResult) -> str:
    """The verdict attribution is asked to explain. In a low-precision run judged against the oracle, absolute
    limits inside the precision's rounding may yet be set aside (`authoring.proof`): the oracle's rules decide
    whether the drift is the kernel's, so theirs is the verdict that calls for an explanation."""
    oracle = [c for c in conclusion.checks if c["key"] in (RELATIVE, SITE, SITE_FLOAT32)]
    if not oracle or kl.oracle is None or kl.oracle.same:
        return conclusion.verdict
    return overall_verdict(oracle)


def _oracle_check(kl: KLResult, ratio: float, atol: float) -> Check:
    """The relative rule's check (`kl.oracle.relative_check`); an error where no oracle arm ran."""
    if kl.oracle is None:
        raise OracleNotMeasuredError(
            "assert_kl_below(relative=...) judges the candidate against the float32 oracle, but no oracle arm ran "
            "for this module: its source must name relative= literally in an assert_kl_below call (the plugin reads "
            "it before the arms run, so the oracle shares their passes). Write relative=2.0 in the call itself"
        )
    return relative_check(kl.oracle, ratio, atol)


def _interval(stats: Mapping[str, Any], key: str) -> tuple[float, float | None, float | None]:
    """The statistic's value and the two ends of its 95% interval (a max is observed: both ends are it)."""
    if key == "max":
        return stats["max"], stats["max"], stats["max"]
    if key in ("median", "p90", "p95", "p99", "p999"):
        lower, upper = stats["quantile_ci"][key]
        return stats[key], lower, upper
    name = "ln_ppl_ratio" if key == "ln_ppl" else key
    lower, upper = stats[f"{name}_ci"]
    return stats[name], lower, upper


def _floor_checks(floors: Mapping[str, float], bounds: Mapping[str, float], n: int) -> list[Check]:
    """A/A: each limit must leave room above the noise floor (below it, for agreement rates)."""
    checks = []
    for key, limit in bounds.items():
        label, direction = _METRICS[key]
        floor = floors.get(key)
        roomy = floor is not None and (limit > floor if direction == "max" else limit < floor)
        checks.append(
            check(
                metric=f"{label} floor",
                key=key,
                value=floor,
                lower=floor,
                upper=floor,
                limit=limit,
                direction=direction,
                n=n,
                method="A/A noise floor (the reference against itself)",
                verdict="pass" if roomy else "fail",
            )
        )
    return checks


def failure_report(kl: KLResult, checks: Sequence[Check], *, nodeid: str, rerun: str, verdict: str = "fail") -> str:
    """The assertion message: a small report that says what failed, where, on what, and how to re-run."""
    s = kl.stats.to_json()
    name = nodeid.split("/")[-1] if nodeid else "gate"
    if kl.aa is not None:
        lines = [f"KL gate bounds sit below the A/A noise floor: {name}"]
        for c in checks:
            if c["verdict"] != "pass":
                rel = "≤" if c["direction"] == "max" else "≥"
                lines.append(
                    f"  {c['key']} limit {_fmt(c['limit'])} {rel} A/A floor {_fmt(c['value'])} "
                    f"(reference vs itself, prefill chunk {kl.aa['chunk']}): the gate would fail on noise"
                )
    else:
        head = "failed (a limit shown crossed)" if verdict == "fail" else "inconclusive (an interval straddles a limit)"
        lines = [f"KL gate {head}: {name}"]
        windows = s.get("n_sequences", s["n_prompts"])
        also = f" ({windows} windows of them)" if windows != s["n_prompts"] else ""
        n = f"over {s['n_prompts']} prompts{also}, {s['n_tokens']} tokens"
        for c in checks:
            passed = c["verdict"] == "pass"
            mark = {"pass": "", "fail": "  ✗ fail", "inconclusive": "  ? inconclusive"}[c["verdict"]]
            if c["key"] == "mean":
                lo, hi = s["mean_ci"]
                text = f"mean KL {_fmt(s['mean'])} (95% interval {_fmt(lo)}–{_fmt(hi)} {n})"
            elif c["key"] in ("top1", "same_top"):
                lo, hi = s[f"{c['key']}_ci"]
                text = (
                    f"{c['metric']} {percent(c['value'])} (95% interval {percent(lo)}–{percent(hi)} {n}; "
                    f"{s['flips']} flips, {s['near_tie_flips']} near-tie flips)"
                )
            elif c["key"] == "max":
                text = f"max KL {_fmt(c['value'])}"
            else:
                text = f"{c['metric']} {_fmt(c['value'])} (95% upper bound {_fmt(c['upper'])})"
            rel = ("≤" if passed else ">") if c["direction"] == "max" else ("≥" if passed else "<")
            limit = percent(c["limit"]) if c["direction"] == "min" else _fmt(c["limit"])
            lines.append(f"  {text} {rel} limit {limit}{mark}")
            if c["verdict"] == "inconclusive":
                need = (
                    f"about {c['n_needed']} prompts at the observed spread would tell"
                    if c.get("n_needed")
                    else "more prompts would not bring it inside the limit"
                    if s["n_prompts"] > 1
                    else "one prompt gives no interval: use at least 2 (--mlx-kl-prompts)"
                )
                lines.append(f"    the 95% interval straddles the limit: {need}")
        for w in s.get("worst", [])[:3]:
            i = w["prompt"]
            preview = kl.previews[i] if i < len(kl.previews) else ""
            lines.append(
                f"  worst: prompt {i} ({preview!r}), position {w['position']}, next token {kl.token(w['token_id'])!r}: "
                f"KL {_fmt(w['kl'])}, p {_p(w['p_ref'])} → {_p(w['p_cand'])}; top-1 {kl.token(w['ref_top1'])!r} → "
                f"{kl.token(w['cand_top1'])!r}"
            )
    lever = kl.lever
    shape = kl.shape
    serving = f" · decode {shape.decode} of {shape.tokens}" if shape.path == "serving" else ""
    lines.append(
        f"  arms: {lever.name}={lever.describe_value('reference')} vs "
        f"{lever.name}={lever.describe_value('candidate')} · path={shape.path}{serving}"
    )
    model = kl.candidate.get("pinned")
    if kl.reference_model:
        model = f"{kl.reference_model.get('pinned')} (reference) vs {model}"
    lines.append(f"  model: {model} · reference arm: {kl.reference_source}")
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)


def _p(x: float | None) -> str:
    """A next token's probability; "?" where an arm's list did not hold it (a server's top-k)."""
    return "?" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
