"""The read model of a gate record: typed, immutable, and parsed in one place.

A record is JSON on the wire (`records.gate_record` writes it; it crosses processes as text and lands in
the JSON report, a JUnit property and the results DB). Every reader in `results/` takes it through
`parse_record` into a `Record` and reads attributes, never dict keys. `parse_record` first passes it
through the one `records.migrate_record`, which turns any older shape into the current one (records
before `record_version`: checks with `bound`, `other_bound` and `passed`; capability tasks without
`flipped`), so a user's old DB rows and reports still read. The parse is tolerant: a field missing,
null, of the wrong type or not finite reads as None (a table shows a dash), never an exception.

Derived facts are computed here, once: a speed measurement's longest context, a context's KV ratio, a
task's drop, a record's prompt count, the bound a check compared. Also parsed here: the run facts readers
need from a run's config (interrupted, shard, merge), a results-DB row, a queued run, a JSON report.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from .fields import integer, nodeid_of, real, text
from .records import RECORD_VERSION, GateRecord, RunInfo, migrate_record

__all__ = [
    "AA",
    "Answer",
    "Attribution",
    "CapabilityScore",
    "CheckResult",
    "ErrorInfo",
    "Flipped",
    "FlippedItem",
    "Histogram",
    "Interrupted",
    "Interval",
    "KLProfile",
    "LayerError",
    "LimitsFrom",
    "limits_from_words",
    "Lever",
    "ModelInfo",
    "PositionProfile",
    "PromptMeans",
    "Ratio",
    "Record",
    "ScopeDrift",
    "RunFacts",
    "ScoreTask",
    "Shard",
    "Sizes",
    "Speed",
    "SpeedArm",
    "SpeedContext",
    "Stats",
    "StoredRow",
    "Task",
    "WorstContext",
    "WorstToken",
    "calibration_module",
    "parse_attribution",
    "interrupted_of",
    "nodeid_of",
    "parse_record",
    "parse_row",
    "pending_entry",
    "report_contents",
    "row_run",
    "run_facts",
    "run_info_of",
    "stored_record",
]


class Interval(NamedTuple):
    """The two ends of an interval, in the figure's own units; None where there is no such end."""

    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class CheckResult:
    """One limit of an assertion (a record's check, or a capability task's drop or floor): the value, its
    interval [lower, upper] (the same meaning whatever the direction), the limit and the verdict."""

    metric: str | None = None
    key: str | None = None
    value: float | None = None
    lower: float | None = None
    upper: float | None = None
    limit: float | None = None
    direction: str | None = None  # "max": must stay at or below the limit; "min": at or above
    verdict: str | None = None  # "pass" | "fail" | "inconclusive"; None: the check says none
    n: int | None = None
    n_needed: int | None = None  # inconclusive: about how many items would tell
    method: str | None = None
    p_value: float | None = None
    context: int | None = None  # a speed check: the context (tokens) it holds at

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def bound(self) -> float | None:
        """The end the verdict compared with the limit: the upper for "max", the lower for "min"."""
        return self.lower if self.direction == "min" else self.upper

    @property
    def label(self) -> str:
        return self.metric or self.key or "—"


@dataclass(frozen=True)
class ModelInfo:
    """Which model an arm ran."""

    label: str | None  # its pinned id (repo@commit), else whatever names it
    commit: str | None = None


@dataclass(frozen=True)
class LimitsFrom:
    """Where a gate's limits were shown to work on the model and backend it judged (`records.LimitsFrom`)."""

    status: str  # records.LIMIT_SOURCES: calibrated, proven, unproven, refuted
    model: str
    backend: str
    file: str | None = None
    models_entry: str | None = None
    why: str | None = None
    known_bad: str | None = None  # the known-bad value, as text
    known_bad_figures: tuple[str, ...] = ()
    floors: Mapping[str, float] = field(default_factory=dict)
    inside_floor: tuple[str, ...] = ()
    note: str | None = None

    @property
    def shown(self) -> bool:
        """The limits were shown to catch a broken variant on this model and backend."""
        return self.status in ("calibrated", "proven")

    @property
    def words(self) -> str:
        """One line, the same in every report: where the limits come from and what that showed."""
        on = f"{self.model} ({self.backend})"
        own = f" (its models= entry {self.models_entry!r})" if self.models_entry else ""
        if self.status == "calibrated":
            text = f"limits{own} shown on {on} by {self.file or 'its calibration file'}"
        elif self.status == "proven":
            bad = f"known-bad {self.known_bad}" if self.known_bad else "its known-bad"
            text = f"limits{own} proven on {on}: {bad} fails them"
        elif self.status == "refuted":
            text = f"limits{own} do not catch the known-bad on {on}: {self.why or 'it passes them'}"
        else:
            text = f"limits{own} unproven on {on}: {self.why or 'not calibrated'}"
        if self.inside_floor:
            text += f"; {', '.join(self.inside_floor)} inside {self.model}'s noise floor (inconclusive)"
        if self.note:
            text += f" · {self.note}"
        return text


