"""`assert_known_bad_fails`: a gate's known-bad test passes only when its drift test gives a *fail* verdict
on the known-bad arm, for patch, KV and weights levers (the forms this project's gates plant); a known-bad
that passes the limits, a drift test with no limits, an inconclusive verdict, a plain `assert`, the
reference itself or a value the lever cannot take each fail, saying which; under --mlx-aa it skips. A
context lever's known-bad is a whole lever (`pytest.mark.mlx_lever(...)`) with its own reference arm,
named by what it switches; one on another path than the gate's, or comparing two models, is refused.

One pytester session on the tiny model runs a module per case (the model loads once); the broken kernel
is an RMSNorm that divides by the mean square instead of its root (top-1 0%, mean KL ~2.7 here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_mlxgate.authoring.known_bad import _bad_lever, known_bad_shown
from pytest_mlxgate.errors import MlxgateUsageError
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.verdicts.known_bad_step import known_bad_text

BROKEN_KERNELS = '''
import mlx.core as mx


def rms_norm_without_the_root(x, weight, eps, *, stream=None):
    """Divides by the mean square, not by its square root: the norm's scale is wrong everywhere."""
    ms = mx.mean(x.astype(mx.float32) ** 2, axis=-1, keepdims=True)
    return (x / (ms + eps) * weight).astype(x.dtype)
