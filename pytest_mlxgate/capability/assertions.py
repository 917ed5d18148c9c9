"""`assert_capability_at_least`: a paired non-inferiority gate on real tasks, with three verdicts.

Both arms answer the very same items, so the gate reasons about the pairs. Per task and limit:
*pass* = shown inside the margin (the one-sided upper (1 - alpha) bound of the paired drop
<= `max_drop`; the candidate's lower bound >= `floor`), *fail* = a regression shown (the drop
significantly larger than `max_drop`, Holm-corrected across the tasks asserted together; the
score's upper bound under `floor`), otherwise *inconclusive*, which never passes: it says what n
would tell. Bounds at a fixed n: `stats/verdicts.py`; with `n=Budget(...)` the items come in
batches until the verdict is shown (`stats/sequential.py`, anytime-valid, regression level
alpha / k over k tasks). A gate passes only when every check passed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pytest

from ..common.format import clip, percent, points
from ..results.verdicts import SKIPPED
from ..results.wire import Check
from ..stats import paired_tests as S
from ..stats import verdicts as V
from ..stats.intervals import wilson_interval
from ..stats.sequential import bounds_from_diffs
from ..verdicts.conclude import Conclusion, Target, check, conclude
from .base import Budget, TaskSkipped
from .result import CapabilityRun

__all__ = ["CapabilitySubject", "assert_capability_at_least", "capability_checks", "flipped_items"]


class CapabilitySubject(Target, Protocol):
    """What `assert_capability_at_least` needs of the `paired` fixture (`session.paired.Paired` is one)."""

    def capability(
        self, task: str, *, n: int | Budget | None = None, sequential: Mapping[str, float | None] | None = None
    ) -> CapabilityRun: ...


def assert_capability_at_least(
    result: CapabilitySubject | Mapping[str, CapabilityRun],
    task: str | Sequence[str],
    *,
    floor: float | None = None,
    max_drop: float | None = None,
    n: int | Budget | None = None,
    alpha: float = 0.05,
) -> dict[str, CapabilityRun]:
    """Pass only when each task's drop is shown to be at most `max_drop` (and its score at least
    `floor`); fail when a larger drop is shown; otherwise the gate is inconclusive and says what n
    would tell (it fails, or with --mlx-inconclusive warns or xfails; it never passes).

    `result` is the `paired` fixture (both arms run here, on the same items) or a mapping of
    task -> `CapabilityRun`. `n`: the items per task (default: the tier's size; the tier is
    `--mlx-tier smoke|full`), or `Budget(items=, seconds=, batch=)` to add items in batches until
    the drop is shown either way. A task that cannot run here (no data, no sandbox) is skipped with
    the reason. Returns the runs.
    """
    __tracebackhide__ = True
    tasks = [task] if isinstance(task, str) else list(task)
    budget = _validated(result, floor=floor, max_drop=max_drop, n=n, alpha=alpha)
    sequential = {"max_drop": max_drop, "alpha": alpha, "fail_alpha": alpha / max(1, len(tasks))}
    runs, skipped = _run_tasks(result, tasks, n=n, sequential=sequential if budget is not None else None)
    checks, stats = capability_checks(runs, floor=floor, max_drop=max_drop, alpha=alpha)
    bounds = {
        "floor": floor,
        "max_drop": max_drop,
        "alpha": alpha,
        "budget": budget.to_json() if budget is not None else None,
    }
    conclusion = _conclusion(runs, stats, checks, skipped, bounds)

    def message(*, verdict: str, nodeid: str, rerun: str, checks: Sequence[Check]) -> str:
        return failure_report(runs, stats, checks, verdict=verdict, rerun=rerun, nodeid=nodeid)

    conclude(None if isinstance(result, Mapping) else result, conclusion, message)
    if skipped and not runs:
        pytest.skip("; ".join(skipped.values()))
    return runs


def _run_tasks(
    result: CapabilitySubject | Mapping[str, CapabilityRun],
    tasks: Sequence[str],
    *,
    n: int | Budget | None,
    sequential: Mapping[str, float | None] | None,
) -> tuple[dict[str, CapabilityRun], dict[str, str]]:
    """Each task's run (both arms on the same items, or the given mapping's), and the tasks that cannot
    run here with the reason."""
    runs: dict[str, CapabilityRun] = {}
    skipped: dict[str, str] = {}
    for name in tasks:
        try:
            runs[name] = (
                result[name] if isinstance(result, Mapping) else result.capability(name, n=n, sequential=sequential)
            )
        except TaskSkipped as e:
            skipped[name] = str(e)
    return runs, skipped


def _conclusion(
    runs: Mapping[str, CapabilityRun],
    stats: Mapping[str, Any],
    checks: Sequence[Check],
    skipped: Mapping[str, str],
    bounds: Mapping[str, Any],
) -> Conclusion:
    """A capability gate's conclusion: its checks and each task's figures; skipped when no task ran."""
    n_items = sum(int(t["n"]) for t in stats.values())
    return Conclusion(
        mode="capability",
        checks=checks,
        bounds={k: v for k, v in bounds.items() if v is not None},
        verdict="" if runs else SKIPPED,
        fields={
            "sizes": {"prompts": n_items},
            "stats": {"n_prompts": n_items},
            "tasks": dict(stats),
            "skipped": dict(skipped),
            "durations": {"total_s": round(sum(sum(t["durations"].values()) for t in stats.values()), 3)},
        },
    )


def _validated(
    result: object, *, floor: float | None, max_drop: float | None, n: int | Budget | None, alpha: float
) -> Budget | None:
    """The limits and sizes checked (TypeError / ValueError saying the fix); the Budget, if `n` is one."""
    if floor is None and max_drop is None:
        raise TypeError("assert_capability_at_least needs floor= and/or max_drop=")
    for name, value in (("floor", floor), ("max_drop", max_drop)):
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"{name}={value}: scores are fractions in [0, 1] (e.g. max_drop=0.02 for 2 points)")
    if max_drop is not None and max_drop >= 1:
        raise ValueError(f"max_drop={max_drop}: a drop of the whole score cannot be tested; use a margin below 1")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha} must be in (0, 0.5)")
    budget = n if isinstance(n, Budget) else None
    if budget is not None and max_drop is None:
        raise TypeError("n=Budget(...) sizes the drop test, so it needs max_drop= (a floor alone takes a count)")
    if budget is not None and isinstance(result, Mapping):
        raise TypeError("n=Budget(...) runs the arms batch by batch: pass the `paired` fixture, not finished runs")
    if n is not None and budget is None and not (isinstance(n, int) and n >= 1):
        raise ValueError(f"n={n!r}: a positive number of items per task, or n=Budget(items=..., seconds=...)")
    return budget


def capability_checks(
    runs: Mapping[str, CapabilityRun], *, floor: float | None, max_drop: float | None, alpha: float
) -> tuple[list[Check], dict[str, dict[str, Any]]]:
    """Per task: scores with intervals, the drop's bounds and verdict, the floor's; one check per limit."""
    per_task: dict[str, dict[str, Any]] = {}
    p_values: dict[str, float] = {}
    for name, run in runs.items():
        ref, cand = run.scores("reference"), run.scores("candidate")
        info: dict[str, Any] = {
            "n": run.n,
            "tier": run.tier,
            "graded": run.graded,
            "ref_score": sum(ref) / run.n,
            "cand_score": sum(cand) / run.n,
            "durations": run.durations,
            "reference_source": run.reference_source,
            "items": run.paired_items(),
            "flipped": flipped_items(run),
        }
        if run.graded:
            info["ref_ci"] = list(S.mean_interval_bootstrap(ref))
            info["cand_ci"] = list(S.mean_interval_bootstrap(cand))
        else:
            k_ref, k_cand = sum(1 for x in ref if x >= 1), sum(1 for x in cand if x >= 1)
            info["ref_ci"] = list(wilson_interval(k_ref, run.n))
            info["cand_ci"] = list(wilson_interval(k_cand, run.n))
        if run.sequential is not None:
            info["sequential"] = run.sequential
        if run.ranks > 1:
            info["ranks"] = run.ranks  # split over mx.distributed ranks; the statistics are over every item
        if max_drop is not None and run.sequential is None:
            test = (
                S.drop_test_graded(ref, cand, max_drop=max_drop, alpha=alpha)
                if run.graded
                else S.drop_test_binary(ref, cand, max_drop=max_drop, alpha=alpha)
            )
            info["drop_test"] = test.to_json()
            p_values[name] = test.p_value
        per_task[name] = info
    k = len(p_values)
    shown = S.holm(p_values, alpha=alpha) if k > 1 else {key: p < alpha for key, p in p_values.items()}
    fail_alpha = alpha / max(1, len(runs))
    checks: list[Check] = []
    for name, info in per_task.items():
        run = runs[name]
        if max_drop is not None:
            info["holm"] = k > 1
            drop = (
                _sequential_drop(run.sequential)
                if run.sequential is not None
                else _fixed_drop(run, info, max_drop=max_drop, alpha=alpha, fail_alpha=fail_alpha, shown=shown[name])
            )
            info["drop_verdict"] = drop
            checks.append(
                check(
                    metric=f"{name} drop",
                    key="drop",
                    value=drop["value"],
                    lower=drop["lower"],
                    upper=drop["upper"],
                    limit=max_drop,
                    direction="max",
                    n=run.n,
                    n_needed=drop["n_needed"],
                    method=drop["method"],
                    verdict=drop["verdict"],
                    p_value=info.get("drop_test", {}).get("p_value"),
                )
            )
        if floor is not None:
            fl = _floor(run, floor=floor, alpha=alpha)
            info["cand_lower"] = fl["lower"]
            info["floor_verdict"] = fl
            checks.append(
                check(
                    metric=f"{name} score",
                    key="score",
                    value=info["cand_score"],
                    lower=fl["lower"],
                    upper=fl["upper"],
                    limit=floor,
                    direction="min",
                    n=run.n,
                    n_needed=fl["n_needed"],
                    method=fl["method"],
                    verdict=fl["verdict"],
                )
            )
    return checks, per_task


#: The flipped items a record shows with their prompt (the HTML report's), and how much of each text
#: (a prompt's last 600 characters, an output's first 400, and an ellipsis where clipped).
_FLIPPED_SHOWN, _PROMPT_CHARS, _OUTPUT_CHARS = 20, 601, 401


def flipped_items(run: CapabilityRun) -> dict[str, Any]:
    """The items whose score changed between the arms (losses first): how many, and the first few with
    the tail of their exact input (where the question is) and both arms' outputs, clipped."""
    flipped = run.flipped()
    items = []
    for item, ref, cand in flipped[:_FLIPPED_SHOWN]:
        prompt = clip(run.rendered.get(item.id) or item.text or "", _PROMPT_CHARS, keep="end")
        items.append(
            {
                "id": item.id,
                "prompt": prompt,
                **{
                    arm: {"output": clip(r.output, _OUTPUT_CHARS), "score": r.score, "verdict": r.verdict}
                    for arm, r in (("reference", ref), ("candidate", cand))
                },
            }
        )
    return {"total": len(flipped), "items": items}


