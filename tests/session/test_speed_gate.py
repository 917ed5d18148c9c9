"""Speed and memory in a gate session: a module with `mlx_speed` measures once and every record of
it carries the figures (summary once, JSON, DB columns); assert_faster's and assert_smaller's verdicts
end tests (assert_faster's memory goals still work, with a DeprecationWarning);
--mlx-speed on/off and the size options apply; bad sizes are usage errors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

GATE = """
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=3, tokens=24, decode=4),
    pytest.mark.mlx_speed(contexts=(16, 40), decode=3, repetitions=3),
]


def test_drift(paired):
    assert_kl_below(paired, mean=10.0)


def test_memory(paired):
    assert_smaller(paired, kv=0.3, at="all")


def test_memory_as_before(paired):
    assert_faster(paired, kv=0.3, at="all")


def test_impossible_speed_up(paired):
    assert_faster(paired, decode=100.0)


def test_impossible_saving(paired):
    assert_smaller(paired, kv=0.01)
"""

PLAIN = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
              pytest.mark.mlx_kl(prompts=2, tokens=16)]


def test_drift(paired):
    assert_kl_below(paired, mean=1e-6)
"""


@pytest.mark.slow  # a pytester session measuring speed
def test_a_speed_module_measures_once_and_every_record_carries_it(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_kv=GATE)
    report, db = tmp_path / "r.json", tmp_path / "h.sqlite"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", f"--mlx-report={report}", f"--mlx-db={db}"
    )
    result.assert_outcomes(passed=3, failed=2, warnings=1)
    out = result.stdout.str()
    assert "speed gate failed (shown short of a goal): test_kv.py::test_impossible_speed_up" in out
    assert "memory gate failed (shown over a goal): test_kv.py::test_impossible_saving" in out
    assert "DeprecationWarning: assert_faster(kv=0.3): memory goals are assert_smaller's now" in out
    assert out.count("speed @40: prefill ×") == 1 and out.count("speed @16: prefill ×") == 1  # once per module
    assert "speed (both arms interleaved): contexts 16, 40 tokens, 3 decoded, up to 3 pairs each" in out
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(report.read_text())["gates"]}
    assert records["test_drift"]["mode"] == "gate" and records["test_memory"]["mode"] == "speed"
    ids = {r["speed"]["id"] for r in records.values()}
    assert len(ids) == 1  # one measurement, shared
    speed = records["test_memory"]["speed"]
    assert sorted(speed["contexts"]) == ["16", "40"]
    # the module's sampled goals, read from its source, are what the trials stop on (bytes goals need no pairs)
    assert speed["shape"]["goals"] == [{"key": "decode", "limit": 100.0, "at": None}]
    assert {speed["contexts"][c]["stopped"] for c in ("16", "40")} <= {"decided", "precise", "budget"}
    assert all(
        len(speed["contexts"][c][arm]["trials"]) == 3 for c in ("16", "40") for arm in ("reference", "candidate")
    )
    assert [c["verdict"] for c in records["test_memory"]["checks"]] == ["pass", "pass"]
    # where the module's time went: the first test ran the model load, both KL arms and the speed trials (its
    # record carries speed), so it is charged for them; the tests after it read shared results and pay nothing
    first = records["test_drift"]["phases"]
    assert {"load", "reference", "candidate", "speed"} <= set(first) and min(first.values()) > 0
    assert first["speed"] >= speed["duration_s"] - 0.001  # the trials' own clock runs inside the phase's
    for name in ("test_memory", "test_memory_as_before", "test_impossible_speed_up", "test_impossible_saving"):
        assert not {"load", "reference", "candidate", "speed"} & set(records[name]["phases"]), name
    old, new = records["test_memory_as_before"], records["test_memory"]
    assert old["checks"] == new["checks"]
    assert (old["mode"], old["verdict"], old["bounds"]) == ("speed", "pass", {"kv": 0.3})
    assert records["test_impossible_speed_up"]["verdict"] == "fail"
    saving = records["test_impossible_saving"]
    assert (saving["mode"], saving["verdict"]) == ("speed", "fail")
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT mode, speed_context, decode_ratio, ref_kv_bytes > cand_kv_bytes FROM quality_runs"
        ).fetchall()
    conn.close()
    assert len(rows) == 5 and all(r[1] == 40 and r[2] is not None and r[3] == 1 for r in rows)


