"""`mlxgate plan`, no false green: a plan is verified only by its gate's records of it (a failed or silent
verification never exits 0 or reads "VERIFIED", whichever command searched it), a plan written without
verification says so inside and wherever a lever reads it, and what the commands cannot use (a gate that
does not import, an option that would be ignored or read as its default) is refused before anything runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_mlxgate.errors import LeverError

ENV = {**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"}

KV_LEVER = 'pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving")'
WEIGHTS_LEVER = 'pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 8, "group_size": 64})'


def _gate(tmp_path: Path, kind: str, body: str, *, sizes: str = "prompts=2, tokens=8, decode=4") -> Path:
    """A gate module of `kind` (kv, weights) whose tests are `body`."""
    lever = KV_LEVER if kind == "kv" else WEIGHTS_LEVER
    path = tmp_path / f"test_{kind}_gate.py"
    path.write_text(
        "import pytest\nfrom pytest_mlxgate import assert_kl_below\n\n"
        f"pytestmark = [{lever}, pytest.mark.mlx_kl({sizes})]\n\n{body}"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return path


PASSES = "def test_drift(paired):\n    assert_kl_below(paired, mean=10.0)\n"
#: Its KL assertion passes on the selection as on its own prompts, then it fails: the gate's verdict is "error".
FAILS_ON_ITS_OWN_PROMPTS = (
    "def test_drift(paired):\n    assert_kl_below(paired, mean=10.0)\n"
    "    raise AssertionError('the plan fails this gate on its own prompts')\n"
)


# --- A: a gate module that does not import ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kv", "weights"])
@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("def test_drift(paired)", "SyntaxError: expected ':': def test_drift(paired)"),
        ("import no_such_module_for_this_gate", "ModuleNotFoundError: No module named 'no_such_module_for_this_gate'"),
        ("LIMIT = 1 / 0", "ZeroDivisionError: division by zero"),
    ],
)
def test_a_gate_that_does_not_import_is_a_usage_error_naming_the_file_the_line_the_error_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, line: str, what: str
) -> None:
    """Before: a raw traceback from importlib."""
    from pytest_mlxgate.cli import main

    gate = _gate(tmp_path, kind, f"{line}\n\n{PASSES}")
    code = main(["plan", kind, "--gate", str(gate), "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"mlxgate: error: --gate {gate}: the gate module does not import ({what}, at {gate}, line 6)")
    assert f"fix it (`python -m pytest --collect-only {gate}` shows the same error)" in err


# --- C: options that would be ignored, or read as their default ---------------------------------------------


@pytest.mark.parametrize("kind", ["kv", "weights"])
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--points", "-1"], "--points -1: --points is how many plans --frontier measures, and no --frontier"),
        (["--points", "3"], "--points 3: --points is how many plans --frontier measures"),
        (["--frontier", "--points", "-1"], "--points -1: give at least 1 plan to measure along the frontier"),
        (["--bits", ""], "--bits '': empty (an empty value is not the default); give comma-separated whole numbers"),
        (["--group-sizes", " "], "--group-sizes ' ': empty (an empty value is not the default)"),
        (["--bits", "4,x"], "--bits 4,x: not comma-separated whole numbers; give comma-separated whole numbers, e.g."),
    ],
)
def test_an_option_that_would_be_ignored_or_read_as_its_default_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, extra: list[str], message: str
) -> None:
    from pytest_mlxgate.cli import main

    gate = _gate(tmp_path, kind, PASSES)
    code = main(["plan", kind, "--gate", str(gate), "--model", str(tmp_path / "no-model"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert "or leave" in err  # and how to get the default


def test_save_with_no_verify_is_refused_it_would_quantize_a_plan_no_gate_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_mlxgate.cli import main

    gate = _gate(tmp_path, "weights", PASSES)
    argv = ["plan", "weights", "--gate", str(gate), "--save", str(tmp_path / "m"), "--no-verify"]
    assert main(argv) == 2
    assert "--save writes the model of a plan its gate verified, and --no-verify skips" in capsys.readouterr().err


def test_a_kv_plan_file_giving_one_half_names_the_half_it_lacks_and_a_spec_that_works(tmp_path: Path) -> None:
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    path = tmp_path / "kv_config.json"
    path.write_text(json.dumps({"layers": {"0": {"k_bits": 8}}}))
    with pytest.raises(LeverError) as e:
        parse_kv_value(path)
    assert f"kv_config {path} key 'layers'.'0' lacks 'v_bits' (the values' width); a valid spec: " in str(e.value)
    assert "{'k_bits': 8, 'v_bits': 4, 'group_size': 64} (each its own)" in str(e.value)
