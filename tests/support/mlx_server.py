"""Real mlx_lm.server processes for the server-arm tests: on 127.0.0.1, a free port, a readiness probe
(`/v1/models`), stopped at teardown, and the log's tail in the error when one does not come up."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_WITHIN = 120.0  # seconds: ~10 s here for the embedded model, more under a busy xdist worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    """A started server: its base URL (no /v1), its process (to stop it mid-run) and its log."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def mlx_server(model: Path, log_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    """`python -m mlx_lm server --model MODEL ARGS` on a free port, ready; stopped on exit (ARGS starting
    `--mlxgate-reference`: the mlxgate protocol's reference server instead). `env`: variables set for it
    (mlx_lm.server's /v1/models scans the hub cache and breaks where there is none)."""
    port = free_port()
    log = log_dir / f"mlx_lm-server-{port}.log"
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--host", "127.0.0.1"]
    if args[:1] == ("--mlxgate-reference",):  # the mlxgate protocol's reference implementation instead
        command = [sys.executable, "-m", "pytest_mlxgate.remote.reference_server", "--model", str(model)]
        args = args[1:]
    command += ["--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_WITHIN
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlx_lm.server exited {proc.returncode} before it was ready: {_tail(log)}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlx_lm.server not ready within {READY_WITHIN:g} s: {_tail(log)}")
            time.sleep(0.3)
        yield RunningServer(url, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


#: mlx_lm.server's `--quantized-kv-start` when none is given: no test's prompt reaches it.
MLX_LM_KV_START = 5000
#: mlx_lm.server's 8- and 4-bit KV caches from the first token (its default start quantizes nothing at a
#: test's lengths).
KV8 = ("--kv-bits", "8", "--quantized-kv-start", "0")
KV4 = ("--kv-bits", "4", "--quantized-kv-start", "0")


def answers_by_its_cache(args: tuple[str, ...]) -> bool:
    """Whether a server started with ARGS answers a prompt according to what it has cached, not the prompt
    alone: a KV cache quantized from a token within a test's prompts. mlx_lm.server reuses the nearest cached
    prefix; a prompt computed on a reused quantized cache attends to quantized keys where a fresh one computes
    its prefill in full precision. Measured on the embedded model (4 prompts x 16 positions asked after a 4 x 8
    session): at 8 bits one prompt's top-k log-probabilities moved up to 0.15; at 4 bits its top lists
    changed and the gate's mean KL went 0.076 -> 0.115, its interval [0.052, 0.100] -> [0, 0.237]."""
    if "--kv-bits" not in args:
        return False
    start = int(args[args.index("--quantized-kv-start") + 1]) if "--quantized-kv-start" in args else MLX_LM_KV_START
    return start < MLX_LM_KV_START


def hub_env(folder: Path) -> dict[str, str]:
    """A hub cache folder for a server's /v1/models to scan (a test's HOME has none)."""
    (folder / "hub").mkdir(exist_ok=True)
    return {"HF_HUB_CACHE": str(folder / "hub")}