@dataclass(frozen=True)
class Lever:
    """The lever of both arms, its values as text (a value that is not a string: its JSON)."""

    name: str | None = None
    kind: str | None = None
    ref: str | None = None
    cand: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class Sizes:
    prompts: int | None = None
    tokens: int | None = None
    decode: int | None = None
    chunk: int | None = None


@dataclass(frozen=True)
class WorstToken:
    """One of a KL gate's worst tokens (`stats.worst`)."""

    prompt: int | None = None
    position: int | None = None
    kl: float | None = None
    token_id: int | None = None
    ref_top1: int | None = None
    cand_top1: int | None = None
    p_ref: float | None = None
    p_cand: float | None = None


#: The KL statistics a reader may ask for by key (`Stats.figure`).
_FIGURES = ("mean", "median", "p90", "p95", "p99", "p999", "max", "same_top", "top1", "ln_ppl_ratio")


@dataclass(frozen=True)
class Stats:
    """A KL gate's statistics (`stats/kl_stats.py`); a capability gate's holds only `n_prompts`."""

    present: frozenset[str] = frozenset()  # the keys the record's stats hold (a measured gate's rows)
    n_prompts: int | None = None  # independent texts (KL) or items (capability): the n of every interval
    n_sequences: int | None = None  # token sequences scored: more than n_prompts where windows share a text
    n_tokens: int | None = None
    confidence: float | None = None
    mean: float | None = None
    mean_ci: Interval = Interval()
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    quantile_ci: Mapping[str, Interval] = field(default_factory=dict)
    max: float | None = None
    same_top: float | None = None
    same_top_ci: Interval = Interval()
    top1: float | None = None
    top1_ci: Interval = Interval()
    flips: int | None = None
    near_tie_flips: int | None = None
    near_ties: int | None = None
    ln_ppl_ratio: float | None = None
    worst: tuple[WorstToken, ...] = ()

    def has(self, key: str) -> bool:
        return key in self.present

    def figure(self, key: str) -> float | None:
        """`mean`, `p99`, `top1` … by name; None for a name that is not a KL statistic."""
        return cast("float | None", getattr(self, key)) if key in _FIGURES else None

    def quantile_interval(self, q: str) -> Interval:
        return self.quantile_ci[q] if q in self.quantile_ci else Interval()

    @property
    def agreement(self) -> tuple[float | None, float | None]:
        """Top-1 agreement and its lower end: `top1`, or `same_top` in records from before top-1 was kept."""
        if self.has("top1"):
            return self.top1, self.top1_ci.lower
        return self.same_top, self.same_top_ci.lower

    @property
    def identical(self) -> bool:
        """Every distribution equal: nothing to bound (a lever identical on this backend)."""
        return self.max == 0.0 and self.same_top == 1.0


@dataclass(frozen=True)
class Histogram:
    """Per-token KL in bins of 1/per_decade decade from 10**decades[0]; zero, under and over counted aside."""

    counts: tuple[int, ...] = ()
    decades: tuple[int, int] | None = None
    per_decade: int = 0
    zero: int = 0
    under: int = 0
    over: int = 0


@dataclass(frozen=True)
class PositionProfile:
    """Per bucket of neighbouring positions: first, last, tokens, median and p90 of KL over prompts, flips."""

    first: tuple[int | None, ...] = ()
    last: tuple[int | None, ...] = ()
    n: tuple[int | None, ...] = ()
    median: tuple[float | None, ...] = ()
    p90: tuple[float | None, ...] = ()
    flips: tuple[int | None, ...] = ()
    near_tie_flips: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class PromptMeans:
    """Per prompt (at most 128 recorded): its index, mean KL with its interval, its tokens."""

    index: tuple[int | None, ...] = ()
    mean: tuple[float | None, ...] = ()
    ci: tuple[Interval, ...] = ()
    n_tokens: tuple[int | None, ...] = ()
    total: int | None = None
    method: str | None = None


@dataclass(frozen=True)
class WorstContext:
    """A worst token in its text: before it, the token, after it."""

    prompt: int | None = None
    position: int | None = None
    before: str | None = None
    token: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class KLProfile:
    """What the HTML report plots (`stats/kl_profile.py`); an older record holds none of it (None, empty)."""

    histogram: Histogram = Histogram()
    by_position: PositionProfile = PositionProfile()
    prompts: PromptMeans = PromptMeans()
    worst_context: tuple[WorstContext, ...] = ()


