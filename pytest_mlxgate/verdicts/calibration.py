"""`--mlx-calibrate`: from one measurement of a gate module, limits to paste, and the rule that set them.

A limit has two jobs: the lever as it is must clear it with room (or the gate flips on the next
run), and it must sit far above the noise of the reference against itself (or it tests noise). The
rule: a KL limit is at least `LEVER_FACTOR` x the lever's 95% upper bound and at least
`FLOOR_FACTOR` x the A/A floor, rounded up to a round number; top-1 agreement the same on its
disagreement rate (1 - top-1). Speed: half the speed-up the interval's lower end shows (a goal the
lever keeps on a noisier machine); none when no speed-up is shown. Bytes (KV, weights) are exact:
their ratio plus 10%.

A rule relative to the lever alone passes anything: 4x a broken kernel's drift passes that kernel.
So every suggestion is capped by absolute quality bounds (`QUALITY_BOUNDS`), what "the same model"
still means whatever the lever: mean KL <= 2 nats, p99 KL <= 10 nats, top-1 agreement >= 30%.
Anchors: llama.cpp's Llama-3-8B figures are mean KL 0.00136 / same top 97.7% at q8_0 and 0.0313 /
91.9% at q4_K_M; the loosest lever this project gates, 4-bit weights on the 135M embedded model,
measures mean 0.66 (upper 0.78), p99 2.8 (upper 3.0), top-1 55.9% (lower 46.2%)
(gates/calibration/test_weights.json), and its gate asks mean 2, p99 6, top-1 30%, the bounds
themselves where the check's room asks for them: every gate in gates/ sits inside the bounds. A mean KL of 2 nats is
most of the embedded model's own next-token entropy (its mean NLL is 2.4 nats): past it the
candidate is another distribution, not a perturbation of the reference; below 30% top-1 most greedy
tokens change. Broken levers measured here sit far beyond: 2-bit weights mean 15.1 / top-1 0.0%,
an RMSNorm accumulating in float16 mean 8.4 / 0.0%, RoPE with its cache offset dropped mean 2.19.
(Absolute, not relative to the reference's entropy: the record does not carry that entropy.)

A lever whose 95% bound lies beyond a quality bound gets no limits at all, but a message that it
breaks the model (its figures, the worst tokens), unless the module accepts it explicitly with
`pytest.mark.mlx_calibrate(accept_broken="why")`; the suggestion and the record then say so. Every
suggestion comes with the known-bad step (`verdicts.known_bad_step`): what to plant and how to show the
limits fail it (`authoring.known_bad`). Only the standard library: the xdist controller renders this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..common.format import percent
from ..errors import MlxgateUsageError
from .known_bad_step import known_bad_step

__all__ = [
    "CHECK_ROOM",
    "CHECK_RULE",
    "FLOOR_FACTOR",
    "LEVER_FACTOR",
    "QUALITY_BOUNDS",
    "RULE",
    "accept_broken_from",
    "accept_broken_reason",
    "beyond_quality_bounds",
    "check_kl_limit",
    "check_speed_goal",
    "least_kl_limit",
    "metric_text",
    "nice_ceil",
    "suggest_limits",
]

LEVER_FACTOR = 4.0
FLOOR_FACTOR = 10.0
#: What "the same model" still means, whatever the lever: no suggested limit is looser, and a lever
#: whose 95% bound is beyond one gets no limits (see the module docstring for why these numbers).
QUALITY_BOUNDS: Mapping[str, float] = {"mean": 2.0, "p99": 10.0, "top1": 0.30}
#: Round steps within a decade: a limit reads as 2e-3, not 2.28e-3.
_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0)
#: The metrics a suggestion names: what gates/ assert on (mean: the typical token, p99: the tail,
#: top-1: what greedy decoding would say).
KL_METRICS = (("mean", "mean KL", "mean_ci", 1), ("p99", "p99 KL", "quantile_ci", 1), ("top1", "top-1", "top1_ci", 0))
#: The marker by which a module accepts a lever beyond the quality bounds, and its one argument.
ACCEPT_MARKER = "mlx_calibrate"
_ACCEPT_HOW = (
    f'add pytest.mark.{ACCEPT_MARKER}(accept_broken="why this much change is what you mean to ship") to '
    "the module's pytestmark and calibrate again (the suggestion and the record then carry the reason)"
)

#: The least room a gate's limit must leave the lever it was calibrated on (what `--mlx-aa` and the
#: calibration files' test check): its 95% bound at most 1/CHECK_ROOM of the limit (KL), of the
#: disagreement the limit allows (top-1). Suggestions aim for LEVER_FACTOR, twice as much, so a
#: re-measured lever whose bound doubles still passes the check.
CHECK_ROOM = LEVER_FACTOR / 2
#: Agreement rates: their limits are lower bounds, and the rule scales their complement (disagreement).
AGREEMENT_METRICS = frozenset({"top1", "same_top"})

RULE = (
    f"rule: each KL limit >= {LEVER_FACTOR:g}x the lever's 95% upper bound and >= {FLOOR_FACTOR:g}x the A/A "
    f"floor, rounded up to 1/1.5/2/3/5/7 x 10^k; top-1 by the same rule on 1 - top-1; all capped by the "
    f"quality bounds (mean KL <= {QUALITY_BOUNDS['mean']:g}, p99 KL <= {QUALITY_BOUNDS['p99']:g}, top-1 >= "
    f"{QUALITY_BOUNDS['top1']:.0%}); speed goals half the speed-up the interval's lower end shows; bytes (KV, "
    "weights) their exact ratio + 10%"
)


CHECK_RULE = (
    f"check: each KL limit >= {FLOOR_FACTOR:g}x the A/A floor and >= {CHECK_ROOM:g}x the lever's 95% "
    f"bound (or at its quality bound, where no looser limit is allowed); agreement rates (top-1) by the "
    f"same rule on their disagreement; never beyond the quality bounds; speed goals at or below the "
    f"lower end of the lever's interval, byte limits at or above its exact ratio"
)


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


def _interval(stats: Mapping[str, Any], key: str, ci: str) -> tuple[float | None, float | None]:
    lo, hi = _bound(stats, key, ci, 0), _bound(stats, key, ci, 1)
    return lo, hi


def _beyond(key: str, x: float | None) -> bool:
    if x is None:
        return False
    cap = QUALITY_BOUNDS[key]
    return x < cap if key == "top1" else x > cap


def beyond_quality_bounds(kl: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The metrics whose 95% bound on the gate's side (upper for KL, lower for top-1; the value where
    there is no interval) lies beyond its quality bound: one entry each, empty for a lever that keeps
    the model."""
    out = []
    for key, label, ci, side in KL_METRICS:
        bound = _bound(kl, key, ci, side)
        value = kl.get(key)
        value = None if value is None or not math.isfinite(float(value)) else float(value)
        judged = bound if bound is not None else value
        if _beyond(key, judged):
            out.append(
                {
                    "metric": label,
                    "key": key,
                    "value": value,
                    "bound": bound,
                    "quality_bound": QUALITY_BOUNDS[key],
                    "point_beyond": _beyond(key, value),
                }
            )
    return out


