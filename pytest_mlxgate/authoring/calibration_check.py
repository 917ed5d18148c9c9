"""A gate module's limits checked against its calibration file (`authoring.calibration_file`): `--mlx-aa` and
a fast test read the file back (`module_findings`) and check the gate's limits, as its source declares them,
by `verdicts.calibration.CHECK_RULE` (the rule `suggest_limits` sizes by, with half its room): a limit the
file shows wrong is a problem; a file measured on other serving code, another lever or other sizes is stale,
which says so and names the command that refreshes it. Only the standard library."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..common.format import DASH, figure
from ..config.names import DEFAULT_CANDIDATE
from ..verdicts.calibration import AGREEMENT_METRICS, CHECK_RULE, check_kl_limit, check_speed_goal
from ..verdicts.known_bad_step import known_bad_text
from .calibration_file import (
    CALIBRATION_DIR,
    FORMAT,
    KL_ASSERTION,
    GateSource,
    Limit,
    calibration_candidate,
    calibration_model,
    calibration_path,
    read_calibration,
)
from .serving_code import serving_code

__all__ = ["Findings", "known_bad_verdict", "module_findings"]


@dataclass
class Findings:
    """A gate module against its calibration file: `problems` (limits the file shows wrong: the gate
    is not trustworthy as written), `stale` (why the file may no longer describe the code), `notes`."""

    module: str
    file: Path
    refresh: str  # the command that measures it again
    shown_file: str = ""  # the file as messages name it: beside the module as `module` names it
    missing: bool = False
    problems: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem_text(self) -> str:
        file = self.shown_file or self.file
        lines = [f"{self.module}: its limits break the calibration rule against {file}:"]
        lines += [f"  {p}" for p in self.problems]
        lines.append(f"  ({CHECK_RULE})")
        if self.stale:
            lines.append(f"  the file is stale ({'; '.join(self.stale)}): refresh it first: {self.refresh}")
        lines.append(
            f"  fix: set the limits the calibration suggests ({file}: suggested.code), or "
            f"re-measure with {self.refresh}"
        )
        return "\n".join(lines)

    def stale_text(self) -> str:
        return (
            f"{self.shown_file or self.file} is stale: {'; '.join(self.stale)}. Its figures may not be what "
            f"this code measures; refresh it: {self.refresh}"
        )


def known_bad_verdict(drift: Mapping[str, Any], limits: Sequence[Limit]) -> tuple[str, list[str]]:
    """A known-bad variant's drift table against KL limits, by the agreed check rule ("max": fail iff
    the interval's lower end is beyond the limit; "min": iff its upper end is): ("fail", the limits
    shown crossed) when one is, else ("pass"/"inconclusive", the limits it was not shown to cross)."""
    crossed, unclear, passed = [], [], []
    metrics = drift.get("metrics") or {}
    for lim in limits:
        row = metrics.get(lim.key) or {}
        lower, upper = row.get("lower"), row.get("upper")
        agreement = lim.key in AGREEMENT_METRICS
        near, far = (upper, lower) if not agreement else (lower, upper)
        text = f"{lim.key} [{figure(lower, other=DASH)}, {figure(upper, other=DASH)}] vs limit {lim.value:g}"
        if far is not None and _beyond(far, lim.value, agreement):
            crossed.append(text)
        elif near is not None and not _beyond(near, lim.value, agreement):
            passed.append(text)
        else:
            unclear.append(text)
    if crossed:
        return "fail", crossed
    return ("inconclusive" if unclear else "pass"), unclear + passed


def _beyond(x: float, limit: float, agreement: bool) -> bool:
    """On the failing side of a limit: below it for an agreement rate, above it for KL."""
    return x < limit if agreement else x > limit


def module_findings(
    module: Path, *, shown_as: str | None = None, test: str | None = None, model: str | None = None
) -> Findings:
    """Check the limits `module` declares (one test's: `test`) on `model` (None: the embedded model)
    against that model's calibration file; say whether that file is stale. `shown_as`: the module's
    path as messages name it (default: as given)."""
    name = shown_as or str(module)
    path = calibration_path(module, model)
    findings = Findings(
        module=name,
        file=path,
        refresh=f"pytest {shlex.quote(name)} --mlx-calibrate"
        + (f" --mlx-candidate {calibration_candidate(model)}" if model else ""),
        shown_file=str(Path(name).parent / path.relative_to(module.parent)),
    )
    try:
        doc = read_calibration(path)
    except ValueError as e:
        findings.problems.append(str(e))
        return findings
    if doc is None:
        findings.missing = True
        return findings
    held_model = doc.get("model")
    held: Mapping[str, Any] = held_model if isinstance(held_model, Mapping) else {}
    if held.get("name") is not None or held.get("repo") is not None:
        theirs = calibration_model(held.get("name"), held.get("repo"))
        if theirs != model:
            findings.problems.append(
                f"{findings.shown_file} holds a calibration of {held.get('name') or held.get('repo')}, not of "
                f"{model or DEFAULT_CANDIDATE} whose file this is: move it to "
                f"{CALIBRATION_DIR}/{theirs + '/' if theirs else ''}{module.stem}.json, or calibrate again"
            )
            return findings
    gate = GateSource.read(module)
    findings.stale = _stale(doc, gate)
    limits = gate.limits_of(test, model=model)
    findings.notes.extend(f"not checked (not a literal): {text}" for text in gate.not_literal)
    suggested = doc.get("suggested") or {}
    breaks = suggested.get("breaks")
    if breaks and not suggested.get("accepted") and limits:
        findings.problems.append(f"the calibration shows the lever breaks the model: {breaks.get('message')}")
    drift = (doc.get("drift") or {}).get("metrics") or {}
    floors = doc.get("aa_floor") or {}
    for lim in limits:
        if lim.assertion == KL_ASSERTION:
            row = drift.get(lim.key) or {}
            side = "lower" if lim.key in AGREEMENT_METRICS else "upper"
            floor = floors.get(lim.key)
            findings.problems.extend(
                check_kl_limit(
                    lim.key,
                    lim.value,
                    lever_bound=row.get(side),
                    floor=float(floor) if isinstance(floor, (int, float)) else None,
                )
            )
        else:
            findings.problems.extend(_speed_problems(lim, doc.get("speed") or {}))
    if test is None or gate.limits_of(test, kl=True, model=model):
        findings.problems.extend(_known_bad_problems(doc, gate, model))
    return findings


def _stale(doc: Mapping[str, Any], gate: GateSource) -> list[str]:
    reasons = []
    if doc.get("calibration_format") != FORMAT:
        reasons.append(f"written in calibration format {doc.get('calibration_format')}, this code reads {FORMAT}")
    then = (doc.get("serving_code") or {}).get("files") or {}
    now = serving_code()["files"]
    changed = sorted(n for n in set(then) | set(now) if then.get(n) != now.get(n))
    if changed:
        reasons.append(
            f"the serving code changed since it was measured ({', '.join(changed)}; serving code digest "
            f"{str((doc.get('serving_code') or {}).get('digest'))[:12]} then, "
            f"{serving_code()['digest'][:12]} now)"
        )
    parts_then = (doc.get("gate") or {}).get("parts") or {}
    changed_gate = sorted(
        n for n in set(parts_then) | set(gate.digest["parts"]) if parts_then.get(n) != gate.digest["parts"].get(n)
    )
    if changed_gate:
        reasons.append(f"the gate's own declarations changed since ({', '.join(changed_gate)})")
    versions = doc.get("versions") or {}
    for dist, key in (("mlx", "mlx"), ("mlx-lm", "mlx_lm")):
        then_v = versions.get(key)
        try:
            now_v = version(dist)
        except PackageNotFoundError:
            now_v = None
        if then_v and now_v and then_v != now_v:
            reasons.append(f"measured with {dist} {then_v}, installed here: {now_v}")
    return reasons


def _speed_problems(lim: Limit, speed: Mapping[str, Any]) -> list[str]:
    if lim.key == "weights":
        w = speed.get("weights") or {}
        return check_speed_goal("weights", lim.value, ratio=w.get("ratio"), lower=None, upper=None, where="(weights)")
    contexts = speed.get("contexts") or {}
    if not contexts:
        return [f"{lim.test}: {lim.assertion}({lim.key}={lim.value:g}): the calibration measured no speed"]
    if lim.at == "all":
        chosen = sorted(contexts, key=int)
    elif isinstance(lim.at, int):
        chosen = [str(lim.at)] if str(lim.at) in contexts else []
        if not chosen:
            return [
                f"{lim.key}={lim.value:g} at={lim.at}: the calibration did not measure that context "
                f"(it has {', '.join(sorted(contexts, key=int))})"
            ]
    else:
        chosen = [max(contexts, key=int)]
    problems = []
    for ctx in chosen:
        row = contexts[ctx]
        if lim.key == "kv":
            est = {"ratio": (row.get("kv") or {}).get("ratio")}
        else:
            est = row.get("peak" if lim.key == "memory" else lim.key) or {}
        problems.extend(
            check_speed_goal(
                lim.key,
                lim.value,
                ratio=est.get("ratio"),
                lower=est.get("lower"),
                upper=est.get("upper"),
                where=f"@{ctx} tokens",
            )
        )
    return problems


def _known_bad_problems(doc: Mapping[str, Any], gate: GateSource, model: str | None = None) -> list[str]:
    known_bad = doc.get("known_bad")
    kl_limits = gate.limits_of(kl=True, model=model)
    if not isinstance(known_bad, Mapping) or not kl_limits or not gate.declares_known_bad:
        return []
    drift = known_bad.get("drift")
    if known_bad.get("non_finite"):
        return []  # NaN or inf logits: the gate goes red on them
    if not isinstance(drift, Mapping):
        if not known_bad.get("declared"):
            return [
                "KNOWN_BAD: the calibration was measured before the gate declared it and holds no measurement of it"
            ]
        return [f"KNOWN_BAD = {known_bad_text(known_bad.get('value'))}: the calibration holds no measurement of it"]
    verdict, why = known_bad_verdict(drift, kl_limits)
    if verdict == "fail":
        return []
    return [
        f"KNOWN_BAD = {known_bad_text(known_bad.get('value'))} is not shown to fail the gate's KL limits ({verdict}: "
        f"{'; '.join(why)}): limits that pass a broken variant may pass a broken kernel"
    ]