@dataclass(frozen=True)
class ScopeDrift:
    """One scope of attribution: the candidate on these layers only, its KL against the reference."""

    name: str | None = None
    kind: str | None = None  # layer | block | type | rest
    layers: tuple[int, ...] = ()
    level: int | None = None  # 1: the first round; 2: the worst block's layers
    ranked: bool = True  # False: a block whose layers were measured in its place
    n: int | None = None
    mean: float | None = None
    mean_ci: Interval = Interval()
    p99: float | None = None
    top1: float | None = None
    by_position: PositionProfile | None = None  # attention-type scopes: KL by position


@dataclass(frozen=True)
class LayerError:
    """With the lever everywhere: one layer's output error relative to the reference arm's."""

    layer: int | None = None
    type: str | None = None
    rel_error: float | None = None
    ci: Interval = Interval()


@dataclass(frozen=True)
class Attribution:
    """Where a KL gate's drift comes from (`explain.attribute`): scopes, the output-error curve, the cost."""

    sequences: int | None = None
    budget: float | None = None
    whole_mean: float | None = None  # the lever everywhere, on the same sequences
    whole_ci: Interval = Interval()
    scopes: tuple[ScopeDrift, ...] = ()
    residual: tuple[LayerError, ...] = ()
    residual_sequences: int | None = None
    notes: tuple[str, ...] = ()
    sequence_arms: int | None = None
    gate_sequence_arms: int | None = None
    seconds: float | None = None
    gate_seconds: float | None = None
    source: str | None = None  # computed | cache

    def top(self, k: int = 3) -> tuple[ScopeDrift, ...]:
        """The ranked layer, block and outside-the-layers scopes with the most drift, worst first."""
        rows = [s for s in self.scopes if s.kind != "type" and s.ranked and s.mean is not None]
        return tuple(sorted(rows, key=lambda s: -(s.mean or 0.0))[:k])


@dataclass(frozen=True)
class AA:
    """--mlx-aa: the noise floors a gate's limits must sit above, by metric."""

    floors: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """One arm's answer to a capability item."""

    output: str | None = None
    score: float | None = None
    verdict: str | None = None


@dataclass(frozen=True)
class FlippedItem:
    """An item whose score changed between the arms; `prompt` (its tail) only in records that kept it."""

    id: str | None = None
    prompt: str | None = None
    reference: Answer = Answer()
    candidate: Answer = Answer()


@dataclass(frozen=True)
class Flipped:
    total: int | None = None
    items: tuple[FlippedItem, ...] = ()


@dataclass(frozen=True)
class Task:
    """One capability task of a gate: both scores with intervals, the drop's and the floor's verdicts."""

    name: str
    n: int | None = None
    ref_score: float | None = None
    cand_score: float | None = None
    ref_ci: Interval = Interval()
    cand_ci: Interval = Interval()
    drop_check: CheckResult | None = None  # max_drop=: the paired drop (reference − candidate) and its bounds
    floor_check: CheckResult | None = None  # floor=: the candidate's score and its bounds
    flipped: Flipped | None = None  # None: not recorded

    @property
    def drop(self) -> float | None:
        """Reference score − candidate score: what the candidate lost (negative: gained)."""
        if self.ref_score is None or self.cand_score is None:
            return None
        return self.ref_score - self.cand_score

    @property
    def method(self) -> str | None:
        return (self.drop_check.method if self.drop_check else None) or (
            self.floor_check.method if self.floor_check else None
        )


@dataclass(frozen=True)
class ScoreTask:
    reference: float | None = None
    candidate: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class CapabilityScore:
    """The run's Capability Score: the unweighted mean over the six tasks, partial when one did not run."""

    reference: float | None = None
    candidate: float | None = None
    partial: bool | None = None
    tasks: Mapping[str, ScoreTask] = field(default_factory=dict)
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ratio:
    """Candidate / reference: the geometric mean of the paired ratios with its interval (bytes: exact)."""

    ratio: float | None = None
    ci: Interval = Interval()
    n: int | None = None


@dataclass(frozen=True)
class SpeedArm:
    prefill_tps: float | None = None
    decode_tps: float | None = None
    peak_bytes: int | None = None
    kv_bytes: int | None = None  # allocated
    kv_held_bytes: int | None = None  # the positions holding a token (a wrapped window: at most its window)


@dataclass(frozen=True)
class SpeedContext:
    """Both arms at one context length, and their ratios (None: not measured)."""

    length: int
    reference: SpeedArm = SpeedArm()
    candidate: SpeedArm = SpeedArm()
    prefill: Ratio | None = None
    decode: Ratio | None = None
    peak: Ratio | None = None
    kv: Ratio | None = None
    stopped: str | None = None  # why the trials stopped here: "decided", "precise", "budget" (None: a fixed count)

    @property
    def kv_ratio(self) -> float | None:
        """The KV cache bytes ratio: recorded, else from both arms' bytes."""
        if self.kv is not None and self.kv.ratio is not None:
            return self.kv.ratio
        ref, cand = self.reference.kv_bytes, self.candidate.kv_bytes
        return cand / ref if ref and cand is not None else None