def accept_broken_reason(args: tuple[Any, ...], kwargs: Mapping[str, Any], where: str) -> str:
    """The reason an `mlx_calibrate(accept_broken="...")` marker gives, on one line; ValueError says what
    is wrong (the caller wraps it in its usage error)."""
    unknown = sorted(set(kwargs) - {"accept_broken"})
    if args or unknown or "accept_broken" not in kwargs:
        raise ValueError(
            f'{where}: takes only accept_broken="why" (the reason a lever beyond the quality bounds '
            f"is acceptable); got {', '.join([*map(repr, args), *unknown]) or 'nothing'}"
        )
    reason = kwargs["accept_broken"]
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(
            f"{where}: accept_broken={reason!r}: give the reason as text, e.g. "
            'accept_broken="2-bit weights: we ship them knowingly for on-device drafts"'
        )
    if not one_line(reason):
        raise ValueError(f"{where}: accept_broken={reason!r}: give the reason as printable text")
    return one_line(reason)


def one_line(text: str) -> str:
    """`text` as one line of printable characters: what a `# ...` comment in pasted code can hold."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def suggest_limits(
    kl: Mapping[str, Any],
    floors: Mapping[str, float],
    speed: Mapping[str, Any] | None,
    *,
    module: str | None = None,
    lever: Mapping[str, Any] | None = None,
    accept_broken: str | None = None,
    tokens: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The measurement side by side with the limits the rule gives, and the code to paste.

    `kl` is the lever's KL statistics (`KLStats.to_json()`), `floors` the A/A floors (`aa_floors`),
    `speed` the module's speed record or None; `module` (its path) and `lever` (`Lever.to_json()`)
    name the known-bad step's command; `accept_broken` is the module's stated reason to accept a lever
    beyond the quality bounds; `tokens` the text of the worst tokens' ids. Returns JSON: `rows` (what
    was measured), `kl_limits`, `speed_goals`, `notes` (what the rule could not size, and why), `code`
    (lines to paste; none for a lever beyond the quality bounds unless accepted), `breaks` (None, or
    why the lever breaks the model), `accepted` (the reason, when it was needed and used) and
    `known_bad` (the step that shows the limits catch a broken variant; with every suggested limit)."""
    rows: list[dict[str, Any]] = []
    limits: dict[str, float] = {}
    notes: list[str] = []
    beyond = beyond_quality_bounds(kl)
    accept_broken = (one_line(accept_broken) or None) if accept_broken else None  # it ends up in a pasted comment
    accepted = accept_broken if beyond else None
    if accept_broken and not beyond:
        notes.append(
            f"{ACCEPT_MARKER}(accept_broken=...) is set but this lever is within the quality bounds: the "
            "acceptance is not needed (remove it, so it cannot hide a later break)"
        )
    sized = not beyond or accepted is not None
    for key, label, ci, side in KL_METRICS:
        lever_bound = _bound(kl, key, ci, side)
        floor = floors.get(key)
        floor = None if floor is None or not math.isfinite(floor) else float(floor)
        rows.append(
            {
                "metric": label,
                "key": key,
                "value": kl.get(key),
                "bound": lever_bound,
                "floor": floor,
                "quality_bound": QUALITY_BOUNDS[key],
            }
        )
        if not sized:
            continue
        if lever_bound is None:
            notes.append(f"{label}: no 95% bound (too few prompts); run more prompts to size it")
            continue
        limit = _kl_limit(key, label, lever_bound, floor, capped=accepted is None, notes=notes)
        if limit is not None:
            limits[key] = limit
    goals, speed_rows = _speed_goals(speed, notes)
    code = []
    breaks = _breaks(kl, beyond, tokens or {}, accepted=accepted) if beyond else None
    if sized:
        if limits:
            line = "assert_kl_below(paired, " + ", ".join(f"{k}={_code_number(v)}" for k, v in limits.items()) + ")"
            if accepted is not None:
                line += f"  # beyond the quality bounds, accepted: {accepted}"
            code.append(line)
        for assertion, kinds in (("assert_faster", _SPEED_UP), ("assert_smaller", _SAVED)):
            asked = {k: v for k, v in goals.items() if k in kinds}
            if asked:
                code.append(
                    f"{assertion}(paired, " + ", ".join(f"{k}={_code_number(v)}" for k, v in asked.items()) + ")"
                )
    else:
        goals = {}  # a gate for a broken lever gets nothing to paste that could pass
    return {
        "rule": RULE,
        "quality_bounds": dict(QUALITY_BOUNDS),
        "rows": rows + speed_rows,
        "kl_limits": limits,
        "speed_goals": goals,
        "notes": notes,
        "code": code,
        "breaks": breaks,
        "accepted": accepted,
        "known_bad": known_bad_step(module, lever) if limits else None,
    }


