"""A limits proof's measurement (`Proof`): the judged model's A/A floor and its KNOWN_BAD's drift, measured
once per module where no calibration file covers it, and kept beside the reference (`cached_or_measured`).

Whatever the known-bad arm raises (a kernel that crashes, a lever that cannot be built) is a `Proof.error`
naming KNOWN_BAD: the gate reads error with the fix, never a traceback and never a pass. An entry read back
is checked as a calibration file is (`entry_problems`): its seal vouches only that the bytes are the ones
written (no truncation, no damage), not who wrote them, so the figures are read as figures, checked for
shape and range, and every verdict is derived again from them at each run (`LimitsProof.vouch`); no stored
verdict is believed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..common.format import figure
from ..common.keys import canonical_json, key_digest
from ..errors import MlxgateError, NonFiniteLogitsError
from ..kl.measure import chunked_floor, reference_key
from ..kl.oracle import RELATIVE, OracleDistances, relative_check
from ..kl.site import SITE, SITE_FLOAT32, SiteCheck
from ..levers.lever import Lever
from ..results.wire import Check
from ..session.paired import Paired
from ..session.phases import PhaseClock
from ..stats.kl_stats import QUANTILES, KLStats
from ..verdicts.calibration import AGREEMENT_METRICS
from .known_bad import is_whole_lever, known_bad_lever, known_bad_paired, known_bad_shown
from .precision_floor import precision_floor
from .serving_code import serving_code

__all__ = ["PROOF_FORMAT", "Proof", "cached_or_measured", "entry_problems", "named"]

#: Bump when what a cached proof holds changes meaning: an older entry is then a miss.
PROOF_FORMAT = 2


@dataclass(frozen=True)
class Proof:
    """What a proof run measured on the judged model: its A/A floor and its known-bad's KL statistics."""

    floors: Mapping[str, float]
    known_bad: object | None = None  # the module's KNOWN_BAD (None: none declared)
    known_bad_stats: Mapping[str, Any] | None = None  # KLStats.to_json() of the known-bad arm
    non_finite: str | None = None  # the known-bad gave NaN or inf logits: caught whatever the limits
    error: str | None = None  # the known-bad could not be measured
    source: str = "measured"  # or "cache"
    # the plain path's own distance from the float32 oracle (point values, a low-precision run only)
    precision: Mapping[str, float] | None = None
    known_bad_oracle: Mapping[str, Any] | None = None  # its OracleDistances.state(), where the gate asks relative=
    known_bad_site: Mapping[str, Any] | None = None  # its SiteCheck.state(), where its lever has a site

    def to_json(self) -> dict[str, Any]:
        return {
            "floors": dict(self.floors),
            "known_bad_stats": dict(self.known_bad_stats) if self.known_bad_stats is not None else None,
            "non_finite": self.non_finite,
            "precision": dict(self.precision) if self.precision is not None else None,
            "known_bad_oracle": dict(self.known_bad_oracle) if self.known_bad_oracle is not None else None,
            "known_bad_site": dict(self.known_bad_site) if self.known_bad_site is not None else None,
        }

    def oracle_checks(self, checks: Sequence[Check]) -> list[Check]:
        """The known-bad's checks of the gate's oracle rules (`relative=`: the model's, and the site's two),
        each at the limit (and ratio) the gate's own check used; none where the proof holds no such measurement."""
        distances = OracleDistances.from_state(self.known_bad_oracle) if self.known_bad_oracle is not None else None
        site = SiteCheck.from_state(self.known_bad_site) if self.known_bad_site is not None else None
        out: list[Check | None] = []
        for made in checks:
            ratio = float((made.get("oracle") or {}).get("relative") or 0.0)
            if made["key"] == RELATIVE and distances is not None and ratio:
                out.append(relative_check(distances, ratio, made["limit"]))
            elif made["key"] == SITE and site is not None and ratio:
                out.append(site.check(ratio, made["limit"]))
            elif made["key"] == SITE_FLOAT32 and site is not None:  # its tolerance is its limit: no ratio
                out.append(site.check_float32(made["limit"]))
        return [c for c in out if c is not None]


def named(paired: Paired, bad: object) -> str:
    """`_shown`, a whole lever by what it switches (as built on this module, when it can be)."""
    try:
        lever = known_bad_lever(paired, bad) if is_whole_lever(bad) else None
    except MlxgateError:
        lever = None
    return _shown(bad, lever)


