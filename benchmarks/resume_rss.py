"""resume_rss: resuming a 1 GiB left-over partial costs constant client memory and only the suffix.

The fake hub (separate process: it holds the ~1 GiB file in memory, so its RSS is not ours) serves
bench/resume with one LFS file of 1 GiB + 3 MiB + 4321 bytes, made of deterministic blocks that
this process regenerates as a stream. The first 1 GiB is written (and fsynced, like a partial left
by an earlier run) as blobs/<sha256>.bench.mlxgate-partial in a fresh cache. A fresh child process
then imports the downloader, does one warm-up snapshot_download of a tiny repo (so first-use
imports and client set-up are not counted), resets its peak-RSS mark (/proc/self/clear_refs),
reads VmRSS, calls snapshot_download, and reads VmHWM: growth = VmHWM - VmRSS before the call.
Goal: growth <= 64 MiB. Also printed: bytes the server sent (should be the suffix only), the time.
The page cache is left as it is: the child re-hashes a prefix that is probably still cached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import (
    REPO_ROOT,
    HubProcess,
    header,
    hf_env,
    mib,
    pattern_blocks,
    proc_status,
    reset_peak_rss,
    verdict,
)

REPO = "bench/resume"
TINY = "bench/tiny"
FILE = "model.safetensors"
PREFIX = 1 << 30
SIZE = PREFIX + (3 << 20) + 4321
SEED = 20240601
GOAL = 64 << 20


def spec() -> dict[str, Any]:
    return {
        "repos": [
            {
                "repo_id": REPO,
                "files": [
                    {"path": FILE, "size": SIZE, "gen": "pattern", "seed": SEED},
                    {"path": "config.json", "size": 600, "gen": "text", "seed": 1},
                ],
            },
            {
                "repo_id": TINY,
                "files": [
                    {"path": "weights.bin", "size": 64 << 10, "gen": "random", "seed": 5},
                    {"path": "config.json", "size": 300, "gen": "text", "seed": 2},
                ],
            },
        ]
    }


def write_partial(path: Path) -> str:
    """Write the first PREFIX bytes to `path` (fsynced); return the sha256 of the whole file."""
    h = hashlib.sha256()
    done = 0
    with open(path, "wb") as f:
        for block in pattern_blocks(SIZE, SEED):
            h.update(block)
            if done < PREFIX:
                f.write(block[: PREFIX - done])
            done += len(block)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def child(args: dict[str, Any]) -> None:
    """In a fresh process: warm up, then measure the resume call's peak RSS growth."""
    from pytest_mlxgate.hub import snapshot_download

    endpoint, cache = args["endpoint"], args["cache"]
    at_start = proc_status()
    snapshot_download(TINY, endpoint=endpoint, cache_dir=cache)  # warm-up: imports, client set-up
    warmed = proc_status()
    reset_ok = reset_peak_rss()
    before = proc_status()
    t0 = time.perf_counter()
    snap = snapshot_download(REPO, endpoint=endpoint, cache_dir=cache)
    elapsed = time.perf_counter() - t0
    after = proc_status()
    print(
        json.dumps(
            {
                "rss_before": before["VmRSS"],
                "hwm_before": before["VmHWM"],
                "hwm_after": after["VmHWM"],
                "rss_after": after["VmRSS"],
                "hwm_reset": reset_ok,
                "seconds": elapsed,
                "snapshot": str(snap),
                "rss_at_start": at_start["VmRSS"],
                "hwm_warmed": warmed["VmHWM"],
            }
        )
    )


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks resume_rss")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return

    header("resume_rss: resume a 1 GiB partial; client peak RSS growth and bytes re-fetched")
    tmp = Path(tempfile.mkdtemp(prefix="mlxgate-bench-resume-"))
    try:
        free = shutil.disk_usage(tmp).free
        need = SIZE + (512 << 20)
        if free < need:
            print(f"SKIPPED: {mib(free)} free under {tmp}, need {mib(need)}")
            return
        print(
            f"disk: {free / (1 << 30):.1f} GiB free under {tmp.parent}; file {SIZE} bytes, "
            f"partial {PREFIX} bytes, suffix {SIZE - PREFIX} bytes"
        )
        t0 = time.perf_counter()
        with HubProcess(spec()) as hub:
            sha = hub.repos[REPO]["files"][FILE]["sha256"]
            print(
                f"fake hub: pid {hub.proc.pid}, set up in {time.perf_counter() - t0:.1f}s, "
                f"server RSS {mib(hub.call('rss')['VmRSS'])} (not counted)"
            )
            cache = tmp / "cache"
            blobs = cache / "models--bench--resume" / "blobs"
            blobs.mkdir(parents=True)
            partial = blobs / f"{sha}.bench.mlxgate-partial"
            t0 = time.perf_counter()
            local_sha = write_partial(partial)
            if local_sha != sha:
                raise RuntimeError(f"content generator drifted: server sha256 {sha}, local {local_sha}")
            print(f"partial written and fsynced in {time.perf_counter() - t0:.1f}s: {partial.name}")

            hub.call("reset_log")
            env = dict(os.environ)
            env.update(hf_env(tmp / "hf_home"))
            for k in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
                env.pop(k, None)
            env.pop("LD_PRELOAD", None)
            cmd = [
                sys.executable,
                "-m",
                "benchmarks",
                "resume_rss",
                "--child",
                json.dumps({"endpoint": hub.endpoint, "cache": str(cache)}),
            ]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            served = hub.call("bytes_served", repo_id=REPO, path=FILE)
            reqs = hub.call("requests")

        blob = blobs / sha
        ok_blob = blob.is_file() and blob.stat().st_size == SIZE and not partial.exists()
        if ok_blob:  # the published bytes really are the file (streamed, constant memory)
            from pytest_mlxgate.hub.hashing import hash_file

            ok_blob = hash_file(blob, "sha256") == sha
        growth = r["hwm_after"] - r["rss_before"]
        print(
            f"client (child pid, fresh process): RSS before call {mib(r['rss_before'])}, "
            f"peak during call {mib(r['hwm_after'])} (peak mark reset before the call: {r['hwm_reset']}); "
            f"child RSS after imports {mib(r['rss_at_start'])}, peak through the warm-up {mib(r['hwm_warmed'])}"
        )
        print(
            f"resume call: {r['seconds']:.2f}s (child process wall {wall:.2f}s incl. start-up and warm-up); "
            f"blob published, {SIZE} bytes, sha256 checked: {ok_blob}"
        )
        print(
            f"server sent {served} bytes of {FILE} (suffix = {SIZE - PREFIX}): "
            f"{'suffix only' if served == SIZE - PREFIX else 'MORE THAN THE SUFFIX'}; "
            f"requests incl. the warm-up repo {reqs}"
        )
        print(f"peak RSS growth = {mib(growth)} (goal <= {mib(GOAL)}): {verdict(growth <= GOAL and ok_blob)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"cleaned up {tmp}: {not tmp.exists()}")
