"""`mlxgate get|verify` in a subprocess: stdout carries only the result, exit codes 0/1/2."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import standin_hub

TESTS = Path(__file__).parent
# Runs the CLI with the stand-in hub in place of the real one (no network in these tests).
WITH_STANDIN = (
    "import standin_hub; standin_hub.install(); "
    "from pytest_mlxgate.cli import main; raise SystemExit(main())"
)


def mlxgate(
    cwd: Path, *args: str, standin: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run_env = {**os.environ, "PYTHONPATH": str(TESTS), **(env or {})}
    code = WITH_STANDIN if standin else "from pytest_mlxgate.cli import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=run_env, capture_output=True, text=True, timeout=60
    )


def test_get_local_directory_prints_only_its_path(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    out = mlxgate(tmp_path, "get", "./model")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{tmp_path / 'model'}\n", "")


def test_console_script_module_entry(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "pytest_mlxgate.cli", "get", "./model"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout == f"{tmp_path / 'model'}\n"


def test_bad_names_exit_2_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.mlxgate.aliases]\nmine = "org/mine"\n')
    out = mlxgate(tmp_path, "get", "e5x")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("mlxgate: error: 'e5x' is not a known model; known: e2b, e4b, mine, smollm2-135m; ")
    assert "[tool.mlxgate.aliases] in pyproject.toml" in out.stderr
    out = mlxgate(tmp_path, "verify", "org/na..me")
    assert out.returncode == 2 and "is not a valid repo id" in out.stderr
    out = mlxgate(tmp_path, "get", "org/m@v1", "--revision", "v2")
    assert out.returncode == 2 and "contradicts" in out.stderr
    out = mlxgate(tmp_path, "get", "--endpoint", "nope", "org/m")
    assert out.returncode == 2 and "not a hub endpoint" in out.stderr  # argparse's own exit 2


def test_get_and_verify_through_the_hub(tmp_path: Path) -> None:
    cache, log = tmp_path / "cache", tmp_path / "calls.jsonl"
    env = {"STANDIN_HUB_LOG": str(log)}
    got = mlxgate(tmp_path, "get", "org/model", "--cache-dir", str(cache), "--dataset", "--offline", standin=True, env=env)
    assert got.returncode == 1 and "not in the cache and we are offline" in got.stderr
    assert "Traceback" not in got.stderr

    got = mlxgate(tmp_path, "get", "org/model", "--cache-dir", str(cache), "--dataset", "--endpoint", "http://h.invalid",
                  standin=True, env=env)
    snapshot = cache / "datasets--org--model" / "snapshots" / standin_hub.COMMIT
    assert (got.returncode, got.stdout) == (0, f"{snapshot}\n")
    assert got.stderr == ""  # not a TTY: no bar
    call = json.loads(log.read_text().splitlines()[-1])
    assert (call["repo_type"], call["endpoint"], call["offline"]) == ("dataset", "http://h.invalid", None)

    ok = mlxgate(tmp_path, "verify", "org/model", "--dataset", "--cache-dir", str(cache), standin=True)
    assert ok.returncode == 0
    assert ok.stdout == f"org/model@{standin_hub.COMMIT[:7]}: 1 files, 25 B re-hashed: ok\n"

    (snapshot / "corrupt.bin").write_bytes(b"x")
    bad = mlxgate(tmp_path, "verify", "org/model", "--dataset", "--cache-dir", str(cache), standin=True)
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        f"org/model@{standin_hub.COMMIT[:7]}: 2 files, 26 B re-hashed: 1 problem(s)",
        "  corrupt.bin: sha256 mismatch",
    ]


def test_hub_errors_exit_1_with_the_hubs_message(tmp_path: Path) -> None:
    out = mlxgate(tmp_path, "get", "missing/model", "--cache-dir", str(tmp_path), standin=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "mlxgate: missing/model does not exist on the hub (404); check the name\n"
    out = mlxgate(tmp_path, "verify", "org/never-fetched", "--cache-dir", str(tmp_path), standin=True)
    assert out.returncode == 1 and "is not in the cache" in out.stderr


def test_verify_a_local_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    out = mlxgate(tmp_path, "verify", "./model")
    assert out.returncode == 2 and "no hub checksums" in out.stderr


def test_progress_bar_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process: stderr pretends to be a TTY, the stand-in hub reports progress."""
    from pytest_mlxgate import cli

    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = TTY()
    monkeypatch.setitem(sys.modules, "pytest_mlxgate.hub", standin_hub)
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["get", "org/model", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.endswith(f"{standin_hub.COMMIT}\n")
    frame = tty.getvalue().split("\r")[-1]
    assert frame.startswith("org/model [") and "100%" in frame and "25 B / 25 B" in frame and frame.endswith("\n")
