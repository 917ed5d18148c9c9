"""A gate record as JUnit XML properties: flat `mlxgate.*` names any junit reader can use, plus the record.

`junit_properties` gives one gate's `(name, value)` pairs: `mlxgate.verdict`, `mlxgate.kl.mean.upper`,
`mlxgate.capability.mmlu.drop.limit`, `mlxgate.speed.decode.lower`, a gate that raised its
`mlxgate.error.type`, `.phase` and `.message`, where its limits come from `mlxgate.limits_from` (the
words every report shows) with its `.status`, `.shown` and `.file` … and last `mlxgate.record`, the
whole record as strict JSON (what `--mlx-report` writes for that gate). Interval ends are `.lower`
and `.upper` whatever the metric's direction; the bound a verdict compared is `.upper` for a
"must stay below" metric and `.lower` for a "must reach" one (top-1, a score floor, a speed-up).

Where they go depends on `junit_family`. The JUnit schema pytest's xunit2 follows (the Jenkins xunit
plugin's junit-10.xsd) has no `<properties>` in a `<testcase>`, only in a `<testsuite>`; that is why
pytest's `record_property` warns under xunit2. So under xunit1/legacy each gate's properties sit in
its own `<testcase>`; under xunit2 (pytest's default) they sit in the `<testsuite>`, each name
scoped by the gate's node id: `mlxgate[gates/test_kv.py::test_drift].verdict` (`suite_properties`,
read back with `split_suite_name`). Standard library only (the xdist controller builds them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from .fields import dumps, jsonable
from .model import Interval, LimitsFrom, Record
from .record_capability import CapabilityScore
from .record_checks import CheckResult
from .record_speed import Speed
from .records import RECORD_PROPERTY

__all__ = ["PREFIX", "junit_properties", "property_text", "record_json", "split_suite_name", "suite_properties"]

PREFIX = "mlxgate."

_Pairs = Iterator[tuple[str, Any]]


def property_text(value: Any) -> str | None:
    """A value as a property's text: numbers as Python/JSON write them, None (and NaN, inf) left out."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return value
    return dumps(value)


def junit_properties(record: Record) -> list[tuple[str, str]]:
    """One gate's flat properties, then `mlxgate.record` (strict JSON). Each name once."""
    seen: dict[str, str] = {}
    for name, value in _flat(record):
        text = property_text(value)
        if text is not None and name not in seen:
            seen[name] = text
    seen.pop(RECORD_PROPERTY, None)
    return [*seen.items(), (RECORD_PROPERTY, record_json(record))]


def record_json(record: Record) -> str:
    """The record as strict JSON in printable ASCII: pytest's junitxml rewrites what XML cannot hold
    (DEL, some code points) as `#x..`, which would change a token's text inside the record."""
    return json.dumps(jsonable(record.to_json()), ensure_ascii=True, allow_nan=False).replace("\x7f", "\\u007f")


def suite_properties(record: Record) -> list[tuple[str, str]]:
    """The same pairs for the `<testsuite>` (xunit2): `mlxgate[NODEID].verdict` … `mlxgate[NODEID].record`."""
    scope = f"mlxgate[{record.nodeid}]."
    return [(scope + name.removeprefix(PREFIX), value) for name, value in junit_properties(record)]


def split_suite_name(name: str) -> tuple[str, str] | None:
    """`mlxgate[a.py::test_x[1]].kl.mean` -> (`a.py::test_x[1]`, `mlxgate.kl.mean`); None if not one of ours."""
    if not name.startswith("mlxgate["):
        return None
    nodeid, sep, rest = name[len("mlxgate[") :].rpartition("].")  # a key never holds "]."; a node id may
    return (nodeid, PREFIX + rest) if sep and nodeid else None


# -- the flat names ------------------------------------------------------------------------------