@dataclass(frozen=True)
class Speed:
    """Speed and memory of both arms (`speed/result.py`), contexts shortest first."""

    id: str | None = None
    repetitions: int | None = None
    decode_tokens: int | None = None
    contexts: tuple[SpeedContext, ...] = ()
    weights_reference: int | None = None
    weights_candidate: int | None = None
    memory_method: str | None = None
    duration_s: float | None = None
    load_seen: Mapping[str, Any] | None = None  # other processes' load while the trials were timed

    @property
    def as_json(self) -> dict[str, Any]:
        """The measurement in its JSON shape, from what was read (well-formed whatever the record held): for
        `results.speed_text`, the one wording of speed figures, which the assertion messages share."""

        def arm(a: SpeedArm) -> dict[str, Any]:
            return {
                "prefill_tps": a.prefill_tps,
                "decode_tps": a.decode_tps,
                "peak_bytes": a.peak_bytes,
                "kv_bytes": a.kv_bytes,
                "kv_held_bytes": a.kv_held_bytes,
            }

        def ratio(r: Ratio | None) -> dict[str, Any] | None:
            return None if r is None else {"ratio": r.ratio, "ratio_ci": list(r.ci), "n": r.n}

        return {
            "contexts": {
                str(c.length): {
                    "context": c.length,
                    "reference": arm(c.reference),
                    "candidate": arm(c.candidate),
                    "prefill": ratio(c.prefill),
                    "decode": ratio(c.decode),
                    "peak": ratio(c.peak),
                    "kv": ratio(c.kv),
                    "stopped": c.stopped,
                }
                for c in self.contexts
            },
            "weights_bytes": {"reference": self.weights_reference, "candidate": self.weights_candidate},
            "load_seen": self.load_seen,
        }

    @property
    def longest(self) -> SpeedContext | None:
        """The longest measured context: the one the DB columns, history and unqualified names show."""
        return self.contexts[-1] if self.contexts else None

    @property
    def weights_ratio(self) -> float | None:
        ref, cand = self.weights_reference, self.weights_candidate
        return cand / ref if ref and cand is not None else None


@dataclass(frozen=True)
class ErrorInfo:
    """A gate that raised instead of deciding: the error's type, its message's first lines, the phase."""

    type: str | None = None
    message: str | None = None
    phase: str | None = None


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
    bounds_floor: float | None = None  # a capability gate's floor= and max_drop=
    bounds_max_drop: float | None = None
    checks: tuple[CheckResult, ...] = ()
    total_s: float | None = None
    phases: Mapping[str, float] = field(default_factory=dict)  # this record's share of its module's work, s
    rerun: str | None = None
    reference_source: str | None = None
    lever_calls: int | None = None  # a patch lever: calls of its site seen in the candidate arm
    aa: AA | None = None
    tokens: Mapping[str, str] = field(default_factory=dict)
    kl_profile: KLProfile = KLProfile()
    attribution: Attribution | None = None  # where the drift comes from (--mlx-explain, or a failing KL gate)
    tasks: Mapping[str, Task] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    capability_score: CapabilityScore | None = None
    speed: Speed | None = None
    error: ErrorInfo | None = None

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


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


# -- the parse -----------------------------------------------------------------------------------


def parse_record(record: Mapping[str, Any]) -> Record:
    """The one parse of a record (from the JSON report, a carried report/JUnit property, a DB row's
    record_json, or `gate_record` itself) into the read model, through `migrate_record`."""
    r: Mapping[str, Any] = cast("Mapping[str, Any]", migrate_record(record))
    stats = _map(r.get("stats"))
    lever = _map(r.get("lever"))
    bounds = _map(r.get("bounds"))
    aa = r.get("aa")
    score = _map(r.get("capability_score"))
    speed = _map(r.get("speed"))
    error = _map(r.get("error"))
    return Record(
        nodeid=nodeid_of(r),
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
            ref=text(lever.get("ref")),
            cand=text(lever.get("cand")),
            path=text(lever.get("path")),
        ),
        path=text(r.get("path")),
        sizes=_sizes(_map(r.get("sizes"))),
        stats=_stats(stats),
        limits_for=text(r.get("limits_for")) or None,
        limits_from=_limits_from(_map(r.get("limits_from"))),
        bounds_floor=real(bounds.get("floor")),
        bounds_max_drop=real(bounds.get("max_drop")),
        checks=tuple(_check(c) for c in _list(r.get("checks")) if isinstance(c, Mapping)),
        total_s=real(_map(r.get("durations")).get("total_s")),
        phases={str(k): v for k, v in ((k, real(v)) for k, v in _map(r.get("phases")).items()) if v is not None},
        rerun=text(r.get("rerun")),
        reference_source=text(r.get("reference_source")),
        lever_calls=integer(_map(r.get("lever_calls")).get("candidate")),
        aa=AA(floors={str(k): real(v) for k, v in _map(_map(aa).get("floors")).items()})
        if isinstance(aa, Mapping)
        else None,
        tokens={str(k): v for k, v in _map(r.get("tokens")).items() if isinstance(v, str)},
        kl_profile=_profile(_map(r.get("kl_profile"))),
        attribution=parse_attribution(_map(r.get("attribution"))) if r.get("attribution") else None,
        tasks={str(name): _task(str(name), _map(t)) for name, t in _map(r.get("tasks")).items()},
        skipped={str(k): str(v) for k, v in _map(r.get("skipped")).items()},
        capability_score=_score(score) if score else None,
        speed=_speed(speed) if speed else None,
        error=ErrorInfo(
            type=text(error.get("type")), message=text(error.get("message")), phase=text(error.get("phase"))
        )
        if error
        else None,
    )


