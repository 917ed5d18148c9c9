"""`mlxgate plan`, no false green: a plan is verified only by its gate's records of it (a failed or silent
verification never exits 0 or reads "VERIFIED", whichever command searched it), a plan written without
verification says so inside and wherever a lever reads it, and what the commands cannot use (a gate that
does not import, an option that would be ignored or read as its default) is refused before anything runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
