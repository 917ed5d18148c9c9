"""Gate: this project's own RMSNorm kernel (`gates/custom_rms_norm.py`) vs MLX's `mx.fast.rms_norm`.

The custom-kernel gate: a real kernel written with `mx.fast.metal_kernel` (Apple GPUs) and
`mx.fast.cuda_kernel` (NVIDIA), patched over `mlx.core.fast.rms_norm` everywhere it is bound in
the candidate arm; the reference arm keeps MLX's own fused kernel. Serving path: the prefix
prefilled through the cache, then the last 32 tokens decoded one at a time, where a norm runs on
one row per layer per token and launch cost, not bandwidth, decides its speed.

Where it runs: only where MLX has its Metal or CUDA backend. Everywhere else (this project's Linux
CPU machines) the module is skipped before any fixture runs, with a reason naming what it needs
and what the machine has: no model loads. On a new GPU machine run the quicker check first:
`python gates/custom_rms_norm_check.py` (the kernel against `mx.fast.rms_norm` over shapes and
dtypes, no model; exit 1 on a mismatch or a compile error, whose log it prints).

What was and was not run. No Metal or CUDA machine has run this kernel or this gate yet.
- Run (tests/levers/test_custom_kernel_gate.py, on every CI run where the tools exist): the launch
  rms_norm makes (grid in threads, one group per row, template arguments, dtypes), recorded in place
  of MLX's kernel object; the Metal source exactly as MLX generates it (traced by
  `mx.export_function`, which needs no Metal device); the CUDA source as MLX's `cuda_kernel` wraps
  it, compiled to PTX by nvcc for every dtype pair; both bodies run under a C++ stand-in for a GPU
  (threads, barriers, simdgroup/warp sums) on that launch, agreeing with `mx.fast.rms_norm` and a
  float64 RMSNorm, and catching a planted off-by-one in the sum.
- Run once, by hand, in the session that wrote it: the CUDA source compiled by NVRTC (what MLX's
  CUDA backend JIT-compiles with) with MLX's own flags and device headers, for sm_90a, sm_80 and
  compute_75, every dtype pair: no error, no warning.
- Not run: Apple's Metal compiler, any GPU, this gate's KL and speed.

How the limits were set. They are NOT measured (no GPU here): they come from what two
float32-accumulated RMSNorms can differ by.
- Both sum x² in float32, in different orders (this kernel: a strided sum per thread, then across a
  simdgroup/warp, then one partial per simdgroup/warp; MLX: vectors of 4-8 per thread, then the same
  two levels), so 1/rms differs by a few float32 ulps (~1e-7 relative) for rows of 576 to 4096. In a
  float32 model (the embedded one) that is the whole difference; in float16/bfloat16 this kernel
  rounds x·rsqrt·weight once where MLX rounds twice (x·rsqrt to the dtype, then its product with the
  weight), so outputs may differ by one unit in the last place, here and there.
- Carried through the model's 30 layers, rounding-level differences in the norms are the noise the
  attention gate's limits already accept: mean KL 1e-4, p99 1e-3, top-1 99% leave orders of
  magnitude of room above float32 rounding and sit far below what a real bug (a lost weight, a wrong
  row length, a missing element in the sum) does to every token.
- KNOWN_BAD, the kernel's mean square over half of each row (`custom_rms_norm.rms_norm_half_row`, what
  a launch with half the threads per row computes), must fail them: `--mlx-calibrate` measures it where
  the gate runs, and a model no calibration covers proves the limits on it first.
- Size them on the hardware: `pytest gates/test_custom_kernel.py --mlx-calibrate` on a Mac or a CUDA
  machine measures the lever's drift, the A/A floor and speed, prints the calls to paste here, and
  writes them to `gates/calibration/test_custom_kernel.json` (none yet: the calibration files' test
  skips this module where it does not run).

Speed: `assert_faster(paired, decode=0.95)`, a "not slower" guard, not a speed-up claim. This
kernel does what MLX's does (one row per group, a two-level float32 reduction) without its vector
loads, and goes through a Python wrapper where MLX's is one C++ call (the check script prints both
per-call times), so it is not expected to win; the gate holds the swap to no worse than 5% of
decode tokens/s at the longest context. Being an interval's lower end, it passes a kernel as fast
as MLX's only where the 9 pairs spread by less than ~5% (else inconclusive: add pairs with
`--mlx-speed-reps`). Replace it with what `--mlx-calibrate` shows once it has run on a GPU.
"""

from __future__ import annotations

import pytest
from custom_rms_norm import SKIP_REASON, kernel_backend, rms_norm

from pytest_mlxgate import Paired, assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.skipif(kernel_backend() is None, reason=SKIP_REASON),
    pytest.mark.mlx_lever("custom_rms_norm", patch="mlx.core.fast.rms_norm", ref=None, cand=rms_norm, path="serving"),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]


KNOWN_BAD = "custom_rms_norm:rms_norm_half_row"  # the mean square over half of each row (gates/custom_rms_norm.py)


def test_drift(paired: Paired) -> None:
    # relative=2.0: in bf16 or fp16 the kernel against the float32 oracle, at its site call by call too
    assert_kl_below(paired, mean=1e-4, p99=1e-3, top1=0.99, relative=2.0)


def test_speed(paired: Paired) -> None:
    assert_faster(paired, decode=0.95)
