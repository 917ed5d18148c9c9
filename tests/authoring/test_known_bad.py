"""`assert_known_bad_fails`: a gate's known-bad test passes only when its drift test gives a *fail* verdict
on the known-bad arm, for patch, KV and weights levers (the forms this project's gates plant); a known-bad
that passes the limits, a drift test with no limits, an inconclusive verdict, a plain `assert`, the
reference itself or a value the lever cannot take each fail, saying which; under --mlx-aa it skips.

One pytester session on the tiny model runs a module per case (the model loads once); the broken kernel
is an RMSNorm that divides by the mean square instead of its root (top-1 0%, mean KL ~2.7 here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BROKEN_KERNELS = '''
import mlx.core as mx


def rms_norm_without_the_root(x, weight, eps, *, stream=None):
    """Divides by the mean square, not by its square root: the norm's scale is wrong everywhere."""
    ms = mx.mean(x.astype(mx.float32) ** 2, axis=-1, keepdims=True)
    return (x / (ms + eps) * weight).astype(x.dtype)
'''

NORM_LEVER = (
    'pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", '
    'ref="pytest_mlxgate.reference_ops:rms_norm", cand=None)'
)

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_known_bad_fails

pytestmark = [{lever}, pytest.mark.mlx_kl(prompts={prompts}, tokens=32, decode=8)]

KNOWN_BAD = {known_bad!r}


def test_drift(paired):
    {drift}


def test_known_bad(paired):
    assert_known_bad_fails(paired, KNOWN_BAD, test_drift)
"""

BAD = "kb_kernels:rms_norm_without_the_root"
CASES = {
    # module: (lever, prompts, known_bad, drift body)
    "caught": (NORM_LEVER, 4, BAD, "assert_kl_below(paired, mean=1e-3, p99=1e-2, top1=0.9)"),
    "loose": (NORM_LEVER, 4, BAD, "assert_kl_below(paired, mean=50, p99=50)"),
    "nolimits": (NORM_LEVER, 4, BAD, "pytest.fail('test_drift has no limits yet', pytrace=False)"),
    "inconclusive": (NORM_LEVER, 1, BAD, "assert_kl_below(paired, mean=1e-3)"),
    "plainassert": (NORM_LEVER, 4, BAD, "assert paired.kl().stats.mean < 1e-3"),
    "isref": (NORM_LEVER, 4, "pytest_mlxgate.reference_ops:rms_norm", "assert_kl_below(paired, mean=1e-3)"),
    "badvalue": (NORM_LEVER, 4, "not a name!", "assert_kl_below(paired, mean=1e-3)"),
    "undeclared": (NORM_LEVER, 4, None, "assert_kl_below(paired, mean=1e-3)"),
    # gates/test_kv_cache.py's and gates/test_weights.py's forms: fewer bits as the known-bad
    "kv": (
        'pytest.mark.mlx_lever("kv", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving")',
        4,
        2,
        "assert_kl_below(paired, mean=1e-4, p99=1e-3)",
    ),
    "weights": (
        'pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 8, "group_size": 64})',
        4,
        {"bits": 2, "group_size": 64},
        "assert_kl_below(paired, mean=1e-3, p99=1e-2)",
    ),
}


@pytest.mark.slow  # two pytester sessions on the tiny model, ten gate modules
def test_a_known_bad_test_passes_only_when_the_drift_test_fails_its_variant(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    (pytester.path / "kb_kernels.py").write_text(BROKEN_KERNELS)
    for name, (lever, prompts, known_bad, drift) in CASES.items():
        pytester.makepyfile(
            **{f"test_{name}": GATE.format(lever=lever, prompts=prompts, known_bad=known_bad, drift=drift)}
        )
    report = tmp_path / "r.json"
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-db=off", "-rA"]
    result = pytester.runpytest_subprocess(*common, f"--mlx-report={report}", "-k", "test_known_bad")
    outcomes = {
        line.split(" ")[1].split("::")[0][5:-3]: line.split(" ")[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "caught": "PASSED",
        "kv": "PASSED",
        "weights": "PASSED",
        **{
            name: "FAILED"
            for name in ("loose", "nolimits", "inconclusive", "plainassert", "isref", "badvalue", "undeclared")
        },
    }, result.stdout.str()
    out = result.stdout.str()
    assert "Traceback" not in out
    for words in [
        f"the known-bad variant '{BAD}' passes test_drift's limits (mean KL 95% bound * <= limit 50; p99 KL 95% "
        "bound * <= limit 50): limits that pass a broken variant would pass a broken kernel; tighten them*",
        f"test_drift has no limits yet, so the known-bad variant '{BAD}' cannot be shown to fail: size them "
        "(`pytest test_nolimits.py --mlx-calibrate`)*",
        f"test_drift could not tell the known-bad variant '{BAD}' apart from its limits (inconclusive)*",
        f"test_drift raised AssertionError on the known-bad variant '{BAD}' without a gate verdict*",
        "KNOWN_BAD 'pytest_mlxgate.reference_ops:rms_norm' is the gate's reference arm*",
        "*patch value 'not a name!' is not an object name*",
        "no known-bad variant shown to fail yet: set KNOWN_BAD in test_undeclared.py to a variant with a bug "
        "test_drift's limits must catch, a function with mlx.core.fast.rms_norm's signature and the bug*",
    ]:
        result.stdout.fnmatch_lines([words])
    # the known-bad arm's verdicts are not the test's record: no record says "fail" for a test that passed
    gates = json.loads(report.read_text())["gates"]
    passed = {f"test_{name}.py::test_known_bad" for name in ("caught", "kv", "weights")}
    assert not [g for g in gates if g["nodeid"] in passed and g.get("verdict") == "fail"], gates

    aa = pytester.runpytest_subprocess(*common, "--mlx-aa", "test_caught.py::test_known_bad")
    aa.assert_outcomes(skipped=1)
    aa.stdout.fnmatch_lines(["*--mlx-aa: the reference against itself has no candidate arm*"])


@pytest.mark.slow  # a pytester session (it stops before any arm runs)
def test_an_acceptance_without_a_reason_fails_the_calibration(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(
        test_g=f"""
import pytest

pytestmark = [{NORM_LEVER}, pytest.mark.mlx_calibrate(accept_broken="")]


def test_drift(paired):
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", "-p", "no:randomly", "--mlx-db=off", "--mlx-calibrate"
    )
    result.assert_outcomes(errors=1)  # the paired fixture refuses it, saying why
    result.stdout.fnmatch_lines(
        ["*marker mlx_calibrate on test_g.py::test_drift: accept_broken='': give the reason as text*"]
    )
    assert "Traceback" not in result.stdout.str()
