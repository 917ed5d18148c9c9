"""What CI reads from a run, through pytester on the tiny model: a failing, an inconclusive and a passing
gate, with and without xdist, under junit_family xunit1 and xunit2, with warnings as errors. The JUnit
XML (read by xml.etree and by junitparser) holds each gate's flat properties and its record, equal to
the JSON report's, where the family allows them; the GitHub job summary is appended to the file the
runner names; the annotations point at each failing or inconclusive gate's `def` line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.results.junit import split_suite_name

PERTURB = '''
import mlx.core as mx

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    """RMSNorm with weights 2% too large: a small, real drift."""
    return _fused(x, weight * 1.02, eps)
'''

FAILS = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=3, tokens=16),
]


@pytest.mark.parametrize("limit", [1e-9])
def test_drift(paired, limit):
    assert_kl_below(paired, mean=limit, top1=0.2)
"""

UNSURE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=1, tokens=16),  # one prompt gives no interval: inconclusive
]


def test_one_prompt(paired):
    assert_kl_below(paired, mean=1e-9)
"""

PASSES = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-3)
"""

NODEIDS = {
    "test_fails.py::test_drift[1e-09]": "fail",
    "test_unsure.py::test_one_prompt": "inconclusive",
    "test_passes.py::test_drift": "pass",
}


def _def_line(path: Path, name: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(f"def {name}("))


@pytest.mark.slow  # a pytester gate session per setup (~10 s each)
@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
@pytest.mark.parametrize("xdist", [False, True], ids=["no-xdist", "n2"])
def test_junit_job_summary_and_annotations(
    pytester: pytest.Pytester,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    xdist: bool,
) -> None:
    if xdist:
        pytest.importorskip("xdist")
    junitparser = pytest.importorskip("junitparser")
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(perturb=PERTURB, test_fails=FAILS, test_unsure=UNSURE, test_passes=PASSES)
    pytester.syspathinsert()
    summary, xml_path, report = tmp_path / "step-summary.md", tmp_path / "junit.xml", tmp_path / "report.json"
    summary.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path.parent))  # the checkout holds the project folder
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "--mlx-db=off",
        f"--mlx-report={report}",
        f"--junit-xml={xml_path}",
        "-o",
        f"junit_family={family}",
        "-W",
        "error::pytest.PytestWarning",
        "-p",
        "no:randomly",
        *(["-n", "2"] if xdist else ["-p", "no:xdist"]),
    )
    result.assert_outcomes(failed=2, passed=1)  # the inconclusive gate fails too (the default policy)
    assert "warnings summary" not in result.stdout.str()

    reported = {g["nodeid"]: g for g in json.loads(report.read_text())["gates"]}
    assert set(reported) == set(NODEIDS)
    _check_junit(xml_path, family, reported)
    _check_junitparser(junitparser, xml_path, family, reported)

    # the job summary: appended after what was there, failing gate first, where the reports are
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("an earlier step's summary\n\n### mlxgate: 3 gates — 1 fail · 1 inconclusive · 1 pass\n")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[1] for r in rows] == ["❌ fail", "⚠️ inconclusive", "✅ pass"]
    assert rows[0].startswith("| `test_fails::test_drift[1e-09]` | ❌ fail | mean KL ")
    assert "vs limit ≤ 1e-09: fail" in rows[0]
    assert "| 3 prompts · 48 tokens" in rows[0] and "| 1 prompts · 16 tokens" in rows[1]
    assert f"JSON report: `{report}`" in text and f"JUnit XML: `{xml_path}`" in text
    assert text.count("### mlxgate") == 1  # the controller alone writes it

    # the annotations: at the def line (below the decorator), paths relative to the checkout
    folder = pytester.path.name
    commands = [line for line in result.stdout.lines if line.startswith("::")]
    fails_line = _def_line(pytester.path / "test_fails.py", "test_drift")
    unsure_line = _def_line(pytester.path / "test_unsure.py", "test_one_prompt")
    assert len(commands) == 2, commands
    assert commands[0].startswith(
        f"::error file={folder}/test_fails.py,line={fails_line},title=mlxgate fail%3A "
        "test_fails%3A%3Atest_drift[1e-09]::FAIL test_fails::test_drift[1e-09]: mean KL "
    )
    assert commands[1].startswith(
        f"::warning file={folder}/test_unsure.py,line={unsure_line},title=mlxgate "
        "inconclusive%3A test_unsure%3A%3Atest_one_prompt::INCONCLUSIVE "
    )
    assert fails_line == 11  # the def, not pytest's line of the parametrize decorator


