"""A failing KL gate explains itself without being asked, within the budget: the record's `attribution`,
the failure message, the terminal summary and the HTML report all say which layer the drift comes from;
a passing gate is explained only under --mlx-explain, and --mlx-explain-budget 0 turns the automatic
explanation off. An explanation never changes a verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

GATE = """
import json, pathlib
import pytest
from pytest_mlxgate import assert_kl_below

PLAN = pathlib.Path(__file__).with_name("plan.json")
PLAN.write_text(json.dumps({"default": {"bits": 8, "group_size": 32}, "layers": {"1": {"bits": 2, "group_size": 32}}}))

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand=str(PLAN), path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=24, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, mean=LIMIT)
"""


def _run(
    pytester: pytest.Pytester, model: Path, tmp: Path, limit: float, *args: str
) -> tuple[Any, dict[str, Any], str]:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_gate=GATE.replace("LIMIT", repr(limit)))
    report, html = tmp / "report.json", tmp / "report.html"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={model}",
        "-p",
        "no:randomly",
        "--mlx-db=off",
        f"--mlx-report={report}",
        f"--mlx-html={html}",
        "--mlx-allow-untrained",
        "--mlx-explain-budget=8",
        *args,
    )
    record = json.loads(report.read_text())["gates"][0]
    return result, record, html.read_text()


@pytest.mark.slow  # four pytester sessions on the tiny llama
def test_a_failing_gate_says_where_its_drift_comes_from_and_a_passing_one_only_when_asked(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    result, record, html = _run(pytester, tiny_kv_model_dir, tmp_path, 1e-6)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert record["verdict"] == "fail"
    top = max((s for s in record["attribution"]["scopes"] if s["kind"] == "layer"), key=lambda s: s["mean"])
    assert top["layers"] == [1]
    assert "where the drift comes from" in out and "drift from: layer 1 " in out  # the message, the summary
    assert "<h3>Where the drift comes from</h3>" in html and 'data-plot="attribution-scopes"' in html

    result, record, _ = _run(pytester, tiny_kv_model_dir, tmp_path, 100.0)
    result.assert_outcomes(passed=1)
    assert "attribution" not in record and "drift from" not in result.stdout.str()

    result, record, _ = _run(pytester, tiny_kv_model_dir, tmp_path, 100.0, "--mlx-explain")
    result.assert_outcomes(passed=1)  # explained, and still the verdict the bounds give
    assert record["verdict"] == "pass" and record["attribution"]["scopes"]

    result, record, _ = _run(pytester, tiny_kv_model_dir, tmp_path, 1e-6, "--mlx-explain-budget=0")
    result.assert_outcomes(failed=1)
    assert "attribution" not in record and "where the drift comes from" not in result.stdout.str()


def test_the_budget_comes_from_the_command_line_then_the_ini_then_the_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mlxgate.config.settings import read_gate_settings

    def budget(*args: str, env: str | None = None, ini: str = "") -> float:
        if env is None:
            monkeypatch.delenv("MLXGATE_EXPLAIN_BUDGET", raising=False)
        else:
            monkeypatch.setenv("MLXGATE_EXPLAIN_BUDGET", env)
        pytester.makeini(f"[pytest]\n{ini}")
        return read_gate_settings(pytester.parseconfig(*args)).explain_budget

    assert budget() == 3.0
    assert budget(env="1.5") == 1.5
    assert budget(env="1.5", ini="mlx_explain_budget = 2") == 2.0
    assert budget("--mlx-explain-budget=0", env="1.5", ini="mlx_explain_budget = 2") == 0.0
    from pytest_mlxgate.errors import MlxgateUsageError

    with pytest.raises(MlxgateUsageError, match="MLXGATE_EXPLAIN_BUDGET='lots'"):
        budget(env="lots")
    with pytest.raises(pytest.UsageError):
        pytester.parseconfig("--mlx-explain-budget=-1")