def _limits_from(value: Mapping[str, Any]) -> LimitsFrom | None:
    status, model, backend = text(value.get("status")), text(value.get("model")), text(value.get("backend"))
    if not (status and model and backend):
        return None
    bad = _map(value.get("known_bad"))
    known_bad = bad.get("value")
    return LimitsFrom(
        status=status,
        model=model,
        backend=backend,
        file=text(value.get("file")) or None,
        models_entry=text(value.get("models_entry")) or None,
        why=text(value.get("why")) or None,
        known_bad=text(known_bad),
        known_bad_figures=tuple(str(f) for f in _list(bad.get("figures"))),
        floors={str(k): v for k, v in ((k, real(v)) for k, v in _map(value.get("floors")).items()) if v is not None},
        inside_floor=tuple(str(k) for k in _list(value.get("inside_floor"))),
        note=text(value.get("note")) or None,
    )


def limits_from_words(value: Any) -> str | None:
    """A record's `limits_from` (its wire form) in the words every report shows; None without one."""
    parsed = _limits_from(_map(value))
    return parsed.words if parsed is not None else None


def _interval(value: Any) -> Interval:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return Interval(real(value[0]), real(value[1]))
    return Interval()


def _model(value: Any) -> ModelInfo | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        label = next((str(value[k]) for k in ("pinned", "repo_id", "name") if value.get(k)), None)
        return ModelInfo(label=label, commit=text(value.get("commit")))
    return ModelInfo(label=text(value))


def _sizes(s: Mapping[str, Any]) -> Sizes:
    return Sizes(
        prompts=integer(s.get("prompts")),
        tokens=integer(s.get("tokens")),
        decode=integer(s.get("decode")),
        chunk=integer(s.get("chunk")),
    )


def _stats(s: Mapping[str, Any]) -> Stats:
    figures = {key: real(s.get(key)) for key in _FIGURES}
    return Stats(
        present=frozenset(str(k) for k in s),
        n_prompts=integer(s.get("n_prompts")),
        n_sequences=integer(s.get("n_sequences")),
        n_tokens=integer(s.get("n_tokens")),
        confidence=real(s.get("confidence")),
        mean_ci=_interval(s.get("mean_ci")),
        same_top_ci=_interval(s.get("same_top_ci")),
        top1_ci=_interval(s.get("top1_ci")),
        quantile_ci={str(q): _interval(ci) for q, ci in _map(s.get("quantile_ci")).items()},
        flips=integer(s.get("flips")),
        near_tie_flips=integer(s.get("near_tie_flips")),
        near_ties=integer(s.get("near_ties")),
        worst=tuple(
            WorstToken(
                prompt=integer(w.get("prompt")),
                position=integer(w.get("position")),
                kl=real(w.get("kl")),
                token_id=integer(w.get("token_id")),
                ref_top1=integer(w.get("ref_top1")),
                cand_top1=integer(w.get("cand_top1")),
                p_ref=real(w.get("p_ref")),
                p_cand=real(w.get("p_cand")),
            )
            for w in _list(s.get("worst"))
            if isinstance(w, Mapping)
        ),
        **figures,  # the float fields named in _FIGURES
    )


def _ints(value: Any) -> tuple[int | None, ...]:
    return tuple(integer(v) for v in _list(value))


def _reals(value: Any) -> tuple[float | None, ...]:
    return tuple(real(v) for v in _list(value))