def _flat(record: Record) -> _Pairs:
    yield "mlxgate.gate", record.gate
    yield "mlxgate.verdict", record.verdict
    yield "mlxgate.mode", record.mode
    yield "mlxgate.model", record.candidate.label if record.candidate else None
    yield "mlxgate.reference_model", record.reference_model.label if record.reference_model else None
    yield "mlxgate.lever", record.lever.name
    yield "mlxgate.lever.reference", record.lever.ref
    yield "mlxgate.lever.candidate", record.lever.cand
    yield "mlxgate.path", record.path
    yield "mlxgate.n_prompts", record.n_prompts
    yield "mlxgate.n_tokens", record.stats.n_tokens
    yield "mlxgate.reference_source", record.reference_source
    yield "mlxgate.duration_s", record.total_s
    if record.error is not None:  # a gate that raised: what, where, and its message's first lines
        yield "mlxgate.error.type", record.error.type
        yield "mlxgate.error.phase", record.error.phase
        yield "mlxgate.error.message", record.error.message
    if record.limits_from is not None:
        yield from _limits_from(record.limits_from)
    if record.mode == "score" and record.capability_score is not None:
        yield from _score(record.capability_score)
    if record.mode in ("gate", "aa") and record.stats.present:
        yield from _kl(record)
    if record.oracle is not None:  # both arms' KL from the float32 oracle (`relative=`)
        yield "mlxgate.oracle", record.oracle.words
        yield "mlxgate.oracle.dtype", record.oracle.dtype
        yield "mlxgate.oracle.plain_mean", record.oracle.plain
        yield "mlxgate.oracle.candidate_mean", record.oracle.candidate
    if record.server is not None:  # a candidate served over HTTP: its KL a lower bound from the top-k
        yield "mlxgate.server", record.server.words
        yield "mlxgate.server.url", record.server.url
        yield "mlxgate.server.k", record.server.k
        yield "mlxgate.server.bound", record.server.bound
    if record.mode == "capability":
        yield from _capability(record)
    if record.speed is not None:
        yield from _speed(record, record.speed)
    yield "mlxgate.rerun", record.rerun


def _limits_from(limits: LimitsFrom) -> _Pairs:
    """Where the gate's limits were shown to work on the model and backend it judged: its words, then the parts."""
    yield "mlxgate.limits_from", limits.words
    yield "mlxgate.limits_from.status", limits.status
    yield "mlxgate.limits_from.shown", limits.shown
    yield "mlxgate.limits_from.model", limits.model
    yield "mlxgate.limits_from.backend", limits.backend
    yield "mlxgate.limits_from.dtype", limits.dtype
    yield "mlxgate.limits_from.file", limits.file
    yield "mlxgate.limits_from.known_bad", limits.known_bad


def _interval(name: str, ci: Interval) -> _Pairs:
    yield f"{name}.lower", ci.lower
    yield f"{name}.upper", ci.upper


def _check(name: str, check: CheckResult) -> _Pairs:
    """A check's value, interval ends, limit and verdict under `name`."""
    yield name, check.value
    yield f"{name}.lower", check.lower
    yield f"{name}.upper", check.upper
    yield f"{name}.limit", check.limit
    yield f"{name}.verdict", check.verdict or "fail"
    yield f"{name}.n_needed", check.n_needed


def _kl(record: Record) -> _Pairs:
    stats = record.stats
    for c in record.checks:
        if record.mode == "aa":
            key = f"mlxgate.aa.{c.key}"
            yield f"{key}.floor", c.value
            yield f"{key}.limit", c.limit
            yield f"{key}.verdict", "pass" if c.passed else "fail"
        else:
            yield from _check(f"mlxgate.kl.{c.key}", c)
    # what every KL gate measured, asserted or not (a name already given by a check keeps its value)
    yield "mlxgate.kl.mean", stats.mean
    yield from _interval("mlxgate.kl.mean", stats.mean_ci)
    yield "mlxgate.kl.p99", stats.p99
    yield from _interval("mlxgate.kl.p99", stats.quantile_interval("p99"))
    yield "mlxgate.kl.max", stats.max
    yield "mlxgate.kl.top1", stats.top1
    yield from _interval("mlxgate.kl.top1", stats.top1_ci)
    yield "mlxgate.kl.flips", stats.flips
    yield "mlxgate.kl.near_tie_flips", stats.near_tie_flips
    for key, floor in sorted(record.floors.items()):
        yield f"mlxgate.aa.{key}.floor", floor


