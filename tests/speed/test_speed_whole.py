"""The speed assertions' whole output on recorded figures: every check `speed_checks` makes (each field,
in order, for every goal and context), the whole failure message a user reads, the contexts `at=` picks,
and the JSON a trial and a shape record."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from speed_words import context_text

from pytest_mlxgate import assert_faster, assert_smaller
from pytest_mlxgate.speed.assertions import speed_checks, speed_failure
from pytest_mlxgate.speed.result import Trial
from pytest_mlxgate.speed.shape import SpeedGoal, SpeedShape

SAMPLED = "geometric mean of paired ratios, Student-t on their logs"
KV_EXACT = "bytes counted over the cache arrays (exact)"
WEIGHTS_EXACT = "bytes counted over the parameters (exact)"


def est(ratio: float | None, lo: float | None, hi: float | None, n: int = 9, log_sd: float | None = 0.05) -> Any:
    return {"ratio": ratio, "ratio_ci": [lo, hi], "n": n, "log_sd": log_sd}


def arm(prefill: float, decode: float, kv: int) -> dict[str, Any]:
    return {"prefill_tps": prefill, "decode_tps": decode, "kv_bytes": kv, "peak_bytes": None}


def record() -> dict[str, Any]:
    """Three contexts, keyed so that text order (600, 64, 8192) is not number order (64, 600, 8192)."""
    return {
        "shape": {"contexts": [64, 600, 8192], "decode": 16, "repetitions": 9, "warmup": 2},
        "memory_method": "mlx allocator peak (mx.get_peak_memory)",
        "weights_bytes": {"reference": 400, "candidate": 100},
        "contexts": {
            "600": {  # decode straddles its goal (a spread known), prefill too (no spread), memory unread
                "reference": arm(250.0, 12.5, 4 << 20),
                "candidate": arm(300.0, 13.0, 2 << 20),
                "decode": est(1.08, 1.0, 1.16),
                "prefill": est(1.12, 1.0, 1.3, n=4, log_sd=None),
                "peak": est(None, None, None),
                "kv": {"ratio": 0.35},
            },
            "64": {  # decode shown, prefill shown short, no peak, KV shown
                "reference": arm(100.0, 10.0, 1 << 20),
                "candidate": arm(110.0, 13.0, 1 << 19),
                "decode": est(1.3, 1.2, 1.4),
                "prefill": est(1.0, 0.9, 1.05),
                "peak": None,
                "kv": {"ratio": 0.25},
            },
            "8192": {  # no decode pairs, an empty prefill, a peak shown under its goal, no KV figure
                "reference": arm(50.0, 5.0, 8 << 20),
                "candidate": arm(55.0, 5.5, 4 << 20),
                "prefill": {},
                "peak": est(0.5, 0.45, 0.55, n=5),
            },
        },
    }


GOALS = {"decode": 1.05, "prefill": 1.1, "memory": 0.6, "kv": 0.3, "weights": 0.5}  # weights last: still first


def made(
    metric: str,
    key: str,
    value: float | None,
    lower: float | None,
    upper: float | None,
    limit: float,
    direction: str,
    verdict: str,
    n: int,
    method: str,
    context: int | None,
    n_needed: int | None = None,
) -> dict[str, Any]:
    out = {
        "metric": metric,
        "key": key,
        "value": value,
        "lower": lower,
        "upper": upper,
        "limit": limit,
        "direction": direction,
        "verdict": verdict,
        "n": n,
        "n_needed": n_needed,
        "method": method,
    }
    if context is not None:
        out["context"] = context
    return out


def expected_at(context: int) -> list[dict[str, Any]]:
    """The four per-context checks of GOALS at `context`, in GOALS' order."""
    rows = {
        64: [
            made("decode tok/s @64", "speed.decode", 1.3, 1.2, 1.4, 1.05, "min", "pass", 9, SAMPLED, 64),
            made("prefill tok/s @64", "speed.prefill", 1.0, 0.9, 1.05, 1.1, "min", "fail", 9, SAMPLED, 64),
            made(
                "peak memory @64",
                "speed.memory",
                None,
                None,
                None,
                0.6,
                "max",
                "inconclusive",
                0,
                "not measured on this backend",
                64,
            ),  # fmt: skip
            made("KV bytes @64", "speed.kv", 0.25, 0.25, 0.25, 0.3, "max", "pass", 1, KV_EXACT, 64),
        ],
        600: [
            # (t(0.975, 8) * 0.05 / log(1.08 / 1.05)) ** 2 = 16.7: 17 pairs would tell
            made(
                "decode tok/s @600", "speed.decode", 1.08, 1.0, 1.16, 1.05, "min", "inconclusive", 9, SAMPLED, 600, 17
            ),
            made("prefill tok/s @600", "speed.prefill", 1.12, 1.0, 1.3, 1.1, "min", "inconclusive", 4, SAMPLED, 600),
            made(
                "peak memory @600",
                "speed.memory",
                None,
                None,
                None,
                0.6,
                "max",
                "inconclusive",
                0,
                "not measured on this backend",
                600,
            ),  # fmt: skip
            made("KV bytes @600", "speed.kv", 0.35, 0.35, 0.35, 0.3, "max", "fail", 1, KV_EXACT, 600),
        ],
        8192: [
            made(
                "decode tok/s @8192",
                "speed.decode",
                None,
                None,
                None,
                1.05,
                "min",
                "inconclusive",
                0,
                "no pairs",
                8192,
            ),  # fmt: skip
            made(
                "prefill tok/s @8192",
                "speed.prefill",
                None,
                None,
                None,
                1.1,
                "min",
                "inconclusive",
                0,
                "no pairs",
                8192,
            ),  # fmt: skip
            made("peak memory @8192", "speed.memory", 0.5, 0.45, 0.55, 0.6, "max", "pass", 5, SAMPLED, 8192),
            made("KV bytes @8192", "speed.kv", None, None, None, 0.3, "max", "inconclusive", 1, KV_EXACT, 8192),
        ],
    }
    return rows[context]


