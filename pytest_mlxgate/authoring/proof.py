"""Limits shown on the model they judge: every verdict says where its limits come from (`limits_from`).

A gate's limits were sized on one model on one backend, and its calibration file shows there that
they sit above the noise and fail the module's `KNOWN_BAD`. On any other model or backend those
numbers say nothing by themselves: a less sensitive model lets a broken lever through, a more
sensitive one fails a good lever on its own noise. So where no calibration file of the judged model
on this backend covers a gate module (`covering_file`), the run first shows there what the file
would have shown (`Proof`, once per module, cached beside the reference):

- the A/A floor (the reference against itself with another prefill chunk): a KL limit below
  `FLOOR_FACTOR` x this model's floor makes its check *inconclusive*, never a fail or a pass by noise;
- the known-bad variant's drift: when it passes every limit of a KL assertion here, that gate is an
  *error* naming the known-bad, its figures and the command that calibrates this model; when it is not
  shown to fail them, the gate can at best be inconclusive.

A module with no KNOWN_BAD (or a two-model lever, which has none) is *unproven*: said in its verdict
line, an error under --mlx-require-proof. Capability and speed limits are not proven by a known-bad:
their records say whether a calibration covers them and what kind of limit they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..common.format import figure
from ..kl.assertions import kl_checks
from ..kl.oracle import RELATIVE, inside_precision
from ..models.device import backend_of
from ..results.verdicts import ERROR, overall_verdict
from ..results.wire import Check, LimitsFrom
from ..session.paired import Paired
from ..verdicts.calibration import FLOOR_FACTOR
from ..verdicts.conclude import Conclusion
from .calibration_file import KL_KEYS, calibration_path, read_calibration
from .coverage import (
    covering_file,
    covers_precision,
    dtype_option,
    inside_floor,
    limits_not_shown,
    model_label,
    model_of,
    not_this_modules,
)
from .proof_measure import PROOF_FORMAT, Proof, cached_or_measured, named

__all__ = [
    "PROOF_FORMAT",
    "LimitsProof",
    "Proof",
    "covering_file",
    "covers_precision",
    "inside_floor",
    "inside_precision",
    "limits_proof",
]

#: What a record's note says of each kind of limit: whether it means the same on every model.
NOTES = {
    "capability": "a drop margin in points: the same on every model",
    "speed": "a speed or memory goal: sized on the model and machine it was calibrated on",
}


@dataclass
class LimitsProof:
    """One gate module's `limits_from`: made once per module by `limits_proof`, asked by every assertion
    through `vouch` (the `paired` fixture's hook in `verdicts.conclude`)."""

    paired: Paired  # the module's first `paired`: its arms, item and re-run
    model: str
    backend: str
    file: Path | None  # the covering calibration file (None: none covers)
    shown_file: str  # the file as the run names it (covering, or where --mlx-calibrate would write it)
    calibrate_command: str
    prove: bool  # --mlx-prove auto: measure a proof on first use where no file covers the limits
    require: bool  # --mlx-require-proof
    known_bad: object | None
    unprovable: str | None = None  # why no known-bad can speak for these limits (None: one can)
    own_entry: bool = True  # the model's limits go in a `models=` entry (the embedded model's are the gate's own)
    dtype: str | None = None  # the precision the judged model computes in (`--mlx-dtype`)
    calibration: Mapping[str, Any] | None = None  # the covering file as read
    not_this_modules: str | None = None  # why that file was not measured on this module (None: it was)
    _proof: Proof | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """The judged model as messages name it: `smollm2-135m (cpu, bfloat16)`."""
        return f"{self.model} ({self.backend}, {self.dtype})" if self.dtype else f"{self.model} ({self.backend})"

    def vouch(self, conclusion: Conclusion) -> Conclusion:
        """`conclusion` with its `limits_from`, its KL checks read against this model's floor and its
        verdict settled by the known-bad (`refuted`: error; not shown to fail: at best inconclusive)."""
        if conclusion.mode not in ("gate", "capability", "speed"):
            return conclusion  # A/A, a score, an error: no limits of their own to prove
        entry = self._base(conclusion)
        if conclusion.mode != "gate":
            entry["note"] = NOTES[conclusion.mode]
            if self.file is None:
                entry["why"] = "not calibrated"
            return _with(conclusion, entry)
        if self.file is not None:
            stale = self._stale_for(conclusion)
            if stale is None:
                return _with(conclusion, entry)
            entry["stale_file"] = stale  # the status the proof below settles (or --mlx-prove off's unproven)
        if not self.prove:
            entry |= {"status": "unproven", "why": "--mlx-prove off"}
            return self._required(conclusion, entry)
        proof = self.proof()
        checks = list(conclusion.checks)
        bounds = {str(k): float(v) for k, v in conclusion.bounds.items() if k in KL_KEYS}
        entry["floors"] = {k: float(v) for k, v in proof.floors.items() if k in bounds}
        noisy = inside_floor(bounds, proof.floors)
        if noisy:
            entry["inside_floor"] = noisy
            checks = [_at_floor(c, self.model, proof.floors) if c["key"] in noisy else c for c in checks]
        rounding = inside_precision(bounds, proof.precision or {})
        by_oracle = any(c["key"] == RELATIVE for c in checks)  # the assertion also judges against the oracle
        if rounding:
            entry["precision_floor"] = {k: float(v) for k, v in (proof.precision or {}).items() if k in bounds}
            entry["inside_precision"] = rounding
            if by_oracle:  # limits that cannot speak in this precision leave the verdict to the oracle's rules
                entry["set_aside"] = True
                checks = [c for c in checks if c["key"] not in rounding]
                bounds = {k: v for k, v in bounds.items() if k not in rounding}
            else:
                checks = [self._at_precision(c, proof.precision or {}) if c["key"] in rounding else c for c in checks]
        verdict = overall_verdict(checks)
        if self.unprovable is not None:
            entry |= {"status": "unproven", "why": self.unprovable}
            return self._required(replace(conclusion, checks=checks, verdict=verdict), entry)
        bad = named(self.paired, self.known_bad)
        if proof.error is not None:
            entry |= {"status": "unproven", "why": f"known-bad {bad} could not be measured: {proof.error}"}
            return _with(replace(conclusion, checks=checks, verdict=ERROR), entry, error=self._unmeasured(bad, proof))
        if proof.non_finite is not None:
            entry |= {"status": "proven", "known_bad": {"value": bad, "verdict": "fail", "figures": ["non-finite"]}}
            return _with(replace(conclusion, checks=checks, verdict=verdict), entry)
        bad_checks = kl_checks(proof.known_bad_stats or {}, bounds) + proof.oracle_checks(conclusion.checks)
        bad_verdict = overall_verdict(bad_checks) if bad_checks else "inconclusive"  # nothing judged: nothing shown
        figures = [_figure(c) for c in bad_checks]
        entry["known_bad"] = {"value": bad, "verdict": bad_verdict, "figures": figures}
        if bad_verdict == "fail" and rounding and not by_oracle:
            entry |= {"status": "unproven", "why": self._rounding_why(rounding, proof.precision or {})}
            return self._required(replace(conclusion, checks=checks, verdict=verdict), entry)
        if bad_verdict == "fail":
            entry["status"] = "proven"
            return _with(replace(conclusion, checks=checks, verdict=verdict), entry)
        if bad_verdict == "pass":
            entry |= {"status": "refuted", "why": f"known-bad {bad} passes them ({'; '.join(figures)})"}
            return _with(
                replace(conclusion, checks=checks, verdict=ERROR), entry, error=self._refuted(bad, figures, noisy)
            )
        entry |= {
            "status": "unproven",
            "why": f"known-bad {bad} not shown to fail them ({'; '.join(figures)}): more prompts would tell",
        }
        if verdict == "pass":
            verdict = "inconclusive"  # limits not shown to catch a broken variant here: a pass shows nothing
        return self._required(replace(conclusion, checks=checks, verdict=verdict), entry)

    def _stale_for(self, conclusion: Conclusion) -> str | None:
        """Why the covering file does not show these limits (None: it does): not this module's file, or the
        limits no longer fail the known-bad figures it recorded or sit inside its floor (`coverage`)."""
        if self.not_this_modules is not None:
            return self.not_this_modules
        bounds = {str(k): float(v) for k, v in conclusion.bounds.items() if k in KL_KEYS}
        return limits_not_shown(self.calibration or {}, bounds, known_bad=self.known_bad is not None)

    def _at_precision(self, check: Check, precision: Mapping[str, float]) -> Check:
        """A check whose limit sits below the plain path's own distance from float32: a fail there is the
        precision's rounding, not the kernel's, so it reads inconclusive; a pass stands."""
        if check["verdict"] == "pass":
            return check
        method = (
            f"limit inside {self.dtype}'s own distance from float32 on {self.model} (the plain path's "
            f"{check['metric']} {figure(precision.get(check['key']))}): judge it with relative= against the oracle"
        )
        return Check(**{**check, "verdict": "inconclusive", "n_needed": None, "method": method})

    def _rounding_why(self, keys: Sequence[str], precision: Mapping[str, float]) -> str:
        shown = ", ".join(f"{k} {figure(precision.get(k))}" for k in keys)
        return (
            f"{', '.join(keys)} below {self.dtype}'s own distance from float32 ({shown}, the plain path's): such "
            "limits read rounding, so the known-bad failing them proves nothing; use relative= (the float32 oracle)"
        )

    def proof(self) -> Proof:
        """The A/A floor and the known-bad's drift on this model (once per module; cached beside the reference)."""
        if self._proof is None:
            self._proof = cached_or_measured(self.paired, self.known_bad if self.unprovable is None else None)
        return self._proof

    def _base(self, conclusion: Conclusion) -> LimitsFrom:
        entry = LimitsFrom(
            status="calibrated" if self.file is not None else "unproven",
            model=self.model,
            backend=self.backend,
            file=self.shown_file,
        )
        if self.dtype:
            entry["dtype"] = self.dtype
        models_entry = conclusion.fields.get("limits_for")
        if isinstance(models_entry, str):
            entry["models_entry"] = models_entry
        return entry

    def _required(self, conclusion: Conclusion, entry: LimitsFrom) -> Conclusion:
        """An unproven gate: a note in its verdict line, an error under --mlx-require-proof."""
        if not self.require or conclusion.verdict == ERROR:
            return _with(conclusion, entry)
        message = (
            f"limits unproven on {self.where}: {entry.get('why')}; --mlx-require-proof makes "
            f"this an error.\n  {self._calibrate_hint()}, or declare KNOWN_BAD in the module (a variant with a "
            "bug its limits must fail)"
        )
        return _with(replace(conclusion, verdict=ERROR), entry, error=message)

    def _refuted(self, bad: str, figures: Sequence[str], noisy: Sequence[str]) -> str:
        lines = [
            f"limits do not catch the known-bad on {self.where}: {self.paired.nodeid}",
            f"  KNOWN_BAD = {bad} passes every limit here:",
            *(f"    {f}" for f in figures),
            f"  limits that pass a broken variant on {self.model} would pass a broken kernel: they were sized on "
            "another model or backend",
            f"  {self._calibrate_hint()}",
        ]
        if noisy:
            lines.append(f"  ({', '.join(noisy)}: inside {self.model}'s noise floor as well)")
        lines.append(f"  re-run: {self.paired.rerun}")
        return "\n".join(lines)

    def _unmeasured(self, bad: str, proof: Proof) -> str:
        return "\n".join(
            [
                f"the limits proof on {self.where} could not measure KNOWN_BAD = {bad}: {proof.error}",
                f"  {self.paired.nodeid}: the proof runs the module's known-bad variant to show its limits fail it "
                "here; a known-bad must run and make the model worse (a kernel with a bug), not stop",
                f"  fix KNOWN_BAD (or the kernel it names), or {self._calibrate_hint()}",
                f"  re-run: {self.paired.rerun}",
            ]
        )

    def _calibrate_hint(self) -> str:
        own = (
            f"give the limits it suggests as models={{{self.model!r}: {{...}}}}"
            if self.own_entry
            else "paste the limits it suggests into the gate"
        )
        command = self.calibrate_command
        return f"make this model's limits its own: {command} (writes {self.shown_file}; then {own} and commit both)"


def limits_proof(paired: Paired, *, prove: str, require: bool) -> LimitsProof:
    """The module's LimitsProof: which file covers it, whether a proof will run, and with what known-bad."""
    run, item = paired.run, paired.item
    module = Path(item.path)
    candidate = run.candidate.describe()
    described = dict(candidate)
    backend = backend_of(run.machine.get("device", "cpu"))
    covering = covering_file(module, described, backend, run.machine)
    if covering is not None and run.lever.two_models and run.reference is not None:
        ref = dict(run.reference.describe())
        doc_ref = ((read_calibration(covering) or {}).get("model") or {}).get("reference") or {}
        if doc_ref.get("commit") != ref.get("commit"):
            covering = None  # the file was measured against another reference model
    calibration = read_calibration(covering) if covering is not None else None
    path = covering or calibration_path(module, model_of(described), candidate.get("dtype"))
    root = item.config.rootpath
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    shown_module = paired.nodeid.split("::")[0]
    name = described.get("name") or described.get("repo_id")
    known_bad = getattr(item.module, "KNOWN_BAD", None) if getattr(item, "module", None) is not None else None
    unprovable = None
    if run.lever.kind == "model":
        unprovable = "a two-model lever has no known-bad value"
    elif known_bad is None:
        unprovable = "no known-bad"
    return LimitsProof(
        paired=paired,
        model=model_label(described),
        backend=backend,
        dtype=str(described.get("dtype") or "") or None,
        file=covering,
        shown_file=shown,
        calibrate_command=f"pytest {shown_module} --mlx-candidate {name}{dtype_option(described)} --mlx-calibrate",
        prove=prove == "auto",
        require=require,
        known_bad=known_bad,
        unprovable=unprovable,
        own_entry=model_of(described) is not None,
        calibration=calibration,
        not_this_modules=not_this_modules(calibration, module, run.lever.name) if calibration is not None else None,
    )


def _with(conclusion: Conclusion, entry: LimitsFrom, *, error: str | None = None) -> Conclusion:
    fields: dict[str, Any] = {**conclusion.fields, "limits_from": dict(entry)}
    if error is not None:
        fields["error"] = {"type": "LimitsNotShown", "message": error, "phase": "call"}
    return replace(conclusion, fields=fields)


def _at_floor(check: Check, model: str, floors: Mapping[str, float]) -> Check:
    """A check whose limit sits inside the model's noise floor: a fail there may be noise, so it reads
    inconclusive; a pass (the bound inside even that limit) stands."""
    if check["verdict"] == "pass":
        return check
    floor = floors.get(check["key"])
    method = f"limit inside {model}'s A/A noise floor ({figure(floor)}; the rule asks {FLOOR_FACTOR:g}x it)"
    return Check(**{**check, "verdict": "inconclusive", "n_needed": None, "method": method})


def _figure(check: Check) -> str:
    """A known-bad's check as its figure: the bound that decided it (a fail: the end shown beyond the limit)."""
    lower, upper, limit = figure(check.get("lower")), figure(check.get("upper")), figure(check["limit"])
    name, verdict, at_most = check["metric"], check["verdict"], check["direction"] == "max"
    if verdict == "inconclusive":
        return f"{name} 95% interval [{lower}, {upper}] straddles limit {limit}"
    if verdict == "pass":
        return (
            f"{name} 95% upper bound {upper} ≤ limit {limit}"
            if at_most
            else f"{name} 95% lower bound {lower} ≥ limit {limit}"
        )
    return (
        f"{name} 95% lower bound {lower} > limit {limit}"
        if at_most
        else f"{name} 95% upper bound {upper} < limit {limit}"
    )