def _capability(record: Record) -> _Pairs:
    for task in record.tasks.values():
        base = f"mlxgate.capability.{task.name}"
        yield f"{base}.n", task.n
        yield f"{base}.reference", task.ref_score
        yield from _interval(f"{base}.reference", task.ref_ci)
        yield f"{base}.candidate", task.cand_score
        yield from _interval(f"{base}.candidate", task.cand_ci)
        if task.drop_check is not None:
            yield from _check(f"{base}.drop", task.drop_check)
        if task.floor_check is not None:
            yield from _check(f"{base}.score", task.floor_check)
    for task_name, why in record.skipped.items():
        yield f"mlxgate.capability.{task_name}.skipped", why


def _score(score: CapabilityScore) -> _Pairs:
    yield "mlxgate.score.reference", score.reference
    yield "mlxgate.score.candidate", score.candidate
    yield "mlxgate.score.partial", score.partial
    for task, v in score.tasks.items():
        yield f"mlxgate.score.{task}.reference", v.reference
        yield f"mlxgate.score.{task}.candidate", v.candidate


def _speed(record: Record, speed: Speed) -> _Pairs:
    """The longest context unqualified (`mlxgate.speed.decode.ratio`), others as `mlxgate.speed@64.…`."""
    longest = speed.longest

    def base(context: int | None) -> str:
        at_longest = longest is not None and context == longest.length
        return "mlxgate.speed" if context is None or at_longest else f"mlxgate.speed@{context}"

    if longest is not None:
        yield "mlxgate.speed.context", longest.length
    for ctx in reversed(speed.contexts):
        name = base(ctx.length)
        for key, est in (("prefill", ctx.prefill), ("decode", ctx.decode), ("peak", ctx.peak)):
            if est is not None:
                yield f"{name}.{key}.ratio", est.ratio
                yield from _interval(f"{name}.{key}.ratio", est.ci)
                yield f"{name}.{key}.pairs", est.n
        yield f"{name}.prefill.reference_tps", ctx.reference.prefill_tps
        yield f"{name}.prefill.candidate_tps", ctx.candidate.prefill_tps
        yield f"{name}.decode.reference_tps", ctx.reference.decode_tps
        yield f"{name}.decode.candidate_tps", ctx.candidate.decode_tps
        yield f"{name}.kv.ratio", ctx.kv.ratio if ctx.kv is not None else None
        yield f"{name}.kv.reference_bytes", ctx.reference.kv_bytes
        yield f"{name}.kv.candidate_bytes", ctx.candidate.kv_bytes
        yield f"{name}.kv.reference_held_bytes", ctx.reference.kv_held_bytes
        yield f"{name}.kv.candidate_held_bytes", ctx.candidate.kv_held_bytes
        yield f"{name}.peak.reference_bytes", ctx.reference.peak_bytes
        yield f"{name}.peak.candidate_bytes", ctx.candidate.peak_bytes
    if speed.weights_ratio is not None:
        yield "mlxgate.speed.weights.ratio", speed.weights_ratio
    yield "mlxgate.speed.weights.reference_bytes", speed.weights_reference
    yield "mlxgate.speed.weights.candidate_bytes", speed.weights_candidate
    for c in record.checks:
        key = c.key or ""
        if not key.startswith("speed."):
            continue
        goal = {"memory": "peak"}.get(key.removeprefix("speed."), key.removeprefix("speed."))
        name = f"{base(c.context)}.{goal}"  # beside the figures above: `.ratio`, `.ratio.lower` …
        yield f"{name}.limit", c.limit
        yield f"{name}.verdict", c.verdict
        yield f"{name}.n_needed", c.n_needed
