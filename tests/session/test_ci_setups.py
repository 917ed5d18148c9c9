"""The pytest setups CI uses, each through pytester on a real gate: -p no:cacheprovider (the
reference cache off and said once, or in --mlx-reference-cache DIR), -p no:xdist, -n 2,
--junit-xml, -x, --lf, -k, PYTEST_ADDOPTS, and a read-only checkout (one warning per by-product not
written, with its fix; the verdicts still printed; no crash; the JSON report the run owes is an error
that fails the run)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

GATES = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-6)


def test_tight(paired):
    assert_kl_below(paired, mean=1e-6, max=1e-6)
"""

# A gate that fails for real: RMSNorm weights 2% too large (a small, real drift) against 1e-9.
DRIFTING = """
import mlx.core as mx
import pytest
from pytest_mlxgate import assert_kl_below

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    return _fused(x, weight * 1.02, eps)


pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="test_a_drift:rms_norm"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
]


def test_drifts(paired):
    assert_kl_below(paired, mean=1e-9)
"""


@pytest.fixture
def checkout(pytester: pytest.Pytester, tiny_model_dir: Path) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_gates=GATES)
    pytester.syspathinsert()
    return pytester


def _run(p: pytest.Pytester, model: Path, *args: str) -> pytest.RunResult:
    return p.runpytest_subprocess(f"--mlx-candidate={model}", "-p", "no:randomly", *args)


def _sources(result: pytest.RunResult) -> list[str]:
    return [line.split("ref: ")[1].split()[0] for line in result.stdout.lines if "ref: " in line]


def test_without_the_cacheprovider_the_reference_cache_is_off_and_said_once(
    checkout: pytest.Pytester, tiny_model_dir: Path
) -> None:
    for _ in range(2):
        result = _run(checkout, tiny_model_dir, "-p", "no:cacheprovider", "--mlx-db=off")
        result.assert_outcomes(passed=2)
        notes = [line for line in result.stdout.lines if "reference cache off" in line]
        assert len(notes) == 1 and "--mlx-reference-cache DIR" in notes[0]
        assert _sources(result) == ["computed"] * 2 or _sources(result) == ["computed"]
    assert not (checkout.path / ".pytest_cache").exists()


@pytest.mark.slow  # four pytester sessions
def test_a_configured_reference_cache_works_without_pytests_cache(
    checkout: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    where = tmp_path / "refs"
    args = ("-p", "no:cacheprovider", "--mlx-db=off", f"--mlx-reference-cache={where}")
    first, second = (_run(checkout, tiny_model_dir, *args) for _ in range(2))
    assert "computed" in _sources(first) and set(_sources(second)) == {"cache"}
    assert not any("reference cache off" in line for line in second.stdout.lines)
    off = _run(checkout, tiny_model_dir, "--mlx-db=off", "--mlx-reference-cache=off")
    off.stdout.fnmatch_lines(["mlxgate: reference cache off (--mlx-reference-cache off)"])
    assert set(_sources(off)) == {"computed"}


@pytest.mark.slow  # a pytester session per setup
@pytest.mark.parametrize("setup", ["no-xdist", "n2", "junit", "x", "k", "addopts"])
def test_the_setups_ci_uses(
    checkout: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    junit = tmp_path / "junit.xml"
    extra = {
        "no-xdist": ["-p", "no:xdist"],
        "n2": ["-n", "2"],
        "junit": [f"--junit-xml={junit}"],
        "x": ["-x"],
        "k": ["-k", "tight"],
        "addopts": [],
    }[setup]
    if setup == "addopts":
        monkeypatch.setenv("PYTEST_ADDOPTS", "--mlx-kl-prompts=3 --mlx-db=off")
    if setup == "n2":
        pytest.importorskip("xdist")
    if setup == "x":
        checkout.makepyfile(test_a_drift=DRIFTING)  # collected first: -x stops there
    result = _run(checkout, tiny_model_dir, *extra)
    expected = {"k": {"passed": 1}, "x": {"failed": 1}}.get(setup, {"passed": 2})
    result.assert_outcomes(**expected)
    result.stdout.fnmatch_lines(["*mlxgate*", "gate *metric*value*"])  # the verdict table
    if setup == "addopts":
        result.stdout.fnmatch_lines(["*3 prompts*"])
    if setup == "junit":
        cases = ET.parse(junit).getroot().iter("testcase")
        assert sorted(c.get("name") or "" for c in cases) == ["test_drift", "test_tight"]


@pytest.mark.slow  # two pytester sessions
def test_last_failed_reruns_only_the_failed_gate(checkout: pytest.Pytester, tiny_model_dir: Path) -> None:
    checkout.makepyfile(test_a_drift=DRIFTING)
    _run(checkout, tiny_model_dir, "--mlx-db=off").assert_outcomes(passed=2, failed=1)
    again = _run(checkout, tiny_model_dir, "--mlx-db=off", "--lf")
    again.assert_outcomes(failed=1)  # the passing file is not even collected
    again.stdout.fnmatch_lines(["*AssertionError: KL gate*test_a_drift.py::test_drifts"])
    assert _sources(again) == ["cache"]  # the reference arm the first run computed


@pytest.fixture
def read_only(checkout: pytest.Pytester) -> Iterator[Path]:
    """The checkout bind-mounted read-only onto itself (root may write anywhere else)."""
    where = checkout.path
    done = subprocess.run(["mount", "--bind", str(where), str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount a read-only checkout here: {done.stderr.strip() or done.returncode}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], capture_output=True, text=True)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only: {ro.stderr.strip()}")
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


@pytest.mark.slow  # a pytest session on a read-only mount
def test_a_read_only_checkout_warns_once_per_by_product_and_refuses_a_report_it_cannot_write(
    checkout: pytest.Pytester, tiny_model_dir: Path, read_only: Path, tmp_path: Path
) -> None:
    with pytest.raises(OSError):
        (read_only / "probe").write_text("x")

    # pytester's own runner writes into its directory: run pytest as CI would, from the checkout
    def run(*more: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pytest", f"--mlx-candidate={tiny_model_dir}", "-p", "no:randomly"]
        return subprocess.run(
            [*command, f"--basetemp={tmp_path / 'base'}", "-W", "default", *more],
            cwd=read_only,
            capture_output=True,
            text=True,
            timeout=600,
        )

    done = run()
    out = done.stdout + done.stderr
    # the by-products (reference cache, results DB) cannot be written: a warning each, once, and verdicts
    assert done.returncode == pytest.ExitCode.OK, out[-3000:]
    assert "2 passed" in out and "Traceback" not in out
    assert "test_gates::test_drift" in out and "pass" in out  # the verdict table
    assert out.count("is not writable") == 1 and "--mlx-reference-cache DIR" in out  # once, not per gate
    assert "results DB" in out and "--mlx-db off" in out  # a by-product: a warning
    # a report asked for where it cannot be written: refused before any gate runs (not found at the end)
    refused = run("--mlx-report=report.json")
    said = refused.stdout + refused.stderr
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, said[-3000:]
    assert f"--mlx-report {read_only / 'report.json'}: the folder {read_only} cannot be written" in said
    assert "passed" not in said and "Traceback" not in said
    assert not (read_only / "report.json").exists()