def _kl_limit(
    key: str, label: str, lever_bound: float, floor: float | None, *, capped: bool, notes: list[str]
) -> float | None:
    """One metric's limit by the rule, capped by its quality bound unless the module accepted a break."""
    cap = QUALITY_BOUNDS[key]
    if key == "top1":
        miss = max(LEVER_FACTOR * (1 - lever_bound), FLOOR_FACTOR * (1 - floor) if floor is not None else 0.0)
        if miss <= 0:
            notes.append(f"{label}: the arms agree on every token here, so the rule has nothing to scale")
            return None
        rule = 1 - nice_ceil(miss)
        if capped and rule < cap:
            notes.append(
                f"{label}: capped at the quality bound {percent(cap)} (the rule's room would allow "
                f"{'any agreement' if rule <= 0 else percent(rule)}); the lever's lower bound "
                f"{percent(lever_bound)} leaves less room than x{LEVER_FACTOR:g}"
            )
            return round(cap, 6)
        if rule <= 0:
            notes.append(f"{label}: the lever disagrees too often for a top-1 limit to mean anything")
            return None
        return math.floor(round(rule * 1e6, 3)) / 1e6  # down: a rule of 0.99999985 is no limit of 1
    size = max(LEVER_FACTOR * lever_bound, FLOOR_FACTOR * floor if floor is not None else 0.0)
    if size <= 0:
        notes.append(
            f"{label}: 0 for the lever and the A/A floor alike (identical on this backend): "
            "calibrate where the lever differs (e.g. Metal, CUDA), or set the limit from the "
            "precision you accept"
        )
        return None
    rule = nice_ceil(size)
    if capped and rule > cap:
        room = f"x{cap / lever_bound:.1f}" if lever_bound > 0 else "all the"
        floor_text = (
            f"; it is only x{cap / floor:.1f} above the A/A floor {_sci(floor)}"
            if floor and cap < FLOOR_FACTOR * floor
            else ""
        )
        notes.append(
            f"{label}: capped at the quality bound {_code_number(cap)} (the rule asks {_code_number(rule)}): "
            f"{room} room above the lever's 95% bound {_sci(lever_bound)}, not x{LEVER_FACTOR:g}, so a "
            f"noisier run may not tell{floor_text}"
        )
        return cap
    return rule


