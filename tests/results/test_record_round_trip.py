"""One record, its wire form beside it: `parse_record(r.to_json())` is `r` for any record, and a record
read from the wire writes that wire again (stored records of every writer, as the suite's gates wrote them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.results.fields import Interval, dumps, jsonable
from pytest_mlxgate.results.model import ErrorInfo, Lever, LimitsFrom, ModelInfo, Record, Sizes, parse_record
from pytest_mlxgate.results.record_capability import (
    Answer,
    CapabilityScore,
    Flipped,
    FlippedItem,
    ScoreTask,
    Task,
)
from pytest_mlxgate.results.record_checks import CheckResult
from pytest_mlxgate.results.record_kl import (
    AA,
    STATS_KEYS,
    Attribution,
    Histogram,
    KLProfile,
    LayerError,
    PositionProfile,
    PromptMeans,
    ScopeDrift,
    Stats,
    WorstContext,
    WorstToken,
)
from pytest_mlxgate.results.record_speed import LoadSeen, Ratio, ServedSpeed, Speed, SpeedArm, SpeedContext
from pytest_mlxgate.results.verdicts import VERDICTS
from pytest_mlxgate.results.wire import RECORD_VERSION, migrate_record

STORED = Path(__file__).parent / "records"

# -- values ------------------------------------------------------------------------------------------

reals = st.floats(allow_nan=False, allow_infinity=False, width=64)
opt_real = st.none() | reals
opt_int = st.none() | st.integers(-(2**53), 2**53)
words = st.text(max_size=12)
opt_text = st.none() | words
some_text = st.text(min_size=1, max_size=12)  # fields where "" reads as None
opt_some_text = st.none() | some_text
intervals = st.builds(Interval, opt_real, opt_real)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | reals | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=8,
)


def kept(typed: frozenset[str] | tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """A part's untyped keys: names none of its typed keys have, JSON values."""
    return st.dictionaries(words.map(lambda k: f"x-{k}"), json_values, max_size=2).filter(
        lambda d: not set(d) & set(typed)
    )


