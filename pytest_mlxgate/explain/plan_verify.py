"""A plan's verdict: the gate itself, run on its own (held-out) prompts with the plan as its candidate, at
the gate's length and at a long context.

A plan chosen on 128-token sequences says nothing of 2,000 tokens: quantization error accumulates over
the positions attention reads, and on a windowed model (gemma's sliding layers) nothing before the window
wraps exercises the quantized ring buffer's rotation. So once the plan passes at the gate's length, the
gate runs again at `long_context` tokens (`LONG_FACTOR` x its own, and past the sliding window on a
windowed model); the plan is verified only when both pass, and a plan that passes short and fails long
is reported with both figures, never returned as the answer. Here too: the search's verdicts in words
(its rounds, its uniform plans, the gate's verdict), shared by every plan kind's summary.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..results.merge import MergeError, read_report
from ..results.model import Record
from .plan_gate import GateSpec

__all__ = [
    "LONG_FACTOR",
    "long_context",
    "report_beside",
    "round_lines",
    "uniform_lines",
    "verdict_lines",
    "verification_lines",
    "verify_plan",
]

#: The characters of a failed verification's output kept in its record: enough for the traceback's end.
OUTPUT_TAIL = 2000
#: The long verification's length, as a multiple of the gate's tokens.
LONG_FACTOR = 4


def long_context(gate: GateSpec, window: int | None) -> int:
    """`LONG_FACTOR` x the gate's tokens, and at least the sliding window plus the decode steps on a
    windowed model (so every decoded token reads a window that has wrapped)."""
    tokens = LONG_FACTOR * gate.tokens
    return max(tokens, window + gate.decode) if window is not None else tokens


def verify_plan(
    gate: GateSpec,
    plan_file: Path,
    *,
    candidate: str | None,
    report: Path,
    long: int | None = None,
    capability: bool = True,
    reference_cache: Path | str | None = None,
) -> dict[str, Any]:
    """Run the gate's KL tests under pytest with `plan_file` as the candidate, on the gate's own prompts:
    the verdicts of its records, their checks and the command (what a reader re-runs). With `long`, a plan
    that passes runs again at that many tokens (`"long"`: the same fields). A plan that passes both then
    runs the gate's capability tests (HashHop: `"capability"`), unless `capability` is False (`"capability":
    "not run"`). Verified only when every run passes. `reference_cache`: the runs' --mlx-reference-cache
    (a folder, or "off"; None: pytest's own, where the gate runs)."""
    runs: dict[str, Any] = dict(candidate=candidate, reference_cache=reference_cache)
    short = _run_gate(gate, plan_file, report=report, tokens=None, tests=gate.kl_tests, **runs)
    short["tokens"] = gate.tokens
    if not short["verified"]:
        return short
    result = short
    if long is not None:
        at_length = report_beside(report, "long")
        longer = _run_gate(gate, plan_file, report=at_length, tokens=long, tests=gate.kl_tests, **runs)
        result = {**short, "verified": bool(longer["verified"]), "long": {**longer, "tokens": long}}
    if not result["verified"] or not gate.capability_tests:
        return result
    if not capability:
        return {**result, "capability": "not run"}
    tasks = report_beside(report, "capability")
    ran = _run_gate(gate, plan_file, report=tasks, tokens=None, tests=gate.capability_tests, **runs)
    return {**result, "verified": bool(ran["verified"]), "capability": ran}


def _run_gate(
    gate: GateSpec,
    plan_file: Path,
    *,
    candidate: str | None,
    report: Path,
    tokens: int | None,
    tests: Sequence[str],
    reference_cache: Path | str | None,
) -> dict[str, Any]:
    if not tests:  # -k "" would run every test of the module: a verification asks for the ones it judges by
        raise ValueError(f"no tests of {gate.path} to verify the plan with")
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(gate.path),
        "-q",
        "-p",
        "no:randomly",
        f"--mlx-lever={gate.lever.name}",
        "--mlx-ref-value=plain",
        f"--mlx-cand-value={plan_file}",
        f"--mlx-report={report}",
        "--mlx-db=off",
        "--mlx-speed=off",
        "--mlx-explain-budget=0",
        "-k",
        " or ".join(tests),
    ]
    if tokens is not None:
        command.append(f"--mlx-kl-tokens={tokens}")
    if candidate:
        command.append(f"--mlx-candidate={candidate}")
    if reference_cache is not None:
        command.append(f"--mlx-reference-cache={reference_cache}")
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    # the asked tests' records (a capability run adds the session's score summary, not a verdict); each
    # asked test must have one: a test that never reported is not a pass
    records = [r for r in _report_records(report) if r.nodeid.split("::")[-1].split("[")[0] in tests]
    verdicts = {r.nodeid: r.verdict for r in records}
    reported = {r.nodeid.split("::")[-1].split("[")[0] for r in records}
    silent = sorted(set(tests) - reported)
    verified = not silent and bool(records) and all(v == "pass" for v in verdicts.values()) and done.returncode == 0
    return {
        "command": " ".join(command[2:]),
        "verdicts": verdicts,
        "verified": verified,
        "reason": None if verified else _unverdicted(silent, done.returncode, tests, verdicts),
        "checks": [c.to_json() for r in records for c in r.checks],
        "exit": done.returncode,
        "output_tail": done.stdout[-OUTPUT_TAIL:] if not verified else "",
    }


def _unverdicted(silent: Sequence[str], code: int, tests: Sequence[str], verdicts: Mapping[str, Any]) -> str | None:
    """Why a run is no verdict on the plan beyond its own failing verdicts: an asked test that left no record
    (none selected, skipped, ended before its assertion), or a run that failed with every record a pass."""
    if silent:
        why = (
            f"pytest selected none of them (exit 5: -k {' or '.join(tests)}); a limit's assert_kl_below belongs "
            "in the test function itself, not in a helper it calls"
            if code == 5
            else f"skipped, deselected, or ended before its assertion (exit {code})"
        )
        return f"the gate's {', '.join(silent)} left no record: {why}; a test that never judged the plan passes nothing"
    if code != 0 and all(v == "pass" for v in verdicts.values()):
        return f"every record passes, but the gate's run exited {code}: an error outside its KL checks (its output)"
    return None


def _report_records(report: Path) -> list[Record]:
    """The gate records of the verifying run's JSON report; none where it wrote no readable report."""
    try:
        return read_report(report).gates
    except MergeError:
        return []


def report_beside(report: Path, run: str) -> Path:
    """Where a verification's second run (`long`, `capability`) writes its report: beside the first, named
    for the run (`r.json` -> `r.long.json`; a name without a suffix gets `.json`)."""
    return report.with_name(f"{report.stem}.{run}{report.suffix or '.json'}")


def check_figures(checks: Sequence[Mapping[str, Any]]) -> str:
    """`mean 1.05e-3 [bound 1.57e-3 vs 2e-3] pass; ...`: each check's figure, the bound it compares and
    its limit, in a line."""
    parts = []
    for c in checks:
        bound = c.get("upper") if c.get("direction") == "max" else c.get("lower")
        shown = "-" if bound is None else f"{bound:.3g}"
        value = "-" if c.get("value") is None else f"{c['value']:.3g}"
        parts.append(f"{c.get('key')} {value} [bound {shown} vs {c.get('limit'):g}] {c.get('verdict')}")
    return "; ".join(parts) or "no checks"


def verification_lines(v: Mapping[str, Any]) -> list[str]:
    """The verification in words: its verdict at the gate's length, at the long context and on the gate's
    capability tests (the figures of whichever failed)."""
    short_tokens = v.get("tokens")
    at = f" at {short_tokens} tokens" if short_tokens is not None else ""
    long = v.get("long")
    tasks = v.get("capability")
    if isinstance(tasks, Mapping) and not tasks["verified"]:
        also = f" and at {long['tokens']} tokens" if long is not None else ""
        return [
            f"  NOT verified: passes the gate's KL tests{at}{also} but not its capability tests: "
            f"{tasks['verdicts'] or 'no verdict'}",
            f"    {check_figures(tasks.get('checks', []))}",
            *_why(tasks),
        ]
    if v["verified"]:
        line = f"  VERIFIED: passes the gate on its own (held-out) prompts{at}: {v['verdicts']}"
        if long is not None:
            line += f"; and at {long['tokens']} tokens: {long['verdicts']}"
        else:
            line += " (not checked at a long context: --long-tokens 0)"
        if isinstance(tasks, Mapping):
            line += f"; and its capability tests: {tasks['verdicts']}"
        elif tasks == "not run":
            line += "; its capability tests were not run (--no-capability): KL only"
        return [line]
    if long is None:
        return [
            f"  NOT verified: does not pass the gate on its own (held-out) prompts{at}: {v['verdicts']}",
            f"    {check_figures(v.get('checks', []))}",
            *_why(v),
        ]
    return [
        f"  NOT verified: passes the gate{at} but not at {long['tokens']} tokens: a plan for short contexts "
        "only, not returned",
        f"    at {short_tokens} tokens: {check_figures(v.get('checks', []))}",
        f"    at {long['tokens']} tokens: {check_figures(long.get('checks', []))}",
        *_why(long),
    ]


def _why(run: Mapping[str, Any]) -> list[str]:
    """A run's reason it is no verdict (`_unverdicted`), as a line; none where its verdicts say it."""
    return [f"    why: {run['reason']}"] if run.get("reason") else []


def round_lines(rounds: Sequence[Mapping[str, Any]], selection: int) -> list[str]:
    """Each measured round in a line: its target and prediction, the measured mean, the checks that did not
    pass, the figure at the long context, the verdict."""
    lines = []
    for k, r in enumerate(rounds, 1):
        short = [f"{key} {v}" for key, v in r.get("checks", {}).items() if v != "pass"]
        why = f" ({', '.join(short)})" if short else ""
        long = r.get("long")
        at_length = f", at the long context {long['mean']:.3g} ({long['verdict']})" if long else ""
        lines.append(
            f"  round {k}: predicted {r['predicted']:.3g} <= target {r['target']:.3g}; measured mean KL "
            f"{r['mean']:.3g} [{r['mean_ci'][0]:.3g}, {r['mean_ci'][1]:.3g}]{why}{at_length} -> {r['verdict']} on "
            f"{selection} selection sequences"
        )
    return lines


def uniform_lines(uniform: Sequence[Mapping[str, Any]], plan_bytes: float, *, key: str) -> list[str]:
    """Each uniform plan in a line: its mean on the selection, whether it passes, its bytes (`key`) over the
    plan's."""
    lines = []
    for u in uniform:
        rel = u[key] / plan_bytes if plan_bytes else math.nan
        lines.append(
            f"  uniform {u['option']}: mean KL {u['mean']:.3g} on the selection, "
            f"{'passes' if u['passes'] else 'does not pass'} · {rel:.3f}x the plan's bytes"
        )
    return lines


def verdict_lines(verification: Mapping[str, Any] | None, chosen: str, seconds: float) -> list[str]:
    """The gate's verdict on the plan (or that it was not asked for), and what the search took."""
    lines = []
    if verification is not None:
        lines.extend(verification_lines(verification))
    elif chosen != "none":
        lines.append("  not verified (--no-verify): passed on the selection only; run the gate on it before use")
    lines.append(f"  took {seconds:.0f} s")
    return lines
