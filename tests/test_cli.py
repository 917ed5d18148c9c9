"""`mlxgate get|verify` in a subprocess: stdout carries only the result, exit codes 0/1/2.

Hub names go through the real downloader to the fake hub on loopback (`tests/support/fakehub.py`); each
subprocess gets an isolated HF_* environment whose HF_ENDPOINT refuses connections, so a command
not given `--endpoint` could never reach the internet.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub, Request

TOKEN = "hf_cli_test_token_0123456789"

# Every test here runs in the shared isolated HF_* environment (tests/conftest.py): every HF_* variable
# replaced, so no token, no cache, not offline, and HF_ENDPOINT refuses connections.
pytestmark = pytest.mark.usefixtures("hf_env")


def mlxgate(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "from pytest_mlxgate.cli import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def requests_for(hub: FakeHub, repo_id: str) -> list[Request]:
    """Every request the hub (or its CDN) got for `repo_id`: API, resolve and content."""
    return [r for r in list(hub.log) if (r.file is not None and r.file[1] == repo_id) or f"/{repo_id}/" in r.path]


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
    known = "e2b, e4b, gemma3-270m, mine, smollm2-135m"
    assert out.stderr.startswith(f"mlxgate: error: 'e5x' is not a known model; known: {known}; ")
    assert "[tool.mlxgate.aliases] in pyproject.toml" in out.stderr
    out = mlxgate(tmp_path, "verify", "org/na..me")
    assert out.returncode == 2 and "is not a valid repo id" in out.stderr
    out = mlxgate(tmp_path, "get", "org/m@v1", "--revision", "v2")
    assert out.returncode == 2 and "contradicts" in out.stderr
    out = mlxgate(tmp_path, "get", "--endpoint", "nope", "org/m")
    assert out.returncode == 2 and "not a hub endpoint" in out.stderr  # argparse's own exit 2


@pytest.mark.slow  # nine mlxgate subprocesses
def test_get_and_verify_through_the_hub(hub: FakeHub, tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "cli"}', "weights.bin": bytes(range(256)) * 8}  # 2 kB: LFS, via the CDN
    commit = hub.add_repo("cli/data", files, repo_type="dataset")
    cache = tmp_path / "cache"
    get = ("get", "cli/data", "--cache-dir", str(cache), "--dataset", "--endpoint", hub.endpoint)

    got = mlxgate(tmp_path, *get, "--offline")
    assert (got.returncode, got.stdout) == (1, "")
    assert got.stderr.startswith(f"mlxgate: offline, and dataset cli/data@main is not in the cache {cache}. ")
    assert "mlxgate get cli/data --dataset" in got.stderr  # the fix
    assert "Traceback" not in got.stderr
    got = mlxgate(tmp_path, *get, env={"HF_HUB_OFFLINE": "1"})  # no --offline: the environment decides
    assert got.returncode == 1 and "offline, and dataset cli/data@main is not in the cache" in got.stderr
    assert requests_for(hub, "cli/data") == []

    with FakeHub() as elsewhere:  # --endpoint over HF_ENDPOINT
        got = mlxgate(tmp_path, *get, env={"HF_ENDPOINT": elsewhere.endpoint})
    assert elsewhere.log == []
    snapshot = cache / "datasets--cli--data" / "snapshots" / commit
    assert (got.returncode, got.stdout) == (0, f"{snapshot}\n")
    assert got.stderr == ""  # not a TTY: no bar
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == files
    assert [r.path for r in hub.log if "/revision/" in r.path] == ["/api/datasets/cli/data/revision/main"]
    assert hub.bytes_served("cli/data") == sum(len(b) for b in files.values())

    verify = ("verify", "cli/data", "--dataset", "--cache-dir", str(cache))
    ok = mlxgate(tmp_path, *verify)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"cli/data@{commit[:7]}: 2 files, 2.1 kB re-hashed: ok\n", "")

    blob = (snapshot / "weights.bin").resolve()
    blob.write_bytes(bytes(2048))  # same size, other bytes
    bad = mlxgate(tmp_path, *verify)
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    assert lines[:2] == [
        f"cli/data@{commit[:7]}: 2 files, 2.1 kB re-hashed: 1 problem(s)",
        f"  weights.bin: content hashes to {hashlib.sha256(bytes(2048)).hexdigest()}, "
        f"not {hashlib.sha256(files['weights.bin']).hexdigest()} (corrupt blob {blob})",
    ]
    assert len(lines) == 3 and lines[2].startswith("fix: mlxgate verify cli/data") and "--repair" in lines[2]

    # The fix it prints: --repair moves the blob aside, `get` fetches that file alone again.
    fixed = mlxgate(tmp_path, *verify, "--repair")
    assert fixed.returncode == 1 and "moved aside" in fixed.stdout and "fix:" not in fixed.stdout
    hub.reset_log()
    got = mlxgate(tmp_path, *get)
    assert (got.returncode, got.stdout) == (0, f"{snapshot}\n")
    assert hub.bytes_served("cli/data") == hub.bytes_served("cli/data", "weights.bin") == 2048
    ok = mlxgate(tmp_path, *verify)
    assert (ok.returncode, ok.stdout) == (0, f"cli/data@{commit[:7]}: 2 files, 2.1 kB re-hashed: ok\n")


def test_hub_errors_exit_1_with_the_hubs_message(hub: FakeHub, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    out = mlxgate(tmp_path, "get", "cli/missing", "--cache-dir", cache, "--endpoint", hub.endpoint)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith(
        f"mlxgate: looking up model cli/missing@main: {hub.endpoint}/api/models/cli/missing/revision/main "
        "answered 404 (RepoNotFound). Check the repo id, the revision and whether it is a model or a dataset repo; "
    )
    assert out.stderr.count("\n") == 1 and out.stderr.endswith("\n")  # one line, no traceback

    hub.add_repo("cli/gated", {"config.json": b"{}"}, gated_token=TOKEN)
    out = mlxgate(tmp_path, "get", "cli/gated", "--cache-dir", cache, "--endpoint", hub.endpoint)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith(
        f"mlxgate: looking up model cli/gated@main: {hub.endpoint}/api/models/cli/gated/revision/main "
        "answered 401 (GatedRepo; no token was sent). "
        f"To fix: if the repo is gated, accept its terms on {hub.endpoint}; "
    )
    assert "HF_TOKEN" in out.stderr and out.stderr.count("\n") == 1
    out = mlxgate(
        tmp_path, "get", "cli/gated", "--cache-dir", cache, "--endpoint", hub.endpoint, env={"HF_TOKEN": TOKEN}
    )
    assert out.returncode == 0 and out.stdout.startswith(f"{cache}/models--cli--gated/snapshots/")
    assert TOKEN not in out.stdout + out.stderr
    assert len(requests_for(hub, "cli/missing")) == 1  # a 404 is not retried

    out = mlxgate(tmp_path, "verify", "cli/never-fetched", "--cache-dir", cache)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"mlxgate: model cli/never-fetched@main is not in the cache {cache}; nothing to verify\n"


def test_verify_a_local_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    out = mlxgate(tmp_path, "verify", "./model")
    assert out.returncode == 2 and "no hub checksums" in out.stderr


def test_progress_bar_only_on_a_terminal(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process: stderr pretends to be a TTY, the real downloader reports progress."""
    from pytest_mlxgate import cli

    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    commit = hub.add_repo("cli/bar", {"config.json": b'{"model_type": "tty-bar"}'})  # 25 B
    tty = TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["get", "cli/bar", "--cache-dir", str(tmp_path), "--endpoint", hub.endpoint]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'models--cli--bar' / 'snapshots' / commit}\n"
    frame = tty.getvalue().split("\r")[-1]
    assert frame.startswith("cli/bar [") and "100%" in frame and "25 B / 25 B" in frame and frame.endswith("\n")
