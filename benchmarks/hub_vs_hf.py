"""hub_vs_hf: wall time of our snapshot_download vs huggingface_hub's, same repo, same server, one run.

A ~194 MiB repo (4 x 48 MiB LFS shards, a 2 MiB LFS tokenizer, three small git files; random bytes
made once) is served over loopback by tests/fakehub.FakeHub in a separate process (its own GIL).
Each repeat downloads it into a fresh cache dir with each client, the order alternating (ours
first on even repeats, hf first on odd ones) so both share the machine's drift; the cache dir is
removed after each download, and os.sync() runs before each (untimed) so one run's write-back
does not land in the next one's time; nothing is dropped (the page cache is left alone). One
uncounted warm-up download per client comes first (imports, first connections). Both clients
use 8 download threads. Note the clients differ in durability: ours fsyncs every blob and its
directory before publishing it; huggingface_hub does not fsync (its bytes may still be in the
page cache when it returns).
Goal: median(ours) / median(hf) <= 1.0.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import HubProcess, header, isolate_hub_env, median, mib, verdict

REPO = "bench/hub-vs-hf"
WORKERS = 8  # huggingface_hub's default max_workers and our RetryPolicy.workers default
GOAL = 1.0


def repo_spec(shard_mib: int, shards: int) -> dict[str, Any]:
    files = [
        {
            "path": f"model-{i + 1:05d}-of-{shards:05d}.safetensors",
            "size": shard_mib << 20,
            "gen": "random",
            "seed": 100 + i,
        }
        for i in range(shards)
    ]
    files += [
        {"path": "tokenizer.json", "size": 2 << 20, "gen": "random", "seed": 7},  # >= 1 KiB: LFS
        {"path": "config.json", "size": 700, "gen": "text", "seed": 1},  # < 1 KiB: plain git files
        {"path": "generation_config.json", "size": 180, "gen": "text", "seed": 2},
        {"path": "README.md", "size": 900, "gen": "text", "seed": 3},
    ]
    return {"repos": [{"repo_id": REPO, "files": files}]}


def _cpu() -> float:
    """CPU seconds (user + sys, all threads) of this process: the client only, the server is elsewhere."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _check(snap: Path, files: dict[str, Any]) -> None:
    for path, info in files.items():
        size = (snap / path).stat().st_size
        if size != info["size"]:
            raise RuntimeError(f"{snap / path}: {size} bytes, expected {info['size']}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks hub_vs_hf")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shard-mib", type=int, default=48)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args(argv)

    header("hub_vs_hf: our snapshot_download vs huggingface_hub's, same fake hub (separate process)")
    tmp = Path(tempfile.mkdtemp(prefix="mlxgate-bench-hub-"))
    try:
        isolate_hub_env(tmp / "hf_home")  # before huggingface_hub is imported: it reads env at import
        import huggingface_hub
        from huggingface_hub import snapshot_download as hf_snapshot_download

        from pytest_mlxgate.hub import snapshot_download as our_snapshot_download
        from pytest_mlxgate.hub.transport import RetryPolicy

        policy = RetryPolicy(workers=WORKERS)
        t0 = time.perf_counter()
        with HubProcess(repo_spec(args.shard_mib, args.shards)) as hub:
            files = hub.repos[REPO]["files"]
            total = sum(f["size"] for f in files.values())
            print(
                f"repo: {len(files)} files, {mib(total)} (served from pid {hub.proc.pid}, "
                f"set up in {time.perf_counter() - t0:.1f}s); huggingface_hub {huggingface_hub.__version__}"
            )
            print(f"parallelism: ours RetryPolicy.workers={policy.workers}, hf max_workers={WORKERS}")

            clients: dict[str, Callable[[Path], Path]] = {
                "ours": lambda cache: our_snapshot_download(
                    REPO, endpoint=hub.endpoint, cache_dir=cache, policy=policy
                ),
                "hf": lambda cache: Path(
                    hf_snapshot_download(REPO, endpoint=hub.endpoint, cache_dir=cache, max_workers=WORKERS)
                ),
            }
            times: dict[str, list[float]] = {"ours": [], "hf": []}
            last: dict[str, float] = {}
            cpu: dict[str, list[float]] = {"ours": [], "hf": []}
            traffic: dict[str, Any] = {}
            for rep in range(-1, args.repeats):  # -1: warm-up, not counted
                order = ["ours", "hf"] if rep % 2 == 0 else ["hf", "ours"]
                for name in order:
                    cache = tmp / f"cache-{name}-{rep}"
                    hub.call("reset_log")
                    gc.collect()
                    os.sync()  # earlier runs' write-back must not land in this run's time
                    cpu0 = _cpu()
                    start = time.perf_counter()
                    snap = clients[name](cache)
                    elapsed = time.perf_counter() - start
                    cpu_used = _cpu() - cpu0
                    _check(snap, files)
                    served = hub.call("bytes_served", repo_id=REPO)
                    traffic[name] = (served, hub.call("requests"))
                    shutil.rmtree(cache)
                    last[name] = elapsed
                    if rep >= 0:
                        times[name].append(elapsed)
                        cpu[name].append(cpu_used)
                print(
                    f"  {f'repeat {rep + 1}' if rep >= 0 else 'warm-up'} ({' then '.join(order)}): "
                    + ", ".join(f"{n} {last[n]:.3f}s" for n in ("ours", "hf")),
                    flush=True,
                )

        for name in ("ours", "hf"):
            served, reqs = traffic[name]
            print(
                f"{name:>4}: median {median(times[name]):.3f}s over {len(times[name])} "
                f"(min {min(times[name]):.3f}, max {max(times[name]):.3f}); "
                f"{total / median(times[name]) / (1 << 20):.0f} MiB/s; client CPU (user+sys) median "
                f"{median(cpu[name]):.3f}s; server sent {mib(served)}; "
                f"requests {dict(sorted(reqs.items()))}"
            )
        ratio = median(times["ours"]) / median(times["hf"])
        paired = median([o / h for o, h in zip(times["ours"], times["hf"], strict=True)])
        print(
            f"ratio ours/hf = {ratio:.2f} (median of per-repeat ratios: {paired:.2f}); "
            f"goal <= {GOAL:.1f}: {verdict(ratio <= GOAL)}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