def _shown(bad: object, lever: Lever | None = None) -> str:
    """The known-bad as a verdict line names it: a whole lever as the calibration file does, a value as JSON."""
    if is_whole_lever(bad):
        return known_bad_shown(bad, lever)
    try:
        return json.dumps(bad, sort_keys=True)
    except TypeError:
        return repr(bad)


# -- measuring, and the cache beside the reference --------------------------------------------------


def _key(paired: Paired, known_bad: object | None) -> dict[str, Any]:
    """What a proof depends on: everything the reference arm does (model commit, machine, sequences,
    sizes, the reference lever), the known-bad as declared, and the serving code."""
    run = paired.run
    return {
        "proof": PROOF_FORMAT,
        "reference": reference_key(
            model=run.reference_model(),
            lever=run.lever,
            shape=run.shape,
            sequences_digest=run.sequences_digest,
            machine=run.machine,
        ),
        "candidate": run.candidate.describe()["commit"],
        "known_bad": _known_bad_key(paired, known_bad),
        "serving_code": serving_code()["digest"],
    }


def _known_bad_key(paired: Paired, known_bad: object | None) -> object:
    """Both arms of the known-bad's lever as a cache key names them (a callable by its source's digest, so
    an edited known-bad kernel is measured again); one that cannot be built is never stored (it errors)."""
    if known_bad is None:
        return None
    try:
        lever = known_bad_lever(paired, known_bad)
    except MlxgateError:
        return _shown(known_bad)
    return {"reference": lever.key("reference"), "candidate": lever.key("candidate")}


def cached_or_measured(paired: Paired, known_bad: object | None) -> Proof:
    """The proof from the cache beside the reference, else measured (under the entry's lock, so two xdist
    workers whose modules share it measure it once) and stored."""
    run = paired.run
    if run.cache is None:
        found = _measure(paired, known_bad)
    else:
        key = _key(paired, known_bad)
        hit = _load(run.cache, key)
        if hit is None:
            with run.cache.computing(key_digest(key)):
                hit = _load(run.cache, key)  # another worker may have stored it while this one waited
                if hit is None:
                    found = _measure(paired, known_bad)
                    if found.error is None:
                        _store(run.cache, key, found)
        if hit is not None:
            run.say(f"limits proof: from the reference cache ({_proof_line(hit)})")
            return replace(hit, known_bad=known_bad, source="cache")
    run.say(f"limits proof: {_proof_line(found)}")
    return found


def _measure(paired: Paired, known_bad: object | None) -> Proof:
    """The A/A arm (the reference against itself, another prefill chunk) and the known-bad arm."""
    run = paired.run
    run.say("limits proof: no calibration covers this model here; the A/A floor first")
    with run.phases.timing("proof"):
        _, floors = chunked_floor(
            reference=run.reference_model(),
            lever=run.lever,
            shape=run.shape,
            sequences=run.sequences,
            sequences_digest=run.sequences_digest,
            machine=run.machine,
            cache=run.cache,
            counters=type(run.counters)(),
            say=run.say,
            watch=run.watch,
        )
        precision = precision_floor(run)
        if known_bad is None:
            return Proof(floors=floors, precision=precision)
        run.say(f"limits proof: the known-bad variant KNOWN_BAD = {named(paired, known_bad)}")
        try:
            bad = known_bad_paired(paired, known_bad)
            bad.run.phases = PhaseClock()  # its arms are this proof's time, charged once, here
            measured = bad.kl()
        except NonFiniteLogitsError as e:
            return Proof(floors=floors, known_bad=known_bad, non_finite=str(e), precision=precision)
        except MlxgateError as e:
            return Proof(floors=floors, known_bad=known_bad, error=str(e), precision=precision)
        except Exception as e:  # noqa: BLE001 - whatever a user's known-bad kernel raises is this gate's error
            raised = f"it raised {type(e).__name__}: {e}".rstrip(": ")
            return Proof(floors=floors, known_bad=known_bad, error=raised, precision=precision)
    return Proof(
        floors=floors,
        known_bad=known_bad,
        known_bad_stats=measured.stats.to_json(),
        precision=precision,
        known_bad_oracle=measured.oracle.state() if measured.oracle is not None else None,
        known_bad_site=measured.site.state() if measured.site is not None else None,
    )


def _proof_line(proof: Proof) -> str:
    mean = proof.floors.get("mean")
    text = f"A/A mean KL floor {figure(mean)}"
    if proof.known_bad_stats is not None:
        text += f"; known-bad mean KL {figure(proof.known_bad_stats.get('mean'))}"
    elif proof.non_finite is not None:
        text += "; known-bad gives non-finite logits"
    return text


