"""A KV gate that declares `snapshot_plan=` serves the candidate snapshot's own kv_config.json when
the snapshot ships one (what its serving stack runs), the gate's declared plan otherwise; a shipped
file that is not a plan is an error naming that file, never the declared plan quietly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 4, "group_size": 64, "start": 0},
                          snapshot_plan="kv_config.json", path="serving"),
    pytest.mark.mlx_kl(prompts=2, tokens=24, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=100.0)
"""


def _run(pytester: pytest.Pytester, model: Path, report: Path) -> tuple[pytest.RunResult, dict[str, object]]:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plan=GATE)
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={model}", "-p", "no:randomly", "--mlx-db=off", f"--mlx-report={report}"
    )
    records = json.loads(report.read_text())["gates"] if report.exists() else [{}]
    return result, records[0]


@pytest.mark.slow  # three pytester sessions on the tiny gemma-4
def test_the_snapshot_s_own_plan_replaces_the_declared_one_only_when_shipped(
    pytester: pytest.Pytester, tiny_gemma4_dir: Path, tmp_path: Path
) -> None:
    shipping = tmp_path / "shipping"
    shutil.copytree(tiny_gemma4_dir, shipping)
    (shipping / "kv_config.json").write_text(json.dumps({"types": {"full": {"bits": 8}}}))
    result, record = _run(pytester, shipping, tmp_path / "a.json")
    result.assert_outcomes(passed=1)
    assert "ships kv_config.json, so the candidate arm serves it" in result.stdout.str()
    lever = record["lever"]
    assert isinstance(lever, dict) and "kv_config.json" in str(lever["cand"]) and "full 8-bit" in str(lever["cand"])

    result, record = _run(pytester, tiny_gemma4_dir, tmp_path / "b.json")
    result.assert_outcomes(passed=1)
    assert "ships kv_config.json" not in result.stdout.str()
    assert record["lever"]["cand"] == "4-bit g64 from token 0"  # type: ignore[index]

    (shipping / "kv_config.json").write_text('{"layers": {"0": {"bits": 7}}}')
    result, _ = _run(pytester, shipping, tmp_path / "c.json")
    assert result.ret != 0
    out = result.stdout.str()
    assert "the candidate snapshot's own kv_config.json" in out and "bits=7" in out
    assert "1 passed" not in out