def flat(cls: type, **values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(cls, **values, more=kept(tuple(values)))


checks = flat(
    CheckResult,
    metric=opt_text,
    key=opt_text,
    value=opt_real,
    lower=opt_real,
    upper=opt_real,
    limit=opt_real,
    direction=opt_text,
    verdict=st.sampled_from(VERDICTS),  # a current check always has one (`migrate_check` gives older ones theirs)
    n=opt_int,
    n_needed=opt_int,
    method=opt_text,
    p_value=opt_real,
    context=opt_int,
)
positions = flat(
    PositionProfile,
    first=st.tuples(opt_int),
    last=st.tuples(opt_int, opt_int),
    n=st.tuples(opt_int),
    median=st.tuples(opt_real),
    p90=st.tuples(opt_real),
    flips=st.tuples(opt_int),
    near_tie_flips=st.tuples(),
)
worst = flat(
    WorstToken,
    prompt=opt_int,
    position=opt_int,
    kl=opt_real,
    token_id=opt_int,
    ref_top1=opt_int,
    cand_top1=opt_int,
    p_ref=opt_real,
    p_cand=opt_real,
)


@st.composite
def stats(draw: st.DrawFn) -> Stats:
    figures = {k: draw(opt_real) for k in ("mean", "median", "p90", "p95", "p99", "p999", "max", "same_top", "top1")}
    more = draw(kept(STATS_KEYS))
    return Stats(
        present=frozenset({*STATS_KEYS, *more}),
        n_prompts=draw(opt_int),
        n_sequences=draw(opt_int),
        n_tokens=draw(opt_int),
        confidence=draw(opt_real),
        mean_ci=draw(intervals),
        quantile_ci=draw(st.dictionaries(words, intervals, max_size=2)),
        same_top_ci=draw(intervals),
        top1_ci=draw(intervals),
        flips=draw(opt_int),
        near_tie_flips=draw(opt_int),
        near_ties=draw(opt_int),
        ln_ppl_ratio=draw(opt_real),
        worst=tuple(draw(st.lists(worst, max_size=2))),
        more=more,
        **figures,
    )


profiles = st.builds(
    KLProfile,
    histogram=flat(
        Histogram,
        counts=st.tuples(st.integers(0, 9), st.integers(0, 9)),
        decades=st.none() | st.tuples(st.integers(-9, 0), st.integers(0, 3)),
        per_decade=st.integers(0, 8),
        zero=st.integers(0, 5),
        under=st.integers(0, 5),
        over=st.integers(0, 5),
    ),
    by_position=positions,
    prompts=flat(
        PromptMeans,
        index=st.tuples(opt_int),
        mean=st.tuples(opt_real),
        ci=st.tuples(intervals),
        n_tokens=st.tuples(opt_int),
        total=opt_int,
        method=opt_text,
    ),
    worst_context=st.lists(
        flat(WorstContext, prompt=opt_int, position=opt_int, before=opt_text, token=opt_text, after=opt_text),
        max_size=2,
    ).map(tuple),
    more=kept(("histogram", "by_position", "prompts", "worst_context")),
)
attributions = st.builds(
    Attribution,
    sequences=opt_int,
    budget=opt_real,
    whole_mean=opt_real,
    whole_ci=intervals,
    whole_n=opt_int,
    scopes=st.lists(
        st.builds(
            ScopeDrift,
            name=opt_text,
            kind=opt_text,
            layers=st.lists(st.integers(0, 40), max_size=3).map(tuple),
            level=opt_int,
            ranked=st.booleans(),
            n=opt_int,
            mean=opt_real,
            mean_ci=intervals,
            p99=opt_real,
            top1=opt_real,
            by_position=st.none() | positions,
        ),
        max_size=2,
    ).map(tuple),
    residual=st.lists(flat(LayerError, layer=opt_int, type=opt_text, rel_error=opt_real, ci=intervals), max_size=2).map(
        tuple
    ),
    residual_sequences=opt_int,
    notes=st.lists(words, max_size=2).map(tuple),
    sequence_arms=opt_int,
    gate_sequence_arms=opt_int,
    seconds=opt_real,
    gate_seconds=opt_real,
    source=opt_text,
    more=kept(("sequences", "budget", "whole", "scopes", "residual", "notes", "cost", "source")),
)
answers = flat(Answer, output=opt_text, score=opt_real, verdict=opt_text)


@st.composite
def tasks(draw: st.DrawFn) -> dict[str, Task]:
    out = {}
    for name in draw(st.lists(words, max_size=2, unique=True)):
        drop = draw(st.none() | checks.map(lambda c: _replace(c, direction="max")))
        floor = draw(st.none() | checks.map(lambda c: _replace(c, direction="min")))
        flipped = st.builds(
            Flipped,
            total=opt_int,
            items=st.lists(
                st.builds(FlippedItem, id=opt_text, prompt=opt_text, reference=answers, candidate=answers), max_size=2
            ).map(tuple),
        )
        out[name] = Task(
            name=name,
            n=draw(opt_int),
            ref_score=draw(opt_real),
            cand_score=draw(opt_real),
            ref_ci=draw(intervals),
            cand_ci=draw(intervals),
            drop_check=drop,
            floor_check=floor,
            flipped=draw(st.none() | flipped),
            more=draw(kept(("n", "ref_score", "cand_score", "ref_ci", "cand_ci", "drop_verdict", "floor_verdict"))),
        )
    return out


def _replace(check: CheckResult, **changes: Any) -> CheckResult:
    import dataclasses

    return dataclasses.replace(check, **changes)


arms = flat(
    SpeedArm, prefill_tps=opt_real, decode_tps=opt_real, peak_bytes=opt_int, kv_bytes=opt_int, kv_held_bytes=opt_int
)
ratios = st.none() | st.builds(Ratio, ratio=opt_real, ci=intervals, n=opt_int, more=kept(("ratio", "ratio_ci", "n")))


def _context(draw: st.DrawFn, length: int) -> SpeedContext:
    return SpeedContext(
        length=length,
        reference=draw(arms),
        candidate=draw(arms),
        prefill=draw(ratios),
        decode=draw(ratios),
        peak=draw(ratios),
        kv=draw(ratios),
        stopped=draw(opt_some_text),
    )


loads = st.none() | flat(LoadSeen, cores=opt_int, other_cores=opt_real, share=opt_real, high=st.none() | st.booleans())


@st.composite
def served_speeds(draw: st.DrawFn) -> ServedSpeed | None:
    if not draw(st.booleans()):
        return None
    concurrent = _context(draw, draw(st.integers(1, 10**6))) if draw(st.booleans()) else None
    return ServedSpeed(
        reference=draw(opt_some_text),
        candidate=draw(opt_some_text),
        concurrent=concurrent,
        requests=draw(opt_int) if concurrent is not None else None,
        more=draw(kept(("reference", "candidate", "concurrent"))),
    )


@st.composite
def speeds(draw: st.DrawFn) -> Speed:
    lengths = sorted(draw(st.lists(st.integers(1, 10**6), max_size=3, unique=True)))
    return Speed(
        id=draw(opt_some_text),
        repetitions=draw(opt_int),
        decode_tokens=draw(opt_int),
        contexts=tuple(_context(draw, n) for n in lengths),
        weights_reference=draw(opt_int),
        weights_candidate=draw(opt_int),
        memory_method=draw(opt_some_text),
        duration_s=draw(opt_real),
        load_seen=draw(loads),
        served=draw(served_speeds()),
        shape_more=draw(kept(("repetitions", "decode"))),
    )


models = st.none() | flat(ModelInfo, name=opt_text, repo_id=opt_text, commit=opt_text, pinned=opt_text)
limits = st.none() | st.builds(
    LimitsFrom,
    status=some_text,
    model=some_text,
    backend=some_text,
    file=opt_some_text,
    models_entry=opt_some_text,
    why=opt_some_text,
    known_bad_value=json_values,
    known_bad_figures=st.lists(words, max_size=2).map(tuple),
    floors=st.dictionaries(words, reals, max_size=2),
    inside_floor=st.lists(words, max_size=2).map(tuple),
    note=opt_some_text,
    known_bad_more=kept(("value", "figures")),
)
records = st.builds(
    Record,
    nodeid=words,
    gate=opt_some_text,
    mode=opt_text,
    verdict=opt_text,
    time=opt_text,
    record_version=st.just(RECORD_VERSION),
    candidate=models,
    reference_model=models,
    lever=flat(Lever, name=opt_text, kind=opt_text, target=opt_text, ref=opt_text, cand=opt_text, path=opt_text),
    path=opt_text,
    sizes=flat(Sizes, prompts=opt_int, tokens=opt_int, decode=opt_int, chunk=opt_int),
    stats=stats(),
    limits_for=opt_some_text,
    limits_from=limits,
    bounds=st.dictionaries(words, json_values, max_size=3),
    checks=st.lists(checks, max_size=3).map(tuple),
    durations=st.dictionaries(words, reals, max_size=2),
    phases=st.dictionaries(words, reals, max_size=2),
    rerun=opt_text,
    reference_source=opt_text,
    forwards=st.dictionaries(words, opt_int, max_size=2),
    lever_calls_by_arm=st.dictionaries(words, opt_int, max_size=2),
    aa=st.none() | st.builds(AA, floors=st.dictionaries(words, opt_real, max_size=2), more=kept(("floors",))),
    tokens=st.dictionaries(words, words, max_size=2),
    kl_profile=profiles,
    attribution=st.none() | attributions,
    tasks=tasks(),
    skipped=st.dictionaries(words, words, max_size=2),
    capability_score=st.none()
    | st.builds(
        CapabilityScore,
        reference=opt_real,
        candidate=opt_real,
        partial=st.none() | st.booleans(),
        tasks=st.dictionaries(words, flat(ScoreTask, reference=opt_real, candidate=opt_real, n=opt_int), max_size=2),
        missing=st.lists(words, max_size=2).map(tuple),
    ),
    speed=st.none() | speeds(),
    error=st.none() | flat(ErrorInfo, type=opt_text, message=opt_text, phase=opt_text),
    more=kept(tuple(f for f in Record.__dataclass_fields__ if f not in ("left_out", "more")) + ("lever_calls",)),
)


def wire(record: Record) -> Any:
    """What crosses a process or lands in a file: the record's strict JSON text, read back."""
    return json.loads(dumps(record.to_json()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_a_record_written_reads_back_equal(record: Record) -> None:
    assert parse_record(wire(record)) == record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_a_record_read_from_its_wire_writes_that_wire_again(record: Record) -> None:
    once = wire(record)
    assert wire(parse_record(once)) == once


def test_a_part_it_did_not_hold_is_left_out_again_and_a_typed_key_is_never_kept_twice() -> None:
    written = {"nodeid": "g.py::t", "verdict": "pass", "stats": {"mean": 0.1}, "x-new": {"a": 1}}
    out = parse_record(written).to_json()
    assert out == {**written, "record_version": RECORD_VERSION}  # no nulls added for what it did not hold
    assert parse_record(written).more == {"x-new": {"a": 1}}  # a newer field survives this reader
    assert set(parse_record(written).stats.more) == set()  # "mean" is typed, not kept as written


def _stored() -> list[Path]:
    return sorted(STORED.glob("*.json"))


@pytest.mark.parametrize("path", _stored(), ids=lambda p: p.stem)
def test_every_writer_s_record_reads_and_writes_as_it_was_written(path: Path) -> None:
    """Records the suite's own gates wrote (KL with profile and attribution, A/A, capability, the score,
    speed, proven and refuted limits, errors, a version-1 record): each parses to a record that writes
    the same wire, after the one migration of older shapes."""
    written = json.loads(path.read_text(encoding="utf-8"))
    record = parse_record(written)
    assert jsonable(record.to_json()) == jsonable(migrate_record(written))
    assert parse_record(wire(record)) == (
        record if written.get("record_version") == RECORD_VERSION else _replace_version(record)
    )


def _replace_version(record: Record) -> Record:
    import dataclasses

    return dataclasses.replace(record, record_version=RECORD_VERSION)


def test_the_stored_records_cover_every_writer() -> None:
    """A writer whose record is not among the stored ones is a writer whose wire form is untested here."""
    read = [parse_record(json.loads(p.read_text(encoding="utf-8"))) for p in _stored()]
    assert {r.mode for r in read} >= {"gate", "aa", "capability", "score", "error"}
    assert any(r.speed is not None for r in read) and any(r.attribution is not None for r in read)
    assert any(r.kl_profile.histogram.counts for r in read) and any(r.limits_from is not None for r in read)
    assert any(r.record_version == 1 for r in read)
