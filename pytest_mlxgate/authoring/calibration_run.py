"""The worker side of a gate's calibration file: written where `--mlx-calibrate` measured, read before `--mlx-aa`.

`keep_calibration` runs once per module, in the process that measured it (an xdist worker owns its
module, so no two processes write one file): it measures the module's `KNOWN_BAD` beside the lever,
then writes `calibration/<stem>.json` (`authoring.calibration_file`; on another model than the
embedded one `calibration/<model>/<stem>.json`, so one model's calibration never replaces another's).
A measurement that is not the gate's (sizes, lever or prompts from the command line), or that has
nothing to check limits against, leaves the file there as it was and says so; a known-bad variant
that cannot be measured fails the calibration. `check_before_aa` is `--mlx-aa`'s part: the test's
limits against the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ..config.names import looks_like_path, split_revision
from ..errors import CalibrationError, MlxgateError, NonFiniteLogitsError, StaleCalibrationWarning
from ..results.git import git_state
from ..session.paired import Paired
from ..verdicts.calibration import CHECK_RULE
from .calibration_check import known_bad_verdict, module_findings
from .calibration_file import (
    FORMAT,
    GateSource,
    calibration_model,
    calibration_path,
    compact_drift,
    machine_versions,
    unusable,
    write_calibration,
)
from .known_bad import is_whole_lever, known_bad_paired, known_bad_shown
from .serving_code import serving_code

__all__ = ["calibration_document", "check_before_aa", "keep_calibration"]

#: Options that make a measurement another than the gate's own: such a run suggests, but writes no file.
_NOT_THE_GATE = (
    "mlx_kl_prompts",
    "mlx_kl_tokens",
    "mlx_kl_decode",
    "mlx_speed_contexts",
    "mlx_speed_decode",
    "mlx_speed_reps",
    "mlx_lever",
    "mlx_ref_value",
    "mlx_cand_value",
    "mlx_prompts_file",
)


def keep_calibration(paired: Paired, calibration: dict[str, Any]) -> None:
    """Measure the module's KNOWN_BAD, write its calibration file, and note both in `calibration`
    (the terminal's calibration block shows them). CalibrationError when the known-bad variant cannot
    be measured: the file on disk is then left as it was."""
    item = paired.item
    module = Path(item.path)
    gate = GateSource.read(module)
    model = _model_of(paired)
    known_bad = _measure_known_bad(paired, gate, module, model)
    doc = calibration_document(paired, calibration, gate, known_bad)
    path = calibration_path(module, model, _dtype_of(paired))
    shown = _shown(path, item.config.rootpath)
    why_not = _not_the_gate(item.config) or unusable(doc)
    if why_not is None:
        write_calibration(path, doc)
        calibration["file"] = {"path": shown, "written": True}
    else:
        kept = "the one there is kept" if path.exists() else "none is there yet"
        calibration["file"] = {"path": shown, "written": False, "why": f"{why_not} ({kept})"}
    calibration["known_bad_result"] = doc["known_bad"]


def calibration_document(
    paired: Paired, calibration: Mapping[str, Any], gate: GateSource, known_bad: dict[str, Any] | None
) -> dict[str, Any]:
    """The calibration file's content, from the measurement `PairedRun.calibration` made."""
    run = paired.run
    module = str(calibration["module"])
    commit, dirty = git_state(Path(paired.item.path).parent)
    machine, versions = machine_versions(run.machine)
    candidate = run.candidate.describe()
    model: dict[str, Any] = {
        "name": candidate.get("name"),
        "repo": candidate.get("repo_id"),
        "commit": candidate.get("commit"),
        "dtype": candidate.get("dtype"),
    }
    if run.lever.two_models and run.reference is not None:
        ref = run.reference.describe()
        model["reference"] = {"name": ref.get("name"), "repo": ref.get("repo_id"), "commit": ref.get("commit")}
    suggested = calibration["suggested"]
    return {
        "calibration_format": FORMAT,
        "module": module,
        "command": f"pytest {module} --mlx-calibrate",
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "code": {"commit": commit, "dirty": dirty},
        "serving_code": serving_code(),
        "gate": gate.digest,
        "model": model,
        "machine": machine,
        "versions": versions,
        "lever": run.lever.to_json(),
        "shape": dict(calibration.get("shape") or {}),
        "aa_floor": {**dict(calibration["floors"]), "chunk": calibration.get("aa_chunk")},
        "drift": compact_drift(calibration["kl"]),
        "known_bad": known_bad if known_bad is not None else {"declared": False},
        "speed": _compact_speed(calibration.get("speed") or {}),
        "limits": _limits(gate, _model_of(paired)),
        "suggested": {
            "kl_limits": suggested.get("kl_limits"),
            "speed_goals": suggested.get("speed_goals"),
            "code": suggested.get("code"),
            "notes": suggested.get("notes"),
            "breaks": suggested.get("breaks"),
            "accepted": suggested.get("accepted"),
        },
        "check_rule": CHECK_RULE,
    }


def _model_of(paired: Paired) -> str | None:
    """The per-model calibration this measurement belongs to (None: the embedded model's)."""
    ref = paired.run.candidate.describe()
    return calibration_model(ref.get("name"), ref.get("repo_id"))


def _limits(gate: GateSource, model: str | None) -> dict[str, Any]:
    """The gate's limits on the calibrated model when it was calibrated, by test and assertion (for the
    reader; the check reads the gate's source as it is now)."""
    out: dict[str, dict[str, Any]] = {}
    for lim in gate.limits_of(model=model):
        entry = out.setdefault(f"{lim.test}: {lim.assertion}", {})
        entry[lim.key] = lim.value
        if lim.at is not None:
            entry["at"] = lim.at
    return out


def _measure_known_bad(paired: Paired, gate: GateSource, module: Path, model: str | None) -> dict[str, Any] | None:
    """The module's KNOWN_BAD run through the same arms as the lever (None: none declared). Its `value`
    is KNOWN_BAD as declared, a whole lever as its `to_json()`."""
    bad = getattr(paired.item.module, "KNOWN_BAD", None) if paired.item.module is not None else None
    if bad is None:
        return None
    shown = _shown(calibration_path(module, model, _dtype_of(paired)), paired.item.config.rootpath)
    try:
        bad_paired = known_bad_paired(paired, bad)
    except MlxgateError as e:
        raise _unmeasured(paired, known_bad_shown(bad), shown, e) from None
    lever = bad_paired.lever
    value = lever.to_json() if is_whole_lever(bad) else bad if isinstance(bad, (str, int, float, dict)) else repr(bad)
    entry: dict[str, Any] = {"declared": True, "value": value}
    paired.run.say(f"calibration: the known-bad variant KNOWN_BAD = {known_bad_shown(bad, lever)}")
    try:
        result = bad_paired.kl()
    except NonFiniteLogitsError as e:
        return {**entry, "non_finite": True, "message": str(e)}
    except MlxgateError as e:
        raise _unmeasured(paired, known_bad_shown(bad, lever), shown, e) from None
    entry["lever"] = result.lever.to_json()
    entry["drift"] = compact_drift(result.stats.to_json())
    limits = gate.limits_of(kl=True, model=model)
    verdict, why = known_bad_verdict(entry["drift"], limits) if limits else ("no limits", [])
    entry["verdict_when_measured"] = {"verdict": verdict, "limits": why}
    return entry


def _unmeasured(paired: Paired, bad: str, shown: str, error: MlxgateError) -> CalibrationError:
    return CalibrationError(
        f"{paired.nodeid.split('::')[0]}: the known-bad variant KNOWN_BAD = {bad} could not be measured, "
        f"so the calibration file was not written ({shown} is left as it was): {error}"
    )


def _compact_speed(speed: Mapping[str, Any]) -> dict[str, Any]:
    """The speed record as the file holds it: per context, both tokens/s ratios with their intervals,
    the arms' medians, peak memory and KV bytes; the weights' bytes; other processes' load."""
    if not speed:
        return {}
    contexts = {}
    for ctx, row in (speed.get("contexts") or {}).items():
        ref, cand = row.get("reference") or {}, row.get("candidate") or {}
        entry: dict[str, Any] = {}
        for key in ("prefill", "decode", "peak"):
            est = row.get(key)
            if isinstance(est, Mapping):
                lo, hi = (list(est.get("ratio_ci") or []) + [None, None])[:2]
                entry[key] = {"ratio": est.get("ratio"), "lower": lo, "upper": hi}
                if key != "peak":
                    entry[key] |= {"reference_tps": ref.get(f"{key}_tps"), "candidate_tps": cand.get(f"{key}_tps")}
        entry["kv"] = {
            "ratio": (row.get("kv") or {}).get("ratio"),
            "reference_bytes": ref.get("kv_bytes"),
            "candidate_bytes": cand.get("kv_bytes"),
        }
        contexts[str(ctx)] = entry
    w = speed.get("weights_bytes") or {}
    weights = dict(w)
    if w.get("reference") and w.get("candidate"):
        weights["ratio"] = w["candidate"] / w["reference"]
    return {
        "shape": speed.get("shape"),
        "contexts": contexts,
        "weights": weights,
        "memory_method": speed.get("memory_method"),
        "load_seen": speed.get("load_seen"),
    }


def _not_the_gate(config: pytest.Config) -> str | None:
    given = [f"--{name.replace('_', '-')}" for name in _NOT_THE_GATE if config.getoption(name, None) is not None]
    if not given:
        return None
    return (
        f"not written: {', '.join(given)} made this another measurement than the gate's own (a calibration "
        "file holds the gate as its module declares it)"
    )


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def check_before_aa(item: pytest.Item) -> None:
    """--mlx-aa: the test's limits against its module's calibration file (when it has one): fail the
    test when the file shows a limit wrong (`calibrate.CHECK_RULE`), warn when the file is stale."""
    __tracebackhide__ = True
    module = Path(item.path)
    shown = item.nodeid.split("::")[0]
    name = item.config.getoption("mlx_candidate", None)  # the model the run is on: its own calibration file
    repo = split_revision(name)[0] if isinstance(name, str) and "/" in name and not looks_like_path(name) else None
    model = calibration_model(name, repo) if isinstance(name, str) else None
    findings = module_findings(module, shown_as=shown, test=getattr(item, "originalname", item.name), model=model)
    if findings.missing:
        return  # a gate never calibrated: --mlx-aa checks its limits against the floor alone, as before
    if findings.stale:
        warnings.warn(StaleCalibrationWarning(findings.stale_text()), stacklevel=2)
    if findings.problems:
        pytest.fail(findings.problem_text(), pytrace=False)


def _dtype_of(paired: Paired) -> str | None:
    """The precision the candidate computed in (its calibration file is named by it where not float32)."""
    dtype = paired.run.candidate.describe().get("dtype")
    return dtype if isinstance(dtype, str) else None
