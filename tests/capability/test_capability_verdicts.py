"""The capability gate's three verdicts on synthetic paired outcomes, at each boundary, with its message;
what an inconclusive verdict does under each --mlx-inconclusive policy; what the record carries."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_mlxgate import assert_capability_at_least
from pytest_mlxgate.capability.base import Budget, Item, ItemResult
from pytest_mlxgate.capability.result import CapabilityRun
from pytest_mlxgate.errors import InconclusiveGateWarning
from pytest_mlxgate.results.records import gate_record
from pytest_mlxgate.verdicts.conclude import Conclusion


def run_of(ref: list[float], cand: list[float], *, task: str = "gsm8k", graded: bool = False) -> CapabilityRun:
    items = [Item(id=f"q{i}", text=f"question {i}") for i in range(len(ref))]

    def results(scores: list[float], tag: str) -> list[ItemResult]:
        return [
            ItemResult(
                item_id=it.id,
                prompt_hash="h",
                output=f"{tag} {it.id}",
                score=float(s),
                verdict="correct" if s >= 1 else "wrong",
            )
            for it, s in zip(items, scores, strict=True)
        ]

    return CapabilityRun(
        task=task,
        tier="smoke",
        graded=graded,
        items=items,
        reference=results(ref, "ref"),
        candidate=results(cand, "cand"),
    )


class FakePaired:
    """What a gate's `paired` fixture offers the assertion: runs, the one publish (kept as the record it
    makes), the policy."""

    def __init__(self, runs: dict[str, CapabilityRun], inconclusive: str = "fail") -> None:
        self.runs = runs
        self.inconclusive = inconclusive
        self.nodeid = "gates/test_x.py::test_capability"
        self.rerun = "pytest gates/test_x.py::test_capability"
        self.records: list[dict[str, Any]] = []
        self.asked: list[tuple[str, Any, Any]] = []

    def capability(self, name: str, *, n: Any = None, sequential: Any = None) -> CapabilityRun:
        self.asked.append((name, n, sequential))
        return self.runs[name]

    def vouch(self, conclusion: Conclusion) -> Conclusion:
        return conclusion

    def publish(self, conclusion: Conclusion) -> None:
        self.records.append(
            gate_record(
                nodeid=self.nodeid,
                mode=conclusion.mode,
                verdict=conclusion.verdict,
                checks=conclusion.checks,
                bounds=conclusion.bounds,
                rerun=self.rerun,
                **conclusion.fields,
            ).to_json()
        )


def agree(n: int) -> tuple[list[float], list[float]]:
    scores = [float(i % 2) for i in range(n)]
    return scores, list(scores)


def test_pass_needs_the_upper_bound_inside_the_margin_and_says_what_n_would_tell_when_it_is_not() -> None:
    ref, cand = agree(25)  # 25 agreeing items bound the drop at 9.8 points
    paired = FakePaired({"gsm8k": run_of(ref, cand)})
    assert_capability_at_least(paired, "gsm8k", max_drop=0.10)
    check = paired.records[-1]["checks"][0]
    assert paired.records[-1]["verdict"] == "pass" and check["verdict"] == "pass" and "passed" not in check
    assert check["upper"] == pytest.approx(0.0977, abs=1e-4) and check["n"] == 25 and check["n_needed"] is None
    assert check["direction"] == "max" and check["lower"] < 0 < check["upper"] and "bound" not in check

    ref, cand = agree(24)  # one fewer: 10.1 points, not shown
    paired = FakePaired({"gsm8k": run_of(ref, cand)})
    with pytest.raises(AssertionError) as failure:
        assert_capability_at_least(paired, "gsm8k", max_drop=0.10)
    text = str(failure.value)
    assert text.startswith("capability gate inconclusive (nothing shown either way): test_x.py::test_capability")
    assert (
        "gsm8k: inconclusive: n=24 bounds the drop at 10.1 points (one-sided 95% upper bound, Tango score), "
        "above the allowed 10.0 points; observed drop 0.0 points"
    ) in text
    assert "about 25 items (1 more) at the observed discordance (0 lost, 0 gained in 24) would bound it at 10.0" in text
    assert "an inconclusive gate fails" in text and "re-run: pytest gates/test_x.py::test_capability" in text
    record = paired.records[-1]
    assert record["verdict"] == "inconclusive"
    assert record["checks"][0] | {"upper": None} == record["checks"][0] | {
        "verdict": "inconclusive",
        "n": 24,
        "n_needed": 25,
        "limit": 0.10,
        "upper": None,
    }
    assert record["checks"][0]["upper"] > 0.10 and "passed" not in record["checks"][0]


def test_a_regression_is_shown_only_when_the_drop_test_rejects_at_the_margin() -> None:
    ref = [1.0] * 40
    lost = [0.0] * 10 + [1.0] * 30  # 10 of 40 lost: a 25-point drop
    paired = FakePaired({"gsm8k": run_of(ref, lost)})
    with pytest.raises(AssertionError) as failure:
        assert_capability_at_least(paired, "gsm8k", max_drop=0.05)
    text = str(failure.value)
    assert text.startswith("capability gate failed (regression shown)")
    assert "gsm8k: fail (regression shown): drop 25.0 points is more than the allowed 5.0 points" in text
    assert "discordant: 10 lost, 0 gained" in text and "flipped q0" in text
    assert paired.records[-1]["checks"][0]["verdict"] == "fail"
    # the same 25-point drop against a 20-point margin: neither inside nor shown beyond it
    paired = FakePaired({"gsm8k": run_of(ref, lost)})
    with pytest.raises(
        AssertionError,
        match=r"gsm8k: inconclusive: n=40 bounds the drop at .* above the allowed "
        r"20\.0 points; observed drop 25\.0 points",
    ):
        assert_capability_at_least(paired, "gsm8k", max_drop=0.20)


def test_inconclusive_on_the_regression_side_projects_the_n_that_would_show_it() -> None:
    ref, cand = [1.0] * 40, [0.0] * 10 + [1.0] * 30
    paired = FakePaired({"gsm8k": run_of(ref, cand)})
    with pytest.raises(AssertionError) as failure:
        assert_capability_at_least(paired, "gsm8k", max_drop=0.20)
    assert "would show it above 20.0 points" in str(failure.value)
    assert paired.records[-1]["checks"][0]["n_needed"] > 40


def test_several_tasks_fail_only_on_a_holm_corrected_regression_and_pass_only_when_all_are_shown() -> None:
    ok_ref, ok_cand = agree(40)
    near = [1.0] * 40
    slightly = [0.0] * 4 + [1.0] * 36  # 4 of 40 lost: one-sided exact p = 0.0625 alone: not shown
    paired = FakePaired({"a": run_of(ok_ref, ok_cand, task="a"), "b": run_of(near, slightly, task="b")})
    with pytest.raises(AssertionError, match="inconclusive"):
        assert_capability_at_least(paired, ["a", "b"], max_drop=0.0)
    verdicts = {c["metric"]: c["verdict"] for c in paired.records[-1]["checks"]}
    assert verdicts == {"a drop": "inconclusive", "b drop": "inconclusive"}
    paired = FakePaired({"a": run_of(ok_ref, ok_cand, task="a"), "b": run_of(ok_ref, ok_cand, task="b")})
    assert_capability_at_least(paired, ["a", "b"], max_drop=0.07)  # each bounded at 6.3 points: all shown
    assert paired.records[-1]["verdict"] == "pass" and paired.records[-1]["tasks"]["a"]["holm"] is True


def test_a_floor_passes_fails_or_cannot_tell() -> None:
    ref = [1.0] * 18 + [0.0] * 2
    paired = FakePaired({"gsm8k": run_of(ref, list(ref))})  # 90% of 20: one-sided lower bound 73.8%
    assert_capability_at_least(paired, "gsm8k", floor=0.70)
    with pytest.raises(
        AssertionError,
        match=r"gsm8k: inconclusive: candidate's one-sided 95% lower bound 73\.8% "
        r"< floor 80\.0% ≤ upper bound",
    ):
        assert_capability_at_least(FakePaired({"gsm8k": run_of(ref, list(ref))}), "gsm8k", floor=0.80)
    low = [1.0] * 5 + [0.0] * 15  # 25%: one-sided upper bound 44.0%
    with pytest.raises(
        AssertionError,
        match=r"gsm8k: fail: the candidate's score is shown below the floor: one-sided "
        r"95% upper bound 4\d\.\d% < floor 50\.0% \(n=20, Wilson score\)",
    ):
        assert_capability_at_least(FakePaired({"gsm8k": run_of(low, low)}), "gsm8k", floor=0.50)


def test_graded_scores_use_the_paired_bootstrap_bounds() -> None:
    ref = [0.5, 0.75, 1.0, 0.25] * 10
    cand = [0.5, 0.75, 1.0, 0.0] * 10  # a quarter of the items lose 0.25: drop 6.25 points, every time
    paired = FakePaired({"ifeval": run_of(ref, cand, task="ifeval", graded=True)})
    assert_capability_at_least(paired, "ifeval", max_drop=0.15)
    with pytest.raises(AssertionError, match="fail .regression shown.: drop 6.2 points"):
        assert_capability_at_least(
            FakePaired({"ifeval": run_of(ref, cand, task="ifeval", graded=True)}), "ifeval", max_drop=0.02
        )


def test_the_capability_inconclusive_warning_names_the_gate_s_own_line() -> None:
    """Apart from the test below: mutation testing deselects this one (its trampoline adds a frame)."""
    ref, cand = agree(8)
    with pytest.warns(InconclusiveGateWarning) as warned:
        assert_capability_at_least(FakePaired({"gsm8k": run_of(ref, cand)}, inconclusive="warn"), "gsm8k", max_drop=0.1)
    assert warned[0].filename == __file__  # the warning names the gate's line, not the package's


def test_inconclusive_warns_or_xfails_on_request_and_never_passes_silently() -> None:
    ref, cand = agree(8)
    paired = FakePaired({"gsm8k": run_of(ref, cand)}, inconclusive="warn")
    with pytest.warns(InconclusiveGateWarning, match="inconclusive: n=8 bounds the drop at 25.3 points"):
        assert_capability_at_least(paired, "gsm8k", max_drop=0.10)
    assert paired.records[-1]["verdict"] == "inconclusive"  # the record still says so
    paired = FakePaired({"gsm8k": run_of(ref, cand)}, inconclusive="xfail")
    with pytest.raises(pytest.xfail.Exception, match="inconclusive"):
        assert_capability_at_least(paired, "gsm8k", max_drop=0.10)
    # a regression is never softened by the policy
    lost = FakePaired({"gsm8k": run_of([1.0] * 40, [0.0] * 10 + [1.0] * 30)}, inconclusive="warn")
    with pytest.raises(AssertionError, match="regression shown"):
        assert_capability_at_least(lost, "gsm8k", max_drop=0.05)


def test_a_budget_is_passed_to_the_run_with_the_gates_margin_and_levels() -> None:
    ref, cand = agree(40)
    paired = FakePaired({"a": run_of(ref, cand, task="a"), "b": run_of(ref, cand, task="b")})
    assert_capability_at_least(paired, ["a", "b"], max_drop=0.07, n=Budget(items=64, batch=8))
    assert paired.asked[0] == ("a", Budget(items=64, batch=8), {"max_drop": 0.07, "alpha": 0.05, "fail_alpha": 0.025})
    assert paired.records[-1]["bounds"]["budget"] == {"items": 64, "seconds": None, "batch": 8}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"floor": 0.5, "n": Budget()}, TypeError, "needs max_drop"),
        ({"max_drop": 0.1, "n": 0}, ValueError, "a positive number of items"),
        ({"max_drop": 0.1, "n": 2.5}, ValueError, "a positive number of items"),
    ],
)
def test_bad_sizes_are_refused_with_the_fix(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        assert_capability_at_least(FakePaired({}), "gsm8k", **kwargs)


def test_a_budget_needs_the_paired_fixture_and_sane_numbers() -> None:
    with pytest.raises(TypeError, match="pass the `paired` fixture"):
        assert_capability_at_least({"gsm8k": run_of(*agree(4))}, "gsm8k", max_drop=0.1, n=Budget())
    for bad, match in (({"items": 0}, "items"), ({"batch": 0}, "batch"), ({"seconds": 0}, "seconds")):
        with pytest.raises(ValueError, match=match):
            Budget(**bad)
