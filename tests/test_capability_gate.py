"""A capability gate end to end on the embedded model through pytester: both arms answer the same
items, the record reaches the report with per-task scores and the Capability Score, and a failing
gate's message carries scores, intervals, n and flipped items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GATE = '''
import pytest
from pytest_mlxgate import assert_capability_at_least

pytestmark = pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1")


def test_capability(paired):
    assert_capability_at_least(paired, "mmlu", {bounds}, n=16)
'''

BROKEN = '''
import contextlib

import pytest
from pytest_mlxgate import assert_capability_at_least


def broken(value):
    """The candidate's attention sees keys scaled by 4: a model that has lost its context."""
    import mlx.core as mx

    @contextlib.contextmanager
    def patched():
        fused = mx.fast.scaled_dot_product_attention
        if value == "broken":
            mx.fast.scaled_dot_product_attention = lambda q, k, v, *, scale, **kw: fused(q, k, v, scale=scale * 4, **kw)
        try:
            yield
        finally:
            mx.fast.scaled_dot_product_attention = fused

    return patched()


pytestmark = pytest.mark.mlx_lever("attention", context=broken, ref="ok", cand="broken")


def test_capability(paired):
    assert_capability_at_least(paired, "mmlu", max_drop=0.0, n=40)
'''


@pytest.fixture
def gate_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    return pytester


def test_a_capability_gate_pairs_both_arms_and_reports_the_capability_score(
    gate_dir: pytest.Pytester, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_cap=GATE.format(bounds="max_drop=0.0"))
    report = tmp_path / "cap.json"
    result = gate_dir.runpytest_subprocess("--mlx-offline", f"--mlx-report={report}", "--mlx-db=off",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    records = {r["mode"]: r for r in json.loads(report.read_text())["gates"]}
    cap = records["capability"]
    mmlu = cap["tasks"]["mmlu"]
    assert mmlu["n"] == 16 and mmlu["ref_score"] == mmlu["cand_score"]  # a flag nothing reads: same answers
    assert mmlu["drop_test"]["b"] == 0 and mmlu["drop_test"]["c"] == 0
    assert cap["verdict"] == "pass" and cap["checks"][0]["passed"]
    score = records["score"]["capability_score"]
    assert score["partial"] is True and "gsm8k" in score["missing"]
    assert score["candidate"] == pytest.approx(mmlu["cand_score"])
    result.stdout.fnmatch_lines(["*Capability Score*"])


def test_a_floor_the_candidate_cannot_clear_fails_with_scores_and_n(gate_dir: pytest.Pytester) -> None:
    gate_dir.makepyfile(test_cap=GATE.format(bounds="floor=0.95"))
    result = gate_dir.runpytest_subprocess("--mlx-offline", "--mlx-db=off", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*capability gate failed: test_cap.py::test_capability",
        "*mmlu: candidate's 95% lower bound *% < floor 95.0%",
        "*reference *% (*–*%) → candidate *% (*–*%), n=16 paired items",
        "*re-run: pytest test_cap.py::test_capability*",
    ])


def test_a_broken_candidate_is_caught_by_the_paired_test(gate_dir: pytest.Pytester) -> None:
    gate_dir.makepyfile(test_broken=BROKEN)
    result = gate_dir.runpytest_subprocess("--mlx-offline", "--mlx-db=off", "-p", "no:randomly")
    out = result.stdout.str()
    if result.ret == 0:  # the broken arm must lose items the reference gets right
        pytest.fail("a candidate with scrambled attention passed the paired MMLU gate:\n" + out)
    result.stdout.fnmatch_lines(["*mmlu: drop * is significantly more than the allowed 0.0 points*",
                                 "*discordant: * lost, * gained*", "*flipped *"])
