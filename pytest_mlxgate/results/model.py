"""A gate record, typed and immutable: parsed in one place, and written by its own `to_json`.

A record is JSON on the wire (`records.gate_record` makes it; it crosses processes as text and lands in
the JSON report, a JUnit property and the results DB). Every reader in `results/` takes it through
`parse_record` into a `Record` and reads attributes, never dict keys. `parse_record` first passes it
through the one `wire.migrate_record`, which turns any older shape into the current one (records
before `record_version`: checks with `bound`, `other_bound` and `passed`; capability tasks without
`flipped`), so a user's old DB rows and reports still read. The parse is tolerant: a field missing,
null, of the wrong type or not finite reads as None (a table shows a dash), never an exception.

`Record.to_json()` writes the wire form back: `parse_record(r.to_json()) == r`, and a record parsed from
the wire writes that wire again. Each part keeps the keys the read model does not type (a speed trial's
seconds, an A/A run's whole statistics, a capability item's tests) as written in `more`, and leaves out
again the typed keys it did not hold (`left_out`), so a record read and written again loses nothing.

Derived facts are computed in the read model, once: a speed measurement's longest context, a context's
KV ratio, a task's drop, a record's prompt count, the bound a check compared. Its parts live beside it
(`record_checks`, `record_kl`, `record_capability`, `record_speed`), and what readers need besides a
record (a results-DB row, the run facts, a JSON report) in `runs`. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from .fields import Flat, Interval, absent, integer, mapping, real, rest, sequence, text, written
from .record_capability import CapabilityScore, Task, parse_score, parse_task
from .record_checks import CheckResult, parse_check
from .record_kl import (
    AA,
    Attribution,
    KLProfile,
    Stats,
    parse_aa,
    parse_attribution,
    parse_profile,
    parse_stats,
)
from .record_oracle import Oracle, parse_oracle
from .record_server import ServerArm, parse_server
from .record_speed import Speed, parse_speed
from .wire import RECORD_VERSION, migrate_record

__all__ = [
    "ErrorInfo",
    "Interval",
    "LimitsFrom",
    "limits_from_words",
    "Lever",
    "ModelInfo",
    "Record",
    "Sizes",
    "parse_record",
]


@dataclass(frozen=True)
class ModelInfo(Flat):
    """Which model an arm ran (`wire.ModelRef`): its name as given and where that resolved to."""

    name: str | None = None
    repo_id: str | None = None
    commit: str | None = None
    pinned: str | None = None  # repo@commit
    dtype: str | None = None  # the precision its arms computed in
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    @property
    def label(self) -> str | None:
        """Its pinned id (repo@commit), else whatever names it."""
        return self.pinned or self.repo_id or self.name


@dataclass(frozen=True)
class LimitsFrom:
    """Where a gate's limits were shown to work on the model and backend it judged (`wire.LimitsFrom`)."""

    status: str  # wire.LIMIT_SOURCES: calibrated, proven, unproven, refuted
    model: str
    backend: str
    dtype: str | None = None  # the precision the judged model computed in (older records: not said)
    file: str | None = None
    stale_file: str | None = None  # why that file does not show these limits (`coverage.not_this_modules`, ...)
    models_entry: str | None = None
    why: str | None = None
    known_bad_value: Any = None  # the known-bad value, as written (JSON: a string, or a KV config)
    known_bad_figures: tuple[str, ...] = ()
    floors: Mapping[str, float] = field(default_factory=dict)
    inside_floor: tuple[str, ...] = ()
    note: str | None = None
    precision_floor: Mapping[str, float] = field(default_factory=dict)
    inside_precision: tuple[str, ...] = ()
    set_aside: bool = False  # those limits left the verdict to the oracle's rules (`relative=`)
    known_bad_more: Mapping[str, Any] = field(default_factory=dict)  # the known-bad's verdict..., as written
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`wire.LimitsFrom`, `authoring.proof` writes it)."""
        bad = {**self.known_bad_more, "value": self.known_bad_value, "figures": list(self.known_bad_figures)}
        typed = {
            "status": self.status,
            "model": self.model,
            "backend": self.backend,
            "dtype": self.dtype,
            "file": self.file,
            "stale_file": self.stale_file,
            "models_entry": self.models_entry,
            "why": self.why,
            "known_bad": bad,
            "floors": dict(self.floors),
            "inside_floor": list(self.inside_floor),
            "note": self.note,
            "precision_floor": dict(self.precision_floor),
            "inside_precision": list(self.inside_precision),
            "set_aside": self.set_aside,
        }
        return written(typed, self.left_out, self.more)

    @property
    def known_bad(self) -> str | None:
        """The known-bad value as text (one that is not a string: its JSON)."""
        return text(self.known_bad_value)

    @property
    def known_bad_verdict(self) -> str | None:
        """The known-bad's verdict against these limits (a proof's: "fail" is what proves them)."""
        return text(self.known_bad_more.get("verdict")) or None

    @property
    def shown(self) -> bool:
        """The limits were shown to catch a broken variant on this model and backend."""
        return self.status in ("calibrated", "proven")

    @property
    def words(self) -> str:
        """One line, the same in every report: where the limits come from and what that showed."""
        on = f"{self.model} ({self.backend}, {self.dtype})" if self.dtype else f"{self.model} ({self.backend})"
        own = f" (its models= entry {self.models_entry!r})" if self.models_entry else ""
        if self.status == "calibrated":
            text = f"limits{own} shown on {on} by {self.file or 'its calibration file'}"
        elif self.status == "proven" and self.set_aside and self.inside_precision:
            bad = f"known-bad {self.known_bad}" if self.known_bad else "its known-bad"
            aside = ", ".join(self.inside_precision)
            text = f"limits{own} but {aside} proven on {on}: {bad} fails them"
        elif self.status == "proven":
            bad = f"known-bad {self.known_bad}" if self.known_bad else "its known-bad"
            text = f"limits{own} proven on {on}: {bad} fails them"
        elif self.status == "refuted":
            text = f"limits{own} do not catch the known-bad on {on}: {self.why or 'it passes them'}"
        else:
            text = f"limits{own} unproven on {on}: {self.why or 'not calibrated'}"
        if self.stale_file:
            text += f"; {self.file or 'its calibration file'} does not show them: {self.stale_file}"
        if self.inside_floor:
            text += f"; {', '.join(self.inside_floor)} inside {self.model}'s noise floor (inconclusive)"
        if self.inside_precision:
            rounding = f"{self.dtype or 'its precision'}'s own rounding"
            kept = "set aside: the float32 oracle's rules judge" if self.set_aside else "inconclusive"
            text += f"; {', '.join(self.inside_precision)} inside {rounding} ({kept})"
        if self.note:
            text += f" · {self.note}"
        return text


@dataclass(frozen=True)
class Lever(Flat):
    """The lever of both arms, its values as text (a value that is not a string: its JSON)."""

    name: str | None = None
    kind: str | None = None
    target: str | None = None
    ref: str | None = None
    cand: str | None = None
    path: str | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class Sizes(Flat):
    prompts: int | None = None
    tokens: int | None = None
    decode: int | None = None
    chunk: int | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class ErrorInfo(Flat):
    """A gate that raised instead of deciding: the error's type, its message's first lines, the phase."""

    type: str | None = None
    message: str | None = None
    phase: str | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)


@dataclass(frozen=True)
class Record:
    """One gate's record, read. KL gates fill `stats`/`aa`/`tokens`/`kl_profile`; capability gates
    `tasks`/`skipped`; the run's Capability Score `capability_score`; speed (any gate) `speed`."""

    nodeid: str
    gate: str | None = None
    mode: str | None = None
    verdict: str | None = None
    time: str | None = None
    record_version: int = RECORD_VERSION  # of the record as read (1: written before record_version)
    candidate: ModelInfo | None = None
    reference_model: ModelInfo | None = None
    lever: Lever = Lever()
    path: str | None = None
    sizes: Sizes = Sizes()
    stats: Stats = Stats()
    limits_for: str | None = None  # the model whose own limits (`models=`) replaced the gate's
    limits_from: LimitsFrom | None = None  # where the limits were shown to work on this model and backend
    bounds: Mapping[str, Any] = field(default_factory=dict)  # the limits asked, by metric (a Budget: its JSON)
    checks: tuple[CheckResult, ...] = ()
    durations: Mapping[str, float] = field(default_factory=dict)  # seconds: total_s, and per arm where kept
    phases: Mapping[str, float] = field(default_factory=dict)  # this record's share of its module's work, s
    rerun: str | None = None
    reference_source: str | None = None
    forwards: Mapping[str, int | None] = field(default_factory=dict)  # forward passes per arm (KL gates)
    lever_calls_by_arm: Mapping[str, int | None] = field(default_factory=dict)  # a patch lever: its site's calls
    aa: AA | None = None
    tokens: Mapping[str, str] = field(default_factory=dict)
    kl_profile: KLProfile = KLProfile()
    attribution: Attribution | None = None  # where the drift comes from (--mlx-explain, or a failing KL gate)
    oracle: Oracle | None = None  # both arms against the float32 oracle (`assert_kl_below(relative=...)`)
    server: ServerArm | None = None  # the candidate served over HTTP (`--mlx-cand-server`): its KL is a lower bound
    tasks: Mapping[str, Task] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    capability_score: CapabilityScore | None = None
    speed: Speed | None = None
    error: ErrorInfo | None = None
    left_out: frozenset[str] = frozenset()  # typed keys its wire form did not hold (`fields.absent`)
    more: Mapping[str, Any] = field(default_factory=dict)  # its untyped keys, as written (`fields.rest`)

    def to_json(self) -> dict[str, Any]:
        """The wire form (`wire.GateRecord`), in the current shape (`record_version` RECORD_VERSION):
        `parse_record` reads it back to an equal record (one read from an older version: equal but for its
        `record_version`), and a record parsed from the wire writes that wire again, migrated."""

        def part(value: Any) -> Any:
            return value.to_json() if value is not None else None

        typed = {
            "nodeid": self.nodeid,
            "gate": self.gate,
            "mode": self.mode,
            "verdict": self.verdict,
            "time": self.time,
            "record_version": RECORD_VERSION,
            "candidate": part(self.candidate),
            "reference_model": part(self.reference_model),
            "lever": self.lever.to_json(),
            "path": self.path,
            "sizes": self.sizes.to_json(),
            "stats": self.stats.to_json(),
            "bounds": dict(self.bounds),
            "limits_for": self.limits_for,
            "limits_from": part(self.limits_from),
            "checks": [c.to_json() for c in self.checks],
            "durations": dict(self.durations),
            "phases": dict(self.phases),
            "rerun": self.rerun,
            "reference_source": self.reference_source,
            "forwards": dict(self.forwards),
            "lever_calls": dict(self.lever_calls_by_arm),
            "aa": part(self.aa),
            "tokens": dict(self.tokens),
            "kl_profile": self.kl_profile.to_json(),
            "attribution": part(self.attribution),
            "oracle": part(self.oracle),
            "server": part(self.server),
            "tasks": {name: t.to_json() for name, t in self.tasks.items()},
            "skipped": dict(self.skipped),
            "capability_score": part(self.capability_score),
            "speed": part(self.speed),
            "error": part(self.error),
        }
        return written(typed, self.left_out, self.more)

    @property
    def bounds_floor(self) -> float | None:
        """A capability gate's floor=."""
        return real(self.bounds.get("floor"))

    @property
    def bounds_max_drop(self) -> float | None:
        """A capability gate's max_drop=."""
        return real(self.bounds.get("max_drop"))

    @property
    def total_s(self) -> float | None:
        return self.durations.get("total_s")

    @property
    def lever_calls(self) -> int | None:
        """A patch lever: calls of its site seen in the candidate arm."""
        return self.lever_calls_by_arm.get("candidate")

    @property
    def name(self) -> str:
        """The gate's name as the summary shows it, else its node id."""
        return self.gate or self.nodeid

    @property
    def n_prompts(self) -> int | None:
        """Prompts (KL) or items (capability) the verdict rests on: the stats' count, else the sizes'."""
        return self.stats.n_prompts if self.stats.has("n_prompts") else self.sizes.prompts

    @property
    def floors(self) -> Mapping[str, float | None]:
        return self.aa.floors if self.aa is not None else {}

    def token_text(self, token_id: int | None) -> str | None:
        key = str(token_id)
        return self.tokens[key] if key in self.tokens else None


