"""Limits shown on the model they judge (`authoring.proof`): where no calibration file of the judged model on
this backend covers a module, its KNOWN_BAD must fail its limits there, or the gate never reads pass.

The rules first, on made-up proofs (no model): which file covers, which limits sit inside the floor, and
what each proof does to a verdict. Then real pytester sessions on the tiny model: the issue's own case (a
gate whose limits pass its known-bad) is an error on every report, a gate whose limits fail it passes with
"limits proven", a second run reads the proof from the cache, and --mlx-prove off / --mlx-require-proof.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gate_folder import gate_folder
from hypothesis import given
from hypothesis import strategies as st
from report_records import junit_gate_properties

from pytest_mlxgate.authoring.proof import LimitsProof, Proof, covering_file, inside_floor, model_label
from pytest_mlxgate.cli import main
from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.verdicts.calibration import FLOOR_FACTOR
from pytest_mlxgate.verdicts.conclude import Conclusion

# -- which limits sit inside the floor --------------------------------------------------------------


@given(
    limit=st.floats(min_value=0, max_value=10, allow_nan=False),
    floor=st.floats(min_value=0, max_value=1, allow_nan=False),
)
def test_a_kl_limit_is_inside_the_floor_exactly_when_below_the_rule_s_multiple(limit: float, floor: float) -> None:
    inside = inside_floor({"mean": limit}, {"mean": floor})
    assert (inside == ["mean"]) == (limit < FLOOR_FACTOR * floor)
    # a looser limit is never more inside the floor; a floor that is not measured puts nothing inside
    assert not inside_floor({"mean": limit * 2 + 1e-9}, {"mean": floor}) or inside
    assert inside_floor({"mean": limit}, {}) == []


@given(
    limit=st.floats(min_value=0, max_value=1, allow_nan=False),
    floor=st.floats(min_value=0, max_value=1, allow_nan=False),
)
def test_an_agreement_limit_is_judged_on_its_disagreement(limit: float, floor: float) -> None:
    inside = inside_floor({"top1": limit}, {"top1": floor})
    assert (inside == ["top1"]) == (1 - limit < FLOOR_FACTOR * (1 - floor))


# -- which calibration file covers -----------------------------------------------------------------


def _calibration(
    folder: Path,
    *,
    device: str = "cpu",
    commit: str = "c0ffee",
    dtype: str | None = None,
    chip: dict[str, str] | None = None,
    name: str = "smollm2-135m",
) -> Path:
    path = folder / "calibration" / (f"test_gate.{dtype}.json" if dtype not in (None, "float32") else "test_gate.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    model = {"name": name, "commit": commit} | ({"dtype": dtype} if dtype else {})
    doc = {"calibration_format": 1, "model": model, "machine": {"device": device, **(chip or {})}}
    path.write_text(json.dumps(doc))
    return path


EMBEDDED = {
    "name": "smollm2-135m",
    "repo_id": "mlxgate/SmolLM2-135M-Instruct-f32",
    "commit": "c0ffee",
    "dtype": "float32",
}


def test_a_file_covers_only_its_model_commit_on_its_backend(tmp_path: Path) -> None:
    module = tmp_path / "test_gate.py"
    assert covering_file(module, EMBEDDED, "cpu") is None  # no file
    path = _calibration(tmp_path)
    assert covering_file(module, EMBEDDED, "cpu") == path
    assert covering_file(module, EMBEDDED, "metal") is None  # a CPU file proves nothing on Metal
    assert covering_file(module, {**EMBEDDED, "commit": "beef"}, "cpu") is None  # other weights
    assert covering_file(module, {**EMBEDDED, "commit": None}, "cpu") is None  # weights it cannot name
    gemma = {"name": "gemma3-270m", "repo_id": "mlxgate/gemma-3-270m-f32", "commit": "c0ffee"}
    assert covering_file(module, gemma, "cpu") is None  # the embedded model's file is not gemma's
    m3 = {"chip": "Apple M3 Max", "tf32": "on"}
    _calibration(tmp_path, device="gpu · Metal", chip=m3)
    assert covering_file(module, EMBEDDED, "metal", m3) is not None and covering_file(module, EMBEDDED, "cpu") is None
    path.write_text("{not json")
    assert covering_file(module, EMBEDDED, "metal", m3) is None  # unreadable: covers nothing


BF16 = {**EMBEDDED, "dtype": "bfloat16"}


def test_a_file_covers_only_the_precision_it_was_measured_in(tmp_path: Path) -> None:
    module = tmp_path / "test_gate.py"
    _calibration(tmp_path, dtype="float32")
    assert covering_file(module, EMBEDDED, "cpu") is not None
    assert covering_file(module, BF16, "cpu") is None  # float32 limits say nothing of bfloat16's rounding
    assert covering_file(module, {**EMBEDDED, "dtype": None}, "cpu") is None  # a run whose precision is unknown
    bf16 = _calibration(tmp_path, dtype="bfloat16")
    assert bf16.name == "test_gate.bfloat16.json"  # beside the float32 file, never in its place
    assert covering_file(module, BF16, "cpu") == bf16 and covering_file(module, EMBEDDED, "cpu") is not None
    doc = json.loads(bf16.read_text())
    bf16.write_text(json.dumps({**doc, "model": {**doc["model"], "dtype": "float32"}}))
    assert covering_file(module, BF16, "cpu") is None  # its name is not what it says it measured


def test_a_file_without_a_dtype_covers_a_float32_built_in_model_alone(tmp_path: Path) -> None:
    module = tmp_path / "test_gate.py"
    _calibration(tmp_path)  # written before precision was recorded: the built-in models ran in float32 only
    assert covering_file(module, EMBEDDED, "cpu") is not None
    assert covering_file(module, BF16, "cpu") is None
    hub = {"name": None, "repo_id": "org/m", "commit": "c0ffee", "dtype": "float32"}
    folder = tmp_path / "calibration" / "org--m"
    folder.mkdir(parents=True)
    (tmp_path / "calibration" / "test_gate.json").rename(folder / "test_gate.json")
    json_doc = json.loads((folder / "test_gate.json").read_text())
    json_doc["model"]["name"] = None
    (folder / "test_gate.json").write_text(json.dumps(json_doc))
    assert covering_file(module, hub, "cpu") is None  # a hub model's precision then was whatever it shipped in


@pytest.mark.parametrize(
    ("run", "covers"),
    [
        ({"chip": "Apple M3 Max", "tf32": "on"}, True),
        ({"chip": "Apple M5", "tf32": "on"}, False),  # masked SDPA rounds otherwise on another chip generation
        ({"chip": "Apple M3 Max", "tf32": "off"}, False),  # float32 matmuls at another precision
        ({}, False),
    ],
)
def test_on_a_gpu_a_file_covers_only_its_chip_and_tf32_setting(
    tmp_path: Path, run: dict[str, str], covers: bool
) -> None:
    module = tmp_path / "test_gate.py"
    _calibration(tmp_path, device="gpu · Metal", dtype="bfloat16", chip={"chip": "Apple M3 Max", "tf32": "on"})
    assert (covering_file(module, BF16, "metal", run) is not None) is covers
    # a CPU's rounding has no such switch: its file covers any CPU
    _calibration(tmp_path, device="cpu", dtype="bfloat16", chip={"chip": "AMD EPYC", "tf32": "on"})
    assert covering_file(module, BF16, "cpu", run) is not None


# -- what a proof does to a verdict -----------------------------------------------------------------


@dataclass
class _Paired:
    nodeid: str = "gates/test_gate.py::test_drift"
    rerun: str = "pytest gates/test_gate.py::test_drift"


def _stats(mean: tuple[float, float], top1: tuple[float, float] = (0.99, 1.0)) -> dict[str, Any]:
    value = sum(mean) / 2
    return {
        "n_prompts": 16,
        "mean": value,
        "mean_ci": list(mean),
        "top1": sum(top1) / 2,
        "top1_ci": list(top1),
        "p99": value * 10,
        "quantile_ci": {"p99": [mean[0] * 10, mean[1] * 10]},
    }


def _proof(
    *,
    bad: dict[str, Any] | None,
    floors: dict[str, float] | None = None,
    known_bad: object = "kernels:broken",
    file: Path | None = None,
    prove: bool = True,
    require: bool = False,
    unprovable: str | None = None,
) -> LimitsProof:
    made = LimitsProof(
        paired=_Paired(),  # type: ignore[arg-type]  # what vouch reads of it: nodeid and rerun
        model="e4b",
        backend="metal",
        file=file,
        shown_file="gates/calibration/mlx-community--gemma-4-e4b/test_gate.json",
        calibrate_command="pytest gates/test_gate.py --mlx-candidate e4b --mlx-calibrate",
        prove=prove,
        require=require,
        known_bad=known_bad,
        unprovable=unprovable,
    )
    made._proof = Proof(floors=floors or {"mean": 1e-8, "top1": 0.999}, known_bad=known_bad, known_bad_stats=bad)
    return made


def _gate(mean: tuple[float, float], bounds: dict[str, float] | None = None) -> Conclusion:
    bounds = bounds or {"mean": 1e-3}
    return Conclusion(mode="gate", checks=kl_checks(_stats(mean), bounds), bounds=bounds)


def test_a_known_bad_that_fails_the_limits_proves_them_and_the_verdict_stands() -> None:
    vouched = _proof(bad=_stats((0.05, 0.08))).vouch(_gate((1e-4, 2e-4)))
    assert vouched.verdict == "pass"
    entry = vouched.fields["limits_from"]
    assert entry["status"] == "proven" and entry["known_bad"]["verdict"] == "fail"
    assert "mean KL 95% lower bound 0.05 > limit 0.001" in entry["known_bad"]["figures"]
    words = parse_record({"nodeid": "a::b", "limits_from": entry}).limits_from
    assert words is not None and words.words == 'limits proven on e4b (metal): known-bad "kernels:broken" fails them'


def test_a_known_bad_that_passes_the_limits_makes_the_gate_an_error_naming_it() -> None:
    vouched = _proof(bad=_stats((2e-4, 5e-4))).vouch(_gate((1e-4, 2e-4)))
    assert vouched.verdict == "error"  # never a pass, though the lever's own check passed
    assert [c["verdict"] for c in vouched.checks] == ["pass"]
    assert vouched.fields["limits_from"]["status"] == "refuted"
    message = vouched.fields["error"]["message"]
    assert 'KNOWN_BAD = "kernels:broken" passes every limit here' in message
    assert "mean KL 95% upper bound 0.0005 ≤ limit 0.001" in message
    assert "pytest gates/test_gate.py --mlx-candidate e4b --mlx-calibrate" in message
    assert "models={'e4b': {...}}" in message


def test_a_known_bad_not_shown_to_fail_leaves_a_pass_inconclusive() -> None:
    vouched = _proof(bad=_stats((5e-4, 2e-3))).vouch(_gate((1e-4, 2e-4)))
    assert vouched.verdict == "inconclusive"
    assert vouched.fields["limits_from"]["status"] == "unproven"
    assert "not shown to fail" in vouched.fields["limits_from"]["why"]
    failing = _proof(bad=_stats((5e-4, 2e-3))).vouch(_gate((2e-3, 3e-3)))
    assert failing.verdict == "fail"  # a lever shown beyond its limit still fails


def test_a_limit_inside_the_model_s_floor_turns_a_fail_inconclusive_never_a_pass() -> None:
    proof = _proof(bad=_stats((0.05, 0.08)), floors={"mean": 5e-4})  # the limit 1e-3 < 10 x 5e-4
    failing = proof.vouch(_gate((2e-3, 3e-3)))
    assert failing.verdict == "inconclusive" and failing.checks[0]["verdict"] == "inconclusive"
    assert "noise floor" in failing.checks[0]["method"]
    assert failing.fields["limits_from"]["inside_floor"] == ["mean"]
    passing = proof.vouch(_gate((1e-4, 2e-4)))
    assert passing.verdict == "pass"  # the bound cleared even that limit: shown


def _covering(bad: tuple[float, float] | None = (0.05, 0.08), floor: float = 1e-6) -> dict[str, Any]:
    """A calibration file's figures as `--mlx-calibrate` writes them: the A/A floor and the known-bad's drift."""
    drift = {"metrics": {"mean": {"value": sum(bad) / 2, "lower": bad[0], "upper": bad[1]}}} if bad else None
    return {"aa_floor": {"mean": floor}, "known_bad": {"declared": True, "drift": drift}}


def test_where_a_file_covers_no_proof_runs_and_the_record_names_the_file(tmp_path: Path) -> None:
    proof = _proof(bad=None, file=tmp_path / "c.json")
    proof.calibration = _covering()
    proof._proof = None  # a proof measured here would need a model: none must be asked for
    vouched = proof.vouch(_gate((1e-4, 2e-4)))
    assert vouched.verdict == "pass" and vouched.fields["limits_from"]["status"] == "calibrated"
    assert "stale_file" not in vouched.fields["limits_from"]
    assert proof._proof is None


@pytest.mark.parametrize(
    ("calibration", "limit", "why"),
    [
        # the limits loosened past the known-bad figures the file recorded
        (_covering(bad=(0.05, 0.08)), 0.1, "not shown to fail these limits (pass: mean [0.05, 0.08] vs limit 0.1)"),
        (_covering(bad=(0.05, 0.08)), 0.06, "not shown to fail these limits (inconclusive"),
        (_covering(bad=None), 1e-3, "holds no measurement of the module's KNOWN_BAD"),
        (_covering(floor=2e-4), 1e-3, "mean within 10x its A/A floor"),
    ],
)
def test_a_file_whose_figures_do_not_show_today_s_limits_covers_nothing_and_the_proof_runs(
    tmp_path: Path, calibration: dict[str, Any], limit: float, why: str
) -> None:
    """Checked at every run from the file's own figures: limits that no longer fail its known-bad, or sit in
    its floor, are not calibrated by it; the proof runs (here: its known-bad passes them: refuted)."""
    proof = _proof(bad=_stats((2e-4, 5e-4)), file=tmp_path / "c.json")
    proof.calibration = calibration
    vouched = proof.vouch(_gate((1e-5, 2e-5), {"mean": limit}))
    entry = vouched.fields["limits_from"]
    assert entry["status"] != "calibrated" and why in entry["stale_file"], entry
    assert vouched.verdict != "pass"
    assert (
        "does not show them: " + entry["stale_file"]
        in parse_record({"nodeid": "a::b", "limits_from": entry}).limits_from.words
    )  # type: ignore[union-attr]
    off = _proof(bad=None, file=tmp_path / "c.json", prove=False, require=True)
    off.calibration = calibration
    required = off.vouch(_gate((1e-5, 2e-5), {"mean": limit}))
    assert required.verdict == "error" and required.fields["limits_from"]["status"] == "unproven"


def test_a_file_is_this_module_s_only_by_its_name_lever_and_gate_digest(tmp_path: Path) -> None:
    from pytest_mlxgate.authoring.calibration_file import GateSource
    from pytest_mlxgate.authoring.coverage import not_this_modules

    module = tmp_path / "test_mine.py"
    module.write_text(GATE.format(limits="mean=1e-3"))
    (tmp_path / "kernels.py").write_text(KERNELS)
    doc = {"module": "gates/test_mine.py", "lever": {"name": "norm"}, "gate": GateSource.read(module).digest}
    assert not_this_modules(doc, module, "norm") is None
    assert not_this_modules({**doc, "module": "gates/test_kv_cache.py"}, module, "norm") == (
        "it is the calibration of gates/test_kv_cache.py, not of test_mine.py"
    )
    assert not_this_modules(doc, module, "kv_cache") == "it measured lever 'norm', this module's is 'kv_cache'"
    module.write_text(GATE.format(limits="mean=5.0"))  # limits are judged per assertion, not by the digest
    assert not_this_modules(doc, module, "norm") is None
    module.write_text(GATE.format(limits="mean=1e-3").replace("broken_rms_norm", "scaled_rms_norm"))
    assert "changed since it was measured (KNOWN_BAD)" in str(not_this_modules(doc, module, "norm"))
    module.write_text(GATE.format(limits="mean=1e-3"))
    (tmp_path / "kernels.py").write_text(KERNELS.replace("2.0", "3.0"))
    assert "changed since it was measured (kernels.py)" in str(not_this_modules(doc, module, "norm"))
    no_digest = not_this_modules({**doc, "gate": None}, module, "norm")  # a file written before gate digests
    assert str(no_digest).endswith("(KNOWN_BAD, kernels.py, pytestmark)")


def test_a_file_that_is_not_this_module_s_covers_nothing(tmp_path: Path) -> None:
    proof = _proof(bad=_stats((0.05, 0.08)), file=tmp_path / "c.json")
    proof.calibration = _covering()
    proof.not_this_modules = "it is the calibration of gates/test_kv_cache.py, not of test_mine.py"
    vouched = proof.vouch(_gate((1e-4, 2e-4)))
    entry = vouched.fields["limits_from"]
    assert entry["status"] == "proven" and entry["stale_file"] == proof.not_this_modules  # proven here instead


def test_unproven_reads_as_such_and_is_an_error_only_when_proof_is_required() -> None:
    no_bad = _proof(bad=None, known_bad=None, unprovable="no known-bad")
    vouched = no_bad.vouch(_gate((1e-4, 2e-4)))
    assert vouched.verdict == "pass" and vouched.fields["limits_from"]["why"] == "no known-bad"
    required = _proof(bad=None, known_bad=None, unprovable="no known-bad", require=True).vouch(_gate((1e-4, 2e-4)))
    assert required.verdict == "error" and "--mlx-require-proof" in required.fields["error"]["message"]
    off = _proof(bad=None, prove=False)
    off._proof = None
    assert off.vouch(_gate((1e-4, 2e-4))).fields["limits_from"]["why"] == "--mlx-prove off"


def test_capability_and_speed_limits_say_what_kind_of_limit_they_are() -> None:
    proof = _proof(bad=_stats((0.05, 0.08)))
    capability = proof.vouch(Conclusion(mode="capability", checks=[], bounds={}, verdict="pass"))
    assert "the same on every model" in capability.fields["limits_from"]["note"]
    speed = proof.vouch(Conclusion(mode="speed", checks=[], bounds={}, verdict="pass"))
    assert "speed or memory goal" in speed.fields["limits_from"]["note"]
    assert proof.vouch(Conclusion(mode="aa", checks=[], bounds={}, verdict="floor")).fields == {}


# -- real sessions on the tiny model ----------------------------------------------------------------

KERNELS = '''
import mlx.core as mx

_rms = mx.fast.rms_norm


def scaled_rms_norm(x, weight, eps):
    """Weights 1% too large: the lever, a small real drift."""
    return _rms(x, weight * 1.01, eps)


def broken_rms_norm(x, weight, eps):
    """Weights twice as large: the known-bad."""
    return _rms(x, weight * 2.0, eps)
'''

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="kernels:scaled_rms_norm"),
    pytest.mark.mlx_kl(prompts=4, tokens=32, decode=8),
]

KNOWN_BAD = "kernels:broken_rms_norm"


def test_drift(paired):
    assert_kl_below(paired, {limits})
"""


