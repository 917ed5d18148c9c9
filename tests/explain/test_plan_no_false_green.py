"""`mlxgate plan`, no false green: a plan is verified only by its gate's records of it (a failed or silent
verification never exits 0 or reads "VERIFIED", whichever command searched it), a plan written without
verification says so inside and wherever a lever reads it, and what the commands cannot use (a gate that
does not import, an option that would be ignored or read as its default) is refused before anything runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

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


def _verifying_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A verification run from `folder` (pytest's rootdir, untrained models allowed): its 8-bit plan file."""
    plan = folder / "plan.json"
    plan.write_text(json.dumps({"default": {"bits": 8, "group_size": 64}}))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MLXGATE_ALLOW_UNTRAINED", "1")
    return plan


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


# --- D1: a failed verification is no success, for every plan command ----------------------------------------


def _results(verification: dict[str, Any] | None) -> dict[str, Any]:
    """Each plan command's result (plan kv, plan kv --frontier, plan weights, plan weights --frontier), its plan
    passing on the selection, with `verification`."""
    from pytest_mlxgate.explain.plan_frontier import KV_WORDS, Frontier, FrontierPoint
    from pytest_mlxgate.explain.plan_kv import Option, PlanSearch
    from pytest_mlxgate.explain.plan_weights import WeightsPlanSearch
    from pytest_mlxgate.explain.plan_weights_compare import WEIGHT_WORDS
    from pytest_mlxgate.levers.weights import WeightsSpec

    eight = Option(8, 64)
    kv = PlanSearch({0: eight}, 100.0, 200.0, [], [], {0: 1e-3}, True, "mixed", 3.0, 2, verification)
    weights = WeightsPlanSearch(
        {"m": eight}, WeightsSpec(8, 64), 100.0, 200.0, [], [], "8-bit", True, "mixed", 2, 3.0,
        verification=verification,
    )  # fmt: skip

    def frontier(words: Any, layer: Any) -> Frontier:
        point = FrontierPoint("uniform 8-bit g64", {layer: eight}, 100.0, None, 1e-3, (5e-4, 2e-3), None, None, "pass")
        return Frontier([point], point, 200.0, {"mean": 1e-2}, verification=verification, words=words, selection=2)

    return {
        "kv": kv,
        "kv --frontier": frontier(KV_WORDS, 0),
        "weights": weights,
        "weights --frontier": frontier(WEIGHT_WORDS, "m"),
    }


def _words(command: str, result: Any) -> list[str]:
    from pytest_mlxgate.explain.plan_frontier import frontier_table
    from pytest_mlxgate.explain.plan_kv import plan_summary
    from pytest_mlxgate.explain.plan_weights_compare import weights_summary

    if command.endswith("--frontier"):
        return frontier_table(result)
    return plan_summary(result) if command == "kv" else weights_summary(result)


FAILED = {"verified": False, "verdicts": {"g.py::test_drift": "fail"}, "tokens": 8, "checks": [], "reason": None}
SILENT = {
    "verified": False,
    "verdicts": {},
    "tokens": 8,
    "checks": [],
    "reason": "the gate's test_drift left no record",
}


@pytest.mark.parametrize("command", ["kv", "kv --frontier", "weights", "weights --frontier"])
@pytest.mark.parametrize("verification", [FAILED, SILENT], ids=["failed", "silent"])
def test_a_failed_verification_never_exits_0_writes_out_or_reads_verified_whatever_the_selection_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, verification: dict[str, Any]
) -> None:
    from pytest_mlxgate.plan_cli import _settle

    assert _results(None)[command].succeeded  # the selection passed it: --no-verify's answer
    result = _results(verification)[command]
    assert not result.succeeded
    words = _words(command, result)
    assert any("NOT verified" in line for line in words) and not any("VERIFIED" in line for line in words), words
    out = tmp_path / "plan.json"
    unverified = tmp_path / "plan.unverified.json"
    unverified.write_text("{}")
    args = argparse.Namespace(out=out, kind=command.split()[0])
    assert _settle(args, result, unverified, found=True) == 1
    assert not out.exists() and unverified.is_file()
    captured = capsys.readouterr()
    assert captured.out == "" and "not verified: the plan stays at" in captured.err


