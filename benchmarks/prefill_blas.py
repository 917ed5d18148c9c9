"""prefill_blas: SmolLM2-135M prefill tokens/s with and without the OpenBLAS preload.

The embedded GGUF is converted once (ensure_embedded_snapshot into a temp cache, removed after).
Each configuration runs in its own fresh subprocess -- LD_PRELOAD=<Debian's pthread OpenBLAS
libblas.so.3> vs LD_PRELOAD unset (MLX then uses the reference BLAS in its Linux CPU wheel) --
which loads the model with mlx_lm, prefills a 32-token prompt as a warm-up, then the 256-token
prompt `--fast-repeats` times (OpenBLAS, default 7) or `--repeats` times (reference BLAS,
default 3; ~30 s each on 2 cores, most of this benchmark's run time), with a fresh KV cache each
time and everything evaluated; medians are quoted.
The child says which BLAS it really got (pytest_mlxgate.models.device.blas_in_use, from /proc/self/maps).
Printed: both medians and the ratio with/without. Goal: with/without >= 10x, a conservative
floor under the ~20-25x that ./dev's comment and the device warning cite as the preload's reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import REPO_ROOT, header, median, verdict

PROMPT_TOKENS = 256
WARMUP_TOKENS = 32
GOAL = 10.0  # conservative floor for "OpenBLAS makes prefill an order of magnitude faster"


def openblas_lib() -> str:
    return f"/usr/lib/{platform.machine()}-linux-gnu/openblas-pthread/libblas.so.3"


def child(args: dict[str, Any]) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from pytest_mlxgate.models.device import blas_in_use

    model, tokenizer = load(args["model"])
    text = (
        "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
        "budget, the weather report promises rain in the afternoon, and a student explains "
        "how gradient descent finds the minimum of a smooth convex function. "
    )
    ids = tokenizer.encode(text * 40)[: args["tokens"]]
    if len(ids) < args["tokens"]:
        raise RuntimeError(f"prompt has only {len(ids)} tokens")
    prompt = mx.array(ids)[None]

    def prefill(tokens: mx.array) -> float:
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        logits = model(tokens, cache=cache)
        mx.eval(logits, [c.state for c in cache])
        return time.perf_counter() - t0

    # Warm-up on a short prompt: it pages the weights in and warms the allocator; a full-length
    # one would add ~30 s to the reference-BLAS run for nothing.
    warm = prefill(prompt[:, :WARMUP_TOKENS])
    times = [prefill(prompt) for _ in range(args["repeats"])]
    print(json.dumps({"blas": blas_in_use(), "warmup_s": warm, "times": times, "tokens": len(ids)}))


def run_child(model: Path, preload: bool, repeats: int) -> dict[str, Any]:
    env = dict(os.environ)
    kept = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "openblas" not in p]
    if preload:
        kept.insert(0, openblas_lib())
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    arg = json.dumps({"model": str(model), "tokens": PROMPT_TOKENS, "repeats": repeats})
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "prefill_blas", "--child", arg],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"prefill child (preload={preload}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks prefill_blas")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefills without OpenBLAS (~30 s each)")
    ap.add_argument("--fast-repeats", type=int, default=7, help="timed prefills with OpenBLAS (~1 s each)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return

    header(f"prefill_blas: SmolLM2-135M prefill of {PROMPT_TOKENS} tokens, OpenBLAS preload vs none")
    lib = openblas_lib()
    if not os.path.exists(lib):
        print(f"SKIPPED: {lib} is missing (apt-get install libopenblas0-pthread)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="mlxgate-bench-prefill-"))
    try:
        from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

        t0 = time.perf_counter()
        model = ensure_embedded_snapshot(cache_dir=tmp / "cache")
        print(
            f"model converted from the embedded GGUF in {time.perf_counter() - t0:.1f}s (float32); "
            f"{os.cpu_count()} CPUs; parent LD_PRELOAD={os.environ.get('LD_PRELOAD', '(unset)')}"
        )
        results = {}
        for preload in (True, False):
            r = run_child(model, preload, args.fast_repeats if preload else args.repeats)
            results[preload] = r
            tps = [r["tokens"] / t for t in r["times"]]
            name = "with OpenBLAS" if preload else "without (reference BLAS)"
            print(
                f"  {name}: BLAS in use = {r['blas']}; warm-up ({WARMUP_TOKENS} tokens) {r['warmup_s']:.2f}s; "
                f"runs {', '.join(f'{t:.2f}s' for t in r['times'])}; "
                f"median {median(tps):.0f} tokens/s",
                flush=True,
            )
        fast = median([results[True]["tokens"] / t for t in results[True]["times"]])
        slow = median([results[False]["tokens"] / t for t in results[False]["times"]])
        ratio = fast / slow
        ok = results[True]["blas"] == "OpenBLAS" and results[False]["blas"] != "OpenBLAS"
        print(
            f"prefill: with OpenBLAS {fast:.0f} tokens/s, without {slow:.0f} tokens/s; "
            f"ratio with/without = {ratio:.1f}x (goal >= {GOAL:.0f}x): {verdict(ratio >= GOAL and ok)}"
            + ("" if ok else " (the children did not get the BLAS asked for)")
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