# -- the parse -----------------------------------------------------------------------------------


def parse_record(record: Mapping[str, Any]) -> Record:
    """The one parse of a record's wire form (from the JSON report, a carried report/JUnit property, a DB
    row's record_json, or `gate_record` itself) into a `Record`, through `migrate_record`."""
    r: Mapping[str, Any] = cast("Mapping[str, Any]", migrate_record(record))
    stats = mapping(r.get("stats"))
    lever = mapping(r.get("lever"))
    bounds = mapping(r.get("bounds"))
    aa = r.get("aa")
    score = mapping(r.get("capability_score"))
    speed = mapping(r.get("speed"))
    error = mapping(r.get("error"))
    return Record(
        nodeid=str(r.get("nodeid") or ""),
        gate=text(r.get("gate")) or None,
        mode=text(r.get("mode")),
        verdict=text(r.get("verdict")),
        time=text(r.get("time")),
        record_version=integer(record.get("record_version")) or 1,
        candidate=_model(r.get("candidate")),
        reference_model=_model(r.get("reference_model")),
        lever=Lever(
            name=text(lever.get("name")),
            kind=text(lever.get("kind")),
            target=text(lever.get("target")),
            ref=text(lever.get("ref")),
            cand=text(lever.get("cand")),
            path=text(lever.get("path")),
            left_out=absent(lever, LEVER_KEYS),
            more=rest(lever, LEVER_KEYS),
        ),
        path=text(r.get("path")),
        sizes=_sizes(mapping(r.get("sizes"))),
        stats=parse_stats(stats),
        limits_for=text(r.get("limits_for")) or None,
        limits_from=_limits_from(mapping(r.get("limits_from"))),
        bounds={str(k): v for k, v in bounds.items()},
        checks=tuple(parse_check(c) for c in sequence(r.get("checks")) if isinstance(c, Mapping)),
        durations=_reals(r.get("durations")),
        phases=_reals(r.get("phases")),
        rerun=text(r.get("rerun")),
        reference_source=text(r.get("reference_source")),
        forwards={str(k): integer(v) for k, v in mapping(r.get("forwards")).items()},
        lever_calls_by_arm={str(k): integer(v) for k, v in mapping(r.get("lever_calls")).items()},
        aa=parse_aa(aa) if isinstance(aa, Mapping) else None,
        tokens={str(k): v for k, v in mapping(r.get("tokens")).items() if isinstance(v, str)},
        kl_profile=parse_profile(mapping(r.get("kl_profile"))),
        attribution=parse_attribution(mapping(r.get("attribution"))) if r.get("attribution") else None,
        oracle=parse_oracle(mapping(r.get("oracle"))) if r.get("oracle") else None,
        server=parse_server(r.get("server")),
        tasks={str(name): parse_task(str(name), mapping(t)) for name, t in mapping(r.get("tasks")).items()},
        skipped={str(k): str(v) for k, v in mapping(r.get("skipped")).items()},
        capability_score=parse_score(score) if score else None,
        speed=parse_speed(speed) if speed else None,
        error=ErrorInfo(
            type=text(error.get("type")),
            message=text(error.get("message")),
            phase=text(error.get("phase")),
            left_out=absent(error, ERROR_KEYS),
            more=rest(error, ERROR_KEYS),
        )
        if error
        else None,
        left_out=absent(r, RECORD_KEYS),
        more=rest(r, RECORD_KEYS),
    )


