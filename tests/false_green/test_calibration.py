"""False green from calibration: limits sized from a broken lever itself, pasted, pass that broken lever.

Issue 19's scenario, as a new author would run it: `mlxgate new-gate mynorm --patch mlx.core.fast.rms_norm
--cand mynorm:rms_norm` for an RMSNorm that breaks the model, then `pytest gates/test_mynorm.py
--mlx-calibrate`. Here the kernel divides by the mean square instead of its root, which breaks the tiny
llama as the issue's float16 accumulation breaks the embedded model (top-1 ~0%, mean KL ~3.7 on 8 x 64).
The calibration must print nothing to paste, only that the lever breaks the model; an explicit acceptance
sizes limits and says so; and even then the skeleton stays red until a known-bad variant is shown to fail,
which a gate passing a broken kernel cannot show. The other way round, a good lever's gate goes green
once its calibrated limits and a known-bad variant are in. Real sessions (pytester subprocesses) on the
tiny model; the gate modules are the ones `mlxgate new-gate` writes, edited as an author would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_mlxgate.verdicts.calibration import QUALITY_BOUNDS

pytestmark = pytest.mark.slow  # pytester gate sessions in subprocesses

#: The author's kernel: an RMSNorm that divides by the mean square, not by its square root.
MYNORM = """
import mlx.core as mx


def rms_norm(x, weight, eps, *, stream=None):
    ms = mx.mean(x.astype(mx.float32) ** 2, axis=-1, keepdims=True)
    return (x / (ms + eps) * weight).astype(x.dtype)
"""

Session = Callable[..., pytest.RunResult]
SIZES = [
    "--mlx-kl-prompts=8",
    "--mlx-kl-tokens=64",
    "--mlx-speed-contexts=16",
    "--mlx-speed-reps=3",
    "--mlx-speed-decode=2",
]


def _new_gate(cwd: Path, *args: str) -> Path:
    """`mlxgate new-gate ARGS` as the console command runs it, in `cwd`; the module it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest_mlxgate.cli", "new-gate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return cwd / "gates" / f"test_{args[0]}.py"


def _replace_test(source: str, test: str, body: str | None) -> str:
    """The module with `test`'s body replaced by `body` (None: the test removed), as an author edits it."""
    pattern = re.compile(rf"def {test}\(paired: Paired\) -> None:\n.*?(?=\n\n\ndef |\Z)", re.S)
    assert pattern.search(source), test
    return pattern.sub("" if body is None else f"def {test}(paired: Paired) -> None:\n{body}", source, count=1)


def _paste(line: str) -> str:
    name = line.split("(")[0]
    return f"    from pytest_mlxgate import {name}\n\n    {line}"


@pytest.fixture
def session(pytester: pytest.Pytester, tiny_model_dir: Path) -> Session:
    """A gate session on the tiny model, at this file's sizes: `session(*args)`."""
    pytester.makeini("[pytest]\n")
    (pytester.path / "mynorm.py").write_text(MYNORM)

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            f"--mlx-candidate={tiny_model_dir}", "-p", "no:randomly", "--mlx-db=off", "-rA", *SIZES, *args
        )

    return run


