"""`assert_capability_at_least`: a paired non-inferiority gate on real tasks.

Both arms answer the very same items, so the test is on the pairs: exact McNemar on the discordant
pairs (pass/fail tasks, or a score test when a margin is allowed) or a paired bootstrap (graded
tasks). The gate fails only when the candidate's drop is significantly larger than `max_drop`;
several tasks asserted together are Holm-corrected. `floor` checks the candidate's one-sided
95% lower bound (Wilson for pass/fail) against an absolute score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..common.format import percent, points

if TYPE_CHECKING:
    from .result import CapabilityRun

__all__ = ["assert_capability_at_least", "capability_checks"]


def assert_capability_at_least(
    result: Any,
    task: str | Sequence[str],
    *,
    floor: float | None = None,
    max_drop: float | None = None,
    n: int | None = None,
    alpha: float = 0.05,
) -> dict[str, CapabilityRun]:
    """Fail when a task's score dropped significantly more than `max_drop` (paired, at `alpha`),
    or when the candidate's lower confidence bound is under `floor`.

    `result` is the `paired` fixture (both arms run here, on the same items) or a mapping of
    task -> `CapabilityRun`. `n` limits the items per task (default: the tier's size; the tier is
    `--mlx-tier smoke|full`). A task that cannot run here (no data, no sandbox) is skipped with the
    reason. Returns the runs.
    """
    __tracebackhide__ = True
    import pytest

    tasks = [task] if isinstance(task, str) else list(task)
    if floor is None and max_drop is None:
        raise TypeError("assert_capability_at_least needs floor= and/or max_drop=")
    for name, value in (("floor", floor), ("max_drop", max_drop)):
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"{name}={value}: scores are fractions in [0, 1] (e.g. max_drop=0.02 for 2 points)")
    if max_drop is not None and max_drop >= 1:
        raise ValueError(f"max_drop={max_drop}: a drop of the whole score cannot be tested; use a margin below 1")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha} must be in (0, 0.5)")

    from .base import TaskSkipped

    runs: dict[str, CapabilityRun] = {}
    skipped: dict[str, str] = {}
    for name in tasks:
        try:
            runs[name] = result.capability(name, n=n) if hasattr(result, "capability") else result[name]
        except TaskSkipped as e:
            skipped[name] = str(e)
    checks, stats = capability_checks(runs, floor=floor, max_drop=max_drop, alpha=alpha)
    verdict = "pass" if all(c["passed"] for c in checks) else "fail"
    if not runs:
        verdict = "skipped"
    publish = getattr(result, "publish_capability", None)
    if publish is not None:
        publish(tasks=stats, checks=checks, verdict=verdict, skipped=skipped,
                bounds={"floor": floor, "max_drop": max_drop, "alpha": alpha})
    if verdict == "fail":
        raise AssertionError(failure_report(runs, stats, checks, rerun=getattr(result, "rerun", ""),
                                            nodeid=getattr(result, "nodeid", "")))
    if skipped and not runs:
        pytest.skip("; ".join(skipped.values()))
    return runs


def capability_checks(
    runs: dict[str, CapabilityRun], *, floor: float | None, max_drop: float | None, alpha: float
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per task: scores with intervals, the paired drop test (Holm across tasks), the floor check."""
    from ..stats import paired_tests as S
    from ..stats.intervals import wilson_interval, wilson_lower

    per_task: dict[str, dict[str, Any]] = {}
    p_values: dict[str, float] = {}
    for name, run in runs.items():
        ref, cand = run.scores("reference"), run.scores("candidate")
        info: dict[str, Any] = {"n": run.n, "tier": run.tier, "graded": run.graded,
                                "ref_score": sum(ref) / run.n, "cand_score": sum(cand) / run.n,
                                "durations": run.durations, "reference_source": run.reference_source,
                                "items": run.paired_items()}
        if run.graded:
            info["ref_ci"] = list(S.mean_interval_bootstrap(ref))
            info["cand_ci"] = list(S.mean_interval_bootstrap(cand))
            lower = _graded_lower(cand)
        else:
            k_ref, k_cand = sum(1 for x in ref if x >= 1), sum(1 for x in cand if x >= 1)
            info["ref_ci"] = list(wilson_interval(k_ref, run.n))
            info["cand_ci"] = list(wilson_interval(k_cand, run.n))
            lower = wilson_lower(k_cand, run.n)
        info["cand_lower"] = lower
        if max_drop is not None:
            test = (S.drop_test_graded(ref, cand, max_drop=max_drop, alpha=alpha) if run.graded
                    else S.drop_test_binary(ref, cand, max_drop=max_drop, alpha=alpha))
            info["drop_test"] = test.to_json()
            p_values[name] = test.p_value
        per_task[name] = info
    rejected = S.holm(p_values, alpha=alpha) if len(p_values) > 1 else {k: p < alpha for k, p in p_values.items()}
    checks: list[dict[str, Any]] = []
    for name, info in per_task.items():
        if max_drop is not None:
            test = info["drop_test"]
            info["holm"] = len(p_values) > 1
            checks.append({"metric": f"{name} drop", "key": "drop", "value": test["drop"],
                           "bound": (test.get("drop_ci") or [None, None])[1], "limit": max_drop, "direction": "max",
                           "p_value": test["p_value"], "passed": not rejected[name]})
        if floor is not None:
            checks.append({"metric": f"{name} score", "key": "score", "value": info["cand_score"],
                           "bound": info["cand_lower"], "limit": floor, "direction": "min",
                           "passed": info["cand_lower"] >= floor})
    return checks, per_task


