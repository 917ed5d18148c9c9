"""False green from plumbing: gates that would pass without testing anything are refused.

Each scenario is a real pytest session (pytester, a subprocess) on the tiny llama: a KV plan whose
start lies past every scored position, a patch lever whose site the model never calls, a bare
`--mlx-lever NAME` that would hijack other modules' levers, and a reference function edited under
the same name between two runs (the cached reference must not decide the second verdict).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_folder import gate_folder

pytestmark = pytest.mark.slow  # pytester gate sessions in subprocesses

KV_LATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={{"bits": 2, "group_size": 32, "start": {start}}}),
    pytest.mark.mlx_kl(prompts=2, tokens=24, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=50, p99=50)
"""

PATCH = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("{name}", patch="{target}", ref=None, cand="{cand}"),
    pytest.mark.mlx_kl(prompts=2, tokens=24),
]


def test_drift(paired):
    assert_kl_below(paired, mean={mean}, top1=0.01)
"""

KERNELS = """
import mlx.core as mx

_rms, _layer = mx.fast.rms_norm, mx.fast.layer_norm


def same_rms_norm(x, weight, eps):
    return _rms(x, weight, eps)


def broken_layer_norm(x, weight, bias, eps):
    return _layer(x, weight, bias, eps) * 0.0 + float("nan")
"""

REFERENCE_V1 = """
import mlx.core as mx

_rms = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    return _rms(x, weight, eps)
"""

REFERENCE_V2 = REFERENCE_V1.replace("return _rms(x, weight, eps)", "return _rms(x, weight * 1.5, eps)")

EDITED_REF_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref="myref:rms_norm", cand=None),
    pytest.mark.mlx_kl(prompts=2, tokens=24),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-6, p99=1e-5)
"""


@pytest.fixture
def gates(pytester: pytest.Pytester) -> pytest.Pytester:
    return gate_folder(pytester, kernels=KERNELS)


def _run(pytester: pytest.Pytester, model: Path, tmp: Path, *more: str) -> tuple[pytest.RunResult, dict]:
    report = tmp / "report.json"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={model}",
        f"--mlx-report={report}",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-db=off",
        "--mlx-allow-untrained",
        "-p",
        "no:randomly",
        *more,
    )
    data = json.loads(report.read_text()) if report.is_file() else {}
    return result, data


def _no_pass(result: pytest.RunResult, data: dict) -> None:
    assert result.ret != 0, result.stdout.str()
    assert "Traceback (most recent call last)" not in result.stdout.str() + result.stderr.str()
    assert all(g.get("verdict") != "pass" for g in data.get("gates", [])), data


def test_a_kv_plan_that_quantizes_no_scored_position_is_refused(
    gates: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_kv=KV_LATE.format(start=5000))  # mlx_lm's own default quantized_kv_start
    result, data = _run(gates, tiny_kv_model_dir, tmp_path)
    _no_pass(result, data)
    result.stdout.fnmatch_lines(
        [
            "*KV lever 'kv_cache'*serve the same caches at every position*beyond the 24 "
            "tokens*changes nothing the gate measures*"
        ]
    )


def test_a_kv_plan_starting_inside_the_decode_window_is_tested(
    gates: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    """The refusal's boundary: a start at the last scored position still quantizes (and 2 bits drift)."""
    gates.makepyfile(test_kv=KV_LATE.format(start=23).replace("mean=50, p99=50", "mean=1e-9"))
    result, data = _run(gates, tiny_kv_model_dir, tmp_path)
    result.assert_outcomes(failed=1)  # 2 bits on the last scored position: not within 1e-9
    [record] = data["gates"]
    assert record["stats"]["mean"] > 0 and record["verdict"] != "pass"


def test_a_patch_whose_site_is_never_called_is_refused(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # the llama normalizes with rms_norm: a broken layer_norm is never called, and would "pass"
    gates.makepyfile(
        test_norm=PATCH.format(
            name="layer_norm", target="mlx.core.fast.layer_norm", cand="kernels:broken_layer_norm", mean="1e-9"
        )
    )
    result, data = _run(gates, tiny_model_dir, tmp_path)
    _no_pass(result, data)
    result.stdout.fnmatch_lines(
        ["*mlx.core.fast.layer_norm was never called during the candidate arm*never exercised*"]
    )


def test_an_exact_exercised_patch_passes_saying_how_many_calls_it_saw(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(
        test_norm=PATCH.format(
            name="rms_norm", target="mlx.core.fast.rms_norm", cand="kernels:same_rms_norm", mean="1e-9"
        )
    )
    result, data = _run(gates, tiny_model_dir, tmp_path)
    result.assert_outcomes(passed=1)
    [record] = data["gates"]
    calls = record["lever_calls"]["candidate"]
    assert calls > 0
    result.stdout.fnmatch_lines([f"*identical on this backend ({calls:,} lever calls seen)*"])


def test_a_bare_lever_override_never_hijacks_another_modules_lever(
    gates: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(
        test_kv=KV_LATE.format(start=0),
        test_norm=PATCH.format(
            name="attention", target="mlx.core.fast.rms_norm", cand="kernels:same_rms_norm", mean="1e-9"
        ),
    )
    result, data = _run(
        gates,
        tiny_kv_model_dir,
        tmp_path,
        "--mlx-lever",
        "attention",
        "--mlx-ref-value",
        "original",
        "--mlx-cand-value",
        "kernels:same_rms_norm",
    )
    result.assert_outcomes(passed=2)
    levers = {g["nodeid"]: g["lever"] for g in data["gates"]}
    assert levers["test_kv.py::test_drift"]["kind"] == "kv"  # not an environment variable named "attention"
    assert levers["test_kv.py::test_drift"]["cand"].startswith("2-bit")
    assert levers["test_norm.py::test_drift"]["kind"] == "patch"


def test_a_bare_lever_override_that_matches_no_module_is_a_usage_error(
    gates: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(test_kv=KV_LATE.format(start=0))
    result, data = _run(
        gates, tiny_kv_model_dir, tmp_path, "--mlx-lever", "attention", "--mlx-ref-value", "0", "--mlx-cand-value", "1"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--mlx-lever attention: no collected gate module declares a lever named*env:attention*"]
    )
    assert not data.get("gates")


def test_editing_the_reference_function_recomputes_the_reference(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gates.makepyfile(myref=REFERENCE_V1, test_ref=EDITED_REF_GATE)
    first, data = _run(gates, tiny_model_dir, tmp_path)
    first.assert_outcomes(passed=1)
    assert data["gates"][0]["reference_source"] == "computed"
    again, data = _run(gates, tiny_model_dir, tmp_path)
    again.assert_outcomes(passed=1)
    assert data["gates"][0]["reference_source"] == "cache"  # unchanged: the cache still serves

    gates.makepyfile(myref=REFERENCE_V2)  # same module:qualname, other code
    edited, data = _run(gates, tiny_model_dir, tmp_path)
    assert data["gates"][0]["reference_source"] == "computed", edited.stdout.str()
    edited.assert_outcomes(failed=1)  # the edited reference drifts: the verdict follows the new code
    assert data["gates"][0]["verdict"] == "fail"