#: Float rounding: 10 x 3e-9 is 3.0000000000000004e-8, and a limit of 3e-8 keeps the rule.
_AT_LEAST = 1 - 1e-9


def check_kl_limit(key: str, limit: float, *, lever_bound: float | None, floor: float | None) -> list[str]:
    """What is wrong with a gate's KL limit `key=limit` against its calibration (`CHECK_RULE`): the
    lever's 95% bound on the gate's side (upper for KL, lower for agreement rates) and the A/A floor
    at the same bound. One sentence each (what, and why it matters); empty when the limit keeps the
    rule. Every limit `suggest_limits` gives keeps it, but one capped at a quality bound whose
    floor is too close (its note says so)."""
    agreement = key in AGREEMENT_METRICS

    def room(x: float) -> float:  # what the rule scales: KL itself, or an agreement rate's complement
        return 1 - x if agreement else x

    def text(x: float) -> str:
        return percent(x) if agreement else _sci(x)

    problems: list[str] = []
    cap = QUALITY_BOUNDS.get(key)
    at_cap = cap is not None and math.isclose(limit, cap, rel_tol=1e-9)
    least = least_kl_limit(key, lever_bound, floor) if lever_bound is not None and math.isfinite(lever_bound) else None
    fix = (
        f" (the tightest limit the check accepts here: {key}={_code_number(least)})"
        if least is not None
        else " (no limit within the quality bound keeps the rule here: the lever is too close to it)"
    )
    if cap is not None and not at_cap and (limit < cap if agreement else limit > cap):
        problems.append(
            f"{key}={_code_number(limit)} is beyond the quality bound {text(cap)}: a gate this loose "
            "passes a lever that breaks the model"
        )
    if lever_bound is None or not math.isfinite(lever_bound):
        problems.append(
            f"{key}: the calibration has no 95% bound for the lever (too few prompts), so the limit's room is unknown"
        )
    elif room(lever_bound) > room(limit):
        problems.append(
            f"{key}={_code_number(limit)}: the lever's 95% bound {text(lever_bound)} is beyond it, so "
            "the gate does not pass the lever it was calibrated on" + fix
        )
    elif not at_cap and room(lever_bound) * CHECK_ROOM > room(limit) / _AT_LEAST:
        problems.append(
            f"{key}={_code_number(limit)} leaves the lever's 95% bound {text(lever_bound)} only "
            f"x{room(limit) / room(lever_bound):.2g} of room, less than x{CHECK_ROOM:g}: the gate may "
            "flip on a noisier run of the same lever" + fix
        )
    if floor is not None and math.isfinite(floor) and room(floor) * FLOOR_FACTOR > room(limit) / _AT_LEAST:
        times = f"x{room(limit) / room(floor):.2g}" if room(floor) > 0 else "no"
        problems.append(
            f"{key}={_code_number(limit)} sits {times} above the A/A floor {text(floor)}, less than "
            f"x{FLOOR_FACTOR:g}: the gate's verdict may be decided by noise (the reference against itself)" + fix
        )
    return problems


