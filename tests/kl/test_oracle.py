"""The float32 oracle (`kl.oracle`): the relative rule's arithmetic, its state, and real bf16 sessions on the
tiny model where a correct kernel passes, a broken one fails, and float32 says it is the oracle."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gate_folder import gate_folder
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.kl.oracle import OracleDistances, relative_check
from pytest_mlxgate.results.model import parse_record


def _distances(
    plain: list[float], cand: list[float], *, same: bool = False, texts: list[str] | None = None
) -> OracleDistances:
    n = len(plain)
    return OracleDistances(
        dtype="bfloat16",
        same=same,
        texts=tuple(texts or [f"t{i}" for i in range(n)]),
        plain_sums=tuple(p * 10 for p in plain),
        candidate_sums=tuple(c * 10 for c in cand),
        counts=tuple(10 for _ in range(n)),
    )


finite = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=12), st.floats(1.0, 4.0), st.floats(0.0, 1e-2))
def test_the_rule_passes_only_when_its_upper_bound_clears_atol_and_fails_only_past_its_lower(
    pairs: list[tuple[float, float]], relative: float, atol: float
) -> None:
    plain, cand = [p for p, _ in pairs], [c for _, c in pairs]
    made = relative_check(_distances(plain, cand), relative, atol)
    excess = np.array(cand) - relative * np.array(plain)
    assert math.isclose(made["value"], float(excess.mean()), rel_tol=1e-9, abs_tol=1e-12)
    assert made["lower"] <= made["value"] <= made["upper"]
    expected = "pass" if made["upper"] <= atol else "fail" if made["lower"] > atol else "inconclusive"
    assert made["verdict"] == expected
    assert made["n"] == len(pairs) and made["limit"] == atol


def test_a_candidate_twice_as_far_as_plain_fails_a_rule_of_one_and_a_half_and_passes_one_of_three() -> None:
    plain = [1e-3, 1.2e-3, 0.9e-3, 1.1e-3, 1e-3, 1.05e-3]
    cand = [2 * p for p in plain]
    assert relative_check(_distances(plain, cand), 1.5)["verdict"] == "fail"
    passed = relative_check(_distances(plain, cand), 3.0)
    assert passed["verdict"] == "pass" and math.isclose(passed["ratio"], 2.0)
    assert passed["oracle"] == {
        "plain": pytest.approx(np.mean(plain)),
        "candidate": pytest.approx(np.mean(cand)),
        "relative": 3.0,
    }


def test_sequences_of_one_text_are_one_unit() -> None:
    split = _distances([1e-3, 1e-3, 5e-3], [1e-3, 1e-3, 5e-3], texts=["a", "a", "b"])
    plain, cand, tokens = split.units()
    assert plain.tolist() == pytest.approx([1e-3, 5e-3]) and tokens.tolist() == [20, 10]
    assert relative_check(split, 2.0)["n"] == 2


def test_a_float32_run_where_both_arms_are_the_oracle_says_so() -> None:
    same = _distances([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], same=True)
    made = relative_check(same, 2.0)
    assert made["method"].startswith("identical to the float32 oracle") and made["ratio"] == 1.0
    drifted = relative_check(_distances([0.0] * 4, [1e-3, 1.1e-3, 0.9e-3, 1e-3], same=True), 2.0)
    assert drifted["verdict"] == "fail" and drifted["ratio"] is None  # 0 plain: no ratio, the atol alone judges


def test_a_state_reads_back_and_a_damaged_one_is_refused() -> None:
    made = _distances([1e-3, 2e-3], [1e-3, 3e-3])
    back = OracleDistances.from_state(json.loads(json.dumps(made.state())))
    assert back.state() == made.state() and back.source == "cache"
    for broken in ({**made.state(), "counts": [10]}, {**made.state(), "counts": [0, 0]}, {"dtype": "bfloat16"}):
        with pytest.raises(ValueError):
            OracleDistances.from_state(broken)


# -- real sessions on the tiny model, in bfloat16 ---------------------------------------------------------

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand={cand!r}, path="serving"),
    pytest.mark.mlx_kl(prompts=4, tokens=32, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, relative=2.0)
"""