def _check_junit(xml_path: Path, family: str, reported: dict[str, Any]) -> None:
    """xml.etree: the properties where the family allows them, each gate's once, its record as reported."""
    root = ET.parse(xml_path).getroot()
    (suite,) = root.iter("testsuite")
    cases = {f"{c.get('classname')}.py::{c.get('name')}": c for c in suite.iter("testcase")}
    assert set(cases) == set(NODEIDS)
    suite_props = [(p.get("name") or "", p.get("value") or "") for p in suite.findall("properties/property")]
    if family == "xunit2":
        assert all(c.find("properties") is None for c in cases.values())  # junit-10.xsd allows none there
        per_gate: dict[str, dict[str, str]] = {}
        for name, value in suite_props:
            split = split_suite_name(name)
            assert split is not None, name
            nodeid, key = split
            assert key not in per_gate.setdefault(nodeid, {}), f"{name} twice"
            per_gate[nodeid][key] = value
    else:
        assert not any(name.startswith("mlxgate") for name, _ in suite_props)
        per_gate = {}
        for nodeid, case in cases.items():
            pairs = [(p.get("name") or "", p.get("value") or "") for p in case.findall("properties/property")]
            names = [n for n, _ in pairs]
            assert len(names) == len(set(names)), f"{nodeid}: a property twice"
            per_gate[nodeid] = dict(pairs)
            assert case.get("file") == nodeid.split("::")[0]
    assert set(per_gate) == set(NODEIDS)
    for nodeid, props in per_gate.items():
        record = json.loads(props["mlxgate.record"])
        assert record == reported[nodeid] and record["nodeid"] == nodeid  # its own gate's, as the JSON report has it
        assert props["mlxgate.verdict"] == NODEIDS[nodeid] and props["mlxgate.mode"] == "gate"
        assert props["mlxgate.n_prompts"] == str(record["stats"]["n_prompts"])
        assert props["mlxgate.n_tokens"] == str(record["stats"]["n_tokens"])
        assert props["mlxgate.kl.mean.limit"] == repr(record["checks"][0]["limit"])
        assert props["mlxgate.model"] == record["candidate"]["pinned"]
    fail = per_gate["test_fails.py::test_drift[1e-09]"]
    assert float(fail["mlxgate.kl.mean.lower"]) > 1e-9 and fail["mlxgate.kl.mean.verdict"] == "fail"
    lower, mean, upper = (float(fail[f"mlxgate.kl.mean{end}"]) for end in (".lower", "", ".upper"))
    assert lower <= mean <= upper
    assert (fail["mlxgate.kl.top1.limit"], fail["mlxgate.kl.top1.verdict"]) == ("0.2", "pass")
    assert "mlxgate.kl.mean.upper" not in per_gate["test_unsure.py::test_one_prompt"]  # no interval from one prompt


def _check_junitparser(junitparser: Any, xml_path: Path, family: str, reported: dict[str, Any]) -> None:
    """A junit library reads the same: the results, and the properties where this family puts them."""
    (suite,) = list(junitparser.JUnitXml.fromfile(str(xml_path)))
    outcome = {f"{c.classname}.py::{c.name}": c for c in suite}
    assert outcome["test_passes.py::test_drift"].is_passed
    assert outcome["test_fails.py::test_drift[1e-09]"].is_failure
    assert outcome["test_unsure.py::test_one_prompt"].is_failure
    if family == "xunit2":
        props = {split_suite_name(p.name): p.value for p in suite.properties()}
        records = {
            nodeid: json.loads(v)  # type: ignore[misc]
            for (nodeid, key), v in props.items()
            if key == "mlxgate.record"
        }
    else:
        records = {}
        for nodeid, case in outcome.items():
            values = {p.name: p.value for p in case.child(junitparser.Properties)}
            records[nodeid] = json.loads(values["mlxgate.record"])
            assert values["mlxgate.verdict"] == NODEIDS[nodeid]
    assert records == reported
