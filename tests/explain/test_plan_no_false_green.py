"""`mlxgate plan`, no false green: a plan is verified only by its gate's records of it (a failed or silent
verification never exits 0 or reads "VERIFIED", whichever command searched it), a plan written without
verification says so inside and wherever a lever reads it, and what the commands cannot use (a gate that
does not import, an option that would be ignored or read as its default) is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
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


# --- B: a plan written without verification says so, and so does every lever that reads it -------------------


def _plan(kind: str, gate: Path, model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_mlxgate.cli", "plan", kind, "--gate", str(gate), "--model", str(model),
         "--out", str(out), "--bits", "8", "--group-sizes", "64", "--selection", "2", *extra],
        capture_output=True, text=True, cwd=out.parent, env=ENV,
    )  # fmt: skip


def _mark(out: Path, kind: str, gate: Path) -> None:
    plan = json.loads(out.read_text())
    assert plan["verified"] is False, plan
    assert plan["verification"] == (
        f"`mlxgate plan {kind} --no-verify` chose it on 2 selection sequences; its gate {gate.name} never ran on it; "
        f"run it before use: pytest {gate.name} --mlx-lever={kind if kind == 'weights' else 'kv_cache'} "
        f"--mlx-ref-value=plain --mlx-cand-value={out.name}"
    )


def test_plan_kv_no_verify_writes_a_plan_that_says_so_and_the_lever_says_it_in_the_gate_s_record(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.results.merge import read_report

    gate = _gate(tmp_path, "kv", PASSES)
    out = tmp_path / "kv_config.json"
    done = _plan("kv", gate, tiny_kv_model_dir, out, "--no-verify")
    assert done.returncode == 0 and "not verified (--no-verify)" in done.stderr, done.stderr
    _mark(out, "kv", gate)
    marked = replace(read_gate(gate).lever, cand=str(out))
    assert marked.describe_value("candidate").endswith(f"[NOT verified: {json.loads(out.read_text())['verification']}]")
    # the gate itself runs it (that is how a plan is verified), and its record names it unverified
    report = tmp_path / "r.json"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", *json.loads(out.read_text())["verification"].split("pytest ")[1].split(),
         "-q", "-p", "no:randomly", f"--mlx-candidate={tiny_kv_model_dir}", f"--mlx-report={report}",
         "--mlx-db=off", "--mlx-speed=off"],
        capture_output=True, text=True, cwd=tmp_path, env=ENV,
    )  # fmt: skip
    assert report.is_file(), ran.stdout + ran.stderr
    (record,) = read_report(report).gates  # the command the file gives runs its gate on it
    why = json.loads(out.read_text())["verification"]
    assert record.to_json()["lever"]["cand"].endswith(f"[NOT verified: {why}]"), ran.stdout


def test_plan_weights_no_verify_writes_a_plan_that_says_so_and_the_lever_says_it(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    from pytest_mlxgate.levers.weights import parse_weights_value

    gate = _gate(tmp_path, "weights", PASSES, sizes="prompts=2, tokens=16")
    out = tmp_path / "weights_config.json"
    done = _plan("weights", gate, tiny_kv_model_dir, out, "--no-verify", "--no-compare", "--long-tokens", "0")
    assert done.returncode == 0 and "not verified (--no-verify)" in done.stderr, done.stderr
    _mark(out, "weights", gate)
    spec = parse_weights_value(out)
    assert spec is not None and spec.unverified == json.loads(out.read_text())["verification"]
    assert spec.describe().endswith(f"[NOT verified: {spec.unverified}]")


def test_the_mark_is_read_never_a_claim_and_changes_no_weight_a_plan_quantizes(tmp_path: Path) -> None:
    from pytest_mlxgate.common.plan_mark import mark_unverified
    from pytest_mlxgate.levers.weights import WeightsSpec, parse_weights_value, quantization_block
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    block = quantization_block(WeightsSpec(8, 64, (("model.layers.0.mlp.down_proj", (4, 32)),)))
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    plain.write_text(json.dumps(block))
    marked.write_text(json.dumps(mark_unverified(block, "why")))
    a, b = parse_weights_value(plain), parse_weights_value(marked)
    assert a is not None and b is not None and a.unverified is None and b.unverified == "why"
    assert a.layers == b.layers and a.stable == b.stable  # the same weights: the same quantized copy
    assert "NOT verified" not in a.describe() and b.describe() == a.describe().replace("plain", "marked") + (
        " [NOT verified: why]"
    )
    kv = tmp_path / "kv.json"
    kv.write_text(json.dumps(mark_unverified({"default": 8}, "why")))
    assert parse_kv_value(kv).unverified == "why" and parse_kv_value(kv).describe().endswith("[NOT verified: why]")
    for claim in ({"verified": True}, {"verified": False}, {"verification": "gate passed"}):
        for path, content in ((plain, {**block, **claim}), (kv, {"default": 8, **claim})):
            path.write_text(json.dumps(content))
            with pytest.raises(LeverError, match="never a claim that it passed"):
                (parse_weights_value if path is plain else parse_kv_value)(path)
