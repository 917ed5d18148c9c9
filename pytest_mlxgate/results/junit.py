"""A gate record as JUnit XML properties: flat `mlxgate.*` names any junit reader can use, plus the record.

`junit_properties` gives one gate's `(name, value)` pairs: `mlxgate.verdict`, `mlxgate.kl.mean.upper`,
`mlxgate.capability.mmlu.drop.limit`, `mlxgate.speed.decode.lower`, a gate that raised its
`mlxgate.error.type`, `.phase` and `.message` … and last `mlxgate.record`, the whole record as strict
JSON (what `--mlx-report` writes for that gate). Interval ends are `.lower`
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
from collections.abc import Iterator, Mapping
from typing import Any

from .fields import as_map, check_interval, dumps, integer, jsonable, model_name, nodeid_of, real
from .records import RECORD_PROPERTY, GateRecord

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


def junit_properties(record: GateRecord) -> list[tuple[str, str]]:
    """One gate's flat properties, then `mlxgate.record` (strict JSON). Each name once."""
    seen: dict[str, str] = {}
    for name, value in _flat(record):
        text = property_text(value)
        if text is not None and name not in seen:
            seen[name] = text
    seen.pop(RECORD_PROPERTY, None)
    return [*seen.items(), (RECORD_PROPERTY, record_json(record))]


def record_json(record: GateRecord) -> str:
    """The record as strict JSON in printable ASCII: pytest's junitxml rewrites what XML cannot hold
    (DEL, some code points) as `#x..`, which would change a token's text inside the record."""
    return json.dumps(jsonable(record), ensure_ascii=True, allow_nan=False).replace("\x7f", "\\u007f")


def suite_properties(record: GateRecord) -> list[tuple[str, str]]:
    """The same pairs for the `<testsuite>` (xunit2): `mlxgate[NODEID].verdict` … `mlxgate[NODEID].record`."""
    scope = f"mlxgate[{nodeid_of(record)}]."
    return [(scope + name.removeprefix(PREFIX), value) for name, value in junit_properties(record)]


def split_suite_name(name: str) -> tuple[str, str] | None:
    """`mlxgate[a.py::test_x[1]].kl.mean` -> (`a.py::test_x[1]`, `mlxgate.kl.mean`); None if not one of ours."""
    if not name.startswith("mlxgate["):
        return None
    nodeid, sep, rest = name[len("mlxgate["):].rpartition("].")  # a key never holds "]."; a node id may
    return (nodeid, PREFIX + rest) if sep and nodeid else None


# -- the flat names ------------------------------------------------------------------------------


def _flat(record: GateRecord) -> _Pairs:
    stats, sizes = as_map(record.get("stats")), as_map(record.get("sizes"))
    yield "mlxgate.gate", record.get("gate")
    yield "mlxgate.verdict", record.get("verdict")
    yield "mlxgate.mode", record.get("mode")
    yield "mlxgate.model", model_name(record.get("candidate"))
    yield "mlxgate.reference_model", model_name(record.get("reference_model"))
    lever = as_map(record.get("lever"))
    yield "mlxgate.lever", lever.get("name")
    yield "mlxgate.lever.reference", lever.get("ref")
    yield "mlxgate.lever.candidate", lever.get("cand")
    yield "mlxgate.path", record.get("path")
    yield "mlxgate.n_prompts", integer(stats.get("n_prompts", sizes.get("prompts")))
    yield "mlxgate.n_tokens", integer(stats.get("n_tokens"))
    yield "mlxgate.reference_source", record.get("reference_source")
    yield "mlxgate.duration_s", real(as_map(record.get("durations")).get("total_s"))
    error = as_map(record.get("error"))  # a gate that raised: what, where, and its message's first lines
    yield "mlxgate.error.type", error.get("type")
    yield "mlxgate.error.phase", error.get("phase")
    yield "mlxgate.error.message", error.get("message")
    mode = record.get("mode")
    if mode == "score":
        yield from _score(as_map(record.get("capability_score")))
    if mode in ("gate", "aa") and stats:
        yield from _kl(record, stats)
    if mode == "capability":
        yield from _capability(record)
    if record.get("speed"):
        yield from _speed(record)
    yield "mlxgate.rerun", record.get("rerun")


def _interval(name: str, ci: Any) -> _Pairs:
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        yield f"{name}.lower", real(ci[0])
        yield f"{name}.upper", real(ci[1])


def _check(name: str, check: Mapping[str, Any]) -> _Pairs:
    """A check's value, interval ends, limit and verdict under `name`."""
    lower, upper = check_interval(check)
    yield name, real(check.get("value"))
    yield f"{name}.lower", lower
    yield f"{name}.upper", upper
    yield f"{name}.limit", real(check.get("limit"))
    yield f"{name}.verdict", check.get("verdict") or ("pass" if check.get("passed") else "fail")
    yield f"{name}.n_needed", integer(check.get("n_needed"))


