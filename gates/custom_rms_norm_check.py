"""Check `custom_rms_norm.rms_norm` against `mx.fast.rms_norm` on this machine's GPU, no model needed.

    python gates/custom_rms_norm_check.py          # on a Mac, or on Linux after `pip install mlx[cuda]`

Each case (row length D in 64, 576, 2048, 2560, 4097; float32, float16, bfloat16; a weight of
x's dtype, none, or a float32 weight over half-precision x; leading shapes; a strided x) prints the
largest absolute difference from `mx.fast.rms_norm` and from a float64 NumPy RMSNorm, and
pass/fail. Allowed: against MLX, 1e-5 relative in float32 (both accumulate in float32, in other
orders) and 3 units of the dtype's roundoff in float16/bfloat16 (MLX rounds twice, this kernel
once); against float64, this kernel's one rounding (1 unit) plus what its float32 sum and scaling
can lose (16 + D/threads units of 2^-24, see `compare`). Exit 1 on any failure (a compile error
included: its log is printed); on a machine with neither Metal nor CUDA it prints why it cannot
run and exits 0.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import mlx.core as mx
import numpy as np
from custom_rms_norm import SKIP_REASON, kernel_backend, launch_threads, rms_norm  # gates/ is sys.path[0] as a script

EPS = 1e-5
U32 = 2.0**-24
#: unit roundoff (half an ulp at 1) of each output dtype
ROUNDOFF = {mx.float32: U32, mx.float16: 2.0**-11, mx.bfloat16: 2.0**-8}
TINY = {mx.float32: 1.2e-38, mx.float16: 6.2e-5, mx.bfloat16: 1.2e-38}


def cases() -> list[tuple[str, tuple[int, ...], Any, str, bool]]:
    """(label, x shape, x dtype, weight kind: 'same' | 'none' | 'float32', strided x)."""
    out: list[tuple[str, tuple[int, ...], Any, str, bool]] = []
    for d in (64, 576, 2048, 2560, 4097):
        for dtype in (mx.float32, mx.float16, mx.bfloat16):
            for weight in ("same", "none") + (("float32",) if dtype != mx.float32 else ()):
                shape = (3, 5, d) if d in (576, 4097) else (7, d)
                out.append((f"D={d} {dtype} weight={weight}", shape, dtype, weight, False))
    out.append(("D=576 float16 decode row (1, 1, D)", (1, 1, 576), mx.float16, "same", False))
    out.append(("D=2048 bfloat16 strided x", (4, 2048), mx.bfloat16, "same", True))
    out.append(("D=7 float32 (fewer elements than threads)", (3, 7), mx.float32, "same", False))
    return out


def _numpy(a: Any) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def make_inputs(shape: tuple[int, ...], dtype: Any, weight_kind: str, strided: bool, key: int) -> tuple[Any, Any]:
    """x ~ N(0, 9) of `shape` (every other row of a taller array when `strided`) and a weight ~ 1 + N(0, 0.04)."""
    k1, k2 = mx.random.split(mx.random.key(key))
    if strided:  # not row-contiguous
        x = (mx.random.normal((shape[0] * 2, *shape[1:]), key=k1) * 3).astype(dtype)[::2]
    else:
        x = (mx.random.normal(shape, key=k1) * 3).astype(dtype)
    if weight_kind == "none":
        return x, None
    w_dtype = dtype if weight_kind == "same" else mx.float32
    return x, (1 + 0.2 * mx.random.normal((shape[-1],), key=k2)).astype(w_dtype)


def compare(x: Any, w: Any, ours: Any, eps: float = EPS) -> tuple[bool, str]:
    """Whether `ours` is rms_norm(x, w, eps) to the tolerances above, and the largest differences."""
    theirs = mx.fast.rms_norm(x, w, eps)
    mx.eval(ours, theirs)
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return False, f"dtype/shape {ours.dtype} {ours.shape} vs mx.fast's {theirs.dtype} {theirs.shape}"
    xs = _numpy(x)
    exact = xs / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + eps)
    if w is not None:
        exact = exact * _numpy(w)
    o, t = _numpy(ours), _numpy(theirs)
    u, tiny = ROUNDOFF[ours.dtype], TINY[ours.dtype]
    d = x.shape[-1]
    # float32's share: each thread sums ceil(D / threads) squares in a row, then two trees of <= 5 levels
    # (<= that many + 10 roundings on a sum of positive terms), halved by the square root; rsqrt, the
    # division by D and the products add a few more: 16 + terms units of 2^-24 bound it.
    f32 = (16 + -(-d // launch_threads(d))) * U32
    if ours.dtype == mx.float32:
        vs_mlx = 1e-5 * np.abs(t) + 1e-6
        vs_exact = (u + f32) * np.abs(exact) + 1e-6
    else:
        vs_mlx = (3 * u + f32) * np.abs(exact) + tiny
        vs_exact = (u + f32) * np.abs(exact) + tiny
    err_mlx, err_exact = np.abs(o - t), np.abs(o - exact)
    ok = bool(np.all(np.isfinite(o)) and np.all(err_mlx <= vs_mlx) and np.all(err_exact <= vs_exact))
    worst = int(np.argmax(err_mlx / vs_mlx))
    return ok, (
        f"max |ours - mx.fast| {err_mlx.max():.3g}, max |ours - float64| {err_exact.max():.3g} "
        f"(worst vs mx.fast at flat index {worst}: {o.flat[worst]:.6g} vs {t.flat[worst]:.6g})"
    )


def run_case(shape: tuple[int, ...], dtype: Any, weight_kind: str, strided: bool, key: int) -> tuple[bool, str]:
    x, w = make_inputs(shape, dtype, weight_kind, strided, key)
    return compare(x, w, rms_norm(x, w, EPS))


def main() -> int:
    backend = kernel_backend()
    if backend is None:
        print(f"custom_rms_norm_check: skipped: {SKIP_REASON}")
        return 0
    version = mx.__version__  # type: ignore[attr-defined]  # mlx.core's stubs lack it
    print(f"custom_rms_norm_check: backend {backend}, mlx {version}, {mx.default_device()}")
    failed = 0
    for i, (label, shape, dtype, weight, strided) in enumerate(cases()):
        try:
            ok, detail = run_case(shape, dtype, weight, strided, key=i)
        except Exception:  # a compile or launch error: show it all, it is what the next fix needs
            ok, detail = False, "raised:\n" + traceback.format_exc()
        failed += not ok
        print(f"{'pass' if ok else 'FAIL'}  {label} {shape}: {detail}")
    total = len(cases())
    print(f"{total - failed} passed, {failed} failed")
    if not failed:
        print(decode_timing())
    return 1 if failed else 0


def decode_timing(calls: int = 500) -> str:
    """Per-call time of one decode-shaped norm, evaluated each call: what the gate's speed test will feel
    (a decode step runs ~2 norms per layer; MLX's is one C++ call, ours adds its Python wrapper)."""
    import time

    x, w = make_inputs((1, 1, 576), mx.float16, "same", False, key=0)
    mx.eval(x, w)
    timings = {}
    for name, fn in (("ours", rms_norm), ("mx.fast", mx.fast.rms_norm)):
        for _ in range(20):
            mx.eval(fn(x, w, EPS))
        start = time.perf_counter()
        for _ in range(calls):
            mx.eval(fn(x, w, EPS))
        timings[name] = (time.perf_counter() - start) / calls * 1e6
    return (
        f"timing (not a verdict): (1, 1, 576) float16, {calls} calls evaluated one by one: ours "
        f"{timings['ours']:.1f} us, mx.fast {timings['mx.fast']:.1f} us per call"
    )


if __name__ == "__main__":
    sys.exit(main())
