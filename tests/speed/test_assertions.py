"""assert_faster's verdicts on recorded figures: pass only when the interval clears the goal, fail
when it is shown short, inconclusive (never a pass) in between, with the pairs that would tell."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from pytest_mlxgate import assert_faster, assert_smaller
from pytest_mlxgate.speed.assertions import speed_checks


def _speed(
    decode: tuple[float, float, float],
    *,
    kv: float = 0.5,
    peak: tuple[float, float, float] | None = None,
    contexts: tuple[int, ...] = (128, 512),
) -> dict[str, Any]:
    def est(r: tuple[float, float, float]) -> dict[str, Any]:
        return {"ratio": r[0], "ratio_ci": [r[1], r[2]], "n": 9, "log_sd": 0.05}

    arm = {"prefill_tps": 100.0, "decode_tps": 10.0, "peak_bytes": 1 << 20, "kv_bytes": 1 << 20, "trials": []}
    return {
        "shape": {"contexts": list(contexts), "decode": 16, "repetitions": 9, "warmup": 1},
        "memory_method": "mlx allocator peak",
        "contexts": {
            str(c): {
                "context": c,
                "reference": arm,
                "candidate": arm,
                "prefill": est((1.0, 0.9, 1.1)),
                "decode": est(decode),
                "peak": est(peak) if peak else None,
                "kv": {"ratio": kv},
            }
            for c in contexts
        },
    }


@pytest.mark.parametrize(
    ("decode", "verdict"),
    [
        ((1.30, 1.20, 1.40), "pass"),
        ((1.06, 1.051, 1.07), "pass"),
        ((0.95, 0.90, 1.00), "fail"),
        ((1.08, 1.00, 1.16), "inconclusive"),
    ],
)
def test_decode_goal_verdicts(decode: tuple[float, float, float], verdict: str) -> None:
    (check,) = speed_checks(_speed(decode), {"decode": 1.05}, None)
    assert check["verdict"] == verdict and check["metric"] == "decode tok/s @512"
    assert (check["lower"], check["upper"], check["direction"]) == (decode[1], decode[2], "min")
    assert not {"bound", "other_bound", "passed"} & set(check)
    assert (check["n_needed"] is not None and check["n_needed"] > 9) == (verdict == "inconclusive")


def test_memory_goals_bound_from_above_and_kv_is_exact() -> None:
    checks = speed_checks(_speed((1, 1, 1), kv=0.28, peak=(0.55, 0.50, 0.58)), {"memory": 0.6, "kv": 0.3}, None)
    assert [c["verdict"] for c in checks] == ["pass", "pass"]
    assert (checks[0]["lower"], checks[0]["upper"]) == (0.50, 0.58)  # the upper end must stay under the goal
    assert checks[1]["lower"] == checks[1]["upper"] == checks[1]["value"] == 0.28  # counted: exact
    checks = speed_checks(_speed((1, 1, 1), kv=0.31, peak=(0.62, 0.55, 0.70)), {"memory": 0.6, "kv": 0.3}, None)
    assert [c["verdict"] for c in checks] == ["inconclusive", "fail"]
    (unmeasured,) = speed_checks(_speed((1, 1, 1)), {"memory": 0.6}, None)
    assert unmeasured["verdict"] == "inconclusive" and "not measured" in unmeasured["method"]


def test_at_picks_the_context_and_refuses_one_not_measured() -> None:
    speed = _speed((1.3, 1.2, 1.4))
    assert [c["context"] for c in speed_checks(speed, {"decode": 1.05}, "all")] == [128, 512]
    assert [c["context"] for c in speed_checks(speed, {"decode": 1.05}, 128)] == [128]
    with pytest.raises(ValueError, match=r"measured at \[128, 512\]"):
        speed_checks(speed, {"decode": 1.05}, 8192)


def test_the_failure_message_says_goal_interval_figures_and_what_would_tell() -> None:
    with pytest.raises(AssertionError) as info:
        assert_faster(_speed((1.08, 1.00, 1.16)), decode=1.05)
    text = str(info.value)
    assert "inconclusive" in text and "×1.080 (95% interval ×1.000–×1.160 over 9 pairs), asked ≥ ×1.05" in text
    assert "pairs at the observed spread would tell" in text and "@512 tokens: prefill ×1.00" in text
    assert "measured: 9 interleaved pairs per context after 1 warm-up, 16 decoded tokens per trial" in text
    with pytest.raises(AssertionError, match=r"^speed gate failed \(shown short of a goal\)"):
        assert_faster(_speed((0.95, 0.90, 1.00)), decode=1.05)
    with pytest.raises(TypeError, match="needs a goal"):
        assert_faster(_speed((1, 1, 1)))
    with pytest.raises(ValueError, match="not a usable ratio"):
        assert_faster(_speed((1, 1, 1)), decode=0)


def test_memory_goals_are_assert_smallers_and_fail_as_a_memory_gate() -> None:
    speed = _speed((1.3, 1.2, 1.4), kv=0.31, peak=(0.55, 0.50, 0.58))
    speed["weights_bytes"] = {"reference": 1000, "candidate": 290}
    assert assert_smaller(speed, kv=0.35, memory=0.6, weights=0.31) is not None
    with pytest.raises(AssertionError) as info:
        assert_smaller(speed, kv=0.3, weights=0.31)
    text = str(info.value)
    assert text.startswith("memory gate failed (shown over a goal): gate") and "speed gate" not in text
    assert "KV bytes @512: candidate/reference ×0.310, asked ≤ ×0.3  ✗ fail" in text
    assert "weight bytes: candidate/reference ×0.290, asked ≤ ×0.31\n" in text  # passed: no mark
    with pytest.raises(AssertionError, match=r"^memory gate inconclusive \(an interval straddles a goal\)"):
        assert_smaller(speed, memory=0.56)
    with pytest.raises(TypeError, match=r"assert_smaller needs a goal, e.g. assert_smaller\(paired, kv=0.3\)"):
        assert_smaller(speed)
    with pytest.raises(TypeError):
        assert_smaller(speed, decode=1.05)  # type: ignore[call-arg]  # speed is assert_faster's
    with pytest.raises(ValueError, match="assert_smaller: kv=0.0 is not a usable ratio"):
        assert_smaller(speed, kv=0)
    with pytest.raises(ValueError, match=r"assert_smaller\(at=8192\): speed was measured at \[128, 512\]"):
        assert_smaller(speed, kv=0.3, at=8192)


def test_assert_faster_is_speed_only_and_keeps_memory_goals_one_release_with_a_deprecation_warning() -> None:
    speed = _speed((1.3, 1.2, 1.4), kv=0.31)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a speed goal alone warns of nothing
        assert_faster(speed, decode=1.05)
        with pytest.raises(AssertionError, match=r"^speed gate failed \(shown short of a goal\)"):
            assert_faster(speed, decode=1.5)
    with pytest.warns(
        DeprecationWarning,
        match=r"assert_faster\(kv=0\.3\): memory goals are assert_smaller's now; "
        r"write assert_smaller\(paired, kv=0\.3\)",
    ):
        with pytest.raises(AssertionError) as info:
            assert_faster(speed, kv=0.3)
    with pytest.raises(AssertionError) as smaller:
        assert_smaller(speed, kv=0.3)
    assert str(info.value) == str(smaller.value)  # the same verdict and message as the memory gate's
    # one call with both kinds of goal: one verdict over every check, named by what missed
    with pytest.warns(DeprecationWarning):
        with pytest.raises(AssertionError, match=r"^memory gate failed .*\n  decode tok/s @512: .*asked ≥ ×1.05\n"):
            assert_faster(speed, decode=1.05, kv=0.3)
    with pytest.warns(DeprecationWarning):
        with pytest.raises(AssertionError, match=r"^speed and memory gate failed \(shown past a goal\)"):
            assert_faster(speed, decode=1.5, kv=0.3)
    with pytest.warns(DeprecationWarning, match=r"assert_faster\(memory=0\.9, weights=0\.5\)"):
        with pytest.raises(AssertionError, match="weight bytes"):
            assert_faster(speed, memory=0.9, weights=0.5)  # no weights measured: inconclusive, never a pass


def test_the_deprecation_warning_names_the_gate_s_own_line() -> None:
    """Apart from the test above: mutation testing deselects this one (its trampoline adds a frame)."""
    with pytest.warns(DeprecationWarning) as warned:
        with pytest.raises(AssertionError):
            assert_faster(_speed((1.3, 1.2, 1.4), kv=0.31), kv=0.3)
    assert warned[0].filename == __file__


class _Subject:
    """A `paired` as the speed assertions see it: its measurement, and the conclusions published."""

    def __init__(self, speed: dict[str, Any], inconclusive: str = "fail") -> None:
        self.measured, self.inconclusive = speed, inconclusive
        self.nodeid, self.rerun = "gates/test_x.py::test_memory", "pytest gates/test_x.py::test_memory"
        self.published: list[Any] = []

    def speed(self) -> dict[str, Any]:
        return self.measured

    def vouch(self, conclusion: Any) -> Any:
        return conclusion

    def publish(self, conclusion: Any) -> None:
        self.published.append(conclusion)


def test_each_speed_assertion_publishes_one_conclusion_before_it_raises() -> None:
    speed = _speed((1.3, 1.2, 1.4), kv=0.31)
    speed["arms"] = {"reference": "reference", "candidate": "candidate"}
    subject = _Subject(speed)
    with pytest.raises(
        AssertionError,
        match="memory gate failed .*: test_x.py::test_memory\n(.|\n)*re-run: pytest gates/test_x.py::test_memory",
    ):
        assert_smaller(subject, kv=0.3, at="all")
    (conclusion,) = subject.published
    assert (conclusion.mode, conclusion.verdict, dict(conclusion.bounds)) == ("speed", "fail", {"kv": 0.3})
    assert [(c["key"], c["context"], c["verdict"]) for c in conclusion.checks] == [
        ("speed.kv", 128, "fail"),
        ("speed.kv", 512, "fail"),
    ]
    assert conclusion.fields["speed"] == speed and conclusion.fields["path"] == "serving"
    speed["arms"] = {"reference": "reference", "candidate": "reference"}  # A/A: both sides the reference arm
    subject = _Subject(speed, inconclusive="warn")
    assert_faster(subject, decode=1.05)
    assert [(c.mode, c.verdict) for c in subject.published] == [("aa", "pass")]


def test_a_speed_conclusion_carries_the_measurement_its_duration_and_its_mode() -> None:
    from pytest_mlxgate.speed.assertions import speed_conclusion

    speed = {"contexts": {}, "duration_s": 12.5, "arms": {"reference": "reference", "candidate": "candidate"}}
    made = speed_conclusion(speed, {"decode": 1.05}, [], "pass")
    assert made.verdict == "pass" and speed_conclusion(speed, {"decode": 1.05}, [], "fail").verdict == "fail"
    assert made.mode == "speed" and made.fields["durations"] == {"total_s": 12.5}
    assert made.fields["speed"] == speed and made.fields["path"] == "serving" and made.bounds == {"decode": 1.05}
    aa = speed_conclusion({**speed, "arms": {"candidate": "reference"}}, {}, [])
    assert aa.mode == "aa" and aa.fields["durations"] == {"total_s": 12.5}


def test_a_context_s_line_says_both_ratios_tokens_per_second_bytes_and_pairs() -> None:
    from speed_words import context_text

    ctx = {
        "prefill": {"ratio": 1.2, "ratio_ci": [1.1, 1.3]},
        "decode": {"ratio": 0.9, "ratio_ci": [0.8, 1.0], "n": 7},
        "reference": {"prefill_tps": 250.0, "decode_tps": 12.34, "kv_bytes": 2 * 2**20},
        "candidate": {"prefill_tps": 300.0, "decode_tps": 11.0, "kv_bytes": 2**20},
        "stopped": "decided",
    }
    line = context_text(ctx)
    assert line.startswith(
        "prefill ×1.20 [1.10, 1.30] (tok/s 250 → 300) · decode ×0.90 [0.80, 1.00] (tok/s 12.3 → 11.0)"
    )
    assert line.endswith("· 7 pairs (decided)") and "KV " in line


def test_the_shape_s_goals_are_recorded_by_key_limit_and_context() -> None:
    from pytest_mlxgate.speed.shape import SpeedGoal

    assert SpeedGoal("decode", 1.05).to_json() == {"key": "decode", "limit": 1.05, "at": None}
    assert SpeedGoal("kv", 0.3, at="all").to_json() == {"key": "kv", "limit": 0.3, "at": "all"}


def test_byte_goals_are_exact_figures_with_their_method() -> None:
    """Counted bytes have no interval: lower == upper == value, and the check says they were counted."""
    speed = {"contexts": {"16": {"kv": {"ratio": 0.28}}}, "weights_bytes": {"reference": 400, "candidate": 100}}
    weights, kv = speed_checks(speed, {"weights": 0.3, "kv": 0.3}, None)
    assert (weights["key"], weights["value"], weights["lower"], weights["upper"]) == ("speed.weights", 0.25, 0.25, 0.25)
    assert weights["method"] == "bytes counted over the parameters (exact)" and weights["verdict"] == "pass"
    assert (kv["key"], kv["value"], kv["lower"], kv["upper"]) == ("speed.kv", 0.28, 0.28, 0.28)
    assert kv["method"] == "bytes counted over the cache arrays (exact)" and kv["n"] == 1


def test_a_peak_ratio_needs_a_measured_growth_in_both_arms_of_every_pair() -> None:
    """No growth (0) or no reading (None) in an arm makes the peak ratio unknown, never 0 or infinite."""
    from pytest_mlxgate.speed.result import ContextSpeed, Trial

    ref = [Trial(0.1, 0.2, 1000, 64) for _ in range(3)]

    def peak(cand: list[int | None]) -> Any:
        trials = [Trial(0.1, 0.2, p, 64) for p in cand]
        return ContextSpeed.from_trials(16, 4, ref, trials).peak

    assert peak([500, 500, 500]) is not None
    assert peak([0, 500, 500]) is None and peak([None, 500, 500]) is None