@pytest.fixture
def gates(pytester: pytest.Pytester) -> pytest.Pytester:
    return gate_folder(pytester, kernels=KERNELS)


def _run(p: pytest.Pytester, model: Path, tmp: Path, *more: str) -> pytest.RunResult:
    return p.runpytest_subprocess(
        f"--mlx-candidate={model}",
        f"--mlx-db={tmp / 'results.sqlite'}",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "-p",
        "no:randomly",
        *more,
    )


def _figures(p: pytest.Pytester, model: Path, tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lever's and the known-bad's drift on this model, measured by the plugin (--mlx-prove auto)."""
    p.makepyfile(test_probe=GATE.format(limits="mean=1e9"))
    report = tmp / "probe.json"
    _run(p, model, tmp, "--mlx-prove=auto", f"--mlx-report={report}", "--mlx-db=off")
    record = json.loads(report.read_text())["gates"][0]
    (p.path / "test_probe.py").unlink()
    assert record["phases"]["proof"] > 0  # measured here, once: the modules below share its key
    return record["stats"], record["limits_from"]


@pytest.mark.slow  # four pytester sessions on the tiny model (~25 s)
def test_limits_that_pass_the_known_bad_never_read_pass_anywhere_and_caught_ones_are_proven(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    lever, probe = _figures(gates, tiny_model_dir, tmp_path)
    bad_mean = float(probe["known_bad"]["figures"][0].split("bound ")[1].split()[0])
    lever_upper = lever["mean_ci"][1]
    assert bad_mean > 4 * lever_upper, (lever, probe)  # the known-bad is far worse than the lever here
    # loose: above the known-bad's bound (the case); tight: between the lever's and the known-bad's
    loose, tight = f"mean={bad_mean * 3:.3g}", f"mean={(lever_upper * bad_mean) ** 0.5:.3g}"
    gates.makepyfile(test_loose=GATE.format(limits=loose), test_tight=GATE.format(limits=tight))
    report, html, xml = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "r.xml"
    result = _run(
        gates,
        tiny_model_dir,
        tmp_path,
        "--mlx-prove=auto",
        f"--mlx-report={report}",
        f"--mlx-html={html}",
        f"--junit-xml={xml}",
    )
    result.assert_outcomes(passed=1, failed=1)
    records = {g["nodeid"]: g for g in json.loads(report.read_text())["gates"]}
    loose_record, tight_record = records["test_loose.py::test_drift"], records["test_tight.py::test_drift"]
    assert loose_record["verdict"] == "error" and loose_record["limits_from"]["status"] == "refuted"
    assert tight_record["verdict"] == "pass" and tight_record["limits_from"]["status"] == "proven"
    # the same lever, sizes and known-bad as the probe's: its proof is theirs, read from the cache
    assert result.stdout.str().count("limits proof: from the reference cache") == 2
    result.stdout.fnmatch_lines(
        [
            "*limits do not catch the known-bad on *(cpu, float32)*",
            '*KNOWN_BAD = "kernels:broken_rms_norm" passes every limit*',
        ]
    )
    result.stdout.fnmatch_lines(["*limits proven on *"])  # the summary's line (wrapped where the path is long)
    assert "limits proven on" in parse_record(tight_record).limits_from.words  # type: ignore[union-attr]
    # every report: the history DB, JUnit, HTML, and a merge of the run's report
    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        rows = dict(db.execute("SELECT nodeid, verdict FROM quality_runs").fetchall())
    assert rows == {"test_loose.py::test_drift": "error", "test_tight.py::test_drift": "pass"}
    props = junit_gate_properties(xml)
    assert props["test_loose.py::test_drift"]["mlxgate.verdict"] == "error"
    assert props["test_tight.py::test_drift"]["mlxgate.verdict"] == "pass"
    page = html.read_text()
    assert "limits do not catch the known-bad" in page and 'class="badge v-error"' in page
    assert main(["merge", str(report)]) == 1

    assert "A/A: reference arm with prefill chunk" not in result.stdout.str()  # no A/A arm, no known-bad arm
    assert all("proof" not in g.get("phases", {}) for g in records.values())

    # --mlx-prove off: the loose gate passes, saying its limits are unproven; --mlx-require-proof refuses that
    off = _run(gates, tiny_model_dir, tmp_path, "--mlx-prove=off", "-k", "loose", f"--mlx-report={report}")
    off.assert_outcomes(passed=1)
    unproven = parse_record(json.loads(report.read_text())["gates"][0]).limits_from
    assert unproven is not None and unproven.words.endswith("(cpu, float32): --mlx-prove off"), unproven
    assert "--mlx-prove off" in off.stdout.str()  # the summary says so beside the pass
    both = _run(gates, tiny_model_dir, tmp_path, "--mlx-prove=off", "--mlx-require-proof")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--mlx-require-proof with --mlx-prove off*"])


# -- the options ------------------------------------------------------------------------------------


def test_prove_comes_from_the_command_line_then_the_ini_then_the_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mlxgate.config.settings import read_gate_settings
    from pytest_mlxgate.errors import MlxgateUsageError

    def settings(*args: str, env: str | None = None, ini: str = "") -> tuple[str, bool]:
        if env is None:
            monkeypatch.delenv("MLXGATE_PROVE", raising=False)
        else:
            monkeypatch.setenv("MLXGATE_PROVE", env)
        pytester.makeini(f"[pytest]\n{ini}")
        read = read_gate_settings(pytester.parseconfig(*args))
        return read.prove, read.require_proof

    assert settings() == ("auto", False)
    assert settings(env="off") == ("off", False)
    assert settings(env="off", ini="mlx_prove = auto") == ("auto", False)
    assert settings("--mlx-prove=off", ini="mlx_prove = auto") == ("off", False)
    assert settings(ini="mlx_require_proof = true") == ("auto", True)
    with pytest.raises(MlxgateUsageError, match="MLXGATE_PROVE='sometimes'"):
        settings(env="sometimes")
    with pytest.raises(MlxgateUsageError, match="--mlx-require-proof with --mlx-prove off"):
        settings("--mlx-require-proof", env="off")
    with pytest.raises(pytest.UsageError):
        pytester.parseconfig("--mlx-prove=maybe")


# -- in process: the same sessions as above, where mutation testing can see the proof's code run ----------


def _inprocess(p: pytest.Pytester, model: Path, tmp: Path, report: Path, *more: str) -> pytest.RunResult:
    return p.runpytest_inprocess(
        *more,
        f"--mlx-candidate={model}",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-allow-untrained",
        "--mlx-prove=auto",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )


def test_in_process_a_refuted_and_a_proven_gate_and_the_proof_read_back_from_the_cache(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A gate whose limit its known-bad passes is an error naming it, on this model and backend; one whose
    limit sits between the lever and the known-bad is proven; the proof is measured once, stored beside
    the reference, and read back."""
    report = tmp_path / "r.json"
    gates.makepyfile(test_loose=GATE.format(limits="mean=1e9"))
    first = _inprocess(gates, tiny_model_dir, tmp_path, report)
    first.assert_outcomes(failed=1)
    (loose,) = json.loads(report.read_text())["gates"]
    refuted = loose["limits_from"]
    assert loose["verdict"] == "error" and loose["error"]["type"] == "LimitsNotShown"
    assert refuted["status"] == "refuted" and refuted["model"] == str(tiny_model_dir) and refuted["backend"] == "cpu"
    assert refuted["file"] == "calibration/test_loose.json" and refuted["floors"]["mean"] >= 0
    assert refuted["known_bad"]["verdict"] == "pass" and refuted["known_bad"]["value"] == '"kernels:broken_rms_norm"'
    assert refuted["why"].startswith('known-bad "kernels:broken_rms_norm" passes them (mean KL 95% upper bound ')
    stored = list((tmp_path / "refcache" / "proof").glob("*.json"))
    assert len(stored) == 1  # measured once, kept beside the reference
    bad_bound = float(refuted["known_bad"]["figures"][0].split("bound ")[1].split()[0])
    lever_upper = loose["stats"]["mean_ci"][1]
    assert bad_bound > 4 * lever_upper

    gates.makepyfile(test_loose=GATE.format(limits=f"mean={(lever_upper * bad_bound) ** 0.5:.3g}"))
    again = _inprocess(gates, tiny_model_dir, tmp_path, report)
    again.assert_outcomes(passed=1)
    (tight,) = json.loads(report.read_text())["gates"]
    proven = tight["limits_from"]
    assert tight["verdict"] == "pass" and proven["status"] == "proven" and proven["model"] == str(tiny_model_dir)
    assert proven["known_bad"]["verdict"] == "fail" and proven["floors"] == refuted["floors"]
    assert "limits proof: from the reference cache" in again.stdout.str()  # the same key: not measured again
    assert list((tmp_path / "refcache" / "proof").glob("*.json")) == stored
    # another known-bad is another proof, kept beside the first (its own key, its own file)
    gates.makepyfile(test_loose=GATE.format(limits="mean=1e9").replace("broken_rms_norm", "scaled_rms_norm"))
    third = _inprocess(gates, tiny_model_dir, tmp_path, report)
    assert "limits proof: from the reference cache" not in third.stdout.str()
    assert len(list((tmp_path / "refcache" / "proof").glob("*.json"))) == 2


def test_in_process_a_copied_or_outgrown_calibration_file_lends_no_pass(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 55: a gate whose known-bad passes its limits reads error; another gate's calibration file copied
    beside it must not make it pass, nor may a gate's own file once its limits are loosened past the
    known-bad figures the file recorded. Each time the proof runs instead, and the record says why."""
    report = tmp_path / "r.json"
    gates.makepyfile(test_loose=GATE.format(limits="mean=1e9"))
    _inprocess(gates, tiny_model_dir, tmp_path, report).assert_outcomes(failed=1)
    (loose,) = json.loads(report.read_text())["gates"]
    bad_bound = float(loose["limits_from"]["known_bad"]["figures"][0].split("bound ")[1].split()[0])
    tight_limit = f"mean={(loose['stats']['mean_ci'][1] * bad_bound) ** 0.5:.3g}"
    gates.makepyfile(test_tight=GATE.format(limits=tight_limit))
    _inprocess(gates, tiny_model_dir, tmp_path, report, "test_tight.py", "--mlx-calibrate").assert_outcomes(skipped=1)
    own = gates.path / "calibration" / "test_tight.json"
    _inprocess(gates, tiny_model_dir, tmp_path, report, "test_tight.py").assert_outcomes(passed=1)
    (tight,) = json.loads(report.read_text())["gates"]
    assert tight["limits_from"]["status"] == "calibrated" and "stale_file" not in tight["limits_from"]

    (gates.path / "calibration" / "test_loose.json").write_bytes(own.read_bytes())  # the copied file
    copied = _inprocess(gates, tiny_model_dir, tmp_path, report, "test_loose.py")
    copied.assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    entry = record["limits_from"]
    assert record["verdict"] == "error" and entry["status"] == "refuted", entry
    assert entry["stale_file"] == "it is the calibration of test_tight.py, not of test_loose.py"
    said = " ".join(copied.stdout.str().split())  # the summary's line, wrapped where the path is long
    assert "calibration/test_loose.json does not show them: it is the calibration of test_tight.py" in said

    gates.makepyfile(test_tight=GATE.format(limits="mean=1e9"))  # loosened after calibrating
    loosened = _inprocess(gates, tiny_model_dir, tmp_path, report, "test_tight.py")
    loosened.assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    entry = record["limits_from"]
    assert record["verdict"] == "error" and entry["status"] == "refuted", entry
    assert entry["stale_file"].startswith("the known-bad it measured is not shown to fail these limits (pass: mean [")


CRASHING = '''
def rms_norm(x, weight, eps):
    """A known-bad kernel that cannot run here."""
    raise RuntimeError("no kernel built for this shape")
'''


def test_in_process_a_forged_proof_entry_is_measured_again_and_a_crashing_known_bad_is_an_error(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 55: a proof entry whose seal is valid but whose statistics are empty (or contradict themselves)
    is not believed: it is measured again, never a KeyError; a KNOWN_BAD kernel that raises is an error
    record naming KNOWN_BAD, the proof and the fix, with its limits_from, never a traceback."""
    from pytest_mlxgate.common.refstore import seal, unseal

    report = tmp_path / "r.json"
    gates.makepyfile(test_gate=GATE.format(limits="mean=1e9"))
    _inprocess(gates, tiny_model_dir, tmp_path, report).assert_outcomes(failed=1)  # refuted: the proof stored
    (entry,) = (tmp_path / "refcache" / "proof").glob("*.json")
    stored = json.loads(unseal(entry.read_bytes()))
    stored["data"]["known_bad_stats"] = {}  # empty statistics under a valid seal
    entry.write_bytes(seal(json.dumps(stored).encode()))
    again = _inprocess(gates, tiny_model_dir, tmp_path, report)
    again.assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["limits_from"]["status"] == "refuted" and record["phases"]["proof"] > 0  # measured again
    said = " ".join((again.stdout.str() + again.stderr.str()).split())
    assert "is damaged (ValueError: not a proof this code can trust (known_bad_stats do not read back" in said

    gates.makepyfile(
        crashing=CRASHING,
        test_gate=GATE.format(limits="mean=1e9").replace("kernels:broken_rms_norm", "crashing:rms_norm"),
    )
    crashed = _inprocess(gates, tiny_model_dir, tmp_path, report)
    crashed.assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["verdict"] == "error" and record["error"]["type"] == "LimitsNotShown"
    assert record["limits_from"]["status"] == "unproven"
    assert record["limits_from"]["why"] == (
        'known-bad "crashing:rms_norm" could not be measured: it raised RuntimeError: no kernel built for this shape'
    )
    message = record["error"]["message"]
    assert 'could not measure KNOWN_BAD = "crashing:rms_norm"' in message and "fix KNOWN_BAD" in message
    assert "Traceback" not in crashed.stdout.str()


def test_in_process_a_known_bad_with_non_finite_logits_proves_the_limits_and_keeps_the_model(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """NaN logits turn any gate red: a known-bad that gives them is caught, whatever the limits."""
    (gates.path / "nan_kernels.py").write_text(
        "import mlx.core as mx\n\n\ndef nan_rms_norm(x, weight, eps):\n    return x * mx.array(float('nan'))\n"
    )
    gates.makepyfile(
        test_nan=GATE.format(limits="mean=1e9").replace("kernels:broken_rms_norm", "nan_kernels:nan_rms_norm")
    )
    report = tmp_path / "r.json"
    _inprocess(gates, tiny_model_dir, tmp_path, report).assert_outcomes(passed=1)
    (record,) = json.loads(report.read_text())["gates"]
    proven = record["limits_from"]
    assert record["verdict"] == "pass" and proven["status"] == "proven"
    assert proven["known_bad"] == {"value": '"nan_kernels:nan_rms_norm"', "verdict": "fail", "figures": ["non-finite"]}
    assert proven["model"] == str(tiny_model_dir) and proven["backend"] == "cpu"
    again = _inprocess(gates, tiny_model_dir, tmp_path, report)  # the proof read back keeps the NaN it saw
    again.assert_outcomes(passed=1)
    assert "limits proof: from the reference cache" in again.stdout.str()
    (cached,) = json.loads(report.read_text())["gates"]
    assert cached["limits_from"] == proven


def test_a_model_is_named_by_its_alias_or_as_pinned() -> None:
    """A verdict names a built-in by its alias and a hub model as pinned (repo@commit): the repo alone
    would not say which weights the limits were shown on."""
    hub = {"name": "org/model", "repo_id": "org/model", "commit": "ab12", "pinned": "org/model@ab12"}
    assert model_label(hub) == "org/model@ab12"
    assert model_label({**EMBEDDED, "pinned": "mlxgate/SmolLM2-135M-Instruct-f32@c0ffee"}) == "smollm2-135m"
    assert model_label({"name": "x", "repo_id": "org/x"}) == "org/x" and model_label({}) == "the model"


TWO_MODEL_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [pytest.mark.mlx_lever("model"), pytest.mark.mlx_kl(prompts=2, tokens=16)]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-3)  # far above any A/A floor: the file covers it by model, not by chance
"""


def test_in_process_a_two_model_gate_is_unprovable_until_calibrated_against_its_reference(
    gates: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A two-model lever has no known-bad value: without a file its limits read unproven and say why;
    calibrated against the same reference, the file covers it."""
    import shutil

    same = tmp_path / "same-weights"
    shutil.copytree(tiny_model_dir, same)  # another snapshot, the same weights: KL exactly 0
    gates.makepyfile(test_two=TWO_MODEL_GATE)
    report = tmp_path / "r.json"
    _inprocess(gates, tiny_model_dir, tmp_path, report, f"--mlx-reference={same}").assert_outcomes(passed=1)
    (first,) = json.loads(report.read_text())["gates"]
    assert first["lever"]["kind"] == "model" and first["verdict"] == "pass"
    assert first["limits_from"]["why"] == "a two-model lever has no known-bad value"
    assert first["limits_from"]["status"] == "unproven"  # and still says on what, and which file would cover it
    assert (first["limits_from"]["model"], first["limits_from"]["backend"]) == (str(tiny_model_dir), "cpu")
    assert first["limits_from"]["file"] == "calibration/test_two.json"
    calibrate = _inprocess(gates, tiny_model_dir, tmp_path, report, f"--mlx-reference={same}", "--mlx-calibrate")
    calibrate.assert_outcomes(skipped=1)
    doc = json.loads((gates.path / "calibration" / "test_two.json").read_text())
    assert doc["model"]["reference"]["name"] == str(same) and doc["model"]["reference"]["commit"]
    _inprocess(gates, tiny_model_dir, tmp_path, report, f"--mlx-reference={same}").assert_outcomes(passed=1)
    (covered,) = json.loads(report.read_text())["gates"]
    assert covered["limits_from"]["status"] == "calibrated"
    assert covered["limits_from"]["file"] == "calibration/test_two.json"


def test_a_known_bad_is_named_as_json_or_as_the_whole_lever_it_is() -> None:
    """A verdict's `limits_from.known_bad.value`: a value as JSON (the form the calibration file keeps), a
    whole lever by what it switches, once built; before, by its name."""
    from pytest_mlxgate.authoring.proof_measure import _shown
    from pytest_mlxgate.levers.lever import Lever

    assert _shown({"bits": 4, "group_size": 64}) == '{"bits": 4, "group_size": 64}'
    assert _shown("mymod:broken") == '"mymod:broken"' and _shown(object).startswith("<class")
    whole = pytest.mark.mlx_lever("rope_off", patch="mlx.core.fast.rope", cand="known_bad_ops:rope_off")
    lever = Lever("rope_off", "patch", "mlx.core.fast.rope", None, "known_bad_ops:rope_off", path="serving")
    assert _shown(whole) == "pytest.mark.mlx_lever('rope_off', ...)"
    assert _shown(whole, lever) == (
        "mlx_lever 'rope_off' (patch mlx.core.fast.rope: original → known_bad_ops:rope_off, path=serving)"
    )


KV_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=3, tokens=24, decode=6),
]