def parse_attribution(a: Mapping[str, Any]) -> Attribution:
    """A record's `attribution` (also the assertion's own, before it is a record) in the read model."""
    whole, cost, residual = _map(a.get("whole")), _map(a.get("cost")), _map(a.get("residual"))
    return Attribution(
        sequences=integer(a.get("sequences")),
        budget=real(a.get("budget")),
        whole_mean=real(whole.get("mean")),
        whole_ci=_interval(whole.get("mean_ci")),
        scopes=tuple(_scope(_map(s)) for s in _list(a.get("scopes")) if isinstance(s, Mapping)),
        residual=tuple(
            LayerError(
                layer=integer(e.get("layer")),
                type=text(e.get("type")),
                rel_error=real(e.get("rel_error")),
                ci=_interval(e.get("ci")),
            )
            for e in (_map(x) for x in _list(residual.get("layers")))
        ),
        residual_sequences=integer(residual.get("sequences")),
        notes=tuple(str(n) for n in _list(a.get("notes"))),
        sequence_arms=integer(cost.get("sequence_arms")),
        gate_sequence_arms=integer(cost.get("gate_sequence_arms")),
        seconds=real(cost.get("seconds")),
        gate_seconds=real(cost.get("gate_seconds")),
        source=text(a.get("source")),
    )


def _scope(s: Mapping[str, Any]) -> ScopeDrift:
    bp = s.get("by_position")
    return ScopeDrift(
        name=text(s.get("name")),
        kind=text(s.get("kind")),
        layers=tuple(i for i in _ints(s.get("layers")) if i is not None),
        level=integer(s.get("level")),
        ranked=s.get("ranked") is not False,
        n=integer(s.get("n")),
        mean=real(s.get("mean")),
        mean_ci=_interval(s.get("mean_ci")),
        p99=real(s.get("p99")),
        top1=real(s.get("top1")),
        by_position=_profile({"by_position": bp}).by_position if isinstance(bp, Mapping) else None,
    )


def _profile(p: Mapping[str, Any]) -> KLProfile:
    hist, bp, prompts = _map(p.get("histogram")), _map(p.get("by_position")), _map(p.get("prompts"))
    decades = _list(hist.get("decades"))
    return KLProfile(
        histogram=Histogram(
            counts=tuple(integer(c) or 0 for c in _list(hist.get("counts"))),
            decades=(integer(decades[0]) or 0, integer(decades[1]) or 0) if len(decades) == 2 else None,
            per_decade=integer(hist.get("per_decade")) or 0,
            zero=integer(hist.get("zero")) or 0,
            under=integer(hist.get("under")) or 0,
            over=integer(hist.get("over")) or 0,
        ),
        by_position=PositionProfile(
            first=_ints(bp.get("first")),
            last=_ints(bp.get("last")),
            n=_ints(bp.get("n")),
            median=_reals(bp.get("median")),
            p90=_reals(bp.get("p90")),
            flips=_ints(bp.get("flips")),
            near_tie_flips=_ints(bp.get("near_tie_flips")),
        ),
        prompts=PromptMeans(
            index=_ints(prompts.get("index")),
            mean=_reals(prompts.get("mean")),
            ci=tuple(_interval(c) for c in _list(prompts.get("ci"))),
            n_tokens=_ints(prompts.get("n_tokens")),
            total=integer(prompts.get("total")),
            method=text(prompts.get("method")),
        ),
        worst_context=tuple(
            WorstContext(
                prompt=integer(c.get("prompt")),
                position=integer(c.get("position")),
                before=text(c.get("before")),
                token=text(c.get("token")),
                after=text(c.get("after")),
            )
            for c in (_map(c) for c in _list(p.get("worst_context")))
        ),
    )


def _check(c: Mapping[str, Any], *, direction: str | None = None) -> CheckResult:
    context = c.get("context")
    return CheckResult(
        metric=text(c.get("metric")),
        key=text(c.get("key")),
        value=real(c.get("value")),
        lower=real(c.get("lower")),
        upper=real(c.get("upper")),
        limit=real(c.get("limit")),
        direction=direction if direction is not None else text(c.get("direction")),
        verdict=text(c.get("verdict")),
        n=integer(c.get("n")),
        n_needed=integer(c.get("n_needed")),
        method=text(c.get("method")),
        p_value=real(c.get("p_value")),
        context=int(str(context)) if context is not None and str(context).strip().lstrip("-").isdigit() else None,
    )


def _answer(a: Mapping[str, Any]) -> Answer:
    return Answer(output=text(a.get("output")), score=real(a.get("score")), verdict=text(a.get("verdict")))


def _task(name: str, t: Mapping[str, Any]) -> Task:
    drop, floor, flipped = _map(t.get("drop_verdict")), _map(t.get("floor_verdict")), _map(t.get("flipped"))
    return Task(
        name=name,
        n=integer(t.get("n")),
        ref_score=real(t.get("ref_score")),
        cand_score=real(t.get("cand_score")),
        ref_ci=_interval(t.get("ref_ci")),
        cand_ci=_interval(t.get("cand_ci")),
        drop_check=_check(drop, direction="max") if drop else None,
        floor_check=_check(floor, direction="min") if floor else None,
        flipped=Flipped(
            total=integer(flipped.get("total")),
            items=tuple(
                FlippedItem(
                    id=text(i.get("id")),
                    prompt=i.get("prompt") if isinstance(i.get("prompt"), str) else None,
                    reference=_answer(_map(i.get("reference"))),
                    candidate=_answer(_map(i.get("candidate"))),
                )
                for i in (_map(i) for i in _list(flipped.get("items")))
            ),
        )
        if flipped
        else None,
    )


