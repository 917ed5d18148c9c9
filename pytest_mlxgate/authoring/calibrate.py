"""`--mlx-calibrate`: from one measurement of a gate module, limits to paste, and the rule that set them.

A limit has two jobs: the lever as it is must clear it with room (or the gate flips on the next
run), and it must sit far above the noise of the reference against itself (or it tests noise). The
rule: a KL limit is at least `LEVER_FACTOR` x the lever's 95% upper bound and at least
`FLOOR_FACTOR` x the A/A floor, rounded up to a round number; top-1 agreement the same on its
disagreement rate (1 - top-1). Speed: half the speed-up the interval's lower end shows (a goal the
lever keeps on a noisier machine); none when no speed-up is shown. Bytes (KV, weights) are exact:
their ratio plus 10%. Only the standard library: the xdist controller renders this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..common.format import percent

__all__ = ["FLOOR_FACTOR", "LEVER_FACTOR", "RULE", "calibration_lines", "nice_ceil", "suggest_limits"]

LEVER_FACTOR = 4.0
FLOOR_FACTOR = 10.0
#: Round steps within a decade: a limit reads as 2e-3, not 2.28e-3.
_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0)
#: The metrics a suggestion names: what gates/ assert on (mean: the typical token, p99: the tail,
#: top-1: what greedy decoding would say).
KL_METRICS = (("mean", "mean KL", "mean_ci", 1), ("p99", "p99 KL", "quantile_ci", 1), ("top1", "top-1", "top1_ci", 0))

RULE = (f"rule: each KL limit >= {LEVER_FACTOR:g}x the lever's 95% upper bound and >= {FLOOR_FACTOR:g}x the A/A "
        f"floor, rounded up to 1/1.5/2/3/5/7 x 10^k; top-1 by the same rule on 1 - top-1; speed goals half the "
        "speed-up the interval's lower end shows; bytes (KV, weights) their exact ratio + 10%")


def nice_ceil(x: float) -> float:
    """The smallest round number (1, 1.5, 2, 3, 5, 7 x 10^k) at or above x > 0."""
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"nice_ceil needs a positive finite number, not {x!r}")
    decade = 10.0 ** math.floor(math.log10(x))
    for step in _STEPS:
        value = float(f"{step * decade:.6g}")  # 3e-3, not 0.0030000000000000005
        if value >= x * (1 - 1e-12):
            return value
    raise AssertionError("unreachable: the last step is the next decade")


def _bound(stats: Mapping[str, Any], key: str, ci: str, side: int) -> float | None:
    interval = stats.get(ci)
    if key == "p99" and isinstance(interval, Mapping):
        interval = interval.get("p99")
    if not isinstance(interval, (list, tuple)) or len(interval) < 2:
        return None
    value = interval[side]
    return None if value is None or not math.isfinite(float(value)) else float(value)


def suggest_limits(kl: Mapping[str, Any], floors: Mapping[str, float], speed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measurement side by side with the limits the rule gives, and the code to paste.

    `kl` is the lever's KL statistics (`KLStats.to_json()`), `floors` the A/A floors (`aa_floors`),
    `speed` the module's speed record or None. Returns JSON: `rows` (what was measured), `kl_limits`,
    `speed_goals`, `notes` (what the rule could not size, and why) and `code` (lines to paste)."""
    rows: list[dict[str, Any]] = []
    limits: dict[str, float] = {}
    notes: list[str] = []
    for key, label, ci, side in KL_METRICS:
        lever_bound = _bound(kl, key, ci, side)
        floor = floors.get(key)
        floor = None if floor is None or not math.isfinite(floor) else float(floor)
        rows.append({"metric": label, "key": key, "value": kl.get(key), "bound": lever_bound, "floor": floor})
        if lever_bound is None:
            notes.append(f"{label}: no 95% bound (too few prompts); run more prompts to size it")
            continue
        if key == "top1":
            miss = max(LEVER_FACTOR * (1 - lever_bound), FLOOR_FACTOR * (1 - floor) if floor is not None else 0.0)
            if miss <= 0:
                notes.append(f"{label}: the arms agree on every token here, so the rule has nothing to scale")
                continue
            limit = 1 - nice_ceil(miss)
            if limit <= 0:
                notes.append(f"{label}: the lever disagrees too often for a top-1 limit to mean anything")
                continue
            limits[key] = round(limit, 6)
        else:
            size = max(LEVER_FACTOR * lever_bound, FLOOR_FACTOR * floor if floor is not None else 0.0)
            if size <= 0:
                notes.append(f"{label}: 0 for the lever and the A/A floor alike (identical on this backend): "
                             "calibrate where the lever differs (e.g. Metal, CUDA), or set the limit from the "
                             "precision you accept")
                continue
            limits[key] = nice_ceil(size)
    goals, speed_rows = _speed_goals(speed, notes)
    code = []
    if limits:
        code.append("assert_kl_below(paired, " + ", ".join(f"{k}={_code_number(v)}" for k, v in limits.items()) + ")")
    if goals:
        code.append("assert_faster(paired, " + ", ".join(f"{k}={_code_number(v)}" for k, v in goals.items()) + ")")
    return {"rule": RULE, "rows": rows + speed_rows, "kl_limits": limits, "speed_goals": goals, "notes": notes,
            "code": code}