@pytest.mark.parametrize("kind", ["kv", "weights"])
@pytest.mark.parametrize("frontier", [False, True], ids=["search", "frontier"])
def test_every_plan_command_exits_1_and_writes_no_out_when_its_gate_fails_the_plan(
    tiny_kv_model_dir: Path, tmp_path: Path, kind: str, frontier: bool
) -> None:
    """The whole command, on the tiny llama: the selection passes the plan, its gate does not."""
    sizes = "prompts=2, tokens=16" + (", decode=4" if kind == "kv" else "")
    gate = _gate(tmp_path, kind, FAILS_ON_ITS_OWN_PROMPTS, sizes=sizes)
    out = tmp_path / f"{kind}_config.json"
    extra = ["--long-tokens", "0", *(["--frontier", "--points", "1"] if frontier else [])]
    done = _plan(kind, gate, tiny_kv_model_dir, out, *extra, *(["--no-compare"] if kind == "weights" else []))
    record = json.loads(out.with_suffix(".search.json").read_text())
    assert record["verification"] is not None and record["verification"]["verified"] is False, done.stderr
    assert done.returncode == 1 and done.stdout == "" and not out.exists(), done.stderr
    assert "NOT verified" in done.stderr and "VERIFIED" not in done.stderr.replace("NOT verified", "")
    assert f"not verified: the plan stays at {out.with_name(f'{kind}_config.unverified.json')}" in done.stderr


# --- D2: a verification whose asked tests left no record is no verification -----------------------------------


