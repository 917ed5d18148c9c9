"""The KL gate end to end through pytester: failing gates fail with the report, -n 2 writes one DB
row per gate and one summary, the JSON report carries every field, A/A checks the limits, and
option mistakes are usage errors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from gate_sources import PERTURB

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=3, tokens=24),
]


def test_drift(paired):
    assert_kl_below(paired, mean={mean}, top1=0.2)
"""

NEUTRAL = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1", path="serving"),
    pytest.mark.mlx_kl(prompts=2, tokens=24, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-9, max=1e-9)
"""

RECORD_FIELDS = {
    "nodeid",
    "gate",
    "mode",
    "candidate",
    "reference_model",
    "lever",
    "path",
    "sizes",
    "stats",
    "bounds",
    "checks",
    "verdict",
    "reference_source",
    "durations",
    "phases",
    "time",
    "rerun",
}
STAT_FIELDS = {
    "n_prompts",
    "n_tokens",
    "mean",
    "mean_ci",
    "median",
    "p90",
    "p95",
    "p99",
    "p999",
    "quantile_ci",
    "max",
    "max_at",
    "same_top",
    "same_top_ci",
    "top1",
    "top1_ci",
    "flips",
    "near_tie_flips",
    "ln_ppl_ratio",
    "ln_ppl_ratio_ci",
    "delta_p",
    "worst",
}


@pytest.fixture
def gate_dir(pytester: pytest.Pytester, tiny_model_dir: Path) -> pytest.Pytester:
    pytester.makepyfile(perturb=PERTURB)
    pytester.syspathinsert()
    pytester.makeini("[pytest]\n")
    return pytester


def _args(tiny_model_dir: Path, tmp: Path, *more: str) -> list[str]:
    # `--opt=value`: a bare path argument would move pytest's rootdir (and so the node ids)
    return [f"--mlx-candidate={tiny_model_dir}", f"--mlx-db={tmp / 'results.sqlite'}", "-p", "no:randomly", *more]


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_a_gate_over_its_limit_fails_and_its_message_is_the_report(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_gate=GATE.format(mean="1e-9"))
    result = gate_dir.runpytest_subprocess(*_args(tiny_model_dir, tmp_path))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: KL gate failed (a limit shown crossed): test_gate.py::test_drift",
            "*mean KL * (95% interval *–* over 3 prompts, 72 tokens) > limit 1.00e-09  ✗ fail",
            "*worst: prompt *, position *, next token *",
            "*arms: norm=original vs norm=perturb:rms_norm · path=prefill",
            f"*model: {tiny_model_dir}*",
            f"*re-run: pytest test_gate.py::test_drift --mlx-candidate={tiny_model_dir}",
        ]
    )
    result.stdout.fnmatch_lines(["*test_gate::test_drift*mean KL*FAIL*"])  # the summary table says it too


@pytest.mark.slow  # a pytester gate session in a subprocess under -n 2
def test_xdist_writes_one_db_row_per_gate_one_summary_and_a_full_json_report(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("xdist")
    gate_dir.makepyfile(test_gate=GATE.format(mean="1.0"), test_neutral=NEUTRAL)
    report = tmp_path / "report.json"
    result = gate_dir.runpytest_subprocess(*_args(tiny_model_dir, tmp_path, "-n", "2", "--mlx-report", str(report)))
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("=== mlxgate ===") == 1 or result.stdout.str().count(" mlxgate ") >= 1
    assert sum("mean KL" in line and "test_gate::test_drift" in line for line in result.stdout.lines) == 1

    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        rows = db.execute(
            "SELECT nodeid, verdict, n_prompts, n_tokens, config_json FROM quality_runs ORDER BY nodeid"
        ).fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("test_gate.py::test_drift", "pass", 3, 72),
        ("test_neutral.py::test_drift", "pass", 2, 8),
    ]
    assert json.loads(rows[0][4])  # the run's configuration travels with every row

    data = json.loads(report.read_text())
    assert len(data["gates"]) == 2
    for record in data["gates"]:
        assert RECORD_FIELDS <= set(record), RECORD_FIELDS - set(record)
        assert STAT_FIELDS <= set(record["stats"]), STAT_FIELDS - set(record["stats"])
        assert record["candidate"]["pinned"] == str(tiny_model_dir)
        assert set(record["lever"]) >= {"name", "kind", "ref", "cand"}
        assert record["durations"]["total_s"] > 0
    neutral = next(r for r in data["gates"] if r["nodeid"].startswith("test_neutral"))
    assert neutral["stats"]["mean"] == 0.0 and neutral["path"] == "serving"
    assert neutral["lever"]["ref"] == "0" and neutral["lever"]["cand"] == "1"


AS_LOADED_REFERENCE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever({lever}, path="serving"),
    pytest.mark.mlx_kl(prompts=3, tokens=24, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=100.0)
"""


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_gates_whose_reference_runs_the_model_as_loaded_compute_it_once_per_run(
    gate_dir: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    """A KV lever's plain reference and a patch lever's original compute the same arm: on a cold reference
    cache the first module computes it and the second reads it, instead of computing it again. A module whose
    reference switches something (the perturbed norm as reference) computes its own."""
    gate_dir.makepyfile(
        test_a_kv=AS_LOADED_REFERENCE.format(lever='"kv8", kv=True, ref="plain", cand=8'),
        test_b_norm=AS_LOADED_REFERENCE.format(
            lever='"norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"'
        ),
        test_c_own=AS_LOADED_REFERENCE.format(
            lever='"norm", patch="mlx.core.fast.rms_norm", ref="perturb:rms_norm", cand=None'
        ),
    )
    report = tmp_path / "report.json"
    result = gate_dir.runpytest_subprocess(
        *_args(tiny_kv_model_dir, tmp_path, "--mlx-report", str(report), "--mlx-reference-cache", str(tmp_path / "c"))
    )
    result.assert_outcomes(passed=3)
    records = {r["nodeid"].split(".py")[0]: r for r in json.loads(report.read_text())["gates"]}
    sources = {name: r["reference_source"] for name, r in records.items()}
    assert sources == {"test_a_kv": "computed", "test_b_norm": "cache", "test_c_own": "computed"}
    assert "reference" not in records["test_b_norm"]["phases"] or (
        records["test_b_norm"]["phases"]["reference"] < records["test_a_kv"]["phases"]["reference"]
    )
    assert records["test_b_norm"]["stats"]["mean"] > 0  # its own candidate arm ran against the shared reference


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_aa_fails_limits_below_the_noise_floor_and_passes_the_others(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_loose=GATE.format(mean="1.0"), test_tight=GATE.format(mean="0.0"))
    report = tmp_path / "aa.json"
    result = gate_dir.runpytest_subprocess(*_args(tiny_model_dir, tmp_path, "--mlx-aa", "--mlx-report", str(report)))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*KL gate bounds sit below the A/A noise floor: test_tight.py::test_drift*"])
    records = {r["gate"]: r for r in json.loads(report.read_text())["gates"]}
    assert records["test_loose::test_drift"]["verdict"] == "floor"
    assert records["test_tight::test_drift"]["verdict"] == "fail"
    aa = records["test_loose::test_drift"]["aa"]
    assert aa["repeat"]["mean"] == 0.0  # the same arm twice on CPU: bit-identical
    assert aa["chunked"]["n_tokens"] == 72 and aa["floors"]["mean"] >= 0


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_the_command_line_lever_replaces_the_module_lever(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_gate=GATE.format(mean="1e-9"))
    result = gate_dir.runpytest_subprocess(
        *_args(
            tiny_model_dir,
            tmp_path,
            "--mlx-lever",
            "env:MLXGATE_UNUSED",
            "--mlx-ref-value",
            "a",
            "--mlx-cand-value",
            "b",
        )
    )
    result.assert_outcomes(passed=1)  # an environment variable nothing reads: KL exactly 0
    # a bare name that no module declares replaces nothing: a usage error, not a hijacked lever
    bare = gate_dir.runpytest_subprocess(
        *_args(
            tiny_model_dir, tmp_path, "--mlx-lever", "MLXGATE_UNUSED", "--mlx-ref-value", "a", "--mlx-cand-value", "b"
        )
    )
    assert bare.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_a_gate_without_a_lever_says_how_to_declare_one(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_nolever="def test_drift(paired):\n    pass\n")
    result = gate_dir.runpytest_subprocess(*_args(tiny_model_dir, tmp_path))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*declares no lever: add `pytestmark = pytest.mark.mlx_lever(...)`*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mlx-ref-value", "1"], "*--mlx-ref-value/--mlx-cand-value need --mlx-lever NAME*"),
        (["--mlx-lever", "X", "--mlx-ref-value", "1"], "*--mlx-lever X needs both values*"),
        (["--mlx-kl-prompts", "0"], "*--mlx-kl-prompts: must be at least 1, got 0*"),
        (["--mlx-prompts-file", "nope.jsonl"], "*--mlx-prompts-file: 'nope.jsonl' is not a file*"),
        (["--mlx-server-key-env", "K"], "*--mlx-server-key-env names a key for --mlx-cand-server, which is not given*"),
        (["--mlx-ref-server-key-env", "K"], "*--mlx-ref-server-key-env names a key for --mlx-ref-server, which*"),
        (["--mlx-ref-server", "http://127.0.0.1:9", "--mlx-aa"], "*--mlx-ref-server with --mlx-aa: a calibration*"),
        (["--mlx-cand-server", "http://127.0.0.1:9", "--mlx-calibrate"], "*--mlx-cand-server with --mlx-calibrate*"),
        (["--mlx-ref-server", "http://u:pw@127.0.0.1:9"], "*--mlx-ref-server*password*"),
    ],
)
def test_option_mistakes_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize("option", ["--mlx-report", "--mlx-html", "--mlx-db"])
def test_an_output_under_a_file_is_a_usage_error_before_anything_runs(pytester: pytest.Pytester, option: str) -> None:
    pytester.makefile(".txt", afile="not a folder")
    target = pytester.path / "afile.txt" / "out"
    result = pytester.runpytest_subprocess(f"{option}={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option} {target}: {pytester.path / 'afile.txt'} is a file, not a folder*"])