def test_a_lever_that_breaks_the_model_gets_no_limits_and_its_gate_stays_red(
    pytester: pytest.Pytester, session: Session, tmp_path: Path
) -> None:
    gate = _new_gate(pytester.path, "mynorm", "--patch", "mlx.core.fast.rms_norm", "--cand", "mynorm:rms_norm")
    report = tmp_path / "cal.json"
    result = session("gates/test_mynorm.py", "--mlx-calibrate", f"--mlx-report={report}")
    result.assert_outcomes(skipped=3)  # no verdict
    out = result.stdout.str()
    assert "Traceback" not in out
    assert "assert_kl_below(" not in out and "assert_faster(" not in out  # nothing anywhere to paste
    result.stdout.fnmatch_lines(
        [
            # (fnmatch reads [...] as a character class: the intervals are matched by *)
            "*this lever breaks the model: mean KL * (BEYOND the quality bound <= 2), p99 KL *, top-1 *% * "
            "(BEYOND the quality bound >= 30.0%); worst tokens: prompt * position *; a gate limit that passes it would "
            "pass a broken model, so none is suggested",
            '*accept it explicitly: add pytest.mark.mlx_calibrate(accept_broken="*") to the module\'s pytestmark*',
        ]
    )
    calibration = json.loads(report.read_text())["calibrations"][0]
    kl = calibration["kl"]
    # the tiny model really is broken by this kernel, well past both bounds, not at their edge
    assert kl["mean_ci"][0] > QUALITY_BOUNDS["mean"] and kl["top1_ci"][1] < QUALITY_BOUNDS["top1"], kl
    suggested = calibration["suggested"]
    assert (suggested["code"], suggested["kl_limits"], suggested["speed_goals"]) == ([], {}, {})
    assert {b["key"] for b in suggested["breaks"]["beyond"]} >= {"mean", "top1"}
    assert calibration["accept_broken"] is None and suggested["accepted"] is None

    # an explicit acceptance sizes the limits (the old, lever-relative rule) and says so, there and in the record
    source = gate.read_text().replace(
        "    pytest.mark.mlx_speed(),\n",
        '    pytest.mark.mlx_speed(),\n    pytest.mark.mlx_calibrate(accept_broken="scenario: pasted anyway"),\n',
    )
    gate.write_text(source)
    result = session("gates/test_mynorm.py", "--mlx-calibrate", f"--mlx-report={report}")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*ACCEPTED beyond the quality bounds (mlx_calibrate(accept_broken=...)): scenario: pasted anyway",
            "*this lever breaks the model: *; limits sized anyway, as the module accepts it: scenario: pasted anyway",
            "*assert_kl_below(paired, mean=*)  # beyond the quality bounds, accepted: scenario: pasted anyway",
            "*known-bad step*",
        ]
    )
    calibration = json.loads(report.read_text())["calibrations"][0]
    assert calibration["accept_broken"] == calibration["suggested"]["accepted"] == "scenario: pasted anyway"
    pasted = calibration["suggested"]["code"][0]
    assert pasted.startswith("assert_kl_below(paired, mean=")

    # pasted: the drift test passes the broken kernel, but the gate is not green: no known-bad shown to fail
    source = _replace_test(_replace_test(gate.read_text(), "test_drift", _paste(pasted)), "test_speed", None)
    gate.write_text(source)
    result = session("gates/test_mynorm.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "PASSED gates/test_mynorm.py::test_drift",
            "FAILED gates/test_mynorm.py::test_known_bad - Failed: no known-bad variant*",
        ]
    )
    result.stdout.fnmatch_lines(["no known-bad variant shown to fail yet: set KNOWN_BAD in gates/test_mynorm.py to *"])

    # and the broken kernel itself, planted as the known-bad, passes those limits: still red, saying why
    gate.write_text(source.replace("\nKNOWN_BAD = None\n", '\nKNOWN_BAD = "mynorm:rms_norm"\n'))
    result = session("gates/test_mynorm.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "the known-bad variant 'mynorm:rms_norm' passes test_drift's limits (mean KL 95% "
            "bound * <= limit *): limits that pass a broken variant would pass a broken kernel*"
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_a_good_lever_s_gate_goes_green_once_its_limits_fail_a_known_bad_variant(
    pytester: pytest.Pytester, session: Session, tmp_path: Path
) -> None:
    gate = _new_gate(pytester.path, "fused_norm", "--patch", "mlx.core.fast.rms_norm")  # the original vs plain ops
    result = session("gates/test_fused_norm.py")
    result.assert_outcomes(failed=3)  # no limits, no speed goal, no known-bad
    result.stdout.fnmatch_lines(["no known-bad variant shown to fail yet: set KNOWN_BAD in gates/test_fused_norm.py *"])

    report = tmp_path / "cal.json"
    result = session("gates/test_fused_norm.py", "--mlx-calibrate", f"--mlx-report={report}")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*suggested limits (paste into the gate):",
            "*assert_kl_below(paired, mean=*",
            "*known-bad step (limits never shown to fail a broken variant may pass one): plant a function with "
            "mlx.core.fast.rms_norm's signature and the bug*",
            '*KNOWN_BAD = "mymod:broken"   (in gates/test_fused_norm.py: its test_known_bad runs test_drift on it*',
            "*pytest gates/test_fused_norm.py --mlx-lever fused_norm"
            " --mlx-ref-value pytest_mlxgate.reference_ops:rms_norm"
            " --mlx-cand-value mymod:broken   (once, by hand: must fail)",
        ]
    )
    suggested = json.loads(report.read_text())["calibrations"][0]["suggested"]
    assert suggested["breaks"] is None and suggested["known_bad"]["declare"] == 'KNOWN_BAD = "mymod:broken"'
    drift = suggested["code"][0]
    for key, limit in suggested["kl_limits"].items():  # within the quality bounds
        assert limit >= QUALITY_BOUNDS[key] if key == "top1" else limit <= QUALITY_BOUNDS[key]

    source = _replace_test(gate.read_text(), "test_drift", _paste(drift))
    source = _replace_test(source, "test_speed", None)  # a speed goal from 3 timed pairs here would be noise
    gate.write_text(source.replace("\nKNOWN_BAD = None\n", '\nKNOWN_BAD = "mynorm:rms_norm"\n'))
    result = session("gates/test_fused_norm.py")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["PASSED gates/test_fused_norm.py::test_known_bad"])