@pytest.mark.parametrize(
    ("body", "code", "why"),
    [
        (  # the limit sits in a helper: -k selects no test
            "def check(paired):\n    assert_kl_below(paired, mean=10.0)\n\n\n"
            "def test_drift(paired):\n    check(paired)\n",
            5,
            "the gate's check left no record: pytest selected none of them (exit 5: -k check); a limit's "
            "assert_kl_below belongs in the test function itself",
        ),
        (  # skipped before it judged anything: pytest exits 0
            "def test_drift(paired):\n    pytest.skip('not today')\n    assert_kl_below(paired, mean=10.0)\n",
            0,
            "the gate's test_drift left no record: skipped, deselected, or ended before its assertion (exit 0)",
        ),
        (  # returns before its assertion: a pass to pytest, no record of the plan
            "def test_drift(paired):\n    if paired is not None:\n        return\n"
            "    assert_kl_below(paired, mean=10.0)\n",
            0,
            "the gate's test_drift left no record: skipped, deselected, or ended before its assertion (exit 0)",
        ),
    ],
    ids=["selects-nothing", "skipped", "returns-early"],
)
def test_a_verification_whose_tests_left_no_record_is_not_verified_and_says_why(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, code: int, why: str
) -> None:
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verification_lines, verify_plan

    gate = _gate(tmp_path, "kv", body)
    plan = _verifying_in(tmp_path, monkeypatch)
    got = verify_plan(read_gate(gate), plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json", long=32)
    assert got["exit"] == code and got["verdicts"] == {}, got["output_tail"]
    assert got["verified"] is False and "long" not in got  # nothing judged: no long run either
    assert got["reason"].startswith(why), got["reason"]
    lines = verification_lines(got)
    assert lines[0].startswith("  NOT verified") and lines[-1] == f"    why: {got['reason']}"


def test_a_run_that_exits_non_zero_with_every_record_a_pass_is_not_verified(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's KL test passes, then something outside it fails the run (here the session's end): the pass
    is no verification of the plan, and the reason says where to look; the output's tail comes back whole
    (the last `OUTPUT_TAIL` characters, no more)."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import OUTPUT_TAIL, verify_plan

    gate = _gate(tmp_path, "kv", PASSES)
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.hookimpl(trylast=True)\ndef pytest_sessionfinish(session):\n"
        f"    print('x' * {2 * OUTPUT_TAIL})\n    session.exitstatus = 3\n"
    )
    plan = _verifying_in(tmp_path, monkeypatch)
    got = verify_plan(read_gate(gate), plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json", long=0)
    assert got["verdicts"] == {f"{gate.name}::test_drift": "pass"} and got["exit"] == 3, got["output_tail"]
    assert got["verified"] is False and got["reason"] == (
        "every record passes, but the gate's run exited 3: an error outside its KL checks (its output)"
    )
    assert len(got["output_tail"]) == OUTPUT_TAIL and "x" * 100 in got["output_tail"]


def test_a_parametrized_kl_test_verifies_and_a_capability_test_that_never_judged_does_not(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's KL test runs once per parameter (`test_drift[short]`): its record is the asked test's. Its
    capability test is run too once the KL tests pass; one skipped before its assertion left no record, so
    the plan is not verified, and the capability run says why."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verify_plan

    gate = _gate(
        tmp_path,
        "kv",
        "from pytest_mlxgate import assert_capability_at_least\n\n\n"
        "@pytest.mark.parametrize('n', ['short'])\ndef test_drift(paired, n):\n"
        "    assert_kl_below(paired, mean=10.0)\n\n\n"
        "def test_tail(paired):\n    assert_kl_below(paired, p99=50.0)\n\n\n"
        "def test_tasks(paired):\n    pytest.skip('no tasks today')\n"
        "    assert_capability_at_least(paired, 'hashhop', max_drop=0.15, n=16)\n",
    )
    plan = _verifying_in(tmp_path, monkeypatch)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # the verification sets it itself
    spec = read_gate(gate)
    assert spec.kl_tests == ("test_drift", "test_tail") and spec.capability_tests == ("test_tasks",)
    got = verify_plan(spec, plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json")
    assert got["verdicts"] == {f"{gate.name}::test_drift[short]": "pass", f"{gate.name}::test_tail": "pass"}, got[
        "output_tail"
    ]
    assert "-k test_drift or test_tail" in got["command"]
    assert got["command"].startswith(f"pytest {gate} -q -p no:randomly --mlx-lever=")  # what a reader re-runs
    assert "--mlx-reference-cache" not in got["command"]  # none given: pytest's own, where the gate runs
    tasks = got["capability"]
    assert got["verified"] is False and tasks["verified"] is False and "-k test_tasks" in tasks["command"]
    assert tasks["reason"].startswith("the gate's test_tasks left no record: skipped"), tasks["reason"]
    assert f"--mlx-report={tmp_path / 'r.capability.json'}" in tasks["command"]  # a report of its own
    assert not list(tmp_path.rglob("__pycache__"))  # the verification leaves no bytecode beside the user's gate


def test_a_verification_reads_in_words_with_its_capability_and_long_runs() -> None:
    """Verified with its capability tests passed, or not run; not verified at the long context whose run
    carries no checks (it says so, never a traceback)."""
    from pytest_mlxgate.explain.plan_verify import verification_lines

    kl = {"g.py::test_drift": "pass"}
    verified = {"verified": True, "tokens": 8, "verdicts": kl, "long": {"tokens": 32, "verdicts": kl}}
    tasks = {"verified": True, "verdicts": {"g.py::test_tasks": "pass"}}
    [line] = verification_lines({**verified, "capability": tasks})
    assert line == (
        "  VERIFIED: passes the gate on its own (held-out) prompts at 8 tokens: {'g.py::test_drift': 'pass'}; "
        "and at 32 tokens: {'g.py::test_drift': 'pass'}; and its capability tests: {'g.py::test_tasks': 'pass'}"
    )
    [line] = verification_lines({**verified, "capability": "not run"})
    assert line.endswith("; its capability tests were not run (--no-capability): KL only")
    short = {"verified": False, "tokens": 8, "verdicts": kl}  # no checks recorded: said, never a traceback
    lines = verification_lines({**short, "long": {"tokens": 32, "verdicts": {"g.py::test_drift": "fail"}}})
    assert lines[:3] == [
        "  NOT verified: passes the gate at 8 tokens but not at 32 tokens: a plan for short contexts only, not "
        "returned",
        "    at 8 tokens: no checks",
        "    at 32 tokens: no checks",
    ]


def test_a_plan_that_fails_the_kl_tests_never_reaches_the_capability_tests(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capability tests run only after the KL tests pass, at the gate's length and the long one: a plan
    that fails either is not verified by anything after them (no capability run at all)."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verify_plan

    gate = _gate(
        tmp_path,
        "kv",
        "from pytest_mlxgate import assert_capability_at_least\n\n\n"
        "def test_drift(paired, request):\n    assert_kl_below(paired, mean=10.0)\n"
        "    if request.config.getoption('mlx_kl_tokens'):  # the long run: the plan fails there\n"
        "        raise AssertionError('fails at the long context')\n\n\n"
        "def test_tasks(paired):\n    assert_capability_at_least(paired, 'hashhop', max_drop=0.15, n=16)\n",
    )
    plan = _verifying_in(tmp_path, monkeypatch)
    spec = read_gate(gate)
    assert spec.capability_tests == ("test_tasks",)
    got = verify_plan(spec, plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json", long=32)
    assert got["verdicts"] == {f"{gate.name}::test_drift": "pass"} and got["long"]["verified"] is False
    assert got["verified"] is False and "capability" not in got


def test_the_reason_names_every_asked_test_in_pytest_s_own_k_syntax() -> None:
    """`-k a or b` is what pytest ran (its keywords are lower case); a failing record is its own reason."""
    from pytest_mlxgate.explain.plan_verify import _unverdicted

    why = _unverdicted(["check", "check_long"], 5, ["check", "check_long"], {})
    assert why is not None and "(exit 5: -k check or check_long)" in why and "check, check_long left no record" in why
    assert _unverdicted([], 1, ["test_drift"], {"g.py::test_drift": "fail"}) is None
    assert _unverdicted([], 0, ["test_drift"], {"g.py::test_drift": "pass"}) is None


def test_a_round_and_a_check_read_in_words_with_what_they_measured_and_what_they_lack() -> None:
    """The summary lines a plan prints: a round with its long-context figure and verdict, a check whose value
    was not measured shown as '-', never a crash or a figure it does not have."""
    from pytest_mlxgate.explain.plan_verify import check_figures, round_lines

    rounds = [
        {"predicted": 1e-3, "target": 2e-3, "mean": 1.5e-3, "mean_ci": [1e-3, 2e-3], "verdict": "pass"},
        {
            "predicted": 5e-4,
            "target": 2e-3,
            "mean": 3e-3,
            "mean_ci": [2e-3, 4e-3],
            "checks": {"mean": "fail", "top1": "pass"},
            "long": {"mean": 0.0123, "verdict": "fail"},
            "verdict": "fail",
        },
    ]
    first, second = round_lines(rounds, 3)
    assert first.endswith("measured mean KL 0.0015 [0.001, 0.002] -> pass on 3 selection sequences")
    assert "(mean fail), at the long context 0.0123 (fail) -> fail" in second and "top1" not in second
    checks = [
        {"key": "mean", "value": None, "upper": 2e-3, "direction": "max", "limit": 1e-3, "verdict": "inconclusive"},
        {"key": "top1", "value": 0.91, "lower": 0.9, "direction": "min", "limit": 0.95, "verdict": "fail"},
    ]
    assert check_figures(checks) == "mean - [bound 0.002 vs 0.001] inconclusive; top1 0.91 [bound 0.9 vs 0.95] fail"
    assert check_figures([]) == "no checks"


def test_a_plan_that_fails_only_its_capability_tests_says_so_with_their_figures() -> None:
    from pytest_mlxgate.explain.plan_verify import verification_lines

    check = {"key": "gsm8k", "value": 0.4, "lower": 0.3, "direction": "min", "limit": 0.5, "verdict": "fail"}
    tasks = {"verified": False, "verdicts": {"g.py::test_gsm8k": "fail"}, "checks": [check]}
    lines = verification_lines({"tokens": 128, "long": {"tokens": 1024}, "capability": tasks, "verified": False})
    assert lines[0].startswith("  NOT verified: passes the gate's KL tests at 128 tokens and at 1024 tokens but not")
    assert lines[1] == "    gsm8k 0.4 [bound 0.3 vs 0.5] fail"
    short = verification_lines({"tokens": 128, "long": None, "capability": tasks, "verified": False})
    assert "at 128 tokens but not its capability tests" in short[0]


_MEAN = {"key": "mean", "value": 1.05e-3, "upper": 1.57e-3, "lower": 8e-4, "direction": "max", "limit": 2e-3}
_TOP1 = {"key": "top1", "value": 0.91, "lower": 0.9, "upper": 0.93, "direction": "min", "limit": 0.95}
_PASS, _FAIL = {"g.py::test_drift": "pass"}, {"g.py::test_drift": "fail"}
_TASKS = {"g.py::test_tasks": "pass"}
_TOP1_FAILS = {**_TOP1, "verdict": "fail"}


@pytest.mark.parametrize(
    ("verification", "lines"),
    [
        (
            {"verified": False, "tokens": 16, "verdicts": _PASS, "long": {"tokens": 64, "verdicts": _PASS},
             "capability": {"verified": False, "verdicts": {}, "checks": [_TOP1_FAILS], "reason": "r"}},
            ["  NOT verified: passes the gate's KL tests at 16 tokens and at 64 tokens but not its capability tests: "
             "no verdict", "    top1 0.91 [bound 0.9 vs 0.95] fail", "    why: r"],
        ),
        (
            {"verified": False, "tokens": 16, "verdicts": _PASS, "long": None,
             "capability": {"verified": False, "verdicts": {"g.py::test_tasks": "fail"}}},
            ["  NOT verified: passes the gate's KL tests at 16 tokens but not its capability tests: "
             "{'g.py::test_tasks': 'fail'}", "    no checks"],
        ),
        (
            {"verified": True, "tokens": 16, "verdicts": _PASS, "long": None},
            ["  VERIFIED: passes the gate on its own (held-out) prompts at 16 tokens: {'g.py::test_drift': 'pass'} "
             "(not checked at a long context: --long-tokens 0)"],
        ),
        (
            {"verified": True, "tokens": 16, "verdicts": _PASS, "long": {"tokens": 64, "verdicts": _PASS},
             "capability": {"verified": True, "verdicts": _TASKS}},
            ["  VERIFIED: passes the gate on its own (held-out) prompts at 16 tokens: {'g.py::test_drift': 'pass'}; "
             "and at 64 tokens: {'g.py::test_drift': 'pass'}; and its capability tests: {'g.py::test_tasks': 'pass'}"],
        ),
        (
            {"verified": False, "tokens": 16, "verdicts": _FAIL, "reason": "r",
             "checks": [{**_MEAN, "verdict": "pass"}, {**_TOP1, "verdict": "fail"}]},
            ["  NOT verified: does not pass the gate on its own (held-out) prompts at 16 tokens: "
             "{'g.py::test_drift': 'fail'}",
             "    mean 0.00105 [bound 0.00157 vs 0.002] pass; top1 0.91 [bound 0.9 vs 0.95] fail", "    why: r"],
        ),
        (
            {"verified": False, "verdicts": _FAIL},
            ["  NOT verified: does not pass the gate on its own (held-out) prompts: {'g.py::test_drift': 'fail'}",
             "    no checks"],
        ),
        (
            {"verified": False, "tokens": 16, "verdicts": _PASS, "checks": [{**_MEAN, "verdict": "pass"}],
             "long": {"tokens": 64, "verdicts": _FAIL, "checks": [{**_TOP1, "verdict": "fail"}], "reason": "r"}},
            ["  NOT verified: passes the gate at 16 tokens but not at 64 tokens: a plan for short contexts only, not "
             "returned", "    at 16 tokens: mean 0.00105 [bound 0.00157 vs 0.002] pass",
             "    at 64 tokens: top1 0.91 [bound 0.9 vs 0.95] fail", "    why: r"],
        ),
    ],
    ids=["tasks-fail-long", "tasks-fail", "verified-short", "verified-all", "short-fails", "no-tokens", "long-fails"],
)  # fmt: skip
def test_every_verification_reads_whole_in_words(verification: dict[str, Any], lines: list[str]) -> None:
    """Each way a verification ends, line by line: which runs passed, the figures of the one that did not
    (the bound a check compares: the upper for a maximum, the lower for a minimum) and why it is no verdict."""
    from pytest_mlxgate.explain.plan_verify import verification_lines

    assert verification_lines(verification) == lines


def test_a_search_s_closing_lines_say_what_was_verified_and_what_it_took() -> None:
    """Not asked to verify: said, with what to do (never where nothing was chosen); a check without a figure
    or a bound reads "-"; the time in whole seconds."""
    from pytest_mlxgate.explain.plan_verify import check_figures, verdict_lines

    assert verdict_lines(None, "mixed", 3.4) == [
        "  not verified (--no-verify): passed on the selection only; run the gate on it before use",
        "  took 3 s",
    ]
    assert verdict_lines(None, "none", 0.6) == ["  took 1 s"]
    unseen = {"key": "p99", "value": None, "direction": "max", "limit": 50, "verdict": "inconclusive"}
    assert check_figures([unseen]) == "p99 - [bound - vs 50] inconclusive"


@pytest.mark.parametrize(
    ("report", "run", "beside"),
    [
        ("out/r.json", "long", "out/r.long.json"),
        ("r.out", "capability", "r.capability.out"),
        ("r", "long", "r.long.json"),
    ],
)
def test_a_verification_s_second_run_reports_beside_the_first(report: str, run: str, beside: str) -> None:
    """Never over the first run's report: beside it, named for the run, a name without a suffix made JSON."""
    from pytest_mlxgate.explain.plan_verify import report_beside

    assert report_beside(Path(report), run) == Path(beside)