WEIGHTS = made("weight bytes", "speed.weights", 0.25, 0.25, 0.25, 0.5, "max", "pass", 1, WEIGHTS_EXACT, None)


@pytest.mark.parametrize(
    ("at", "contexts"),
    [(None, [8192]), ("all", [64, 600, 8192]), (600, [600]), (64, [64])],
)
def test_every_check_of_every_goal_and_context_field_by_field(at: Any, contexts: list[int]) -> None:
    checks = speed_checks(record(), GOALS, at)
    assert checks == [WEIGHTS, *(c for context in contexts for c in expected_at(context))]


def test_goals_keep_their_order_and_only_the_asked_ones_are_checked() -> None:
    checks = speed_checks(record(), {"kv": 0.3, "decode": 1.05}, "all")
    assert [(c["key"], c["context"]) for c in checks] == [
        (key, context) for context in (64, 600, 8192) for key in ("speed.kv", "speed.decode")
    ]


@pytest.mark.parametrize(
    ("weights", "value"),
    [
        ({"reference": 1000, "candidate": 310}, 0.31),
        ({"reference": 0, "candidate": 310}, None),  # nothing counted on the reference: no ratio
        ({"candidate": 310}, None),
        (None, None),
    ],
)
def test_the_weights_ratio_is_counted_once_for_the_run(weights: Any, value: float | None) -> None:
    speed = {"contexts": {}, "weights_bytes": weights}
    (check,) = speed_checks(speed, {"weights": 0.3}, None)
    verdict = "inconclusive" if value is None else "fail"
    assert check == made(
        "weight bytes", "speed.weights", value, value, value, 0.3, "max", verdict, 1, WEIGHTS_EXACT, None
    )


def test_no_contexts_measured_means_no_per_context_checks() -> None:
    assert speed_checks({}, {"decode": 1.05}, None) == []
    assert speed_checks({"contexts": None}, {"decode": 1.05}, "all") == []


@pytest.mark.parametrize("at", [8192 + 1, True, "600", 600.0, "longest"])
@pytest.mark.parametrize("assertion", ["assert_faster", "assert_smaller"])
def test_an_unmeasured_at_is_refused_in_whole_words(at: Any, assertion: str) -> None:
    speed = record()
    speed["contexts"]["1"] = speed["contexts"]["64"]  # True == 1: a bool is still no context
    message = (
        f"{assertion}(at={at!r}): speed was measured at [1, 64, 600, 8192] tokens of context; "
        "pass one of them, 'all', or leave it out for the longest"
    )
    with pytest.raises(ValueError) as info:
        speed_checks(speed, {"decode": 1.05}, at, assertion=assertion)
    assert str(info.value) == message
    if assertion == "assert_faster":
        with pytest.raises(ValueError) as info:
            speed_checks(speed, {"decode": 1.05}, at)  # the default names assert_faster
        assert str(info.value) == message