def _fixed_drop(
    run: CapabilityRun, info: dict[str, Any], *, max_drop: float, alpha: float, fail_alpha: float, shown: bool
) -> dict[str, Any]:
    """One look at n items: pass = upper bound <= margin; fail = the drop test rejected (Holm)."""
    ref, cand = run.scores("reference"), run.scores("candidate")
    test = info["drop_test"]
    if run.graded:
        lower, upper = S.drop_test_graded(
            ref, cand, max_drop=max_drop, alpha=alpha, ci_confidence=1 - 2 * alpha
        ).drop_ci
        method = "paired bootstrap"
    else:
        lower, upper = V.binary_drop_bounds(test["b"], test["c"], run.n, alpha=alpha, fail_alpha=fail_alpha)
        method = "Tango score"
    verdict = V.three_way(within=upper <= max_drop, beyond=shown)
    needed = None
    if verdict == "inconclusive":
        if run.graded:
            diffs = [r - c for r, c in zip(ref, cand, strict=True)]
            sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            needed = V.drop_n_needed_graded(
                test["drop"], sd, run.n, max_drop=max_drop, alpha=alpha, fail_alpha=fail_alpha
            )
        else:
            needed = V.drop_n_needed_binary(
                test["b"], test["c"], run.n, max_drop=max_drop, alpha=alpha, fail_alpha=fail_alpha
            )
    return {
        "verdict": verdict,
        "value": test["drop"],
        "lower": lower,
        "upper": upper,
        "limit": max_drop,
        "n": run.n,
        "n_needed": needed,
        "method": method,
        "alpha": alpha,
    }


