"""kl_gate: what the KL gate costs on the embedded model, and what its compact reference gives up.

Three measurements, each printed with its goal:
1. wall time: a prefill KL gate over N prompts x T tokens (reference arm computed; then again
   with the reference from the cache) against 2 x the raw mlx_lm forward over the same token ids
   (`mx.eval(model(x))` per sequence). Repeats are interleaved (raw, computed, cached, raw, ...)
   so drift in machine speed hits all three alike; medians are quoted.
   Goals: computed / (2 x raw) <= 1.10, cached / (2 x raw) <= 0.60.
2. peak RSS with 64 vs 16 prompts, each in a fresh subprocess, the high-water mark reset after
   the model is loaded (Linux /proc/self/clear_refs) so that loading's peak cannot hide the gate's:
   the arms stream one sequence's logits at a time, so the prompt count must barely matter.
   Goal: ratio <= 1.2.
3. the reference cache's compaction error: for real drifts (8-bit and 4-bit KV cache on the
   serving path, an attention softmax scale 2% too large on prefill) the exact full-vocabulary KL (float64)
   against the KL the gate computes from the compact reference; printed: both means, the
   largest per-token absolute and relative error, and the entry size on disk.
   Goal: the error is below 5% of the gate's mean KL (the gates' limits leave 4x and more).
4. `--only vocab`: the KL gate at gemma-4's 262,144-token vocabulary: a tiny random gemma-4 at that
   vocabulary (tests/support/tinygemma.py) vs the embedded model (49,152), 16 and 64 prompts x 256
   tokens on the prefill path, each in a fresh process: peak RSS growth over the loaded model and
   ms per scored position (both arms). The gate streams one sequence at a time, so a 5x wider
   vocabulary may cost time per position, never memory that grows with the prompt count.
   Goal: peak RSS 64/16 <= 1.2 for each model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import REPO_ROOT, header, median, verdict

TIME_GOAL, CACHED_GOAL, RSS_GOAL = 1.10, 0.60, 1.2


def _load(path: Path | None = None) -> Any:
    import mlx_lm

    from pytest_mlxgate.models.embedded import EMBEDDED_REPO_ID, ensure_embedded_snapshot
    from pytest_mlxgate.models.loaded import LoadedModel
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    path = path or ensure_embedded_snapshot()
    model, tokenizer = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(
        name="smollm2-135m", kind="embedded", repo_id=EMBEDDED_REPO_ID, commit=path.name, path=str(path)
    )
    return LoadedModel(model, tokenizer, snap)


def _run(loaded: Any, lever: Any, shape: Any, n: int, cache_dir: Path | None) -> Any:
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
    from pytest_mlxgate.kl.refcache import ReferenceCache
    from pytest_mlxgate.models.device import blas_in_use
    from pytest_mlxgate.session.paired_run import PairedRun

    seqs = build_sequences(default_prompts(), loaded.tokenizer, n=n, tokens=shape.tokens)
    return PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=loaded,
        reference=None,
        machine={"device": "cpu", "blas": blas_in_use()},
        cache=ReferenceCache(cache_dir) if cache_dir else None,
        allow_untrained=True,
    )  # the random-weight gemma-4 measures the machinery


def _neutral(path: str = "prefill") -> Any:
    from pytest_mlxgate.levers.lever import Lever

    return Lever(name="noop", kind="env", target="MLXGATE_BENCH_UNUSED", ref="0", cand="1", path=path)  # type: ignore[arg-type]


def wall_time(n: int, tokens: int, repeats: int) -> None:
    import mlx.core as mx

    from pytest_mlxgate.kl.shape import RunShape

    header(f"kl_gate wall time: {n} prompts x {tokens} tokens, prefill path, {repeats} interleaved repeats")
    loaded = _load()
    shape = RunShape(path="prefill", tokens=tokens, decode=1)
    seqs = _run(loaded, _neutral(), shape, n, None).sequences
    xs = [mx.array(list(s.ids[:tokens]), dtype=mx.int32)[None] for s in seqs]
    mx.eval(loaded.model(xs[0]))  # warm-up
    raw, computed, cached = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for x in xs:
            mx.eval(loaded.model(x))
        raw.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as tmp:
            run = _run(loaded, _neutral(), shape, n, Path(tmp))
            t0 = time.perf_counter()
            run.kl()
            computed.append(time.perf_counter() - t0)
            again = _run(loaded, _neutral(), shape, n, Path(tmp))
            t0 = time.perf_counter()
            result = again.kl()
            cached.append(time.perf_counter() - t0)
            assert result.reference_source == "cache"
    r, c, h = median(raw), median(computed), median(cached)
    print(f"raw forward (1 arm): median {r:.2f} s   [{', '.join(f'{x:.2f}' for x in raw)}]")
    print(
        f"KL gate, reference computed: median {c:.2f} s -> {c / (2 * r):.3f} x (2 x raw)  "
        f"goal <= {TIME_GOAL}: {verdict(c / (2 * r) <= TIME_GOAL)}"
    )
    print(
        f"KL gate, reference cached:   median {h:.2f} s -> {h / (2 * r):.3f} x (2 x raw)  "
        f"goal <= {CACHED_GOAL}: {verdict(h / (2 * r) <= CACHED_GOAL)}"
    )


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_child(n: int, tokens: int, model_dir: str | None = None) -> None:
    """Peak RSS of the gate alone: Linux lets a process reset its high-water mark (clear_refs 5)
    after the model is loaded, so loading's own peak cannot hide the gate's."""
    from pytest_mlxgate.kl.shape import RunShape

    loaded = _load(Path(model_dir) if model_dir else None)
    import mlx.core as mx

    mx.eval(loaded.model.parameters())
    Path("/proc/self/clear_refs").write_text("5")
    before = _vm("VmRSS")
    t0 = time.perf_counter()
    result = _run(loaded, _neutral(), RunShape(path="prefill", tokens=tokens, decode=1), n, None).kl()
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "peak_kib": _vm("VmHWM"),
                "after_load_kib": before,
                "seconds": seconds,
                "positions": int(result.stats.n_tokens),
            }
        )
    )


def peak_rss(tokens: int) -> None:
    header(f"kl_gate peak RSS: 64 vs 16 prompts x {tokens} tokens, each in a fresh process")
    out = {}
    for n in (16, 64):
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.kl_gate", "--rss-child", str(n), "--tokens", str(tokens)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            env=os.environ.copy(),
        )
        out[n] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{n:>3} prompts: peak RSS during the gate {out[n]['peak_kib'] / 1024:.0f} MiB "
            f"(model loaded: {out[n]['after_load_kib'] / 1024:.0f} MiB; "
            f"growth {(out[n]['peak_kib'] - out[n]['after_load_kib']) / 1024:.0f} MiB)"
        )
    ratio = out[64]["peak_kib"] / out[16]["peak_kib"]
    print(f"ratio 64/16: {ratio:.3f}  goal <= {RSS_GOAL}: {verdict(ratio <= RSS_GOAL)}")


def _child(n: int, tokens: int, model_dir: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.kl_gate", "--rss-child", str(n), "--tokens", str(tokens)]
    if model_dir is not None:
        cmd += ["--model-dir", str(model_dir)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=True, env=os.environ.copy())
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def big_vocabulary(tokens: int) -> None:
    from ._common import TESTS_DIR

    header(f"kl_gate at a 262,144-token vocabulary: tiny gemma-4 vs the embedded model, 16 and 64 prompts x {tokens}")
    sys.path.insert(0, str(TESTS_DIR))
    from tinygemma import build_tiny_gemma4

    with tempfile.TemporaryDirectory() as tmp:
        gemma = build_tiny_gemma4(Path(tmp) / "gemma", vocab=262_144)
        for label, model_dir in (("embedded (49,152)", None), ("tiny gemma-4 (262,144)", gemma)):
            runs = {n: _child(n, tokens, model_dir) for n in (16, 64)}
            for n, r in runs.items():
                growth = (r["peak_kib"] - r["after_load_kib"]) / 1024
                print(
                    f"{label:24} {n:>3} prompts: peak RSS growth {growth:6.0f} MiB (peak {r['peak_kib'] / 1024:.0f} "
                    f"MiB), {1000 * r['seconds'] / r['positions']:.2f} ms per scored position"
                )
            ratio = runs[64]["peak_kib"] / runs[16]["peak_kib"]
            print(f"{label:24} peak RSS 64/16: {ratio:.3f}  goal <= {RSS_GOAL}: {verdict(ratio <= RSS_GOAL)}")


def compaction_error(n: int, tokens: int) -> None:
    """Exact float64 KL vs the gate's KL from the compact reference, on real drifts."""
    import numpy as np

    from pytest_mlxgate.kl.arms import sequence_logits
    from pytest_mlxgate.kl.refcache import ReferenceCache
    from pytest_mlxgate.kl.shape import RunShape
    from pytest_mlxgate.levers.lever import Lever
    from pytest_mlxgate.stats.divergence import compact_reference, compare, exact_kl

    header(f"kl_gate compaction error: exact vs compact-reference KL, {n} prompts x {tokens} tokens")
    loaded = _load()
    cases = [
        (
            "kv 8-bit (serving)",
            Lever(name="kv", kind="kv", target=None, ref="plain", cand="bits=8,group_size=64,start=0", path="serving"),
        ),
        (
            "kv 4-bit (serving)",
            Lever(name="kv", kind="kv", target=None, ref="plain", cand="bits=4,group_size=64,start=0", path="serving"),
        ),
        (
            "attention, softmax scale +2% (prefill)",
            Lever(
                name="attention",
                kind="patch",
                target="mlx.core.fast.scaled_dot_product_attention",
                ref=None,
                cand="benchmarks.kl_gate:slightly_hot_attention",
                path="prefill",
            ),
        ),
    ]
    for label, lever in cases:
        shape = RunShape(path=lever.path, tokens=tokens, decode=min(32, tokens // 2))
        run = _run(loaded, lever, shape, n, None)
        exact, approx, kept = [], [], []
        for seq in run.sequences:
            with lever.applied("reference"):
                ref, _ = sequence_logits(loaded.model, seq.ids, shape, lever.kv_plan("reference"))
            with lever.applied("candidate"):
                cand, _ = sequence_logits(loaded.model, seq.ids, shape, lever.kv_plan("candidate"))
            compact = compact_reference(ref.logits, ref.next_tokens, logits_dtype=ref.dtype)
            exact.append(exact_kl(ref.logits, cand.logits))
            approx.append(compare(compact, cand.logits, cand.next_tokens, cand.positions).kl)
            kept.append(np.diff(compact.offsets))
        e, a = np.concatenate(exact), np.concatenate(approx)
        err = np.abs(e - a)
        with tempfile.TemporaryDirectory() as tmp:
            refs = [compact_reference(*_ref(loaded, lever, shape, s)) for s in run.sequences[:4]]
            size = ReferenceCache(Path(tmp)).store({"bench": label}, refs).stat().st_size / (4 * shape.scored)
        print(
            f"{label}: mean KL exact {e.mean():.3e} vs compact {a.mean():.3e} "
            f"(relative {abs(e.mean() - a.mean()) / max(e.mean(), 1e-30):.2e}); per-token max |err| {err.max():.2e}, "
            f"p99 KL exact {np.quantile(e, 0.99):.3e} vs {np.quantile(a, 0.99):.3e}; "
            f"kept {np.median(np.concatenate(kept)):.0f} ids/position (median), "
            f"{size / 1024:.1f} KiB per position on disk (x 16,384 positions for 64 x 256)  "
            f"goal <5% of mean: {verdict(abs(e.mean() - a.mean()) <= 0.05 * e.mean())}"
        )


def slightly_hot_attention(q: Any, k: Any, v: Any, *, scale: float, **kw: Any) -> Any:
    """Fused attention with a softmax scale 2% too large: a small, real drift on the prefill path."""
    from pytest_mlxgate.levers.reference_ops import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, scale=scale * 1.02, **kw)


def _ref(loaded: Any, lever: Any, shape: Any, seq: Any) -> tuple[Any, Any]:
    from pytest_mlxgate.kl.arms import sequence_logits

    with lever.applied("reference"):
        out, _ = sequence_logits(loaded.model, seq.ids, shape, lever.kv_plan("reference"))
    return out.logits, out.next_tokens


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="kl_gate")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rss-child", type=int, default=None)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["time", "rss", "error", "vocab"], default=None)
    args = parser.parse_args(argv)
    if args.rss_child is not None:
        rss_child(args.rss_child, args.tokens, args.model_dir)
        return
    if args.only in (None, "time"):
        wall_time(args.prompts, args.tokens, args.repeats)
    if args.only in (None, "rss"):
        peak_rss(128)
    if args.only in (None, "error"):
        compaction_error(8, 128)
    if args.only in (None, "vocab"):
        big_vocabulary(args.tokens)


if __name__ == "__main__":
    main(sys.argv[1:])
