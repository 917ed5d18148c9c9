"""A capability gate end to end on the embedded model through pytester: both arms answer the same
items, the record reaches the report with per-task scores and the Capability Score, and a failing
gate's message carries scores, intervals, n and flipped items."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_mlxgate.capability.result import CapabilityRun

GATE = """
import pytest
from pytest_mlxgate import assert_capability_at_least

pytestmark = pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1")


def test_capability(paired):
    assert_capability_at_least(paired, "mmlu", {bounds}, n=8)
"""


@pytest.fixture
def gate_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    return pytester


@pytest.mark.slow  # the embedded model answering MMLU in a pytester session: minutes
def test_a_capability_gate_pairs_both_arms_and_reports_the_capability_score(
    gate_dir: pytest.Pytester, tmp_path: Path
) -> None:
    # 8 agreeing items bound a drop at 25.3 points (one-sided 95%): a 30-point margin is shown
    gate_dir.makepyfile(test_cap=GATE.format(bounds="max_drop=0.3"))
    report = tmp_path / "cap.json"
    result = gate_dir.runpytest_subprocess(
        "--mlx-offline", f"--mlx-report={report}", "--mlx-db=off", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
    records = {r["mode"]: r for r in json.loads(report.read_text())["gates"]}
    cap = records["capability"]
    mmlu = cap["tasks"]["mmlu"]
    assert mmlu["n"] == 8 and mmlu["ref_score"] == mmlu["cand_score"]  # a flag nothing reads: same answers
    assert mmlu["drop_test"]["b"] == 0 and mmlu["drop_test"]["c"] == 0
    assert len(mmlu["items"]) == 8  # per item: both arms' outputs and verdicts, to rescore or join runs
    assert all(len(i["prompt_hash"]) == 16 and i["reference"]["verdict"] in ("correct", "wrong") for i in mmlu["items"])
    assert cap["verdict"] == "pass" and cap["checks"][0]["verdict"] == "pass"
    assert cap["checks"][0]["upper"] == pytest.approx(0.2527, abs=1e-3) and cap["checks"][0]["n"] == 8  # the bound
    score = records["score"]["capability_score"]
    assert score["partial"] is True and "gsm8k" in score["missing"]
    assert score["candidate"] == pytest.approx(mmlu["cand_score"])
    result.stdout.fnmatch_lines(["*Capability Score*"])


@pytest.mark.slow  # the embedded model answering MMLU in a pytester session: minutes
def test_a_floor_the_candidate_cannot_clear_fails_with_scores_and_n(gate_dir: pytest.Pytester) -> None:
    gate_dir.makepyfile(test_cap=GATE.format(bounds="floor=0.95"))
    result = gate_dir.runpytest_subprocess("--mlx-offline", "--mlx-db=off", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*capability gate failed (regression shown): test_cap.py::test_capability",
            "*mmlu: fail: the candidate's score is shown below the floor: one-sided 95% upper bound *% < floor 95.0% "
            "(n=8, Wilson score)",
            "*reference *% (*–*%) → candidate *% (*–*%), n=8 paired items",
            "*re-run: pytest test_cap.py::test_capability*",
        ]
    )


def _run(ref: list[int], cand: list[int]) -> CapabilityRun:
    from pytest_mlxgate.capability.base import Item, ItemResult
    from pytest_mlxgate.capability.result import CapabilityRun

    items = [Item(id=f"q{i}", messages=({"role": "user", "content": f"question {i}"},)) for i in range(len(ref))]

    def results(scores: list[int], tag: str) -> list[ItemResult]:
        return [
            ItemResult(
                item_id=it.id,
                prompt_hash="h",
                output=f"{tag} answer {it.id}",
                score=float(s),
                verdict="correct" if s else "wrong",
            )
            for it, s in zip(items, scores, strict=True)
        ]

    return CapabilityRun(
        task="gsm8k",
        tier="smoke",
        graded=False,
        items=items,
        reference=results(ref, "ref"),
        candidate=results(cand, "cand"),
        rendered={it.id: f"rendered question {it.id}" for it in items},
    )


def test_a_real_drop_on_paired_items_fails_with_discordant_counts_and_flipped_items() -> None:
    from pytest_mlxgate import assert_capability_at_least

    # 60 paired items: the candidate loses 9 the reference got right and gains 1: a 13-point drop
    ref = [1] * 30 + [0] * 30
    cand = [0] * 9 + [1] * 21 + [1] + [0] * 29
    with pytest.raises(AssertionError) as failure:
        assert_capability_at_least({"gsm8k": _run(ref, cand)}, "gsm8k", max_drop=0.0)
    text = str(failure.value)
    assert text.startswith("capability gate failed (regression shown)")
    assert (
        "gsm8k: fail (regression shown): drop 13.3 points is more than the allowed 0.0 points; n=60 bounds it "
        "from below at 5.5 points (one-sided p=0.0107 < alpha, exact-mcnemar)"
    ) in text
    assert "discordant: 9 lost, 1 gained" in text
    assert "reference 50.0% (" in text and "candidate 36.7% (" in text and "n=60 paired items" in text
    assert text.count("flipped q") == 3 and "reference correct 'ref answer q0'" in text
    # the same items: inside a generous margin the upper bound (23.3 points) is shown below it
    assert_capability_at_least({"gsm8k": _run(ref, cand)}, "gsm8k", max_drop=0.25)


def test_identical_arms_pass_only_once_n_bounds_the_drop_inside_the_margin() -> None:
    from pytest_mlxgate import assert_capability_at_least

    same = [1, 0] * 20  # 40 agreeing items: the drop is bounded at 6.3 points
    runs = assert_capability_at_least({"gsm8k": _run(same, same)}, "gsm8k", max_drop=0.07)
    assert runs["gsm8k"].flipped() == []
    with pytest.raises(AssertionError, match=r"inconclusive: n=40 bounds the drop at 6\.3 points"):
        assert_capability_at_least({"gsm8k": _run(same, same)}, "gsm8k", max_drop=0.06)
    with pytest.raises(AssertionError, match="inconclusive"):  # no drop at all, and still nothing shown at margin 0
        assert_capability_at_least({"gsm8k": _run(same, same)}, "gsm8k", max_drop=0.0)