def _sequential_drop(seq: dict[str, Any]) -> dict[str, Any]:
    """The sequential procedure decided already: its anytime-valid bounds and verdict."""
    return {
        "verdict": seq["verdict"],
        "value": seq["drop"],
        "lower": seq["lower"],
        "upper": seq["upper"],
        "limit": seq["max_drop"],
        "n": seq["n"],
        "n_needed": seq["n_needed"],
        "method": "betting confidence sequence, anytime-valid",
        "alpha": seq["alpha"],
        "stopped_by": seq.get("stopped_by"),
        "batches": seq.get("batches"),
    }


def _floor(run: CapabilityRun, *, floor: float, alpha: float) -> dict[str, Any]:
    """The candidate's score against an absolute floor: pass = lower bound >= floor; fail = upper < floor."""
    cand = run.scores("candidate")
    needed = None
    if run.sequential is not None:  # the items were drawn until the drop was shown: an anytime-valid bound
        lower, upper = bounds_from_diffs(np.asarray(cand, dtype=np.float64), alpha=alpha)
        method = "betting confidence sequence, anytime-valid"
    elif run.graded:
        lower, upper = S.mean_interval_bootstrap(cand, confidence=1 - 2 * alpha)
        method = "bootstrap"
    else:
        k = sum(1 for x in cand if x >= 1)
        lower, upper = V.score_bounds(k, run.n, alpha=alpha)
        method = "Wilson score"
    verdict = V.three_way(within=lower >= floor, beyond=upper < floor)
    if verdict == "inconclusive" and not run.graded and run.sequential is None:
        needed = V.floor_n_needed(sum(1 for x in cand if x >= 1), run.n, floor=floor, alpha=alpha)
    return {
        "verdict": verdict,
        "value": sum(cand) / run.n,
        "lower": float(lower),
        "upper": float(upper),
        "limit": floor,
        "n": run.n,
        "n_needed": needed,
        "method": method,
        "alpha": alpha,
    }