@pytest.mark.slow  # two pytester sessions
def test_mlx_speed_on_adds_speed_to_any_gate_and_off_removes_it(
    pytester: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN)
    report = tmp_path / "r.json"
    on = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "-p",
        "no:randomly",
        "--mlx-db=off",
        f"--mlx-report={report}",
        "--mlx-speed=on",
        "--mlx-speed-contexts=8,20",
        "--mlx-speed-decode=2",
        "--mlx-speed-reps=3",
    )
    on.assert_outcomes(passed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert sorted(record["speed"]["contexts"]) == ["20", "8"] and record["speed"]["shape"]["decode"] == 2
    off = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "-p",
        "no:randomly",
        "--mlx-db=off",
        f"--mlx-report={report}",
        "--mlx-speed=off",
    )
    off.assert_outcomes(passed=1)
    (record,) = json.loads(report.read_text())["gates"]
    assert "speed" not in record and "speed @" not in off.stdout.str()


def test_bad_speed_sizes_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmlx_speed = sometimes\n")
    result = pytester.runpytest_subprocess("--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*mlx_speed = 'sometimes'*choose on or off*"])
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess("--mlx-speed-contexts=600,600", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*repeats a length*"])


WEIGHTS = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 4, "group_size": 64}),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
    pytest.mark.mlx_speed(contexts=(16,), decode=2, repetitions=3),
]


def test_drift(paired):
    assert_kl_below(paired, mean=100.0)


def test_memory(paired):
    assert_smaller(paired, weights=0.35)
"""


@pytest.mark.slow  # a pytester session quantizing a model copy
def test_a_weights_gate_quantizes_a_copy_and_counts_its_bytes(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_w=WEIGHTS)
    report = tmp_path / "r.json"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-db=off", f"--mlx-report={report}"
    )
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count("quantizing a copy of") == 1 and "4-bit g64 weights (mlx_lm's converter)" in out
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(report.read_text())["gates"]}
    assert records["test_drift"]["lever"]["cand"] == "4-bit g64 weights" and records["test_drift"]["stats"]["mean"] > 0
    (check,) = records["test_memory"]["checks"]
    # 4-bit words plus a float32 scale and bias per 64 weights, over float32: (0.5 + 0.125) / 4 = 0.156
    assert check["metric"] == "weight bytes" and check["value"] == pytest.approx(0.156, abs=0.01)
    assert "\n  weights 12.6 MiB → 2.0 MiB\n" in out  # the speed lines show both arms' weights


@pytest.mark.slow  # a pytester session
def test_a_weights_gate_on_an_already_quantized_model_skips_and_says_what_it_needs(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    from mlx_lm import convert

    quantized = tmp_path / "q4"
    convert(str(tiny_kv_model_dir), mlx_path=str(quantized), quantize=True, q_bits=4, q_group_size=64)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_w=WEIGHTS)
    result = pytester.runpytest_subprocess(f"--mlx-candidate={quantized}", "-p", "no:randomly", "--mlx-db=off", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*is already quantized*run it on the float repo*"])


WINDOWED = """
import pytest
from pytest_mlxgate import assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=2, tokens=16, decode=2),
    pytest.mark.mlx_speed(decode=2, repetitions=3),
]


def test_memory(paired):
    assert_smaller(paired, kv=0.5, at="all")
"""


@pytest.mark.slow  # a pytester session timing a 384-token context
def test_a_sliding_window_model_is_timed_past_its_window_by_default(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """gemma-4 with a 256-token window: the CPU's default context (128) never wraps it, so a second,
    384 (1.5x the window), is timed, and there the plain arm's sliding layers hold their window only."""
    from tinygemma import build_tiny_gemma4

    model = build_tiny_gemma4(tmp_path_factory.mktemp("gemma4-w256"), sliding_window=256)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_windowed=WINDOWED)
    report = tmp_path / "r.json"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={model}", "-p", "no:randomly", "--mlx-db=off", f"--mlx-report={report}"
    )
    result.assert_outcomes(passed=1)
    (record,) = json.loads(report.read_text())["gates"]
    speed = record["speed"]
    assert speed["shape"]["contexts"] == [128, 384]
    plain = {c: speed["contexts"][c]["reference"] for c in ("128", "384")}
    assert plain["384"]["kv_held_bytes"] < plain["384"]["kv_bytes"], "the wrapped windows hold less than allocated"
    assert "speed @384: prefill ×" in result.stdout.str() and "(holds " in result.stdout.str()