KERNELS = '''
import mlx.core as mx

_rms = mx.fast.rms_norm


def f32_rms_norm(x, weight, eps):
    """A correct kernel: mlx's own, accumulating in float32 and rounding once at the end."""
    return _rms(x.astype(mx.float32), weight.astype(mx.float32), eps).astype(x.dtype)


def eps_x100_rms_norm(x, weight, eps):
    """A subtle bug: RMSNorm's epsilon 100x too large."""
    return _rms(x, weight, eps * 100)
'''


@pytest.fixture
def gates(pytester: pytest.Pytester) -> pytest.Pytester:
    return gate_folder(pytester, kernels=KERNELS)


def _run(p: pytest.Pytester, model: Path, tmp: Path, *more: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    report = tmp / "r.json"
    result = p.runpytest_inprocess(
        *more,
        f"--mlx-candidate={model}",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "--mlx-prove=off",
        "--mlx-explain-budget=0",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    (record,) = json.loads(report.read_text())["gates"]
    return result, record


def _check(record: dict[str, Any], key: str) -> dict[str, Any]:
    (found,) = [c for c in record["checks"] if c["key"] == key]
    return found


def test_in_bfloat16_a_correct_kernel_passes_both_oracle_rules_and_a_subtle_bug_fails_at_its_site(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_gate=GATE.format(cand="kernels:f32_rms_norm"))
    good, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16")
    good.assert_outcomes(passed=1)
    oracle = record["oracle"]
    assert oracle["dtype"] == "bfloat16" and not oracle["same"] and oracle["source"] == "computed"
    assert oracle["plain"]["mean"] > 0  # plain bf16 is not the oracle
    assert _check(record, "relative")["verdict"] == _check(record, "site")["verdict"] == "pass"
    (site,) = oracle["site"]["sites"]
    assert site["target"] == "mlx.core.fast.rms_norm" and site["calls"] > 0
    assert [row["at"] for row in site["by_call"]] == list(range(len(site["by_call"])))  # every norm of a forward

    gates.makepyfile(test_gate=GATE.format(cand="kernels:eps_x100_rms_norm"))
    bad, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16")
    bad.assert_outcomes(failed=1)
    assert record["verdict"] == "fail" and _check(record, "site")["verdict"] == "fail"
    assert _check(record, "site")["ratio"] > 2  # the bug's error at the site, many times plain rounding's
    assert record["oracle"]["source"] == "cache"  # the oracle's distributions, kept beside the reference


def test_in_float32_the_reference_is_the_oracle_and_an_identical_kernel_says_so(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_gate=GATE.format(cand="kernels:f32_rms_norm"))
    result, record = _run(gates, tiny_model_dir, tmp_path)
    result.assert_outcomes(passed=1)
    assert record["oracle"]["same"] and record["oracle"]["source"] == "reference"
    assert record["oracle"]["plain"]["mean"] == 0.0
    relative = _check(record, "relative")
    assert relative["verdict"] == "pass" and relative["method"].startswith(
        ("identical to the float32 oracle", "the reference arm is the float32 oracle")
    )


def test_relative_without_the_oracle_arm_is_an_error_saying_how_to_ask_for_it(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(
        test_gate=GATE.format(cand="kernels:f32_rms_norm").replace(
            "assert_kl_below(paired, relative=2.0)", "limits = {'relative': 2.0}\n    assert_kl_below(paired, **limits)"
        )
    )
    result = gates.runpytest_inprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "--mlx-db=off",
        "--mlx-allow-untrained",
        "--mlx-prove=off",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no oracle arm ran*name relative= literally*"])


FAST_OPS_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever(
        "fused_norms_rope", context="pytest_mlxgate.reference_ops:fast_ops", ref="plain", cand="fused", path="serving"
    ),
    pytest.mark.mlx_kl(prompts=12, tokens=40, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, relative=2.0)
"""


def test_on_gemma_4_the_oracle_and_every_fused_op_s_site_are_judged_in_bfloat16(
    pytester: pytest.Pytester, tiny_gemma4_dir: Path, tmp_path: Path
) -> None:
    """Sliding and full layers, KV-shared readers, softcapping: mlx's fused norms and RoPE against the plain
    bf16 path, each site's calls numbered within a forward (gemma-4 norms q, k, v and more per layer)."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_gate=FAST_OPS_GATE)
    result, record = _run(pytester, tiny_gemma4_dir, tmp_path, "--mlx-dtype=bfloat16")
    result.assert_outcomes(passed=1)
    assert record["candidate"]["dtype"] == "bfloat16" and not record["oracle"]["same"]
    assert _check(record, "relative")["verdict"] == _check(record, "site")["verdict"] == "pass"
    sites = {s["target"]: s for s in record["oracle"]["site"]["sites"]}
    assert {"mlx.core.fast.rms_norm", "mlx.core.fast.rope"} <= set(sites)
    assert all(row["plain_max"] > 0 for row in sites["mlx.core.fast.rms_norm"]["by_call"])  # bf16 rounds


def test_without_a_proof_absolute_limits_inside_bf16_s_rounding_are_set_aside_beside_relative(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The plain path's own distance from float32 comes with the oracle arm: no proof is needed to know a
    float32-sized limit cannot speak in bf16. Alone (no relative=) such a limit still judges, and fails."""
    gates.makepyfile(
        test_gate=GATE.format(cand="kernels:f32_rms_norm").replace("relative=2.0", "mean=1e-9, top1=0.01, relative=2.0")
    )
    result, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16")
    result.assert_outcomes(passed=1)
    assert record["oracle"]["set_aside"] == ["mean"]  # top1 0.01 asks less agreement than plain bf16 has: it speaks
    assert record["oracle"]["plain_figures"]["mean"] > 1e-9
    assert [c["key"] for c in record["checks"]] == ["top1", "relative", "site", "site_f32"]
    assert "mean set aside (inside bfloat16's own rounding)" in parse_record(record).oracle.words  # type: ignore[union-attr]
    gates.makepyfile(test_gate=GATE.format(cand="kernels:eps_x100_rms_norm").replace("relative=2.0", "mean=1e-9"))
    alone, record = _run(gates, tiny_model_dir, tmp_path, "--mlx-dtype=bfloat16")
    alone.assert_outcomes(failed=1)
    assert "oracle" not in record and record["checks"][0]["verdict"] == "fail"


def test_a_candidate_identical_to_the_plain_path_is_shown_as_far_from_the_oracle_not_estimated() -> None:
    """gemma3-270m in bf16, 8 prompts: mx.compile changes nothing there, yet the t interval of c - 2p = -p
    over 8 heavy-tailed texts reached +5.7e-4 (inconclusive). Text by text equal distances need no interval."""
    plain = [1e-4, 2e-3, 9e-3, 3e-4, 5e-4, 1.5e-2, 2e-4, 7e-4]
    equal = relative_check(_distances(plain, list(plain)), 2.0)
    assert equal["verdict"] == "pass" and equal["lower"] == equal["upper"] == equal["value"] < 0
    assert equal["method"].startswith("identical to the plain path")
    assert relative_check(_distances(plain, list(plain)), 0.5)["verdict"] == "fail"  # r < 1: shown beyond
    nearly = relative_check(_distances(plain, [p * 1.0001 for p in plain]), 2.0)
    assert nearly["verdict"] == "inconclusive" and nearly["n_needed"] is not None  # not equal: the interval decides