def _conf(alpha: float) -> str:
    return f"{100 * (1 - alpha):.4g}%"


def _needed_text(needed: int | None, n: int, goal: str, rates: str) -> str:
    if needed is None:
        return f"more items at the observed {rates} would not {goal}"
    return f"about {needed} items ({needed - n} more) at the observed {rates} would {goal}"


def failure_report(
    runs: Mapping[str, CapabilityRun],
    stats: Mapping[str, dict[str, Any]],
    checks: Sequence[Check],
    *,
    verdict: str = "fail",
    rerun: str,
    nodeid: str,
) -> str:
    """Per check that did not pass: its verdict, bound, margin, n and the n that would tell; scores with
    intervals, discordant counts, and a few items that flipped."""
    name = nodeid.split("/")[-1] if nodeid else "capability gate"
    head = "failed (regression shown)" if verdict == "fail" else "inconclusive (nothing shown either way)"
    lines = [f"capability gate {head}: {name}"]
    for c in checks:
        if c["verdict"] == "pass":
            continue
        task = c["metric"].split()[0]
        info = stats[task]
        ref_lo, ref_hi = info["ref_ci"]
        cand_lo, cand_hi = info["cand_ci"]
        scores = (
            f"reference {percent(info['ref_score'])} ({percent(ref_lo)}–{percent(ref_hi)}) → candidate "
            f"{percent(info['cand_score'])} ({percent(cand_lo)}–{percent(cand_hi)}), n={info['n']} paired items"
        )
        n = c["n"]
        if c["key"] == "drop":
            d = info["drop_verdict"]
            t = info.get("drop_test") or {}
            seq = info.get("sequential")
            losses = t.get("b") if t else (seq or {}).get("losses")
            wins = t.get("c") if t else (seq or {}).get("wins")
            disc = f"; discordant: {losses} lost, {wins} gained" if losses is not None else ""
            rates = (
                f"discordance ({losses} lost, {wins} gained in {n})"
                if losses is not None and not runs[task].graded
                else "mean and spread of the differences"
            )
            if c["verdict"] == "fail":
                how = (
                    (
                        f"one-sided p={t['p_value']:.3g} < alpha, {t['method']}"
                        + (", Holm-corrected across tasks" if info.get("holm") else "")
                    )
                    if t
                    else d["method"]
                )
                lines.append(
                    f"  {task}: fail (regression shown): drop {points(d['value'])} is more than the allowed "
                    f"{points(c['limit'])}; n={n} bounds it from below at {points(d['lower'])} ({how}){disc}"
                )
            else:
                lines.append(
                    f"  {task}: inconclusive: n={n} bounds the drop at {points(d['upper'])} (one-sided "
                    f"{_conf(d['alpha'])} upper bound, {d['method']}), above the allowed {points(c['limit'])}; "
                    f"observed drop {points(d['value'])}{disc}"
                )
                goal = (
                    f"bound it at {points(c['limit'])}"
                    if d["value"] < c["limit"]
                    else f"show it above {points(c['limit'])}"
                )
                lines.append(f"    {_needed_text(c['n_needed'], n, goal, rates)}")
                if seq is not None:
                    lines.append(f"    sequential: {seq.get('batches')} batches, stopped by {seq.get('stopped_by')}")
        else:
            fl = info["floor_verdict"]
            if c["verdict"] == "fail":
                lines.append(
                    f"  {task}: fail: the candidate's score is shown below the floor: one-sided "
                    f"{_conf(fl['alpha'])} upper bound {percent(fl['upper'])} < floor {percent(c['limit'])} "
                    f"(n={n}, {fl['method']})"
                )
            else:
                lines.append(
                    f"  {task}: inconclusive: candidate's one-sided {_conf(fl['alpha'])} lower bound "
                    f"{percent(fl['lower'])} < floor {percent(c['limit'])} ≤ upper bound "
                    f"{percent(fl['upper'])} (n={n}, {fl['method']})"
                )
                if not runs[task].graded and runs[task].sequential is None:
                    goal = f"put the bound clear of {percent(c['limit'])}"
                    lines.append(f"    {_needed_text(c['n_needed'], n, goal, 'pass rate')}")
        lines.append(f"    {scores}")
        run = runs[task]
        for item, r, cand in run.flipped()[:3]:
            excerpt = " ".join(run.rendered.get(item.id, "").split())[-90:]
            lines.append(
                f"    flipped {item.id} (…{excerpt!r}): reference {r.verdict} {_short(r.output)!r} → "
                f"candidate {cand.verdict} {_short(cand.output)!r}"
            )
    if verdict == "inconclusive":
        lines.append(
            "  an inconclusive gate fails: it showed nothing. Size it with n= the items above, or "
            "n=Budget(items=..., seconds=...) to stop once it is shown; --mlx-inconclusive=warn|xfail "
            "for exploratory runs"
        )
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