def _score(s: Mapping[str, Any]) -> CapabilityScore:
    partial = s.get("partial")
    return CapabilityScore(
        reference=real(s.get("reference")),
        candidate=real(s.get("candidate")),
        partial=None if partial is None else bool(partial),
        tasks={
            str(t): ScoreTask(
                reference=real(_map(v).get("reference")),
                candidate=real(_map(v).get("candidate")),
                n=integer(_map(v).get("n")),
            )
            for t, v in _map(s.get("tasks")).items()
        },
        missing=tuple(str(m) for m in _list(s.get("missing"))),
    )


def _ratio(value: Any) -> Ratio | None:
    e = _map(value)
    return Ratio(ratio=real(e.get("ratio")), ci=_interval(e.get("ratio_ci")), n=integer(e.get("n"))) if e else None


def _arm(a: Mapping[str, Any]) -> SpeedArm:
    return SpeedArm(
        prefill_tps=real(a.get("prefill_tps")),
        decode_tps=real(a.get("decode_tps")),
        peak_bytes=integer(a.get("peak_bytes")),
        kv_bytes=integer(a.get("kv_bytes")),
        kv_held_bytes=integer(a.get("kv_held_bytes")),
    )


def _speed(s: Mapping[str, Any]) -> Speed:
    contexts = _map(s.get("contexts"))
    lengths = sorted((str(c) for c in contexts if str(c).isdigit()), key=int)  # JSON keys: the length as text
    shape, weights = _map(s.get("shape")), _map(s.get("weights_bytes"))
    return Speed(
        id=text(s.get("id")) or None,
        repetitions=integer(shape.get("repetitions")),
        decode_tokens=integer(shape.get("decode")),
        contexts=tuple(
            SpeedContext(
                length=int(c),
                reference=_arm(_map(_map(contexts[c]).get("reference"))),
                candidate=_arm(_map(_map(contexts[c]).get("candidate"))),
                prefill=_ratio(_map(contexts[c]).get("prefill")),
                decode=_ratio(_map(contexts[c]).get("decode")),
                peak=_ratio(_map(contexts[c]).get("peak")),
                kv=_ratio(_map(contexts[c]).get("kv")),
                stopped=text(_map(contexts[c]).get("stopped")) or None,
            )
            for c in lengths
        ),
        weights_reference=integer(weights.get("reference")),
        weights_candidate=integer(weights.get("candidate")),
        memory_method=text(s.get("memory_method")) or None,
        duration_s=real(s.get("duration_s")),
        load_seen=s.get("load_seen") if isinstance(s.get("load_seen"), Mapping) else None,
    )


# -- rows, runs, reports ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredRow:
    """One results-DB row as history readers use it: when, which run and commit, and the record."""

    run_id: str | None = None
    time: str | None = None
    verdict: str | None = None
    code_commit: str | None = None
    code_dirty: bool | None = None
    mean_kl: float | None = None
    decode_ratio: float | None = None
    record: Record | None = None  # None where its record_json cannot be read


def parse_row(row: Mapping[str, Any]) -> StoredRow:
    """A results-DB row (`ResultsDB.rows`; any subset of its columns): its columns, and its record parsed."""
    record = None
    try:
        stored = json.loads(row.get("record_json") or "")
    except (TypeError, ValueError):
        stored = None
    if isinstance(stored, Mapping):
        record = parse_record(stored)
    dirty = row.get("code_dirty")
    return StoredRow(
        run_id=text(row.get("run_id")),
        time=text(row.get("time")),
        verdict=text(row.get("verdict")),
        code_commit=text(row.get("code_commit")),
        code_dirty=None if dirty is None else bool(dirty),
        mean_kl=real(row.get("mean_kl")),
        decode_ratio=real(row.get("decode_ratio")),
        record=record,
    )


def stored_record(row: Mapping[str, Any]) -> GateRecord | None:
    """The record a DB row stores whole (record_json), as written; None where it cannot be read."""
    try:
        record = json.loads(row.get("record_json") or "")
    except (TypeError, ValueError):
        return None
    return cast("GateRecord", record) if isinstance(record, dict) else None


