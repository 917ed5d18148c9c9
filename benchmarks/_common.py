"""Shared pieces: medians, the out-of-process fake hub, deterministic content, RSS readings."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests" / "support"
BLOCK = 1 << 20


# -- reporting ----------------------------------------------------------------------------------
def median(xs: list[float]) -> float:
    return statistics.median(xs)


def verdict(met: bool) -> str:
    return "MET" if met else "NOT MET"


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def header(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


# -- deterministic content ----------------------------------------------------------------------
def pattern_blocks(size: int, seed: int, start: int = 0) -> Iterator[bytes]:
    """Deterministic, incompressible-enough content, produced 1 MiB at a time.

    Block i is a fixed random MiB (from `seed`) whose first 8 bytes are i: every block differs,
    any process can regenerate any range without holding the file. `start` must be block-aligned.
    """
    if start % BLOCK:
        raise ValueError("start must be a multiple of 1 MiB")
    base = random.Random(seed).randbytes(BLOCK)
    tail = base[8:]
    i = start // BLOCK
    left = size - start
    while left > 0:
        block = i.to_bytes(8, "little") + tail
        if left < BLOCK:
            block = block[:left]
        yield block
        left -= len(block)
        i += 1


def make_content(spec: dict[str, Any]) -> bytes:
    """Bytes for one file spec: {"size", "gen": "random"|"pattern"|"text", "seed"}."""
    size, gen, seed = spec["size"], spec.get("gen", "random"), spec.get("seed", 0)
    if gen == "random":
        return random.Random(seed).randbytes(size)
    if gen == "pattern":
        return b"".join(pattern_blocks(size, seed))
    if gen == "text":
        line = f'{{"bench": true, "seed": {seed}}}\n'.encode()
        return (line * (size // len(line) + 1))[:size]
    raise ValueError(f"unknown gen {gen!r}")


# -- the fake hub in its own process ------------------------------------------------------------
class HubProcess:
    """tests/support/fakehub.FakeHub running in a child process (its own GIL), driven by JSON lines.

    spec = {"repos": [{"repo_id": ..., "files": [{"path", "size", "gen", "seed"}]}]}
    After start: .endpoint, .repos[repo_id] = {"commit", "files": {path: {"size", "sha256"}}}.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.repos: dict[str, Any] = {}

    def __enter__(self) -> HubProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(TESTS_DIR), env.get("PYTHONPATH")]))
        env.pop("LD_PRELOAD", None)  # the server needs no BLAS
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._hubproc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        try:
            ready = self._send(self.spec)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self.endpoint = ready["endpoint"]
        self.repos = ready["repos"]
        return self

    def _send(self, msg: dict[str, Any]) -> Any:
        assert self.proc and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fake hub process died (rc={self.proc.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"fake hub process: {reply['error']}")
        return reply["result"]

    def call(self, op: str, **kw: Any) -> Any:
        return self._send({"op": op, **kw})

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            self.call("close")
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# -- memory ---------------------------------------------------------------------------------------
def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / VmHWM in bytes from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hf_env(hf_home: Path) -> dict[str, str]:
    """Environment for a client talking to the fake hub: no progress bars, telemetry, xet or token."""
    return {
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
        "HF_HOME": str(hf_home),
    }


def isolate_hub_env(hf_home: Path) -> None:
    """Apply hf_env to this process and drop variables that would point clients elsewhere."""
    for k in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
        os.environ.pop(k, None)
    os.environ.update(hf_env(hf_home))