def _speed_goals(speed: Mapping[str, Any] | None, notes: list[str]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    if not speed or not speed.get("contexts"):
        return {}, []
    contexts = speed["contexts"]
    longest = max(contexts, key=int)
    ctx = contexts[longest]
    goals: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for key in ("prefill", "decode"):
        est = ctx.get(key) or {}
        ratio, interval = est.get("ratio"), est.get("ratio_ci") or [None, None]
        rows.append({"metric": f"{key} tok/s @{longest}", "key": key, "value": ratio, "interval": list(interval)})
        lo = interval[0]
        if lo is None or not math.isfinite(float(lo)):
            continue
        if lo > 1.02:
            goals[key] = math.floor((1 + (float(lo) - 1) / 2) * 100) / 100
        else:
            notes.append(f"{key} @{longest}: not shown faster here (x{ratio:.2f}, lower bound {lo:.2f}): no goal")
    kv = (ctx.get("kv") or {}).get("ratio")
    if kv is not None:
        rows.append({"metric": f"KV bytes @{longest}", "key": "kv", "value": kv, "interval": [kv, kv]})
        if kv < 1:
            goals["kv"] = math.ceil(kv * 1.1 * 100) / 100
    w = speed.get("weights_bytes") or {}
    if w.get("reference") and w.get("candidate") and w["candidate"] != w["reference"]:
        ratio = w["candidate"] / w["reference"]
        rows.append({"metric": "weight bytes", "key": "weights", "value": ratio, "interval": [ratio, ratio]})
        if ratio < 1:
            goals["weights"] = math.ceil(ratio * 1.1 * 100) / 100
    return goals, rows


def _code_number(x: float) -> str:
    """A limit as code: 3e-3, 1.5e-5, 0.05, 0.85 (exact: the round numbers nice_ceil makes)."""
    if x == 0 or x >= 1e-2:
        return f"{x:g}"
    mantissa, exponent = f"{x:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _num_text(key: str, x: Any) -> str:
    if x is None:
        return "—"
    if key == "top1":
        return percent(float(x))
    if key in ("prefill", "decode", "kv", "weights"):
        return f"×{float(x):.3g}"
    return _sci(float(x))


def _sci(x: float) -> str:
    """4.2e-4 rather than 0.00042 or 4.2e-04: KL figures span ten decades."""
    if x == 0 or 1e-2 <= abs(x) < 1e3:
        return f"{x:.2g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def calibration_lines(calibration: Mapping[str, Any]) -> list[str]:
    """The terminal's calibration block for one gate module."""
    s = calibration["suggested"]
    shape = calibration.get("shape") or {}
    lines = [f"{calibration['module']} — calibration, no verdict ({calibration['lever']}; "
             f"{shape.get('prompts')} prompts x {shape.get('tokens')} tokens)"]
    lines.append(f"  {'measured':<22}{'lever':>10}{'95% bound':>20}{'A/A floor':>12}")
    for row in s["rows"]:
        key = row["key"]
        if "interval" in row:
            lo, hi = row["interval"]
            bound = f"[{_num_text(key, lo)}, {_num_text(key, hi)}]" if lo != hi else "exact"
            floor = ""
        else:
            bound, floor = _num_text(key, row["bound"]), _num_text(key, row["floor"])
        lines.append(f"  {row['metric']:<22}{_num_text(key, row['value']):>10}{bound:>20}{floor:>12}")
    lines.append(f"  {s['rule']}")
    for note in s["notes"]:
        lines.append(f"  note: {note}")
    if s["code"]:
        lines.append("  suggested limits (paste into the gate; then plant a known-bad variant and check it fails):")
        lines.extend(f"    {line}" for line in s["code"])
    else:
        lines.append("  no limit could be sized from this measurement (see the notes)")
    return lines
