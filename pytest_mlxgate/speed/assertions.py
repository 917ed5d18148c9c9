"""`assert_faster` and `assert_smaller`: a lever passes its speed or memory goal only when the interval clears it.

The verdict words of every gate: *pass* = the ratio's 95% interval lies on the asked side of the
limit (its lower end at or above an asked speed-up, its upper end at or below an asked memory
ratio); *fail* = the whole interval lies on the other side; *inconclusive* otherwise, never a pass,
with about how many pairs would tell. KV and weight bytes are counted, not sampled: their ratio is
exact. Speed goals are `assert_faster`'s, memory goals `assert_smaller`'s (the same measurement).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..results.record_speed import parse_speed
from ..results.speed_text import context_text
from ..results.verdicts import Direction
from ..results.wire import Check
from ..stats.ratios import RatioEstimate, ratio_pairs_needed
from ..verdicts.conclude import Conclusion, Target, check, conclude, given_limits

__all__ = ["SpeedSubject", "assert_faster", "assert_smaller", "speed_checks", "speed_conclusion"]

#: keyword -> (what it bounds, direction): "min" = the ratio must reach the limit, "max" = stay under it.
_GOALS: dict[str, tuple[str, Direction]] = {
    "prefill": ("prefill tok/s", "min"),
    "decode": ("decode tok/s", "min"),
    "memory": ("peak memory", "max"),
    "kv": ("KV bytes", "max"),
    "weights": ("weight bytes", "max"),
}
#: The goals `assert_smaller` asks; the others are `assert_faster`'s.
_MEMORY = ("memory", "kv", "weights")
_SAMPLED = "geometric mean of paired ratios, Student-t on their logs"


class SpeedSubject(Target, Protocol):
    """What `assert_faster`/`assert_smaller` need of the `paired` fixture (`session.paired.Paired` is one)."""

    def speed(self) -> dict[str, Any]: ...


def speed_checks(
    speed: Mapping[str, Any], goals: Mapping[str, float], at: int | str | None, *, assertion: str = "assert_faster"
) -> list[Check]:
    """One check per goal and context: the ratio, both ends of its interval, the limit, the verdict.
    `assertion` names the call an unmeasured `at=` is refused for."""
    checks = []
    if "weights" in goals:  # one figure for the run, not per context
        w = speed.get("weights_bytes") or {}
        ratio = w["candidate"] / w["reference"] if w.get("reference") else None
        checks.append(
            check(
                metric="weight bytes",
                key="speed.weights",
                value=ratio,
                lower=ratio,
                upper=ratio,
                limit=goals["weights"],
                direction="max",
                n=1,
                method="bytes counted over the parameters (exact)",
            )
        )
    for context in _contexts(speed, at, assertion):
        ctx = speed["contexts"][str(context)]
        for key, limit in goals.items():
            if key == "weights":
                continue
            label, direction = _GOALS[key]
            named: dict[str, Any] = dict(
                metric=f"{label} @{context}", key=f"speed.{key}", limit=limit, direction=direction, context=context
            )
            est = ctx.get("peak" if key == "memory" else key)
            if key == "kv":
                ratio = (ctx.get("kv") or {}).get("ratio")
                checks.append(
                    check(
                        **named,
                        value=ratio,
                        lower=ratio,
                        upper=ratio,
                        n=1,
                        method="bytes counted over the cache arrays (exact)",
                    )
                )
            elif not est or est.get("ratio") is None:
                checks.append(
                    check(
                        **named,
                        value=None,
                        lower=None,
                        upper=None,
                        n=0,
                        method="not measured on this backend" if key == "memory" else "no pairs",
                    )
                )
            else:
                lo, hi = est["ratio_ci"]
                made = check(**named, value=est["ratio"], lower=lo, upper=hi, n=int(est["n"]), method=_SAMPLED)
                if made["verdict"] == "inconclusive" and est.get("log_sd") is not None:
                    made["n_needed"] = ratio_pairs_needed(
                        RatioEstimate(
                            est["ratio"], _nan(made["lower"]), _nan(made["upper"]), int(est["n"]), float(est["log_sd"])
                        ),
                        limit,
                    )
                checks.append(made)
    return checks


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _contexts(speed: Mapping[str, Any], at: int | str | None, assertion: str) -> list[int]:
    measured = sorted(int(c) for c in speed.get("contexts") or {})
    if at is None:
        return measured[-1:]
    if at == "all":
        return measured
    if isinstance(at, bool) or not isinstance(at, int) or at not in measured:
        raise ValueError(
            f"{assertion}(at={at!r}): speed was measured at {measured} tokens of context; "
            "pass one of them, 'all', or leave it out for the longest"
        )
    return [at]


def speed_conclusion(
    speed: Mapping[str, Any], goals: Mapping[str, float], checks: Sequence[Check], verdict: str = ""
) -> Conclusion:
    """A speed or memory gate's conclusion: its goals, their checks and the whole measurement. A/A
    (both sides ran the reference arm) records as mode "aa"."""
    aa = (speed.get("arms") or {}).get("candidate") == "reference"
    return Conclusion(
        mode="aa" if aa else "speed",
        checks=checks,
        bounds=goals,
        verdict=verdict,
        fields={
            "path": "serving",
            "speed": dict(speed),
            "durations": {"total_s": float(speed.get("duration_s") or 0.0)},
        },
    )


def _goals(assertion: str, given: Mapping[str, float | None], example: str) -> dict[str, float]:
    return given_limits(
        assertion,
        given,
        example=example,
        usable=lambda _, value: math.isfinite(value) and value > 0,
        what="is not a usable ratio (a positive number)",
    )


def _measured(result: SpeedSubject | Mapping[str, Any]) -> tuple[SpeedSubject | None, dict[str, Any]]:
    if isinstance(result, Mapping):
        return None, dict(result)
    return result, result.speed()


def assert_faster(
    result: SpeedSubject | Mapping[str, Any],
    *,
    decode: float | None = None,
    prefill: float | None = None,
    at: int | str | None = None,
    memory: float | None = None,
    kv: float | None = None,
    weights: float | None = None,
) -> dict[str, Any]:
    """Fail unless the candidate is shown as fast as asked, at 95% confidence.

    `decode`/`prefill`: the least candidate/reference tokens/s ratio (1.05 = at least 5% faster).
    `at`: the context (tokens) the goals hold at, `'all'`, or the longest measured (default). `result`
    is the `paired` fixture (its module's speed is measured once, on first use) or a speed record.
    Returns the speed record. Memory goals are `assert_smaller`'s; `memory=`/`kv=`/`weights=` here still
    work for one release, with a DeprecationWarning.
    """
    __tracebackhide__ = True
    memory_goals = {k: v for k, v in (("memory", memory), ("kv", kv), ("weights", weights)) if v is not None}
    if memory_goals:
        asked = ", ".join(f"{k}={v!r}" for k, v in memory_goals.items())
        warnings.warn(
            DeprecationWarning(
                f"assert_faster({asked}): memory goals are assert_smaller's now; write assert_smaller(paired, {asked}) "
                "(assert_faster keeps them for one release)"
            ),
            stacklevel=2,
        )
    goals = _goals(
        "assert_faster",
        {"decode": decode, "prefill": prefill, **memory_goals},
        "a goal, e.g. assert_faster(paired, decode=1.05) (memory: assert_smaller(paired, kv=0.6))",
    )
    subject, speed = _measured(result)
    conclusion = speed_conclusion(speed, goals, speed_checks(speed, goals, at))

    def message(*, verdict: str, nodeid: str, rerun: str, checks: Sequence[Check]) -> str:
        return speed_failure(speed, checks, nodeid=nodeid, rerun=rerun, verdict=verdict)

    conclude(subject, conclusion, message)
    return speed


def assert_smaller(
    result: SpeedSubject | Mapping[str, Any],
    *,
    kv: float | None = None,
    weights: float | None = None,
    memory: float | None = None,
    at: int | str | None = None,
) -> dict[str, Any]:
    """Fail unless the candidate is shown as small as asked: a memory gate, at 95% confidence.

    `kv`: the most candidate/reference KV cache bytes ratio (counted: exact); `weights`: the most
    parameter bytes ratio (two models, a weights lever; one figure for the run); `memory`: the most
    candidate/reference peak memory growth per trial (sampled: its interval). `at`: the context
    (tokens) the goals hold at, `'all'`, or the longest measured (default). `result` is the `paired`
    fixture or a speed record (the same measurement as `assert_faster`'s). Returns the speed record.
    """
    __tracebackhide__ = True
    goals = _goals(
        "assert_smaller",
        {"kv": kv, "weights": weights, "memory": memory},
        "a goal, e.g. assert_smaller(paired, kv=0.3) or weights=0.31",
    )
    subject, speed = _measured(result)
    conclusion = speed_conclusion(speed, goals, speed_checks(speed, goals, at, assertion="assert_smaller"))

    def message(*, verdict: str, nodeid: str, rerun: str, checks: Sequence[Check]) -> str:
        return speed_failure(speed, checks, nodeid=nodeid, rerun=rerun, verdict=verdict)

    conclude(subject, conclusion, message)
    return speed


def _gate(checks: Sequence[Check], verdict: str) -> str:
    """The gate's name and what it showed: speed, memory, or both (an assert_faster with memory goals)."""
    missed = {c["key"].removeprefix("speed.") in _MEMORY for c in checks if c["verdict"] != "pass"}
    gate = "memory gate" if missed == {True} else "speed gate" if missed == {False} else "speed and memory gate"
    if verdict != "fail":
        return f"{gate} inconclusive (an interval straddles a goal)"
    shown = "over a goal" if missed == {True} else "short of a goal" if missed == {False} else "past a goal"
    return f"{gate} failed (shown {shown})"


def speed_failure(speed: Mapping[str, Any], checks: Sequence[Check], *, nodeid: str, rerun: str, verdict: str) -> str:
    """The assertion message: each goal with its interval, each context's figures, how to re-run."""
    name = nodeid.split("/")[-1] if nodeid else "gate"
    lines = [f"{_gate(checks, verdict)}: {name}"]
    for c in checks:
        mark = {"pass": "", "fail": "  ✗ fail", "inconclusive": "  ? inconclusive"}[c["verdict"]]
        value = "not measured" if c["value"] is None else f"×{c['value']:.3f}"
        interval = ""
        lo, hi = c["lower"], c["upper"]
        if c["key"] not in ("speed.kv", "speed.weights") and lo is not None and hi is not None:
            interval = f" (95% interval ×{lo:.3f}–×{hi:.3f} over {c['n']} pairs)"
        rel = "≥" if c["direction"] == "min" else "≤"
        lines.append(f"  {c['metric']}: candidate/reference {value}{interval}, asked {rel} ×{c['limit']:g}{mark}")
        if c["verdict"] == "inconclusive":
            need = (
                f"about {c['n_needed']} pairs at the observed spread would tell (--mlx-speed-reps)"
                if c.get("n_needed")
                else "more pairs would not tell: the estimate sits on the goal"
                if c["value"] is not None
                else c.get("method", "")
            )
            lines.append(f"    {need}")
    for ctx in parse_speed(speed).contexts:
        lines.append(f"  @{ctx.length} tokens: {context_text(ctx)}")
    shape = speed.get("shape") or {}
    lines.append(
        f"  measured: {shape.get('repetitions')} interleaved pairs per context after "
        f"{shape.get('warmup')} warm-up, {shape.get('decode')} decoded tokens per trial; memory: "
        f"{speed.get('memory_method')}"
    )
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)
