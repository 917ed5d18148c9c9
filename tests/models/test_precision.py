"""`--mlx-dtype`: the arms compute in the precision a run names, and every record, key and calibration says which."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from pytest_mlxgate.config.dtypes import DTYPES, parse_dtype
from pytest_mlxgate.models.precision import cast_model, float32_copy
from pytest_mlxgate.results.model import limits_from_words


@pytest.mark.parametrize(
    ("given", "name"),
    [("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("fp16", "float16"), ("f32", "float32"), ("auto", "auto")],
)
def test_a_dtype_is_read_by_its_full_or_short_name(given: str, name: str) -> None:
    assert parse_dtype(given) == name


def test_an_unknown_dtype_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'int8' is not a dtype .*auto, bfloat16, float16, float32"):
        parse_dtype("int8")


def test_a_bad_dtype_stops_pytest_before_anything_runs(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mlx-dtype=bf17")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'bf17' is not a dtype mlxgate runs a model in*"])
    pytester.makeini("[pytest]\nmlx_dtype = half\n")
    bad_ini = pytester.runpytest()
    assert bad_ini.ret == pytest.ExitCode.USAGE_ERROR
    bad_ini.stderr.fnmatch_lines(["*'half' is not a dtype*"])


def test_a_cast_changes_every_float_parameter_and_keeps_quantized_weights_packed() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.QuantizedLinear(64, 64, group_size=64, bits=4))
    cast_model(model, "bfloat16")
    linear, quantized = model.layers
    assert linear.weight.dtype == linear.bias.dtype == mx.bfloat16
    assert quantized.weight.dtype == mx.uint32 and quantized.scales.dtype == mx.bfloat16
    assert cast_model(model, "auto") is model and linear.weight.dtype == mx.bfloat16  # auto: as it is


def test_the_float32_copy_is_the_same_weights_upcast_and_leaves_the_model_alone() -> None:
    model = cast_model(nn.Linear(32, 32), "bfloat16")
    twin = float32_copy(model)
    assert twin is not model and twin.weight.dtype == mx.float32 and model.weight.dtype == mx.bfloat16
    assert mx.array_equal(twin.weight, model.weight.astype(mx.float32)).item()  # bf16 -> f32 is exact
    x = mx.random.normal((4, 32))
    assert twin(x).dtype == mx.float32 and model(x.astype(mx.bfloat16)).dtype == mx.bfloat16


def test_every_choice_is_an_mlx_dtype_or_auto() -> None:
    assert all(name == "auto" or isinstance(getattr(mx, name), mx.Dtype) for name in DTYPES)


# -- a real session on the tiny model ----------------------------------------------------------------------

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNREAD_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=3, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1.0)
"""


def _run(p: pytest.Pytester, model: Path, tmp: Path, report: Path, *more: str) -> pytest.RunResult:
    return p.runpytest_inprocess(
        *more,
        f"--mlx-candidate={model}",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "--mlx-prove=off",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )


def test_a_bfloat16_run_computes_in_bfloat16_says_so_everywhere_and_keys_its_own_reference(
    pytester: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makepyfile(test_gate=GATE)
    pytester.makeini("[pytest]\n")
    report = tmp_path / "r.json"
    _run(pytester, tiny_model_dir, tmp_path, report, "--mlx-dtype=bf16")
    (bf16,) = json.loads(report.read_text())["gates"]
    assert bf16["candidate"]["dtype"] == "bfloat16" and bf16["reference_source"] == "computed"
    assert bf16["limits_from"]["dtype"] == "bfloat16"
    assert limits_from_words(bf16["limits_from"]).startswith(f"limits unproven on {tiny_model_dir} (cpu, bfloat16)")
    assert "--mlx-dtype=bf16" in bf16["rerun"]  # a re-run of one gate computes in the same precision
    _run(pytester, tiny_model_dir, tmp_path, report)  # as shipped: the tiny model is float32
    (f32,) = json.loads(report.read_text())["gates"]
    assert f32["candidate"]["dtype"] == "float32" and f32["limits_from"]["dtype"] == "float32"
    assert f32["reference_source"] == "computed"  # another precision's reference arm is not this one's
    assert f32["stats"]["mean"] == 0.0 and bf16["stats"]["mean"] == 0.0  # an unread flag: each arm equal its own
    _run(pytester, tiny_model_dir, tmp_path, report, "--mlx-dtype=bfloat16")
    (again,) = json.loads(report.read_text())["gates"]
    assert again["reference_source"] == "cache" and again["candidate"]["dtype"] == "bfloat16"