#: The keys of a record the read model types; any other is kept as written (`Record.more`).
RECORD_KEYS = tuple(f.name for f in fields(Record) if f.name not in ("left_out", "more", "lever_calls_by_arm")) + (
    "lever_calls",
)
LEVER_KEYS = ("name", "kind", "target", "ref", "cand", "path")
ERROR_KEYS = ("type", "message", "phase")
MODEL_KEYS = ("name", "repo_id", "commit", "pinned", "dtype")
SIZES_KEYS = ("prompts", "tokens", "decode", "chunk")
LIMITS_KEYS = (
    "status",
    "model",
    "backend",
    "dtype",
    "file",
    "stale_file",
    "models_entry",
    "why",
    "known_bad",
    "floors",
    "inside_floor",
    "note",
    "precision_floor",
    "inside_precision",
    "set_aside",
)


def _reals(value: Any) -> dict[str, float]:
    """A name -> seconds mapping, its finite numbers."""
    return {str(k): v for k, v in ((k, real(v)) for k, v in mapping(value).items()) if v is not None}


def _limits_from(value: Mapping[str, Any]) -> LimitsFrom | None:
    status, model, backend = text(value.get("status")), text(value.get("model")), text(value.get("backend"))
    if not (status and model and backend):
        return None
    bad = mapping(value.get("known_bad"))
    return LimitsFrom(
        status=status,
        model=model,
        backend=backend,
        dtype=text(value.get("dtype")) or None,
        file=text(value.get("file")) or None,
        stale_file=text(value.get("stale_file")) or None,
        models_entry=text(value.get("models_entry")) or None,
        why=text(value.get("why")) or None,
        known_bad_value=bad.get("value"),
        known_bad_figures=tuple(str(f) for f in sequence(bad.get("figures"))),
        floors={str(k): v for k, v in ((k, real(v)) for k, v in mapping(value.get("floors")).items()) if v is not None},
        inside_floor=tuple(str(k) for k in sequence(value.get("inside_floor"))),
        note=text(value.get("note")) or None,
        precision_floor=_reals(value.get("precision_floor")),
        inside_precision=tuple(str(k) for k in sequence(value.get("inside_precision"))),
        set_aside=value.get("set_aside") is True,
        known_bad_more=rest(bad, ("value", "figures")),
        left_out=absent(value, LIMITS_KEYS),
        more=rest(value, LIMITS_KEYS),
    )


def limits_from_words(value: Any) -> str | None:
    """A record's `limits_from` (its wire form) in the words every report shows; None without one."""
    parsed = _limits_from(mapping(value))
    return parsed.words if parsed is not None else None


def _model(value: Any) -> ModelInfo | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return ModelInfo(
            name=text(value.get("name")),
            repo_id=text(value.get("repo_id")),
            commit=text(value.get("commit")),
            pinned=text(value.get("pinned")),
            dtype=text(value.get("dtype")),
            left_out=absent(value, MODEL_KEYS),
            more=rest(value, MODEL_KEYS),
        )
    return ModelInfo(name=text(value))  # older records: the name alone


def _sizes(s: Mapping[str, Any]) -> Sizes:
    return Sizes(
        prompts=integer(s.get("prompts")),
        tokens=integer(s.get("tokens")),
        decode=integer(s.get("decode")),
        chunk=integer(s.get("chunk")),
        left_out=absent(s, SIZES_KEYS),
        more=rest(s, SIZES_KEYS),
    )


# -- rows, runs, reports ---------------------------------------------------------------------------