'''

NORM_LEVER = (
    'pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", '
    'ref="pytest_mlxgate.reference_ops:rms_norm", cand=None)'
)

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_known_bad_fails

pytestmark = [{lever}, pytest.mark.mlx_kl(prompts={prompts}, tokens=32, decode=8)]

KNOWN_BAD = {known_bad!r}


def test_drift(paired):
    {drift}


def test_known_bad(paired):
    assert_known_bad_fails(paired, KNOWN_BAD, test_drift)
"""

BAD = "kb_kernels:rms_norm_without_the_root"
CASES = {
    # module: (lever, prompts, known_bad, drift body)
    "caught": (NORM_LEVER, 4, BAD, "assert_kl_below(paired, mean=1e-3, p99=1e-2, top1=0.9)"),
    "loose": (NORM_LEVER, 4, BAD, "assert_kl_below(paired, mean=50, p99=50)"),
    "nolimits": (NORM_LEVER, 4, BAD, "pytest.fail('test_drift has no limits yet', pytrace=False)"),
    "inconclusive": (NORM_LEVER, 1, BAD, "assert_kl_below(paired, mean=1e-3)"),
    "plainassert": (NORM_LEVER, 4, BAD, "assert paired.kl().stats.mean < 1e-3"),
    "isref": (NORM_LEVER, 4, "pytest_mlxgate.reference_ops:rms_norm", "assert_kl_below(paired, mean=1e-3)"),
    "badvalue": (NORM_LEVER, 4, "not a name!", "assert_kl_below(paired, mean=1e-3)"),
    "undeclared": (NORM_LEVER, 4, None, "assert_kl_below(paired, mean=1e-3)"),
    # gates/test_kv_cache.py's and gates/test_weights.py's forms: fewer bits as the known-bad
    "kv": (
        'pytest.mark.mlx_lever("kv", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving")',
        4,
        2,
        "assert_kl_below(paired, mean=1e-4, p99=1e-3)",
    ),
    "weights": (
        'pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 8, "group_size": 64})',
        4,
        {"bits": 2, "group_size": 64},
        "assert_kl_below(paired, mean=1e-3, p99=1e-2)",
    ),
}


@pytest.mark.slow  # two pytester sessions on the tiny model, ten gate modules
def test_a_known_bad_test_passes_only_when_the_drift_test_fails_its_variant(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    (pytester.path / "kb_kernels.py").write_text(BROKEN_KERNELS)
    for name, (lever, prompts, known_bad, drift) in CASES.items():
        pytester.makepyfile(
            **{f"test_{name}": GATE.format(lever=lever, prompts=prompts, known_bad=known_bad, drift=drift)}
        )
    report = tmp_path / "r.json"
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-db=off", "-rA"]
    result = pytester.runpytest_subprocess(*common, f"--mlx-report={report}", "-k", "test_known_bad")
    outcomes = {
        line.split(" ")[1].split("::")[0][5:-3]: line.split(" ")[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "caught": "PASSED",
        "kv": "PASSED",
        "weights": "PASSED",
        **{
            name: "FAILED"
            for name in ("loose", "nolimits", "inconclusive", "plainassert", "isref", "badvalue", "undeclared")
        },
    }, result.stdout.str()
    out = result.stdout.str()
    assert "Traceback" not in out
    for words in [
        f"the known-bad variant '{BAD}' passes test_drift's limits (mean KL 95% bound * <= limit 50; p99 KL 95% "
        "bound * <= limit 50): limits that pass a broken variant would pass a broken kernel; tighten them*",
        f"test_drift has no limits yet, so the known-bad variant '{BAD}' cannot be shown to fail: size them "
        "(`pytest test_nolimits.py --mlx-calibrate`)*",
        f"test_drift could not tell the known-bad variant '{BAD}' apart from its limits (inconclusive)*",
        f"test_drift raised AssertionError on the known-bad variant '{BAD}' without a gate verdict*",
        "KNOWN_BAD 'pytest_mlxgate.reference_ops:rms_norm' is the gate's reference arm*",
        "*patch value 'not a name!' is not an object name*",
        "no known-bad variant shown to fail yet: set KNOWN_BAD in test_undeclared.py to a variant with a bug "
        "test_drift's limits must catch, a function with mlx.core.fast.rms_norm's signature and the bug*",
    ]:
        result.stdout.fnmatch_lines([words])
    # the known-bad arm's verdicts are not the test's record: no record says "fail" for a test that passed
    gates = json.loads(report.read_text())["gates"]
    passed = {f"test_{name}.py::test_known_bad" for name in ("caught", "kv", "weights")}
    assert not [g for g in gates if g["nodeid"] in passed and g.get("verdict") == "fail"], gates

    aa = pytester.runpytest_subprocess(*common, "--mlx-aa", "test_caught.py::test_known_bad")
    aa.assert_outcomes(skipped=1)
    aa.stdout.fnmatch_lines(["*--mlx-aa: the reference against itself has no candidate arm*"])


@pytest.mark.slow  # a pytester session (it stops before any arm runs)
def test_an_acceptance_without_a_reason_fails_the_calibration(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(
        test_g=f"""
import pytest

pytestmark = [{NORM_LEVER}, pytest.mark.mlx_calibrate(accept_broken="")]


def test_drift(paired):
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", "-p", "no:randomly", "--mlx-db=off", "--mlx-calibrate"
    )
    result.assert_outcomes(errors=1)  # the paired fixture refuses it, saying why
    result.stdout.fnmatch_lines(
        ["*marker mlx_calibrate on test_g.py::test_drift: accept_broken='': give the reason as text*"]
    )
    assert "Traceback" not in result.stdout.str()


# -- a whole lever as the known-bad: for a lever with no broken value (a context: compile on/off, fused ops)

#: The gate's lever as gates/test_fused_norms_rope.py's, on one op: no value of it is broken.
CONTEXT_LEVER = (
    'pytest.mark.mlx_lever("norms", context="pytest_mlxgate.reference_ops:fast_ops", ref="rms_norm", cand="fused")'
)
WHOLE_BAD = (
    'pytest.mark.mlx_lever("bad_norm", patch="mlx.core.fast.rms_norm", ref=None, '
    'cand="kb_kernels:rms_norm_without_the_root"{path})'
)
WHOLE_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_known_bad_fails

pytestmark = [{lever}, pytest.mark.mlx_kl(prompts=4, tokens=32, decode=8)]

KNOWN_BAD = {known_bad}


def test_drift(paired):
    {drift}


def test_known_bad(paired):
    assert_known_bad_fails(paired, KNOWN_BAD, test_drift)
"""
WHOLE_CASES = {
    # module: (known_bad, drift body)
    "wholecaught": (WHOLE_BAD.format(path=""), "assert_kl_below(paired, mean=1e-3, p99=1e-2, top1=0.9)"),
    "wholeloose": (WHOLE_BAD.format(path=""), "assert_kl_below(paired, mean=50, p99=50)"),
    "wholepath": (WHOLE_BAD.format(path=', path="serving"'), "assert_kl_below(paired, mean=1e-3)"),
}
SHOWN = (
    "mlx_lever 'bad_norm' (patch mlx.core.fast.rms_norm: original → kb_kernels:rms_norm_without_the_root, path=prefill)"
)


@pytest.mark.slow  # two pytester sessions on the tiny model, three gate modules
def test_a_whole_lever_known_bad_runs_as_its_own_arms_and_is_named_by_what_it_switches(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path
) -> None:
    """A context gate's known-bad is a whole patch lever: the gate's known-bad test passes when its limits
    fail it, fails naming it when they pass it, and refuses one on another path than the gate's;
    --mlx-calibrate keeps it in the file as the lever it is."""
    pytester.makeini("[pytest]\n")
    (pytester.path / "kb_kernels.py").write_text(BROKEN_KERNELS)
    for name, (known_bad, drift) in WHOLE_CASES.items():
        gate = WHOLE_GATE.format(lever=CONTEXT_LEVER, known_bad=known_bad, drift=drift)
        pytester.makepyfile(**{f"test_{name}": gate})
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-db=off"]
    result = pytester.runpytest_subprocess(*common, "-rA", "-k", "test_known_bad")
    outcomes = {
        line.split(" ")[1].split("::")[0][5:-3]: line.split(" ")[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {"wholecaught": "PASSED", "wholeloose": "FAILED", "wholepath": "FAILED"}, result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"*the known-bad variant {SHOWN} passes test_drift's limits (mean KL 95% bound * <= limit 50*",
            "*KNOWN_BAD mlx_lever 'bad_norm' (patch mlx.core.fast.rms_norm: original → "
            "kb_kernels:rms_norm_without_the_root, path=serving) runs on path='serving', the gate's lever 'norms' "
            "on path='prefill': *write path='prefill' in the KNOWN_BAD marker*",
        ]
    )

    calibrated = pytester.runpytest_subprocess(
        *common, "--mlx-allow-untrained", "--mlx-calibrate", "test_wholecaught.py::test_drift"
    )
    calibrated.assert_outcomes(skipped=1)
    calibrated.stdout.fnmatch_lines([f"*known-bad KNOWN_BAD = {SHOWN}: mean KL *: fails the gate's limits (caught)"])
    known_bad = json.loads((pytester.path / "calibration" / "test_wholecaught.json").read_text())["known_bad"]
    assert known_bad["value"] == {
        "name": "bad_norm",
        "kind": "patch",
        "target": "mlx.core.fast.rms_norm",
        "ref": "original",
        "cand": "kb_kernels:rms_norm_without_the_root",
        "path": "prefill",
    }
    assert known_bad["verdict_when_measured"]["verdict"] == "fail"


def _context_lever() -> Lever:
    """gates/test_fused_norms_rope.py's lever: a context, on the serving path."""
    return Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "serving")


def test_a_whole_patch_lever_with_the_original_as_reference_shares_the_as_loaded_reference() -> None:
    bad = _bad_lever(
        _context_lever(),
        pytest.mark.mlx_lever(
            "rope", patch="mlx.core.fast.rope", ref=None, cand="pytest_mlxgate.reference_ops:rope", path="serving"
        ),
        base_dir=None,
    )
    assert (bad.kind, bad.target, bad.ref) == ("patch", "mlx.core.fast.rope", None)
    plain_kv = Lever("kv", "kv", None, "plain", {"bits": 8}, "serving")
    assert bad.key("reference") == plain_kv.key("reference") != bad.key("candidate")


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (
            pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken", path="prefill"),
            "KNOWN_BAD mlx_lever 'rope' (patch mlx.core.fast.rope: original → m:broken, path=prefill) runs on "
            "path='prefill', the gate's lever 'fused' on path='serving': the limits are the gate's on its path, so "
            "its known-bad must run there; write path='serving' in the KNOWN_BAD marker",
        ),
        (pytest.mark.mlx_lever("model"), "KNOWN_BAD mlx_lever 'model' (model: "),
        (
            pytest.mark.mlx_lever("w", weights=True, ref=None, cand={"bits": 2, "group_size": 64}, path="serving"),
            "a weights lever compares two models, so its arms are not the gate's model with one bug",
        ),
        (pytest.mark.skip(reason="x"), "KNOWN_BAD is a pytest.mark.skip marker: a known-bad variant is a value"),
        (pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope"), "missing ref= and cand="),
    ],
    ids=["path", "model", "weights", "other-marker", "unparsable"],
)
def test_a_whole_lever_that_cannot_stand_in_for_the_gate_s_is_refused_saying_how_to_fix_it(
    bad: pytest.MarkDecorator, words: str
) -> None:
    with pytest.raises(MlxgateUsageError) as e:
        _bad_lever(_context_lever(), bad, base_dir=None)
    assert words in str(e.value)


def test_a_whole_lever_is_named_by_what_it_switches_and_a_value_by_its_repr() -> None:
    lever = Lever("rope", "patch", "mlx.core.fast.rope", None, "m:broken", "serving")
    mark = pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken", path="serving")
    assert (
        known_bad_shown(mark, lever)
        == known_bad_text(lever.to_json())
        == "mlx_lever 'rope' (patch mlx.core.fast.rope: original → m:broken, path=serving)"
    )
    assert known_bad_shown(mark) == "pytest.mark.mlx_lever('rope', ...)"  # before it is parsed
    assert known_bad_shown("m:broken") == known_bad_text("m:broken") == "'m:broken'"
    assert known_bad_text({"bits": 4, "group_size": 64}) == "{'bits': 4, 'group_size': 64}"


def test_a_two_model_lever_has_no_known_bad_value_and_says_how_to_check_it(tmp_path: Path) -> None:
    lever = Lever("model", "model", None, None, None)
    with pytest.raises(MlxgateUsageError, match=r"lever 'model' compares two models: .*--mlx-candidate BROKEN_MODEL"):
        _bad_lever(lever, "anything", base_dir=tmp_path)


def test_in_process_the_known_bad_test_passes_only_when_its_drift_test_catches_the_variant(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path
) -> None:
    """Five of the slow test's modules, in process (mutation testing sees assert_known_bad_fails run): caught,
    passed by loose limits, no limits yet, a plain assert with no gate verdict, and no KNOWN_BAD."""
    pytester.makeini("[pytest]\n")
    (pytester.path / "kb_kernels.py").write_text(BROKEN_KERNELS)
    pytester.syspathinsert()
    for name in ("caught", "loose", "nolimits", "plainassert", "undeclared"):
        lever, prompts, known_bad, drift = CASES[name]
        pytester.makepyfile(
            **{f"test_{name}": GATE.format(lever=lever, prompts=prompts, known_bad=known_bad, drift=drift)}
        )
    result = pytester.runpytest_inprocess(
        f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "-p", "no:xdist", "--mlx-db=off", "-rA",
        "-k", "test_known_bad",
    )  # fmt: skip
    outcomes = {
        line.split(" ")[1].split("::")[0][5:-3]: line.split(" ")[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "caught": "PASSED",
        **dict.fromkeys(("loose", "nolimits", "plainassert", "undeclared"), "FAILED"),
    }
    result.stdout.fnmatch_lines(
        [f"*the known-bad variant '{BAD}' passes test_drift's limits (mean KL 95% bound * <= limit 50; p99 KL*"]
    )
    # each bound it names is the upper end a "max" limit compared, a number
    assert re.search(
        r"\(mean KL 95% bound [0-9.e+-]+ <= limit 50; p99 KL 95% bound [0-9.e+-]+ <= limit 50\)", result.stdout.str()
    )
    result.stdout.fnmatch_lines([f"*test_drift has no limits yet, so the known-bad variant '{BAD}' cannot be shown*"])
    result.stdout.fnmatch_lines([f"*test_drift raised AssertionError on the known-bad variant '{BAD}' without a gate*"])
    result.stdout.fnmatch_lines(["*no known-bad variant shown to fail yet: set KNOWN_BAD in test_undeclared.py to a*"])


def test_a_known_bad_kv_plan_file_is_found_beside_its_gate_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KNOWN_BAD = "bad_plan.json" names a file in the gate's folder, as the module's own lever values do."""
    from types import SimpleNamespace

    from pytest_mlxgate.authoring.known_bad import known_bad_lever

    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "bad_plan.json").write_text(json.dumps({"default": {"bits": 2, "group_size": 32}}))
    monkeypatch.chdir(tmp_path)  # the run's working directory is not the gate's folder
    lever = Lever("kv", "kv", None, "plain", {"bits": 8, "group_size": 64}, "serving")
    paired = SimpleNamespace(item=SimpleNamespace(path=gates / "test_kv.py"), run=SimpleNamespace(lever=lever))
    bad = known_bad_lever(paired, "bad_plan.json")  # type: ignore[arg-type]
    assert (bad.kind, bad.name) == ("kv", "kv") and bad.value("candidate") == str(gates / "bad_plan.json")
    plan = bad.kv_plan("candidate")
    assert plan.default is not None and (plan.default.bits, plan.default.group_size) == (2, 32)
