"""`assert_faster`: a lever passes its speed or memory goal only when the interval clears it.

The verdict words of every gate: *pass* = the ratio's 95% interval lies on the asked side of the
limit (its lower end at or above an asked speed-up, its upper end at or below an asked memory
ratio); *fail* = the whole interval lies on the other side; *inconclusive* otherwise, never a pass,
with about how many pairs would tell. KV bytes are counted, not sampled: their ratio is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .text import context_text

__all__ = ["assert_faster", "speed_checks"]

#: keyword -> (what it bounds, direction): "min" = the ratio must reach the limit, "max" = stay under it.
_GOALS: dict[str, tuple[str, str]] = {
    "prefill": ("prefill tok/s", "min"),
    "decode": ("decode tok/s", "min"),
    "memory": ("peak memory", "max"),
    "kv": ("KV bytes", "max"),
    "weights": ("weight bytes", "max"),
}


def speed_checks(speed: Mapping[str, Any], goals: Mapping[str, float], at: int | str | None) -> list[dict[str, Any]]:
    """One check per goal and context: the ratio, the bound on the passing side, the limit, the verdict."""
    from ..stats.ratios import RatioEstimate, ratio_pairs_needed

    contexts = _contexts(speed, at)
    checks = []
    if "weights" in goals:  # one figure for the run, not per context
        w = speed.get("weights_bytes") or {}
        ratio = w["candidate"] / w["reference"] if w.get("reference") else None
        limit = float(goals["weights"])
        verdict = "inconclusive" if ratio is None else "pass" if ratio <= limit else "fail"
        checks.append({"metric": "weight bytes", "key": "speed.weights", "value": ratio, "bound": ratio,
                       "other_bound": ratio, "limit": limit, "direction": "max", "n": 1, "n_needed": None,
                       "method": "bytes counted over the parameters (exact)", "verdict": verdict,
                       "passed": verdict == "pass"})
    for context in contexts:
        ctx = speed["contexts"][str(context)]
        for key, limit in goals.items():
            if key == "weights":
                continue
            label, direction = _GOALS[key]
            check: dict[str, Any] = {"metric": f"{label} @{context}", "key": f"speed.{key}", "limit": float(limit),
                                     "direction": direction, "context": context}
            if key == "kv":
                ratio = (ctx.get("kv") or {}).get("ratio")
                verdict = ("inconclusive" if ratio is None else "pass" if ratio <= limit else "fail")
                check.update(value=ratio, bound=ratio, other_bound=ratio, n=1, n_needed=None,
                             method="bytes counted over the cache arrays (exact)", verdict=verdict)
            else:
                est = ctx.get("peak" if key == "memory" else key)
                if not est or est.get("ratio") is None:
                    check.update(value=None, bound=None, other_bound=None, n=0, n_needed=None, verdict="inconclusive",
                                 method="not measured on this backend" if key == "memory" else "no pairs")
                else:
                    lo, hi = (_num(est["ratio_ci"][0]), _num(est["ratio_ci"][1]))
                    bound, other = (lo, hi) if direction == "min" else (hi, lo)
                    if bound is None or other is None:
                        verdict = "inconclusive"
                    elif direction == "min":
                        verdict = "pass" if bound >= limit else "fail" if other < limit else "inconclusive"
                    else:
                        verdict = "pass" if bound <= limit else "fail" if other > limit else "inconclusive"
                    needed = None
                    if verdict == "inconclusive" and est.get("log_sd") is not None:
                        needed = ratio_pairs_needed(RatioEstimate(est["ratio"], lo or math.nan, hi or math.nan,
                                                                  int(est["n"]), float(est["log_sd"])), limit)
                    check.update(value=est["ratio"], bound=bound, other_bound=other, n=int(est["n"]), n_needed=needed,
                                 method="geometric mean of paired ratios, Student-t on their logs", verdict=verdict)
            check["passed"] = check["verdict"] == "pass"
            checks.append(check)
    return checks


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _contexts(speed: Mapping[str, Any], at: int | str | None) -> list[int]:
    measured = sorted(int(c) for c in speed.get("contexts") or {})
    if at is None:
        return measured[-1:]
    if at == "all":
        return measured
    if isinstance(at, bool) or not isinstance(at, int) or at not in measured:
        raise ValueError(f"assert_faster(at={at!r}): speed was measured at {measured} tokens of context; "
                         "pass one of them, 'all', or leave it out for the longest")
    return [at]


def assert_faster(
    result: Any,
    *,
    decode: float | None = None,
    prefill: float | None = None,
    memory: float | None = None,
    kv: float | None = None,
    weights: float | None = None,
    at: int | str | None = None,
) -> dict[str, Any]:
    """Fail unless the candidate is shown as fast, or as small, as asked, at 95% confidence.

    `decode`/`prefill`: the least candidate/reference tokens/s ratio (1.05 = at least 5% faster);
    `memory`: the most candidate/reference peak memory growth per trial; `kv`: the most KV cache
    bytes ratio; `weights`: the most parameter bytes ratio (two models, a weights lever). `at`: the context (tokens) the goals hold at, `'all'`, or the longest measured
    (default). `result` is the `paired` fixture (its module's speed is measured once, on first use)
    or a speed record. Returns the speed record.
    """
    __tracebackhide__ = True
    given = {"decode": decode, "prefill": prefill, "memory": memory, "kv": kv, "weights": weights}
    goals = {k: float(v) for k, v in given.items() if v is not None}
    if not goals:
        raise TypeError("assert_faster needs a goal, e.g. assert_faster(paired, decode=1.05) or kv=0.6")
    for key, value in goals.items():
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"assert_faster: {key}={value} is not a usable ratio (a positive number)")
    speed: dict[str, Any] = result.speed() if hasattr(result, "speed") else dict(result)
    checks = speed_checks(speed, goals, at)
    from ..results.verdicts import overall_verdict, settle_inconclusive

    verdict = overall_verdict(checks)
    publish = getattr(result, "publish_speed", None)
    if publish is not None:
        publish(goals=goals, checks=checks, verdict=verdict)
    if verdict in ("fail", "inconclusive"):
        message = speed_failure(speed, checks, nodeid=getattr(result, "nodeid", ""),
                                rerun=getattr(result, "rerun", ""), verdict=verdict)
        if verdict == "fail":
            raise AssertionError(message)
        settle_inconclusive(message, getattr(result, "inconclusive", "fail"))
    return speed


def speed_failure(speed: Mapping[str, Any], checks: Sequence[Mapping[str, Any]], *, nodeid: str, rerun: str,
                  verdict: str) -> str:
    """The assertion message: each goal with its interval, each context's figures, how to re-run."""
    name = nodeid.split("/")[-1] if nodeid else "gate"
    head = "failed (shown short of a goal)" if verdict == "fail" else "inconclusive (an interval straddles a goal)"
    lines = [f"speed gate {head}: {name}"]
    for c in checks:
        mark = {"pass": "", "fail": "  ✗ fail", "inconclusive": "  ? inconclusive"}[c["verdict"]]
        value = "not measured" if c["value"] is None else f"×{c['value']:.3f}"
        interval = ""
        if c["key"] not in ("speed.kv", "speed.weights") and c.get("bound") is not None:
            lo, hi = sorted((c["bound"], c["other_bound"]))
            interval = f" (95% interval ×{lo:.3f}–×{hi:.3f} over {c['n']} pairs)"
        rel = "≥" if c["direction"] == "min" else "≤"
        lines.append(f"  {c['metric']}: candidate/reference {value}{interval}, asked {rel} ×{c['limit']:g}{mark}")
        if c["verdict"] == "inconclusive":
            need = (f"about {c['n_needed']} pairs at the observed spread would tell (--mlx-speed-reps)"
                    if c.get("n_needed") else "more pairs would not tell: the estimate sits on the goal"
                    if c["value"] is not None else c.get("method", ""))
            lines.append(f"    {need}")
    for context, ctx in (speed.get("contexts") or {}).items():
        lines.append(f"  @{context} tokens: {context_text(ctx)}")
    shape = speed.get("shape") or {}
    lines.append(f"  measured: {shape.get('repetitions')} interleaved pairs per context after "
                 f"{shape.get('warmup')} warm-up, {shape.get('decode')} decoded tokens per trial; memory: "
                 f"{speed.get('memory_method')}")
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)
