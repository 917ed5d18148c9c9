"""`mlxgate new-gate`: the module it writes compiles, passes ruff and collects, for a patch lever with a
defaulted or an explicit reference and for an env lever; every usage error exits 2 saying what, why
and the fix, writing nothing; an existing file is never touched; the gate fails until it has limits
and a known-bad variant they are shown to fail.

The CLI runs in process (`cli.main`, the working directory a temp folder) except where the console
entry itself is the point; the gates it writes run in pytester sessions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core  # noqa: F401  (in-process pytester runs must not re-import the nanobind extension)
import pytest

from pytest_mlxgate import cli

REPO = Path(__file__).resolve().parents[2]

#: A user's kernels module beside the gates, for explicit --ref/--cand values.
KERNELS = '''
def plain_sdpa(q, k, v, *, scale, mask=None, sinks=None, stream=None):
    """The reference a user brings."""


def fast_sdpa(q, k, v, *, scale, mask=None, sinks=None, stream=None):
    """The kernel under test."""


NOT_A_FUNCTION = 3
'''

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def new_gate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """`mlxgate new-gate ARGS` in process, in `cwd`: (exit status, stdout, stderr)."""

    def run(cwd: Path, *args: str) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = cli.main(["new-gate", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def kernels(tmp_path: Path) -> Iterator[Path]:
    """`newgate_kernels.py` in tmp_path (the CLI's working directory), forgotten afterwards."""
    (tmp_path / "newgate_kernels.py").write_text(KERNELS)
    yield tmp_path
    sys.modules.pop("newgate_kernels", None)


FORMS = {
    "patch, defaulted ref": (
        "fused_norm",
        ["--patch", "mlx.core.fast.rms_norm"],
        {
            "patch": "mlx.core.fast.rms_norm",
            "ref": "pytest_mlxgate.reference_ops:rms_norm",
            "cand": None,
            "path": "prefill",
        },
    ),
    "patch, explicit ref and cand": (
        "my_attention",
        [
            "--patch",
            "mlx.core.fast.scaled_dot_product_attention",
            "--ref",
            "newgate_kernels:plain_sdpa",
            "--cand",
            "newgate_kernels.fast_sdpa",
            "--path",
            "serving",
        ],
        {
            "patch": "mlx.core.fast.scaled_dot_product_attention",
            "ref": "newgate_kernels:plain_sdpa",
            "cand": "newgate_kernels.fast_sdpa",
            "path": "serving",
        },
    ),
    "env": (
        "perf_kernel",
        ["--env", "MLX_PERF_KERNEL", "--ref", "unset", "--cand", "1"],
        {"env": "MLX_PERF_KERNEL", "ref": "unset", "cand": "1", "path": "prefill"},
    ),
}


def lever_marker(source: str) -> tuple[list[object], dict[str, object]]:
    """The mlx_lever(...) call's arguments in a gate module's source, as values."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mlx_lever":
            return (
                [ast.literal_eval(a) for a in node.args],
                {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None},
            )
    raise AssertionError("no mlx_lever marker")


def ruff(cwd: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--select",
            "I,F",
            "--line-length",
            "120",
            "--output-format",
            "concise",
            *map(str, paths),
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("form", list(FORMS))
def test_the_gate_compiles_passes_ruff_and_collects(
    form: str, pytester: pytest.Pytester, new_gate: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, args, marker = FORMS[form]
    (pytester.path / "newgate_kernels.py").write_text(KERNELS)
    monkeypatch.delitem(sys.modules, "newgate_kernels", raising=False)
    code, out, err = new_gate(pytester.path, name, *args)
    assert (code, err) == (0, "")
    gate = pytester.path / "gates" / f"test_{name}.py"
    assert out == (
        f"wrote gates/test_{name}.py\n"
        f"next: pytest gates/test_{name}.py --mlx-calibrate  (measures it and prints the limits to paste "
        "into its tests)\n"
        "then: set KNOWN_BAD in it to a broken variant (its test_known_bad checks that the limits fail "
        "it)\n"
        f"and:  pytest gates/test_{name}.py\n"
    )
    source = gate.read_text()
    compile(source, str(gate), "exec")
    assert lever_marker(source) == ([name], marker)
    # pytest_mlxgate is first-party in this repository and third-party elsewhere: clean either way
    for cwd in (pytester.path, REPO):
        checked = ruff(cwd, gate)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:randomly", "gates")
    assert result.ret == 0, result.stdout.str()
    ids = {line for line in result.outlines if "::" in line}
    assert ids == {f"gates/test_{name}.py::{test}" for test in ("test_drift", "test_speed", "test_known_bad")}


def test_the_docstring_names_the_lever_and_each_limit_to_measure(tmp_path: Path, new_gate: Run) -> None:
    code, _, _ = new_gate(tmp_path, "fused_norm", "--patch", "mlx.core.fast.rms_norm", "--path", "serving")
    assert code == 0
    source = (tmp_path / "gates" / "test_fused_norm.py").read_text()
    doc = ast.get_docstring(ast.parse(source))
    assert doc is not None
    lines = doc.splitlines()
    assert lines[0] == (
        "Gate: `fused_norm` (patch `mlx.core.fast.rms_norm`): the original vs `pytest_mlxgate.reference_ops:rms_norm`."
    )
    assert "- reference arm: `pytest_mlxgate.reference_ops:rms_norm`: the same maths in plain mlx ops" in doc
    assert "- candidate arm: the original `mlx.core.fast.rms_norm`, as it ships (the code under test)." in doc
    assert "Serving path" in doc and "How the limits were set (`pytest gates/test_fused_norm.py --mlx-calibrate`" in doc
    for todo in ("A/A floor", "This lever's drift", "A known-bad variant must fail", "Speed and memory"):
        assert any(line.startswith(f"- {todo}") and "TODO" in line for line in lines), todo
    assert (
        "`pytest gates/test_fused_norm.py --mlx-lever fused_norm\n"
        "  --mlx-ref-value pytest_mlxgate.reference_ops:rms_norm --mlx-cand-value mymod:broken`"
    ) in doc
    assert "- A known-bad variant must fail: TODO" in doc and "Declare it as\n  KNOWN_BAD below" in doc
    # never a pass by default: each test only fails, showing the shape of the call to paste, and the known-bad
    # test runs the drift test on a KNOWN_BAD that is None until the author plants one
    calls = {
        n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call)
    }
    assert "fail" in calls and {c for c in calls if c.startswith("assert_")} == {"assert_known_bad_fails"}
    assert source.count("pytest.fail(") == 2
    assert "\nKNOWN_BAD = None\n" in source and "assert_known_bad_fails(paired, KNOWN_BAD, test_drift)" in source
    assert "#: test_drift fails on it): a function with mlx.core.fast.rms_norm's signature and the bug" in source
    assert "#     assert_kl_below(paired, mean=..., p99=..., top1=...)" in source
    assert "#     assert_faster(paired, decode=...)" in source


def test_values_are_written_as_literals_whatever_they_hold(tmp_path: Path, new_gate: Run) -> None:
    ref, cand = 'a "b" \\ c\'d """', "it's\nx"
    code, _, err = new_gate(tmp_path, "quoting", "--env", "MLX_Q", "--ref", ref, "--cand", cand, "--dir", "a/b c")
    assert (code, err) == (0, "")
    gate = tmp_path / "a" / "b c" / "test_quoting.py"  # the folders are made
    source = gate.read_text()
    assert lever_marker(source) == (["quoting"], {"env": "MLX_Q", "ref": ref, "cand": cand, "path": "prefill"})
    doc = ast.get_docstring(ast.parse(source))
    assert doc is not None and f"- reference arm: `MLX_Q={ref!r}`;" in doc
    assert "`pytest 'a/b c/test_quoting.py' --mlx-lever quoting" in doc  # shell-quoted
    namespace: dict[str, object] = {}
    exec(compile(source, str(gate), "exec"), namespace)
    assert namespace["CALIBRATE"] == "pytest 'a/b c/test_quoting.py' --mlx-calibrate"
    assert ruff(tmp_path, gate).returncode == 0


def test_every_plain_op_is_the_default_reference_of_its_fused_op(tmp_path: Path, new_gate: Run) -> None:
    """Looked up by name in pytest_mlxgate.reference_ops: a plain op added there is a default at once."""
    import mlx.core as mx

    from pytest_mlxgate import reference_ops

    ops = [name for name in reference_ops.__all__ if hasattr(mx.fast, name)]
    assert {"rms_norm", "scaled_dot_product_attention"} <= set(ops)
    for op in ops:
        code, _, err = new_gate(tmp_path, f"plain_{op}", "--patch", f"mlx.core.fast:{op}")
        assert (code, err) == (0, "")
        _, kwargs = lever_marker((tmp_path / "gates" / f"test_plain_{op}.py").read_text())
        assert (kwargs["ref"], kwargs["cand"]) == (f"pytest_mlxgate.reference_ops:{op}", None)


USAGE_ERRORS = {
    "NAME not an identifier": (
        ["fused-norm", "--patch", "mlx.core.fast.rms_norm"],
        ["NAME 'fused-norm' is not a Python identifier", "use e.g. 'fused_norm'"],
    ),
    "NAME starting with a digit": (["8bit", "--env", "X", "--ref", "0", "--cand", "1"], ["use e.g. 'lever_8bit'"]),
    "neither --patch nor --env": (["x"], ["exactly one of --patch", "--env VAR", "got neither"]),
    "both --patch and --env": (["x", "--patch", "mlx.core.fast.rms_norm", "--env", "X"], ["exactly one", "got both"]),
    "--env without --cand": (["x", "--env", "MLX_FLAG", "--ref", "0"], ["--env MLX_FLAG needs --cand", "--cand 1"]),
    "--env without either value": (["x", "--env", "MLX_FLAG"], ["needs --ref and --cand"]),
    "--env with its value": (
        ["x", "--env", "MLX_FLAG=1", "--ref", "0", "--cand", "1"],
        ["not an environment variable name", "--env MLX_FLAG"],
    ),
    "--env arms alike": (["x", "--env", "MLX_FLAG", "--ref", "1", "--cand", "1"], ["measure nothing"]),
    "patch target missing": (
        ["x", "--patch", "mlx.core.fast.rms_nrom"],
        ["--patch 'mlx.core.fast.rms_nrom'", "has no attribute 'rms_nrom'", "check the name"],
    ),
    "patch module missing": (["x", "--patch", "newgate_nowhere.f"], ["'newgate_nowhere' cannot be imported"]),
    "no default reference": (
        ["x", "--patch", "newgate_kernels.fast_sdpa"],
        [
            "--patch newgate_kernels.fast_sdpa: no default reference arm",
            "rms_norm",
            "scaled_dot_product_attention",
            "give --ref package.module:function",
        ],
    ),
    "--ref does not resolve": (
        ["x", "--patch", "mlx.core.fast.rms_norm", "--ref", "newgate_kernels:nope"],
        ["--ref 'newgate_kernels:nope'", "has no attribute 'nope'"],
    ),
    "--cand does not resolve": (
        ["x", "--patch", "mlx.core.fast.rms_norm", "--cand", "newgate_nowhere:f"],
        ["--cand 'newgate_nowhere:f'", "importing module 'newgate_nowhere' failed"],
    ),
    "--cand not callable": (
        ["x", "--patch", "mlx.core.fast.rms_norm", "--cand", "newgate_kernels:NOT_A_FUNCTION"],
        ["is callable but", "is int", "same signature"],
    ),
    "patch arms alike": (
        ["x", "--patch", "mlx.core.fast.rms_norm", "--ref", "original"],
        ["both run the original", "measure nothing"],
    ),
    "env arms both unset": (  # "unset" in any case is the one value that unsets the variable
        ["x", "--env", "MLX_PERF_KERNEL", "--ref", "UNSET", "--cand", "unset"],
        ["--ref and --cand both set MLX_PERF_KERNEL to 'UNSET'", "measure nothing"],
    ),
}


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_errors_exit_2_saying_what_why_and_the_fix(case: str, kernels: Path, new_gate: Run) -> None:
    args, words = USAGE_ERRORS[case]
    code, out, err = new_gate(kernels, *args)
    assert (code, out) == (2, "")
    assert err.startswith("mlxgate: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert not (kernels / "gates").exists()  # nothing written, no folder made


def test_an_existing_file_is_left_byte_identical(tmp_path: Path, new_gate: Run) -> None:
    gate = tmp_path / "gates" / "test_fused_norm.py"
    gate.parent.mkdir()
    before = b"# mine, hand-written\x00\xff\n"
    gate.write_bytes(before)
    code, out, err = new_gate(tmp_path, "fused_norm", "--patch", "mlx.core.fast.rms_norm")
    assert (code, out) == (2, "")
    assert "gates/test_fused_norm.py already exists" in err and "never overwrites" in err
    assert "choose another NAME" in err and "delete gates/test_fused_norm.py" in err
    assert gate.read_bytes() == before and sorted(p.name for p in gate.parent.iterdir()) == ["test_fused_norm.py"]


def test_the_console_entry_exits_2_without_a_traceback(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest_mlxgate.cli", "new-gate", "fused-norm", "--env", "X"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith("mlxgate: error: NAME 'fused-norm'") and "Traceback" not in out.stderr


@pytest.mark.slow  # two pytester sessions on the tiny model
def test_the_new_gate_fails_for_real_until_it_has_limits_and_a_known_bad_variant(
    pytester: pytest.Pytester, tiny_model_dir: Path, new_gate: Run
) -> None:
    code, _, _ = new_gate(pytester.path, "fused_norm", "--patch", "mlx.core.fast.rms_norm")
    assert code == 0
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", "-p", "no:randomly", "--mlx-db=off", "gates"
    )
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [  # each failure is its message alone
            "*_ test_drift _*",
            "test_drift has no limits yet, and a gate never passes without them: run "
            "`pytest gates/test_fused_norm.py --mlx-calibrate` and put the assert_kl_below(paired, mean=..., p99=..., "
            "top1=...) call it prints in place of this pytest.fail",
            "*_ test_speed _*",
            "test_speed has no limits yet, * the assert_faster(paired, decode=...) call it prints *",
            "*_ test_known_bad _*",
            "no known-bad variant shown to fail yet: set KNOWN_BAD in gates/test_fused_norm.py to a variant with a bug "
            "test_drift's limits must catch, a function with mlx.core.fast.rms_norm's signature and the bug (e.g. "
            "mymod:broken); the test then runs test_drift on it and passes only when test_drift fails. Limits never "
            "shown to fail a broken variant may pass one.",
            "*short test summary info*",
            "FAILED gates/test_fused_norm.py::test_drift - Failed: test_drift has no limit*",
            "FAILED gates/test_fused_norm.py::test_speed - Failed: test_speed has no limit*",
            "FAILED gates/test_fused_norm.py::test_known_bad - Failed: no known-bad*",
        ]
    )
    assert "Traceback" not in out and "pytest.fail(" not in out  # the message alone, not the code
    # the command it names measures the gate (its tests skip: no verdict) and prints the call to paste
    calibrate = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "-p",
        "no:randomly",
        "--mlx-db=off",
        "gates/test_fused_norm.py",
        "--mlx-calibrate",
        "--mlx-kl-prompts=3",
        "--mlx-kl-tokens=24",
        "--mlx-speed-contexts=16",
        "--mlx-speed-reps=3",
        "--mlx-speed-decode=2",
    )
    calibrate.assert_outcomes(skipped=3)
    calibrate.stdout.fnmatch_lines(
        ["*suggested limits*", "*assert_kl_below(paired, mean=*", "*known-bad step*", '*KNOWN_BAD = "mymod:broken"*']
    )


def test_an_env_gate_names_unset_in_any_case_and_a_patch_gate_plants_against_the_original(
    tmp_path: Path, new_gate: Run
) -> None:
    code, _, _ = new_gate(tmp_path, "kern", "--env", "MLX_PERF_KERNEL", "--ref", "Unset", "--cand", "1")
    assert code == 0
    doc = ast.get_docstring(ast.parse((tmp_path / "gates" / "test_kern.py").read_text())) or ""
    assert doc.splitlines()[0] == "Gate: `kern` (env `MLX_PERF_KERNEL`): '1' vs unset."
    code, _, _ = new_gate(tmp_path, "own", "--patch", "mlx.core.fast.rms_norm", "--ref", "original", "--cand",
                          "pytest_mlxgate.reference_ops:rms_norm")  # fmt: skip
    assert code == 0
    doc = ast.get_docstring(ast.parse((tmp_path / "gates" / "test_own.py").read_text())) or ""
    assert "--mlx-ref-value original --mlx-cand-value mymod:broken" in " ".join(doc.split())