def _kl(record: GateRecord, stats: Mapping[str, Any]) -> _Pairs:
    for check in record.get("checks") or []:
        c = as_map(check)
        if record.get("mode") == "aa":
            key = f"mlxgate.aa.{c.get('key')}"
            yield f"{key}.floor", real(c.get("value"))
            yield f"{key}.limit", real(c.get("limit"))
            yield f"{key}.verdict", "pass" if c.get("passed") else "fail"
        else:
            yield from _check(f"mlxgate.kl.{c.get('key')}", c)
    # what every KL gate measured, asserted or not (a name already given by a check keeps its value)
    yield "mlxgate.kl.mean", real(stats.get("mean"))
    yield from _interval("mlxgate.kl.mean", stats.get("mean_ci"))
    yield "mlxgate.kl.p99", real(stats.get("p99"))
    yield from _interval("mlxgate.kl.p99", as_map(stats.get("quantile_ci")).get("p99"))
    yield "mlxgate.kl.max", real(stats.get("max"))
    yield "mlxgate.kl.top1", real(stats.get("top1"))
    yield from _interval("mlxgate.kl.top1", stats.get("top1_ci"))
    yield "mlxgate.kl.flips", integer(stats.get("flips"))
    yield "mlxgate.kl.near_tie_flips", integer(stats.get("near_tie_flips"))
    for key, floor in sorted(as_map(as_map(record.get("aa")).get("floors")).items()):
        yield f"mlxgate.aa.{key}.floor", real(floor)


def _capability(record: GateRecord) -> _Pairs:
    for task, info in as_map(record.get("tasks")).items():
        t = as_map(info)
        base = f"mlxgate.capability.{task}"
        yield f"{base}.n", integer(t.get("n"))
        yield f"{base}.reference", real(t.get("ref_score"))
        yield from _interval(f"{base}.reference", t.get("ref_ci"))
        yield f"{base}.candidate", real(t.get("cand_score"))
        yield from _interval(f"{base}.candidate", t.get("cand_ci"))
        drop = as_map(t.get("drop_verdict"))
        if drop:
            yield from _check(f"{base}.drop", {"direction": "max", "other_bound": drop.get("lower"),
                                               **drop, "bound": drop.get("upper")})
        floor = as_map(t.get("floor_verdict"))
        if floor:
            yield from _check(f"{base}.score", {"direction": "min", **floor, "bound": floor.get("lower")})
    for task, why in as_map(record.get("skipped")).items():
        yield f"mlxgate.capability.{task}.skipped", why


def _score(score: Mapping[str, Any]) -> _Pairs:
    yield "mlxgate.score.reference", real(score.get("reference"))
    yield "mlxgate.score.candidate", real(score.get("candidate"))
    yield "mlxgate.score.partial", score.get("partial")
    for task, v in as_map(score.get("tasks")).items():
        yield f"mlxgate.score.{task}.reference", real(as_map(v).get("reference"))
        yield f"mlxgate.score.{task}.candidate", real(as_map(v).get("candidate"))


def _speed(record: GateRecord) -> _Pairs:
    """The longest context unqualified (`mlxgate.speed.decode.ratio`), others as `mlxgate.speed@64.…`."""
    speed = as_map(record.get("speed"))
    contexts = as_map(speed.get("contexts"))
    measured = sorted((c for c in contexts if _int_or_none(c) is not None), key=int)
    longest = measured[-1] if measured else None

    def base(context: Any) -> str:
        return "mlxgate.speed" if context is None or str(context) == longest else f"mlxgate.speed@{context}"

    if longest is not None:
        yield "mlxgate.speed.context", int(longest)
    for context in reversed(measured):
        ctx, name = as_map(contexts[context]), base(context)
        ref, cand = as_map(ctx.get("reference")), as_map(ctx.get("candidate"))
        for key in ("prefill", "decode", "peak"):
            est = as_map(ctx.get(key))
            if est:
                yield f"{name}.{key}.ratio", real(est.get("ratio"))
                yield from _interval(f"{name}.{key}.ratio", est.get("ratio_ci"))
                yield f"{name}.{key}.pairs", integer(est.get("n"))
        for key in ("prefill", "decode"):
            yield f"{name}.{key}.reference_tps", real(ref.get(f"{key}_tps"))
            yield f"{name}.{key}.candidate_tps", real(cand.get(f"{key}_tps"))
        yield f"{name}.kv.ratio", real(as_map(ctx.get("kv")).get("ratio"))
        yield f"{name}.kv.reference_bytes", integer(ref.get("kv_bytes"))
        yield f"{name}.kv.candidate_bytes", integer(cand.get("kv_bytes"))
        yield f"{name}.peak.reference_bytes", integer(ref.get("peak_bytes"))
        yield f"{name}.peak.candidate_bytes", integer(cand.get("peak_bytes"))
    weights = as_map(speed.get("weights_bytes"))
    ref_w, cand_w = integer(weights.get("reference")), integer(weights.get("candidate"))
    if ref_w and cand_w is not None:
        yield "mlxgate.speed.weights.ratio", cand_w / ref_w
    yield "mlxgate.speed.weights.reference_bytes", ref_w
    yield "mlxgate.speed.weights.candidate_bytes", cand_w
    for check in record.get("checks") or []:
        c = as_map(check)
        key = str(c.get("key") or "")
        if not key.startswith("speed."):
            continue
        goal = {"memory": "peak"}.get(key.removeprefix("speed."), key.removeprefix("speed."))
        name = f"{base(c.get('context'))}.{goal}"  # beside the figures above: `.ratio`, `.ratio.lower` …
        yield f"{name}.limit", real(c.get("limit"))
        yield f"{name}.verdict", c.get("verdict")
        yield f"{name}.n_needed", integer(c.get("n_needed"))


def _int_or_none(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None