def least_kl_limit(key: str, lever_bound: float, floor: float | None) -> float | None:
    """The tightest round limit (`nice_ceil`) `check_kl_limit` accepts for a lever with this 95% bound
    and A/A floor; the quality bound where only it is left; None where no limit within it keeps the rule."""
    agreement = key in AGREEMENT_METRICS

    def room(x: float) -> float:
        return 1 - x if agreement else x

    floor_room = room(floor) if floor is not None and math.isfinite(floor) else 0.0
    need = max(CHECK_ROOM * room(lever_bound), FLOOR_FACTOR * floor_room)
    cap = QUALITY_BOUNDS.get(key)
    if need <= 0:
        return None
    step = nice_ceil(need)
    limit = float(f"{1 - step:.12g}") if agreement else step  # 1 - 2e-9 stays below 1
    if cap is not None and (limit < cap if agreement else limit > cap):
        keeps_cap = room(lever_bound) <= room(cap) and FLOOR_FACTOR * floor_room <= room(cap) / _AT_LEAST
        return cap if keeps_cap else None
    return None if agreement and limit <= 0 else limit


def check_speed_goal(
    key: str, goal: float, *, ratio: float | None, lower: float | None, upper: float | None, where: str
) -> list[str]:
    """What is wrong with a speed or memory goal against the lever's calibrated measurement at one
    context (`where`): tokens/s goals (`decode`, `prefill`) must sit at or below the interval's lower
    end, peak memory (`memory`) at or above its upper end, bytes (`kv`, `weights`: exact) at or above
    the ratio. Empty when the lever as calibrated meets the goal."""
    if key in ("decode", "prefill"):
        if lower is None or not math.isfinite(lower):
            return [f"{key}={goal:g} {where}: the calibration has no interval for the lever's {key} speed"]
        if lower < goal * _AT_LEAST:
            return [
                f"{key}={goal:g} {where}: the lever's interval lower end is x{lower:.3g} (x{ratio or 0:.3g}), "
                "so it is not shown to meet the goal it is gated on"
            ]
        return []
    bound = upper if key == "memory" else ratio
    if bound is None or not math.isfinite(bound):
        return [f"{key}={goal:g} {where}: the calibration did not measure the lever's {key} ratio"]
    if bound > goal / _AT_LEAST:
        return [f"{key}={goal:g} {where}: the lever measures x{bound:.3g}, over the goal it is gated on"]
    return []


def _breaks(
    kl: Mapping[str, Any], beyond: list[dict[str, Any]], tokens: Mapping[str, str], *, accepted: str | None
) -> dict[str, Any]:
    """Why a lever beyond the quality bounds gets no limits (its figures, its worst tokens) and how to
    accept it explicitly; or, once accepted, what was accepted."""
    shown = {b["key"] for b in beyond}
    figures = []
    for key, label, ci, _side in KL_METRICS:
        lo, hi = _interval(kl, key, ci)
        rel = ">=" if key == "top1" else "<="
        where = "BEYOND the quality bound" if key in shown else "within"
        figures.append(
            f"{label} {metric_text(key, kl.get(key))} [{metric_text(key, lo)}, {metric_text(key, hi)}] "
            f"({where} {rel} {metric_text(key, QUALITY_BOUNDS[key])})"
        )
    worst = []
    for w in list(kl.get("worst") or [])[:3]:
        worst.append(
            f"prompt {w.get('prompt')} position {w.get('position')}, next token "
            f"{_token(tokens, w.get('token_id'))!r}: KL {metric_text('mean', w.get('kl'))}, top-1 "
            f"{_token(tokens, w.get('ref_top1'))!r} -> {_token(tokens, w.get('cand_top1'))!r}"
        )
    clearly = any(b["point_beyond"] for b in beyond)
    head = (
        "this lever breaks the model"
        if clearly
        else "this lever is not shown to keep the model (a 95% bound is beyond a quality bound; more prompts may tell)"
    )
    tail = (
        "; a gate limit that passes it would pass a broken model, so none is suggested"
        if accepted is None
        else f"; limits sized anyway, as the module accepts it: {accepted}"
    )
    message = f"{head}: {', '.join(figures)}" + (f"; worst tokens: {'; '.join(worst)}" if worst else "") + tail
    return {"beyond": beyond, "message": message, "accept": _ACCEPT_HOW}