KNOWN_BAD = {"bits": 2, "group_size": 64, "start": 100000}  # quantizes nothing the gate scores: vacuous


def test_drift(paired):
    assert_kl_below(paired, mean=1.0)
"""


def test_in_process_a_known_bad_that_cannot_be_measured_is_an_error_saying_so(
    gates: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    """A KNOWN_BAD whose arm cannot be measured (here: vacuous) proves nothing: the gate reads error, never
    pass, saying why and how to calibrate instead; a KNOWN_BAD naming nothing is an error naming it."""
    gates.makepyfile(test_proof_vacuous_known_bad=KV_GATE)  # a name no test module of this suite has
    report = tmp_path / "r.json"
    _inprocess(gates, tiny_kv_model_dir, tmp_path, report).assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["verdict"] == "error" and record["error"]["type"] == "LimitsNotShown"
    assert record["limits_from"]["status"] == "unproven"
    assert record["limits_from"]["why"].startswith('known-bad {"bits": 2, "group_size": 64, "start": 100000} could not')
    assert "the lever changes nothing the gate measures" in record["limits_from"]["why"]
    assert "--mlx-calibrate" in record["error"]["message"]
    gates.makepyfile(
        test_proof_vacuous_known_bad=KV_GATE.replace(
            '{"bits": 2, "group_size": 64, "start": 100000}', '"kernels:no_such"'
        )
    )
    _inprocess(gates, tiny_kv_model_dir, tmp_path, report).assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["verdict"] == "error" and "no_such" in record["error"]["message"]


def test_the_calibrate_command_names_the_precision_only_where_it_is_not_float32() -> None:
    from pytest_mlxgate.authoring.coverage import dtype_option

    assert dtype_option({"dtype": "bfloat16"}) == " --mlx-dtype bfloat16"
    assert dtype_option({"dtype": "float32"}) == "" and dtype_option({}) == ""


def test_a_gate_source_that_does_not_parse_names_its_file(tmp_path: Path) -> None:
    from pytest_mlxgate.authoring.calibration_file import GateSource

    module = tmp_path / "test_broken.py"
    module.write_text("def test_drift(paired)\n    pass\n")
    with pytest.raises(SyntaxError) as e:
        GateSource.read(module)
    assert e.value.filename == str(module)


def test_a_floor_that_is_no_number_is_no_floor() -> None:
    """`limits_not_shown` reads only finite numbers as floors (a flag or text in the file's floors is none)."""
    from pytest_mlxgate.authoring.coverage import limits_not_shown

    assert limits_not_shown({"aa_floor": {"mean": True}}, {"mean": 1e-3}, known_bad=False) is None
    assert limits_not_shown({"aa_floor": {"mean": 1e-3}}, {"mean": 1e-3}, known_bad=False) == (
        "mean within 10x its A/A floor"
    )


def test_a_known_bad_that_broke_the_model_shows_any_limit_and_no_measurement_shows_none() -> None:
    """A known-bad whose logits went NaN or inf fails every limit (red whatever they are): the file shows
    them; a file that holds no known-bad figures shows no limit of a module that declares one."""
    from pytest_mlxgate.authoring.coverage import limits_not_shown

    broke = {"aa_floor": {"mean": 1e-6}, "known_bad": {"non_finite": True}}
    assert limits_not_shown(broke, {"mean": 1e-3}, known_bad=True) is None
    assert limits_not_shown({"aa_floor": {"mean": 1e-6}, "known_bad": {}}, {"mean": 1e-3}, known_bad=True) == (
        "it holds no measurement of the module's KNOWN_BAD"
    )
    assert limits_not_shown({"aa_floor": {"mean": 1e-6}}, {"mean": 1e-3}, known_bad=False) is None


def test_a_gpu_calibration_without_its_chip_or_tf32_says_which_fact_is_missing_where() -> None:
    """On a GPU a file covers only the chip and MLX_ENABLE_TF32 setting it was measured with: a fact the file
    lacks reads "unrecorded", one this run lacks "unknown"; a CPU run needs neither."""
    from pytest_mlxgate.authoring.coverage import covers_precision

    f32 = {"dtype": "float32"}
    assert covers_precision(f32, {}, f32, "metal", {"chip": "M3 Max"}) == (
        "measured with chip unrecorded, this run has M3 Max"
    )
    assert covers_precision(f32, {"chip": "M2"}, f32, "metal", {}) == "measured with chip M2, this run has unknown"
    assert covers_precision(f32, {"chip": "M2", "tf32": "0"}, f32, "cuda", {"chip": "M2", "tf32": "1"}) == (
        "measured with tf32 0, this run has 1"
    )
    assert covers_precision(f32, {"chip": "M2", "tf32": "0"}, f32, "metal", {"chip": "M2", "tf32": "0"}) is None
    assert covers_precision(f32, {}, f32, "cpu", {}) is None
