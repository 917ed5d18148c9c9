"""The terminal's calibration block (`--mlx-calibrate`): the measurement beside the limits the rule
(`verdicts.calibration`) gives, the code to paste, the known-bad variant's result and the file written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .calibration import ACCEPT_MARKER, KL_METRICS, metric_text
from .known_bad_step import known_bad_text

__all__ = ["calibration_lines", "known_bad_lines"]


def calibration_lines(calibration: Mapping[str, Any]) -> list[str]:
    """The terminal's calibration block for one gate module (a record written before the quality bounds
    reads as it did then): the measurement, the suggestion, the known-bad variant's result and the
    calibration file (`authoring.calibration_run`)."""
    bad = calibration.get("known_bad_result")
    if isinstance(bad, Mapping) and bad.get("declared") and isinstance(calibration.get("suggested"), Mapping):
        # the module declares its known-bad variant, measured below: no step to plant one
        calibration = {**calibration, "suggested": {**calibration["suggested"], "known_bad": None}}
    return _suggestion_lines(calibration) + _kept_lines(calibration)


def _kept_lines(calibration: Mapping[str, Any]) -> list[str]:
    lines = []
    bad = calibration.get("known_bad_result")
    if isinstance(bad, Mapping) and bad.get("declared"):
        if bad.get("non_finite"):
            shown = known_bad_text(bad.get("value"))
            lines.append(f"  known-bad KNOWN_BAD = {shown}: NaN or inf logits (the gate goes red on them)")
        else:
            metrics = (bad.get("drift") or {}).get("metrics") or {}
            figures = ", ".join(
                f"{label} {metric_text(key, (metrics.get(key) or {}).get('value'))} "
                f"[{metric_text(key, (metrics.get(key) or {}).get('lower'))}, "
                f"{metric_text(key, (metrics.get(key) or {}).get('upper'))}]"
                for key, label, _ci, _side in KL_METRICS
            )
            then = bad.get("verdict_when_measured") or {}
            caught = {
                "fail": "fails the gate's limits (caught)",
                "pass": "PASSES the gate's limits",
                "inconclusive": "is NOT shown to fail the gate's limits",
                "no limits": "the gate has no KL limits yet (the suggested ones must fail it: test_known_bad checks)",
            }.get(str(then.get("verdict")), "measured")
            lines.append(f"  known-bad KNOWN_BAD = {known_bad_text(bad.get('value'))}: {figures}: {caught}")
    file = calibration.get("file")
    if isinstance(file, Mapping):
        if file.get("written"):
            lines.append(
                f"  calibration file: {file.get('path')} written (commit it; --mlx-aa and the calibration "
                "files' test check the limits against it)"
            )
        else:
            lines.append(f"  calibration file: {file.get('path')} {file.get('why')}")
    return lines


def _suggestion_lines(calibration: Mapping[str, Any]) -> list[str]:
    s = calibration["suggested"]
    shape = calibration.get("shape") or {}
    lines = [
        f"{calibration['module']} — calibration, no verdict ({calibration['lever']}; "
        f"{shape.get('prompts')} prompts x {shape.get('tokens')} tokens)"
    ]
    lines.append(f"  {'measured':<22}{'lever':>10}{'95% bound':>20}{'A/A floor':>12}{'quality bound':>15}")
    for row in s["rows"]:
        key = row["key"]
        cap = ""
        if "interval" in row:
            lo, hi = row["interval"]
            bound = f"[{metric_text(key, lo)}, {metric_text(key, hi)}]" if lo != hi else "exact"
            floor = ""
        else:
            bound, floor = metric_text(key, row["bound"]), metric_text(key, row["floor"])
            if row.get("quality_bound") is not None:
                cap = f"{'>=' if key == 'top1' else '<='} {metric_text(key, row['quality_bound'])}"
        lines.append(f"  {row['metric']:<22}{metric_text(key, row['value']):>10}{bound:>20}{floor:>12}{cap:>15}")
    lines.append(f"  {s['rule']}")
    for note in s["notes"]:
        lines.append(f"  note: {note}")
    breaks, accepted, known_bad = s.get("breaks"), s.get("accepted"), s.get("known_bad")
    if breaks and not accepted:
        lines.append(f"  {breaks['message']}")
        lines.append(
            f"  fix the lever and calibrate again; or, if this much change is what you mean to ship, "
            f"accept it explicitly: {breaks['accept']}"
        )
        return lines
    if accepted:
        lines.append(f"  ACCEPTED beyond the quality bounds ({ACCEPT_MARKER}(accept_broken=...)): {accepted}")
        if breaks:
            lines.append(f"  {breaks['message']}")
    if s["code"]:
        lines.append("  suggested limits (paste into the gate):")
        lines.extend(f"    {line}" for line in s["code"])
    else:
        lines.append("  no limit could be sized from this measurement (see the notes)")
    if known_bad:
        lines.extend(known_bad_lines(known_bad, calibration.get("module")))
    elif s["code"] and "known_bad" not in s:  # an older record: the step in words
        lines.append("  then plant a known-bad variant and check it fails")
    return lines


def known_bad_lines(step: Mapping[str, Any], module: object = None) -> list[str]:
    """The known-bad step as the terminal shows it, under every suggestion."""
    where = f"in {module}" if module else "in the gate"
    lines = [
        "  known-bad step (limits never shown to fail a broken variant may pass one): plant "
        f"{step['what']}, and show these limits fail it:"
    ]
    if step.get("declare"):
        lines.append(
            f"    {step['declare']}   ({where}: its test_known_bad runs test_drift on it and passes only "
            "when that fails)"
        )
    if step.get("command"):
        lines.append(f"    {step['command']}   (once, by hand: must fail)")
    return lines