def _path(cache: Any, key: Mapping[str, Any]) -> Path:
    return Path(cache.directory) / "proof" / f"{key_digest(key)}.json"


def _load(cache: Any, key: Mapping[str, Any]) -> Proof | None:
    def decode(payload: bytes) -> Proof | None:
        entry = json.loads(payload)
        if entry.get("key") != json.loads(canonical_json(key)):
            return None
        data = entry["data"]
        wrong = entry_problems(data)
        if wrong:
            raise ValueError(f"not a proof this code can trust ({'; '.join(wrong)})")  # measured again
        precision = data.get("precision")
        return Proof(
            floors={str(k): float(v) for k, v in data["floors"].items()},
            known_bad_stats=data.get("known_bad_stats"),
            non_finite=data.get("non_finite"),
            precision={str(k): float(v) for k, v in precision.items()} if precision is not None else None,
            known_bad_oracle=data.get("known_bad_oracle"),
            known_bad_site=data.get("known_bad_site"),
        )

    loaded: Proof | None = cache.files.load(_path(cache, key), decode)
    return loaded


def entry_problems(data: Any) -> list[str]:
    """What in a stored proof's figures is not what `_measure` writes, each named (empty: it reads): floors and
    precision that are not finite numbers in their range, known-bad statistics that do not read back as
    `KLStats` or whose figures contradict themselves (a mean outside its interval, a KL below 0, an agreement
    rate outside [0, 1]), oracle and site states that do not read back."""
    if not isinstance(data, Mapping):
        return [f"data is {type(data).__name__}, not an object"]
    out: list[str] = []
    for part in ("floors", "precision"):
        figures = data.get(part)
        if figures is None and part == "precision":
            continue
        if not isinstance(figures, Mapping):
            out.append(f"{part} is {type(figures).__name__}, not an object")
            continue
        out.extend(f"{part}.{k} {v!r} is no figure in range" for k, v in figures.items() if not _in_range(k, v))
    if data.get("non_finite") is not None and not isinstance(data.get("non_finite"), str):
        out.append("non_finite is not text")
    stats = data.get("known_bad_stats")
    if stats is not None:
        out.extend(_stats_problems(stats))
    readers: tuple[tuple[Any, str], ...] = ((OracleDistances, "known_bad_oracle"), (SiteCheck, "known_bad_site"))
    for reader, name in readers:
        if data.get(name) is not None:
            try:
                reader.from_state(data[name])
            except (ValueError, TypeError, KeyError) as e:
                out.append(f"{name} does not read back ({e})")
    return out


def _stats_problems(stats: Any) -> list[str]:
    """Why a known-bad's `KLStats.to_json()` cannot be judged (empty: it can)."""
    try:
        read = KLStats.from_json(stats)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return [f"known_bad_stats do not read back as KL statistics ({type(e).__name__}: {e})"]
    out = []
    if read.n_prompts < 1:
        out.append(f"known_bad_stats.n_prompts {read.n_prompts} < 1")
    figures = {"mean": (read.mean, read.mean_ci), "top1": (read.top1, read.top1_ci)}
    figures |= {"same_top": (read.same_top, read.same_top_ci)}
    figures |= {q: (getattr(read, q), read.quantile_ci[q]) for q in QUANTILES}
    for name, (value, (lower, upper)) in figures.items():
        if stats.get(name) is None and name != "mean":
            continue  # not measured (too few tokens for a quantile): nothing to judge it by
        if not _in_range(name, value):
            out.append(f"known_bad_stats.{name} {value!r} is no figure in range")
        elif not lower <= value <= upper:
            out.append(f"known_bad_stats.{name} {value!r} outside its own interval [{lower}, {upper}]")
    return out


def _in_range(key: object, value: object) -> bool:
    """A finite number, >= 0, and at most 1 for an agreement rate (top1, same_top)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return 0 <= value <= 1 if key in AGREEMENT_METRICS else value >= 0


def _store(cache: Any, key: Mapping[str, Any], proof: Proof) -> None:
    payload = json.dumps({"key": json.loads(canonical_json(key)), "data": proof.to_json()}, allow_nan=False)
    try:
        cache.files.write(_path(cache, key), payload.encode())
    except (OSError, ValueError):
        pass  # a by-product: the next run measures it again
