"""False-green corpus: waits, context limits, base models and xdist workers (issue 19, items 6 and 7).

Each scenario is a real pytest session on the tiny models that ends in a clear error or a failing
verdict, never a pass, never a raw traceback:
- a lever that stalls runs into --mlx-arm-timeout: an error naming the arm and how far it got;
- --mlx-kl-tokens past the model's context: refused before any arm runs, naming the limit and the fix;
- a base model (no chat template): the answer check completes a plain sentence instead of raising
  mlx_lm's raw ValueError, and a KL gate asking for more prompts than the default set's plain ones
  still runs and gives its real verdict;
- two tests of one speed module under `-n 2`: one worker, one build, speed timed once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLOW = '''
import os, time
import mlx.core as mx

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    """A real drift (weights 2% too large) behind a stall at every call."""
    time.sleep(float(os.environ.get("MLXGATE_TEST_SLEEP_S", "0.2")))
    return _fused(x, weight * 1.02, eps)
'''

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="slow:rms_norm"),
    pytest.mark.mlx_kl(prompts={prompts}, tokens={tokens}),
]


def test_drift(paired):
    assert_kl_below(paired, mean={mean})


def test_drift_again(paired):
    assert_kl_below(paired, mean={mean})
"""

SPEED = """
import os
import pytest
from pytest_mlxgate import assert_faster

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=2, tokens=24, decode=4),
    pytest.mark.mlx_speed(contexts=(16,), decode=3, repetitions=3),
]


def _where(request):
    with open(os.environ["MLXGATE_TEST_WORKERS_LOG"], "a") as f:
        f.write(f"{request.node.nodeid} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")


def test_decode_ten_times_faster(paired, request):
    _where(request)
    assert_faster(paired, decode=10.0)


def test_prefill_ten_times_faster(paired, request):
    _where(request)
    assert_faster(paired, prefill=10.0)
"""


@pytest.fixture
def tiny_base_model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny llama with its tokenizer's chat template taken out: a base model, as mlx_lm sees one."""
    out = tmp_path / "tiny-base"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _session(pytester: pytest.Pytester, model: Path, *args: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(slow=SLOW)
    return pytester.runpytest_subprocess(
        f"--mlx-candidate={model}", "--mlx-db=off", "--mlx-reference-cache=off", "-p", "no:randomly", *args
    )


def _no_raw_traceback(result: pytest.RunResult) -> None:
    out = result.stdout.str()
    assert "Traceback (most recent call last)" not in out and "site-packages/mlx_lm" not in out


@pytest.mark.slow  # a pytester gate session
def test_a_lever_that_stalls_is_stopped_by_the_arm_timeout_and_never_passes(
    pytester: pytest.Pytester, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5 norm calls per forward x 0.2 s: the candidate arm's first forward takes 1 s, past a 0.5 s limit."""
    monkeypatch.setenv("MLXGATE_TEST_SLEEP_S", "0.2")
    pytester.makepyfile(test_gate=GATE.format(prompts=3, tokens=24, mean="1.0"))
    result = _session(pytester, tiny_model_dir, "--mlx-arm-timeout=0.5")
    result.assert_outcomes(failed=2)  # both tests of the module: the run's error is remembered, not retried
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            (
                "*ArmTimeoutError: the KL candidate arm (norm=slow:rms_norm) ran past the arm time limit: 24 of 72 "
                "positions done in * s (limit 0.5 s, --mlx-arm-timeout)*"
            ),
        ]
    )
    assert "raise the limit with --mlx-arm-timeout SECONDS" in result.stdout.str()
    _no_raw_traceback(result)


@pytest.mark.slow  # a pytester gate session
def test_kl_tokens_past_the_models_context_are_refused_before_any_arm_runs(
    pytester: pytest.Pytester, tiny_model_dir: Path
) -> None:
    """The tiny llama's config says max_position_embeddings 4096."""
    pytester.makepyfile(test_gate=GATE.format(prompts=3, tokens=24, mean="1.0"))
    result = _session(pytester, tiny_model_dir, "--mlx-kl-tokens=5000")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            (
                "*test_gate.py::test_drift: the KL gate asks for 5000 tokens per sequence, but * serves at most 4096 "
                "positions (max_position_embeddings in config.json)*"
            ),
        ]
    )
    out = result.stdout.str()
    assert "Fix: --mlx-kl-tokens 4096 or less" in out
    assert "reference arm" not in out and "candidate arm" not in out  # nothing ran
    _no_raw_traceback(result)


@pytest.mark.slow  # a pytester session that generates with the tiny model
def test_a_base_models_answer_check_completes_a_sentence_instead_of_a_raw_chat_template_error(
    pytester: pytest.Pytester, tiny_base_model_dir: Path
) -> None:
    """Untrained models are allowed in these tests: the completion runs, and its (random) answer fails."""
    pytester.makepyfile(test_snapshot=(ROOT / "gates" / "test_snapshot.py").read_text())
    result = _session(pytester, tiny_base_model_dir, "-k", "test_model_answers")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: greedy completion of 'Q: What is the capital of France*A:' (no chat template: a base*",
        ]
    )
    assert "chat_template is not set" not in result.stdout.str()
    _no_raw_traceback(result)


@pytest.mark.slow  # a pytester gate session
def test_a_base_model_fills_a_gate_past_the_default_chat_prompts_and_gets_its_real_verdict(
    pytester: pytest.Pytester, tiny_base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 prompts: before, sequence 38 began with a chat prompt and the gate failed at setup on a base model."""
    monkeypatch.setenv("MLXGATE_TEST_SLEEP_S", "0")
    pytester.makepyfile(test_gate=GATE.format(prompts=40, tokens=12, mean="1e-9"))
    result = _session(pytester, tiny_base_model_dir, "-k", "test_drift and not again")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: KL gate failed (a limit shown crossed): test_gate.py::test_drift",
            # 38 plain prompts: sequences 38 and 39 are further windows of the first two texts (n counts texts)
            "*mean KL * over 38 prompts (40 windows of them), 480 tokens) > limit 1.00e-09  ✗ fail",
        ]
    )
    assert "no chat template" not in result.stdout.str()


@pytest.mark.slow  # a pytester gate session under -n 2
def test_two_tests_of_a_speed_module_under_n2_run_on_one_worker_and_time_speed_once(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, plain -n 2 sent the two tests to two workers: both built the run and timed the arms at
    once, each speed figure measuring the other worker's load."""
    pytest.importorskip("xdist")
    log = tmp_path / "workers.log"
    monkeypatch.setenv("MLXGATE_TEST_WORKERS_LOG", str(log))
    pytester.makepyfile(test_speed=SPEED)
    report = tmp_path / "report.json"
    result = _session(pytester, tiny_kv_model_dir, "-n", "2", f"--mlx-report={report}")
    result.assert_outcomes(failed=2)  # a 10x speed-up is shown short of: real verdicts
    result.stdout.fnmatch_lines(["*speed gate failed (shown short of a goal): test_speed.py::test_decode_ten*"])
    workers = dict(line.split() for line in log.read_text().splitlines())
    assert len(workers) == 2 and len(set(workers.values())) == 1, workers
    records = json.loads(report.read_text())["gates"]
    assert len(records) == 2 and len({r["speed"]["id"] for r in records}) == 1  # timed once, shared
    assert result.stdout.str().count("speed (both arms interleaved)") == 1  # the module's run built once
    seen = records[0]["speed"]["load_seen"]
    assert {"cores", "wall_s", "high", "waited_for_lock_s"} <= set(seen)