def _message(verdict: str, checks: list[dict[str, Any]], *, nodeid: str = "gates/test_kv.py::test_fast") -> str:
    return speed_failure(record(), checks, nodeid=nodeid, rerun="pytest gates/test_kv.py::test_fast", verdict=verdict)


def _tail(speed: dict[str, Any]) -> list[str]:
    """What every failure message ends with: each context's figures, the measurement's shape, the re-run."""
    return [
        *(
            f"  @{c} tokens: {context_text(ctx)}"
            for c, ctx in sorted(speed["contexts"].items(), key=lambda kv: int(kv[0]))
        ),
        "  measured: 9 interleaved pairs per context after 2 warm-up, 16 decoded tokens per trial; "
        "memory: mlx allocator peak (mx.get_peak_memory)",
        "  re-run: pytest gates/test_kv.py::test_fast",
    ]


def test_the_failure_message_line_by_line() -> None:
    checks = speed_checks(record(), GOALS, "all")
    assert _message("fail", checks).split("\n") == [
        "speed and memory gate failed (shown past a goal): test_kv.py::test_fast",
        "  weight bytes: candidate/reference ×0.250, asked ≤ ×0.5",
        "  decode tok/s @64: candidate/reference ×1.300 (95% interval ×1.200–×1.400 over 9 pairs), asked ≥ ×1.05",
        "  prefill tok/s @64: candidate/reference ×1.000 (95% interval ×0.900–×1.050 over 9 pairs), asked ≥ ×1.1"
        "  ✗ fail",
        "  peak memory @64: candidate/reference not measured, asked ≤ ×0.6  ? inconclusive",
        "    not measured on this backend",
        "  KV bytes @64: candidate/reference ×0.250, asked ≤ ×0.3",
        "  decode tok/s @600: candidate/reference ×1.080 (95% interval ×1.000–×1.160 over 9 pairs), asked ≥ ×1.05"
        "  ? inconclusive",
        "    about 17 pairs at the observed spread would tell (--mlx-speed-reps)",
        "  prefill tok/s @600: candidate/reference ×1.120 (95% interval ×1.000–×1.300 over 4 pairs), asked ≥ ×1.1"
        "  ? inconclusive",
        "    more pairs would not tell: the estimate sits on the goal",
        "  peak memory @600: candidate/reference not measured, asked ≤ ×0.6  ? inconclusive",
        "    not measured on this backend",
        "  KV bytes @600: candidate/reference ×0.350, asked ≤ ×0.3  ✗ fail",
        "  decode tok/s @8192: candidate/reference not measured, asked ≥ ×1.05  ? inconclusive",
        "    no pairs",
        "  prefill tok/s @8192: candidate/reference not measured, asked ≥ ×1.1  ? inconclusive",
        "    no pairs",
        "  peak memory @8192: candidate/reference ×0.500 (95% interval ×0.450–×0.550 over 5 pairs), asked ≤ ×0.6",
        "  KV bytes @8192: candidate/reference not measured, asked ≤ ×0.3  ? inconclusive",
        "    " + KV_EXACT,
        *_tail(record()),
    ]


@pytest.mark.parametrize(
    ("goals", "verdict", "head"),
    [
        ({"kv": 0.3}, "fail", "memory gate failed (shown over a goal)"),
        ({"weights": 0.2}, "fail", "memory gate failed (shown over a goal)"),
        ({"prefill": 1.1}, "fail", "speed gate failed (shown short of a goal)"),
        ({"decode": 1.05, "kv": 0.3}, "fail", "speed and memory gate failed (shown past a goal)"),
        (
            {"kv": 0.3, "prefill": 1.1, "decode": 1.05},
            "fail",
            "speed gate failed (shown short of a goal)",
        ),  # at 64: KV passes
        ({"memory": 0.6}, "inconclusive", "memory gate inconclusive (an interval straddles a goal)"),
        ({"decode": 1.05}, "inconclusive", "speed gate inconclusive (an interval straddles a goal)"),
        (
            {"memory": 0.6, "decode": 1.05},
            "inconclusive",
            "speed and memory gate inconclusive (an interval straddles a goal)",
        ),
    ],
)
def test_the_first_line_names_the_gate_by_what_missed(goals: dict[str, float], verdict: str, head: str) -> None:
    checks = speed_checks(record(), goals, 64 if "prefill" in goals else 600)
    assert _message(verdict, checks).split("\n")[0] == f"{head}: test_kv.py::test_fast"
    assert _message(verdict, checks, nodeid="").split("\n")[0] == f"{head}: gate"
    assert _message(verdict, checks, nodeid="test_top.py::t").split("\n")[0] == f"{head}: test_top.py::t"


