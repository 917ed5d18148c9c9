"""A slow arm says how far it is on the controller's terminal, plain and relayed from xdist workers
(the interval made 0 rather than the arm slow); the limit's and interval's options and ini twins,
their parse-time checks; a model's context read from its config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_mlxgate.config.settings import DEFAULT_ARM_TIMEOUT, GateSettings, read_settings

SLOW = """
import time
import mlx.core as mx

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    time.sleep(0.01)
    return _fused(x, weight * 1.02, eps)
"""

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="slow:rms_norm"),
    pytest.mark.mlx_kl(prompts=3, tokens=24),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1.0)
"""

_LINE = r"running KL candidate arm \(norm=slow:rms_norm\): (24|48) / 72 positions at [0-9.]+ positions/s, ETA \d+:\d\d"


@pytest.mark.slow  # two pytester gate sessions, one under -n 2
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_slow_arm_prints_progress_lines_with_rate_and_eta_and_a_closing_line(
    pytester: pytest.Pytester, tiny_model_dir: Path, workers: list[str]
) -> None:
    if workers:
        pytest.importorskip("xdist")
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(slow=SLOW, test_gate=GATE)
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "--mlx-db=off",
        "--mlx-reference-cache=off",
        "-p",
        "no:randomly",
        "--mlx-progress-interval=0",
        *workers,
    )
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    tag = r"mlxgate: \[gw\d\] " if workers else "mlxgate: "  # a worker's lines come relayed, tagged
    assert len(re.findall(tag + _LINE, out)) == 2, out
    assert re.search(tag + r"ran KL candidate arm \(norm=slow:rms_norm\): 72 positions in [0-9.]+ s", out)
    assert re.search(tag + r"running KL reference arm \(norm=original\): 24 / 72 positions", out)


@pytest.mark.slow  # a pytester gate session
def test_by_default_a_short_arm_prints_no_progress_line(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(slow=SLOW, test_gate=GATE)
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", "--mlx-db=off", "--mlx-reference-cache=off", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
    assert "positions at" not in result.stdout.str() and "ran KL" not in result.stdout.str()


def _gate(pytester: pytest.Pytester, *args: str) -> GateSettings:
    settings = read_settings(pytester.parseconfig(*args))
    assert settings.gate is not None
    return settings.gate


def test_the_limit_is_an_hour_by_default_and_0_or_none_turn_it_off(pytester: pytest.Pytester) -> None:
    assert _gate(pytester).arm_timeout == DEFAULT_ARM_TIMEOUT == 3600.0
    assert _gate(pytester, "--mlx-arm-timeout=90").arm_timeout == 90.0
    for off in ("0", "none", "off"):
        assert _gate(pytester, f"--mlx-arm-timeout={off}").arm_timeout is None
    pytester.makeini("[pytest]\nmlx_arm_timeout = none\nmlx_progress_interval = 2.5\n")
    gate = _gate(pytester)
    assert gate.arm_timeout is None and gate.progress_interval == 2.5
    assert _gate(pytester, "--mlx-arm-timeout=7").arm_timeout == 7.0  # the command line wins


def test_bad_limits_and_intervals_are_usage_errors(pytester: pytest.Pytester) -> None:
    for bad in ("--mlx-arm-timeout=soon", "--mlx-arm-timeout=-1", "--mlx-progress-interval=nan"):
        result = pytester.runpytest_subprocess(bad)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, bad
        assert "seconds" in result.stderr.str()
    pytester.makeini("[pytest]\nmlx_arm_timeout = forever\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "mlx_arm_timeout in" in result.stderr.str() and "not a number of seconds" in result.stderr.str()


def test_a_models_context_comes_from_its_config_its_text_config_or_its_args(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pytest_mlxgate.models.context import context_limit
    from pytest_mlxgate.models.loaded import LoadedModel

    def loaded(config: object, args: object = None) -> LoadedModel:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        snapshot = SimpleNamespace(dir=folder, pinned=str(folder))
        return LoadedModel(SimpleNamespace(args=args) if args else object(), None, snapshot)  # type: ignore[arg-type]

    assert context_limit(loaded({"max_position_embeddings": 8192, "sliding_window": 4096})) == (
        8192,
        "max_position_embeddings in config.json",
    )
    assert context_limit(
        loaded({"text_config": {"max_position_embeddings": 131072}, "max_position_embeddings": 2})
    ) == (131072, "text_config.max_position_embeddings in config.json")
    assert context_limit(loaded({"n_positions": 1024})) == (1024, "n_positions in config.json")
    assert context_limit(loaded(None, SimpleNamespace(max_position_embeddings=2048))) == (
        2048,
        "the model's args.max_position_embeddings",
    )
    assert context_limit(loaded({"hidden_size": 64})) is None  # nothing says: nothing is refused
