"""The CI lane in bfloat16: the project's kernel gates, as they are in gates/, run on the embedded model in
bf16 at sizes that fit CI, and beside them each one's known-bad as its candidate. mlx's own kernels must pass
the float32 oracle's rules; every known-bad must fail them (at the site where its lever has one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

GATES = Path(__file__).resolve().parents[2] / "gates"
KERNEL_GATES = ("test_attention.py", "test_fused_norms_rope.py", "test_compile.py")

#: Known-bads as candidates of their own, judged by the rule the gates name: the attention gate's, and the
#: fused-norms gate's RoPE base 10% off, which only its site shows (tests/authoring/test_precision_proof.py
#: proves the compile gate's hard sigmoid, which fails by orders of magnitude, on the tiny model).
KNOWN_BADS = {
    "test_bad_attention.py": (
        'pytest.mark.mlx_lever("attention", patch="mlx.core.fast.scaled_dot_product_attention", '
        'ref="pytest_mlxgate.reference_ops:scaled_dot_product_attention", '
        'cand="known_bad_ops:attention_scale_off", path="prefill")'
    ),
    "test_bad_rope.py": (
        'pytest.mark.mlx_lever("rope_base_off", patch="mlx.core.fast.rope", ref=None, '
        'cand="known_bad_ops:rope_base_off", path="serving")'
    ),
}
BAD_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [{lever}]


def test_drift(paired):
    assert_kl_below(paired, relative=2.0)
"""


def _bf16_session(pytester: pytest.Pytester, tmp_path: Path, modules: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """`modules` (name: source) run together in bf16 at the lane's sizes: the run and its records by module."""
    for name, source in modules.items():
        (pytester.path / name).write_text(source)
    pytester.makeini("[pytest]\n")
    report = tmp_path / "bf16.json"
    result = pytester.runpytest_subprocess(
        "-k",
        "drift",
        "--mlx-dtype=bfloat16",
        "--mlx-kl-prompts=8",
        "--mlx-kl-tokens=32",
        "--mlx-kl-decode=16",
        "--mlx-prove=off",
        "--mlx-speed=off",
        "--mlx-explain-budget=0",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp_path / 'refcache'}",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
        timeout=900,
    )
    records = {r["nodeid"].split("::")[0]: r for r in json.loads(report.read_text())["gates"]}
    assert set(records) == set(modules) - {"known_bad_ops.py"}, result.stdout.str()[-3000:]
    return result, records


def _relative_and_site(record: dict[str, Any]) -> dict[str, str]:
    return {c["key"]: c["verdict"] for c in record["checks"] if c["key"] in ("relative", "site")}


# Two sessions (mlx's kernels; the known-bads), not one: under xdist they run side by side, ~1.5 min each.
@pytest.mark.slow  # three gate modules in bf16 on the embedded model
def test_in_bfloat16_mlx_s_kernels_pass_the_float32_oracle(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, records = _bf16_session(
        pytester, tmp_path, {name: (GATES / name).read_text() for name in (*KERNEL_GATES, "known_bad_ops.py")}
    )
    for name in KERNEL_GATES:
        assert records[name]["candidate"]["dtype"] == "bfloat16"
        assert set(_relative_and_site(records[name]).values()) == {"pass"}, (name, records[name]["checks"])
    assert "site" in _relative_and_site(records["test_attention.py"])
    assert "site" in _relative_and_site(records["test_fused_norms_rope.py"])
    assert "site" not in _relative_and_site(records["test_compile.py"])  # mx.compile swaps no function
    result.assert_outcomes(passed=len(KERNEL_GATES))


@pytest.mark.slow  # two known-bad gate modules in bf16 on the embedded model
def test_in_bfloat16_every_known_bad_fails_the_float32_oracle(pytester: pytest.Pytester, tmp_path: Path) -> None:
    modules = {name: BAD_GATE.format(lever=lever) for name, lever in KNOWN_BADS.items()}
    result, records = _bf16_session(
        pytester, tmp_path, {**modules, "known_bad_ops.py": (GATES / "known_bad_ops.py").read_text()}
    )
    for name in KNOWN_BADS:
        assert records[name]["candidate"]["dtype"] == "bfloat16"
        assert records[name]["verdict"] == "fail", (name, records[name]["checks"])
    assert _relative_and_site(records["test_bad_rope.py"])["site"] == "fail"  # 10% off the base: only its site
    result.assert_outcomes(failed=len(KNOWN_BADS))