def test_an_interval_with_one_end_missing_is_not_shown_and_an_empty_record_says_so() -> None:
    speed = {"contexts": {"32": {"decode": est(1.0, None, 1.2)}}}
    checks = speed_checks(speed, {"decode": 1.05}, None)
    text = speed_failure(speed, checks, nodeid="t.py::g", rerun="", verdict="inconclusive")
    assert text.split("\n") == [
        "speed gate inconclusive (an interval straddles a goal): t.py::g",
        "  decode tok/s @32: candidate/reference ×1.000, asked ≥ ×1.05  ? inconclusive",
        "    about 10 pairs at the observed spread would tell (--mlx-speed-reps)",
        f"  @32 tokens: {context_text(speed['contexts']['32'])}",
        "  measured: None interleaved pairs per context after None warm-up, None decoded tokens per trial; "
        "memory: None",
    ]


def test_a_passing_assertion_returns_the_record_and_warns_of_nothing() -> None:
    speed = record()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert assert_faster(speed, decode=1.05, at=64) == speed
        assert assert_faster(speed, prefill=0.9, decode=1.2, at=64)  # both lower ends on their goal == speed
        assert assert_smaller(speed, kv=0.3, at=64) == speed
        assert assert_smaller(speed, weights=0.25, memory=0.6, at=8192) == speed


class _Subject:
    def __init__(self, speed: dict[str, Any]) -> None:
        self.measured = speed
        self.nodeid, self.rerun, self.inconclusive = (
            "gates/test_kv.py::test_fast",
            "pytest gates/test_kv.py::test_fast",
            "fail",
        )
        self.published: list[Any] = []

    def speed(self) -> dict[str, Any]:
        return self.measured

    def vouch(self, conclusion: Any) -> Any:
        return conclusion

    def publish(self, conclusion: Any) -> None:
        self.published.append(conclusion)


def test_assert_faster_publishes_its_checks_and_raises_the_whole_message() -> None:
    subject = _Subject(record())
    with pytest.raises(AssertionError) as info:
        assert_faster(subject, decode=1.05, prefill=1.1, at="all")
    (conclusion,) = subject.published
    expected = [c for context in (64, 600, 8192) for c in expected_at(context)[:2]]
    assert list(conclusion.checks) == expected and dict(conclusion.bounds) == {"decode": 1.05, "prefill": 1.1}
    assert conclusion.verdict == "fail" and conclusion.mode == "speed"
    assert str(info.value) == _message("fail", expected)


def test_assert_smaller_publishes_its_checks_and_raises_the_whole_message() -> None:
    subject = _Subject(record())
    with pytest.raises(AssertionError) as info:
        assert_smaller(subject, kv=0.3, weights=0.5, memory=0.6, at=600)
    (conclusion,) = subject.published
    expected = [WEIGHTS, expected_at(600)[3], expected_at(600)[2]]  # weights first, then kv, memory as asked
    assert list(conclusion.checks) == expected
    assert dict(conclusion.bounds) == {"kv": 0.3, "weights": 0.5, "memory": 0.6}
    assert str(info.value) == _message("fail", expected)


