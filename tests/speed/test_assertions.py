"""assert_faster's verdicts on recorded figures: pass only when the interval clears the goal, fail
when it is shown short, inconclusive (never a pass) in between, with the pairs that would tell."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_mlxgate import assert_faster
from pytest_mlxgate.speed.assertions import speed_checks


def _speed(decode: tuple[float, float, float], *, kv: float = 0.5, peak: tuple[float, float, float] | None = None,
           contexts: tuple[int, ...] = (128, 512)) -> dict[str, Any]:
    def est(r: tuple[float, float, float]) -> dict[str, Any]:
        return {"ratio": r[0], "ratio_ci": [r[1], r[2]], "n": 9, "log_sd": 0.05}

    arm = {"prefill_tps": 100.0, "decode_tps": 10.0, "peak_bytes": 1 << 20, "kv_bytes": 1 << 20, "trials": []}
    return {"shape": {"contexts": list(contexts), "decode": 16, "repetitions": 9, "warmup": 1},
            "memory_method": "mlx allocator peak",
            "contexts": {str(c): {"context": c, "reference": arm, "candidate": arm, "prefill": est((1.0, 0.9, 1.1)),
                                  "decode": est(decode), "peak": est(peak) if peak else None, "kv": {"ratio": kv}}
                         for c in contexts}}


@pytest.mark.parametrize(("decode", "verdict"), [((1.30, 1.20, 1.40), "pass"), ((1.06, 1.051, 1.07), "pass"),
                                                  ((0.95, 0.90, 1.00), "fail"), ((1.08, 1.00, 1.16), "inconclusive")])
def test_decode_goal_verdicts(decode: tuple[float, float, float], verdict: str) -> None:
    (check,) = speed_checks(_speed(decode), {"decode": 1.05}, None)
    assert check["verdict"] == verdict and check["metric"] == "decode tok/s @512"
    assert check["bound"] == decode[1] and check["other_bound"] == decode[2]
    assert (check["n_needed"] is not None and check["n_needed"] > 9) == (verdict == "inconclusive")


def test_memory_goals_bound_from_above_and_kv_is_exact() -> None:
    checks = speed_checks(_speed((1, 1, 1), kv=0.28, peak=(0.55, 0.50, 0.58)), {"memory": 0.6, "kv": 0.3}, None)
    assert [c["verdict"] for c in checks] == ["pass", "pass"]
    assert checks[0]["bound"] == 0.58  # the upper end is what must stay under the goal
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
    with pytest.raises(TypeError, match="needs a goal"):
        assert_faster(_speed((1, 1, 1)))
    with pytest.raises(ValueError, match="not a usable ratio"):
        assert_faster(_speed((1, 1, 1)), decode=0)