def _graded_lower(scores: Sequence[float]) -> float:
    from ..stats import paired_tests as S

    lo, _ = S.mean_interval_bootstrap(scores, confidence=0.90)  # two-sided 90% = one-sided 95% lower
    return float(lo)


def failure_report(
    runs: dict[str, CapabilityRun], stats: dict[str, dict[str, Any]], checks: list[dict[str, Any]], *,
    rerun: str, nodeid: str,
) -> str:
    """Scores with intervals and n, discordant counts, p-values, and a few items that flipped."""
    name = nodeid.split("/")[-1] if nodeid else "capability gate"
    lines = [f"capability gate failed: {name}"]
    for c in checks:
        if c["passed"]:
            continue
        task = c["metric"].split()[0]
        info = stats[task]
        ref_lo, ref_hi = info["ref_ci"]
        cand_lo, cand_hi = info["cand_ci"]
        scores = (f"reference {percent(info['ref_score'])} ({percent(ref_lo)}–{percent(ref_hi)}) → candidate "
                  f"{percent(info['cand_score'])} ({percent(cand_lo)}–{percent(cand_hi)}), n={info['n']} paired items")
        if c["key"] == "drop":
            t = info["drop_test"]
            disc = f"; discordant: {t['b']} lost, {t['c']} gained" if t.get("b") is not None else ""
            holm = ", Holm-corrected across tasks" if info.get("holm") else ""
            lines.append(f"  {task}: drop {points(t['drop'])} is significantly more than the allowed {points(c['limit'])} "
                         f"(one-sided p={t['p_value']:.3g} < alpha, {t['method']}{holm}){disc}")
        else:
            lines.append(f"  {task}: candidate's 95% lower bound {percent(c['bound'])} < floor {percent(c['limit'])}")
        lines.append(f"    {scores}")
        run = runs[task]
        for item, r, cand in run.flipped()[:3]:
            excerpt = " ".join(run.rendered.get(item.id, "").split())[-90:]
            lines.append(f"    flipped {item.id} (…{excerpt!r}): reference {r.verdict} {_short(r.output)!r} → "
                         f"candidate {cand.verdict} {_short(cand.output)!r}")
    if rerun:
        lines.append(f"  re-run: {rerun}")
    return "\n".join(lines)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