def test_assert_faster_s_memory_goals_warn_in_whole_words_and_judge_alike() -> None:
    subject = _Subject(record())
    with pytest.warns(DeprecationWarning) as warned, pytest.raises(AssertionError) as info:
        assert_faster(subject, decode=1.05, memory=0.6, kv=0.3, weights=0.5, at=64)
    (warning,) = warned
    assert str(warning.message) == (
        "assert_faster(memory=0.6, kv=0.3, weights=0.5): memory goals are assert_smaller's now; write "
        "assert_smaller(paired, memory=0.6, kv=0.3, weights=0.5) (assert_faster keeps them for one release)"
    )
    (conclusion,) = subject.published
    expected = [WEIGHTS, expected_at(64)[0], expected_at(64)[2], expected_at(64)[3]]
    assert list(conclusion.checks) == expected
    assert dict(conclusion.bounds) == {"decode": 1.05, "memory": 0.6, "kv": 0.3, "weights": 0.5}
    assert str(info.value) == _message("inconclusive", expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda s: assert_faster(s),
            "assert_faster needs a goal, e.g. assert_faster(paired, decode=1.05) "
            "(memory: assert_smaller(paired, kv=0.6))",
        ),
        (
            lambda s: assert_smaller(s),
            "assert_smaller needs a goal, e.g. assert_smaller(paired, kv=0.3) or weights=0.31",
        ),
    ],
)
def test_no_goal_is_refused_with_an_example(call: Any, message: str) -> None:
    with pytest.raises(TypeError) as info:
        call(record())
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda s: assert_faster(s, decode=-1.0),
            "assert_faster: decode=-1.0 is not a usable ratio (a positive number)",
        ),
        (lambda s: assert_faster(s, prefill=0), "assert_faster: prefill=0.0 is not a usable ratio (a positive number)"),
        (
            lambda s: assert_smaller(s, memory=-0.5),
            "assert_smaller: memory=-0.5 is not a usable ratio (a positive number)",
        ),
    ],
)
def test_a_goal_that_is_no_positive_ratio_is_refused(call: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call(record())
    assert str(info.value) == message


def test_a_trial_records_every_field_rounded_to_the_microsecond() -> None:
    trial = Trial(prefill_s=0.12345678, decode_s=1.00000049, peak_bytes=12345, kv_bytes=4096, kv_held_bytes=1024)
    assert trial.to_json() == {
        "prefill_s": 0.123457,
        "decode_s": 1.0,
        "peak_bytes": 12345,
        "kv_bytes": 4096,
        "kv_held_bytes": 1024,
    }
    assert Trial(0.5, 0.25, None, 0).to_json() == {
        "prefill_s": 0.5,
        "decode_s": 0.25,
        "peak_bytes": None,
        "kv_bytes": 0,
        "kv_held_bytes": None,
    }


def test_a_shape_records_every_field_and_its_goals() -> None:
    shape = SpeedShape(
        contexts=(64, 512),
        decode=8,
        repetitions=5,
        warmup=0,
        goals=(SpeedGoal("decode", 1.05), SpeedGoal("memory", 0.6, at="all")),
        precision=0.02,
    )
    assert shape.to_json() == {
        "contexts": [64, 512],
        "decode": 8,
        "repetitions": 5,
        "warmup": 0,
        "goals": [{"key": "decode", "limit": 1.05, "at": None}, {"key": "memory", "limit": 0.6, "at": "all"}],
        "precision": 0.02,
    }
    assert SpeedShape(contexts=(128,), decode=4).to_json() == {
        "contexts": [128],
        "decode": 4,
        "repetitions": 9,
        "warmup": 1,
        "goals": [],
        "precision": 0.04,
    }


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("assert_faster", lambda s: assert_faster(s, decode=1.05, at=7)),
        ("assert_smaller", lambda s: assert_smaller(s, kv=0.3, at=7)),
    ],
)
def test_each_assertion_names_itself_when_it_refuses_an_at(name: str, call: Any) -> None:
    with pytest.raises(ValueError) as info:
        call(record())
    assert str(info.value) == (
        f"{name}(at=7): speed was measured at [64, 600, 8192] tokens of context; "
        "pass one of them, 'all', or leave it out for the longest"
    )


def test_the_deprecation_warning_points_past_the_library() -> None:
    """Its own line is the caller's (test_assertions.py checks which; mutation testing adds a frame there):
    never a line of the assertions' module."""
    from pytest_mlxgate.speed import assertions

    with pytest.warns(DeprecationWarning) as warned, pytest.raises(AssertionError):
        assert_faster(record(), kv=0.3, at=600)
    assert warned[0].filename != assertions.__file__


@pytest.mark.parametrize(
    "call", [lambda s: assert_faster(s, decode=2.0, at=64), lambda s: assert_smaller(s, kv=0.1, at=64)]
)
def test_a_failing_assertion_hides_its_own_frame(call: Any) -> None:
    with pytest.raises(AssertionError) as info:
        call(record())
    shown = [entry.name for entry in info.traceback.filter(info)]
    assert not [name for name in shown if "assert_faster" in name or "assert_smaller" in name], shown


# -- a speed shape's refusals, whole (seed 44's survivors: SpeedShape.__post_init__'s messages) -------------


def test_a_speed_shape_that_repeats_a_context_or_decodes_nothing_is_refused_saying_which() -> None:
    from pytest_mlxgate.errors import LeverError
    from pytest_mlxgate.speed.shape import SpeedShape

    with pytest.raises(LeverError) as e:
        SpeedShape(contexts=(64, 128, 64), decode=8)
    assert str(e.value) == "speed contexts repeat a length: (64, 128, 64)"
    with pytest.raises(LeverError) as e:
        SpeedShape(contexts=(64,), decode=0)
    assert str(e.value) == "speed decode must time at least 1 token, got 0"