@dataclass(frozen=True)
class Interrupted:
    """A run stopped before its end: why, and the modules that never ran."""

    reason: str | None = None
    not_run: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shard:
    """--mlx-shard I/N: which piece of how many, of which plan, and the modules it was to run."""

    index: int | None = None
    count: int | None = None
    plan: str | None = None
    modules: tuple[str, ...] | None = None  # None: the shard lists no plan of modules
    total_modules: int | None = None  # the modules of the whole plan, every shard's together

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class RunFacts:
    """What readers need of a run beside its records: its identity, machine and config facts."""

    run_id: str | None = None
    started: str | None = None
    code_commit: str | None = None
    code_dirty: bool | None = None
    machine: Mapping[str, str] = field(default_factory=dict)
    interrupted: Interrupted | None = None
    shard: Shard | None = None
    without_records: frozenset[str] = frozenset()  # planned modules that ran without a record (all skipped)
    merged_from: int | None = None  # a merged run: how many reports
    inconclusive_policy: str = "fail"


def interrupted_of(value: Any) -> Interrupted | None:
    """A run config's `interrupted` (None when the run was not)."""
    i = _map(value)
    if not i:
        return None
    return Interrupted(reason=text(i.get("reason")) or None, not_run=tuple(str(m) for m in _list(i.get("not_run"))))


def run_facts(run: RunInfo | Mapping[str, Any] | None) -> RunFacts:
    """A run's facts, from its `RunInfo` (or its dict, `RunInfo.to_dict`); empty for None."""
    if run is None:
        return RunFacts()
    d = run if isinstance(run, Mapping) else run.to_dict()
    config = _map(d.get("config"))
    shard = _map(config.get("shard"))
    modules = shard.get("modules")
    dirty = d.get("code_dirty")
    merged = config.get("merged")
    return RunFacts(
        run_id=text(d.get("run_id")),
        started=text(d.get("started")),
        code_commit=text(d.get("code_commit")),
        code_dirty=None if dirty is None else bool(dirty),
        machine={str(k): str(v) for k, v in _map(d.get("machine")).items() if v is not None},
        interrupted=interrupted_of(config.get("interrupted")),
        shard=Shard(
            index=integer(shard.get("index")),
            count=integer(shard.get("count")),
            plan=text(shard.get("plan")),
            modules=tuple(str(m) for m in modules) if isinstance(modules, list) else None,
            total_modules=integer(shard.get("total_modules")),
        )
        if shard
        else None,
        without_records=frozenset(str(m) for m in _map(config.get("without_records"))),
        merged_from=len(merged) if isinstance(merged, list) else None,
        inconclusive_policy=str(_map(config.get("gate")).get("inconclusive") or "fail"),
    )


def run_info_of(run: Mapping[str, Any]) -> RunInfo:
    """A `RunInfo` from its dict (a JSON report's `run`, a queued run, a DB row's columns and config_json);
    KeyError when it lacks `run_id` or `started`."""
    dirty = run.get("code_dirty")
    commit = run.get("code_commit")
    return RunInfo(
        run_id=str(run["run_id"]),
        started=str(run["started"]),
        code_commit=None if commit is None else str(commit),
        code_dirty=None if dirty is None else bool(dirty),
        argv=[str(a) for a in _list(run.get("argv"))],
        config=dict(_map(run.get("config"))),
        machine={str(k): v for k, v in _map(run.get("machine")).items()},
    )


def row_run(row: Mapping[str, Any]) -> RunInfo:
    """The run a stored row belongs to, whole: its columns and its config_json (config, machine, argv)."""
    try:
        extra = json.loads(row.get("config_json") or "{}")
    except (TypeError, ValueError):
        extra = {}
    return run_info_of(
        {
            **_map(extra),
            "run_id": row["run_id"],
            "started": row["started"],
            "code_commit": row.get("code_commit"),
            "code_dirty": row.get("code_dirty"),
        }
    )


def pending_entry(raw: bytes) -> tuple[RunInfo, list[GateRecord]] | None:
    """One line of `<db>.pending.jsonl` (a run a locked DB could not take): its run and records; None
    where the line cannot be read (it stays in the file)."""
    try:
        doc = json.loads(raw)
        info = run_info_of(_map(doc.get("run")))
        records = [cast("GateRecord", r) for r in _list(doc.get("records")) if isinstance(r, dict)]
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    return info, records


def report_contents(doc: Mapping[str, Any]) -> tuple[RunInfo, list[GateRecord], list[dict[str, Any]]]:
    """A JSON report's run, records (as written) and calibrations; KeyError when its run is cut short."""
    run = run_info_of(_map(doc.get("run")))
    gates = [cast("GateRecord", g) for g in _list(doc.get("gates")) if isinstance(g, dict)]
    calibrations = [c for c in _list(doc.get("calibrations")) if isinstance(c, dict)]
    return run, gates, calibrations


def calibration_module(calibration: Mapping[str, Any]) -> str:
    """The module a --mlx-calibrate measurement is of (the JSON report sorts them by it)."""
    return str(calibration.get("module"))