TWO_MODEL = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [pytest.mark.mlx_lever("model"), pytest.mark.mlx_kl(prompts=2, tokens=16)]


def test_drift(paired):
    result = assert_kl_below(paired, mean=1e-9)
    assert result.reference_model is not None
"""


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_two_model_mode_loads_the_reference_and_measures_against_it(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_two=TWO_MODEL)
    same = tmp_path / "same-weights"
    import shutil

    shutil.copytree(tiny_model_dir, same)  # another snapshot, same weights: KL exactly 0
    report = tmp_path / "two.json"
    result = gate_dir.runpytest_subprocess(
        *_args(tiny_model_dir, tmp_path, f"--mlx-reference={same}", f"--mlx-report={report}")
    )
    result.assert_outcomes(passed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["reference_model"]["pinned"] == str(same)
    assert record["lever"]["kind"] == "model"


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_two_model_mode_without_a_reference_says_how_to_name_one(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_two=TWO_MODEL)
    result = gate_dir.runpytest_subprocess(*_args(tiny_model_dir, tmp_path))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pass --mlx-reference NAME*"])


@pytest.mark.slow  # a pytester gate session in a subprocess
def test_a_prompts_file_replaces_the_default_prompts(
    gate_dir: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gate_dir.makepyfile(test_gate=GATE.format(mean="1e-9"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 8})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "Name three prime numbers, and why. " * 3}]})
        + "\n"
    )
    report = tmp_path / "p.json"
    result = gate_dir.runpytest_subprocess(
        *_args(
            tiny_model_dir, tmp_path, f"--mlx-prompts-file={prompts}", "--mlx-kl-prompts=2", f"--mlx-report={report}"
        )
    )
    result.assert_outcomes(failed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert record["stats"]["n_prompts"] == 2  # the command line beats the module's mlx_kl(prompts=3)
    worst = [line for line in result.stdout.lines if "worst: prompt" in line]
    assert worst and all("The quick brown fox" in line or "<|im_start|>" in line for line in worst), worst