def _token(tokens: Mapping[str, str], token_id: object) -> str:
    return tokens.get(str(token_id), f"<{token_id}>")


#: The goals suggested from a speed measurement: speed-ups are assert_faster's, byte savings assert_smaller's.
_SPEED_UP, _SAVED = ("prefill", "decode"), ("kv", "weights")


def _speed_goals(speed: Mapping[str, Any] | None, notes: list[str]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    if not speed or not speed.get("contexts"):
        return {}, []
    longest = max(speed["contexts"], key=int)
    ctx = speed["contexts"][longest]
    goals: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for key in _SPEED_UP:
        est = ctx.get(key) or {}
        ratio, interval = est.get("ratio"), est.get("ratio_ci") or [None, None]
        rows.append({"metric": f"{key} tok/s @{longest}", "key": key, "value": ratio, "interval": list(interval)})
        lo = interval[0]
        if lo is None or not math.isfinite(float(lo)):
            continue
        if lo > 1.02:
            goals[key] = _hundredths(1 + (float(lo) - 1) / 2, math.floor)
        else:
            notes.append(f"{key} @{longest}: not shown faster here (x{ratio:.2f}, lower bound {lo:.2f}): no goal")
    w = speed.get("weights_bytes") or {}
    changed = w.get("reference") and w.get("candidate") and w["candidate"] != w["reference"]
    saved = {"kv": (ctx.get("kv") or {}).get("ratio"), "weights": w["candidate"] / w["reference"] if changed else None}
    for key, metric in zip(_SAVED, (f"KV bytes @{longest}", "weight bytes"), strict=True):
        if (ratio := saved[key]) is not None:  # bytes are counted, not timed: the interval is the ratio
            rows.append({"metric": metric, "key": key, "value": ratio, "interval": [ratio, ratio]})
            if ratio < 1:
                goals[key] = _hundredths(ratio * 1.1, math.ceil)
    return goals, rows


def _hundredths(x: float, direction: Callable[[float], int]) -> float:
    """x to hundredths by `direction` (floor: a speed goal; ceil: a bytes goal), the float's own error
    first rounded away: 1.3's goal is 1.15, not the 1.14 that floor(114.99999999999999) gives."""
    return direction(round(x * 100, 9)) / 100


def _code_number(x: float) -> str:
    """A limit as code: 3e-3, 1.5e-5, 0.05, 0.85 (exact: the round numbers nice_ceil makes)."""
    if x == 0 or x >= 1e-2:
        return f"{x:g}"
    mantissa, exponent = f"{x:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def metric_text(key: str, x: Any) -> str:
    """A figure of `key` as the calibration block prints it: top-1 in percent, ratios as ×, KL in e-notation."""
    if x is None:
        return "—"
    if key == "top1":
        return percent(float(x))
    if key in ("prefill", "decode", "kv", "weights"):
        return f"×{float(x):.3g}"
    return _sci(float(x))


def _sci(x: float) -> str:
    """4.2e-4 rather than 0.00042 or 4.2e-04: KL figures span ten decades. Two digits from 0.01 to 100 (a
    figure that rounds to 100, 99.5 say, is 1.0e2, never Python's 1e+02)."""
    short = f"{x:.2g}"
    if x == 0 or (abs(x) >= 1e-2 and "e" not in short):  # .2g turns to 1e+02 from 99.5 up
        return short
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def accept_broken_from(item: Any) -> str | None:
    """The reason a module's `pytest.mark.mlx_calibrate(accept_broken="...")` gives, or None."""
    mark = item.get_closest_marker(ACCEPT_MARKER)
    if mark is None:
        return None
    try:
        return accept_broken_reason(tuple(mark.args), dict(mark.kwargs), f"marker {ACCEPT_MARKER} on {item.nodeid}")
    except ValueError as e:
        raise MlxgateUsageError(str(e)) from None
