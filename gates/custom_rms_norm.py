"""This project's own RMSNorm kernel, for Apple GPUs (`mx.fast.metal_kernel`) and NVIDIA GPUs (`mx.fast.cuda_kernel`).

`rms_norm(x, weight, eps, *, stream=None)` has `mx.fast.rms_norm`'s signature and semantics (last
axis, any leading shape, `weight` None or 1-D of x's last size, the result in x's and weight's
promoted dtype), so `gates/test_custom_kernel.py` can patch it over `mlx.core.fast.rms_norm` and
gate it against mlx's own kernel. Inference only: it has no vjp/jvp/vmap.

The kernel: one threadgroup (Metal) or block (CUDA) per row; each thread sums x² over a strided
slice of the row in float32, the sums meet in two levels (across a simdgroup or warp, then one
partial per simdgroup/warp summed by the first), and every element is written as
x · rsqrt(sum/D + eps) · weight, computed in float32 and rounded once to the output dtype (mlx's
kernel rounds x · rsqrt(...) to the output dtype before multiplying by the weight in that dtype:
in float16/bfloat16 the two can differ by one unit in the last place).

Written against MLX 0.32's custom-kernel API (docs/src/dev/custom_metal_kernels.rst,
mlx/backend/common/metal_kernel.cpp, mlx/backend/cuda/custom_kernel.cpp): only the body is
given, the signature is generated; `grid` counts threads, not groups; inputs arrive as pointers
(`x_shape` too when the source names it), template arguments as a Metal template or as CUDA
`using`/`constexpr` lines; Metal attributes are declared when the source names them. No GPU has
run it yet (tests/levers/test_custom_kernel_gate.py says what was checked without one):
`python gates/custom_rms_norm_check.py` compares it with `mx.fast.rms_norm` on a machine that
has one. Importing this module imports mlx; nothing is compiled until the first call.
"""

from __future__ import annotations

import functools
import platform
from typing import Any, Literal

import mlx.core as mx

__all__ = [
    "CUDA_SOURCE",
    "INPUT_NAMES",
    "MAX_THREADS",
    "METAL_SOURCE",
    "OUTPUT_NAMES",
    "SKIP_REASON",
    "Backend",
    "build_kernel",
    "kernel_backend",
    "launch_threads",
    "rms_norm",
    "rms_norm_half_row",
    "template_args",
]

Backend = Literal["metal", "cuda"]

#: The kernel's parameters, in the order the generated signature takes them.
INPUT_NAMES = ("x", "w", "eps")
OUTPUT_NAMES = ("out",)
#: Threads per row: at most 1024 (Metal's and CUDA's limit per threadgroup/block), whole
#: simdgroups/warps of 32, about 4 elements each; longer rows loop.
MAX_THREADS = 1024
_WIDTH = 32
_ELEMENTS_PER_THREAD = 4
#: `grid` is a tuple of C ints: rows x threads must fit in one.
_MAX_GRID = 2**31 - 1

# Names the generator reads from the source: x_shape (x is passed as rows x D, so x_shape[1] is D)
# and the Metal attributes below, declared because the source names them. Apple GPUs run 32-wide
# simdgroups, so 1024 threads are at most 32 of them: one `partials` slot each. x, w and out are
# indexed, never bound to a pointer of a named address space: MLX passes an input of fewer than 8
# elements as `constant`, the rest as `device`, and Metal converts neither into the other.
METAL_SOURCE = """
    const uint row = threadgroup_position_in_grid.x;
    const uint lid = thread_position_in_threadgroup.x;
    const uint nthreads = threads_per_threadgroup.x;
    const uint d = uint(x_shape[1]);
    const size_t base = size_t(row) * d;

    float acc = 0.0f;
    for (uint i = lid; i < d; i += nthreads) {
        const float v = static_cast<float>(x[base + i]);
        acc += v * v;
    }
    acc = simd_sum(acc);

    threadgroup float partials[32];
    threadgroup float inv_rms[1];
    if (thread_index_in_simdgroup == 0) {
        partials[simdgroup_index_in_threadgroup] = acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (simdgroup_index_in_threadgroup == 0) {
        const uint n_simd = (nthreads + threads_per_simdgroup - 1) / threads_per_simdgroup;
        float total = thread_index_in_simdgroup < n_simd ? partials[thread_index_in_simdgroup] : 0.0f;
        total = simd_sum(total);
        if (thread_index_in_simdgroup == 0) {
            inv_rms[0] = metal::precise::rsqrt(total / float(d) + eps[0]);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const float scale = inv_rms[0];
    for (uint i = lid; i < d; i += nthreads) {
        float v = static_cast<float>(x[base + i]) * scale;
        if (HAS_WEIGHT) {
            v *= static_cast<float>(w[i]);
        }
        out[base + i] = static_cast<OutT>(v);
    }
"""

# blockDim.x is a multiple of WARP_SIZE (launch_threads makes it so), so every shuffle has all 32
# lanes; at most 1024 threads are 32 warps: one `partials` slot each. Static shared memory
# (shared_memory=0 asks for no dynamic shared memory).
CUDA_SOURCE = """
    const size_t row = blockIdx.x;
    const int lid = threadIdx.x;
    const int nthreads = blockDim.x;
    const int d = x_shape[1];
    const size_t base = row * d;

    float acc = 0.0f;
    for (int i = lid; i < d; i += nthreads) {
        const float v = static_cast<float>(x[base + i]);
        acc += v * v;
    }
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    }

    __shared__ float partials[32];
    __shared__ float inv_rms;
    const int lane = lid % WARP_SIZE;
    const int warp = lid / WARP_SIZE;
    if (lane == 0) {
        partials[warp] = acc;
    }
    __syncthreads();
    if (warp == 0) {
        float total = lane < nthreads / WARP_SIZE ? partials[lane] : 0.0f;
        for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
            total += __shfl_xor_sync(0xffffffffu, total, offset);
        }
        if (lane == 0) {
            inv_rms = rsqrtf(total / static_cast<float>(d) + eps[0]);
        }
    }
    __syncthreads();

    const float scale = inv_rms;
    for (int i = lid; i < d; i += nthreads) {
        float v = static_cast<float>(x[base + i]) * scale;
        if (HAS_WEIGHT) {
            v *= static_cast<float>(w[i]);
        }
        out[base + i] = static_cast<OutT>(v);
    }
"""


@functools.cache
def kernel_backend() -> Backend | None:
    """ "metal" where MLX has its Metal backend, "cuda" where it has CUDA, otherwise None."""
    for name in ("metal", "cuda"):
        module = getattr(mx, name, None)
        is_available = getattr(module, "is_available", None)
        if callable(is_available) and is_available():
            return name
    return None


def _this_machine() -> str:
    device = mx.default_device()
    version = mx.__version__  # type: ignore[attr-defined]  # mlx.core's stubs lack it
    return f"{platform.system()} {platform.machine()}, mlx {version}, default device {device.type.name}"


#: Why the gate cannot run here: what it needs, and what this machine has.
SKIP_REASON = (
    "the custom RMSNorm kernel needs an MLX GPU backend: Metal (Apple silicon, mx.metal.is_available()) "
    "or CUDA (an NVIDIA GPU with `pip install mlx[cuda]`, mx.cuda.is_available()); this machine has "
    f"{kernel_backend() or 'neither'} ({_this_machine()})"
)


def launch_threads(d: int) -> int:
    """Threads per row for rows of `d` elements: whole 32-wide groups, ~4 elements each, at most 1024."""
    wanted = -(-d // _ELEMENTS_PER_THREAD)
    return max(_WIDTH, min(MAX_THREADS, -(-wanted // _WIDTH) * _WIDTH))


def template_args(x_dtype: Any, w_dtype: Any, out_dtype: Any, has_weight: bool) -> list[tuple[str, Any]]:
    """The kernel's template arguments: OutT (the result's type) and HAS_WEIGHT are used by the body; InT and
    WT only name the inputs' dtypes (the body reads through the inputs' own types), so that every dtype
    combination has its own kernel name on CUDA too, where MLX names a kernel by its template alone."""
    return [("InT", x_dtype), ("WT", w_dtype), ("OutT", out_dtype), ("HAS_WEIGHT", has_weight)]


def build_kernel(backend: Backend) -> Any:
    """Build (not compile: that happens on the first call) the kernel object for `backend`."""
    if backend == "metal":
        return mx.fast.metal_kernel(
            name="mlxgate_rms_norm", input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), source=METAL_SOURCE
        )
    if backend == "cuda":
        return mx.fast.cuda_kernel(
            name="mlxgate_rms_norm", input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), source=CUDA_SOURCE
        )
    raise ValueError(f"backend {backend!r} is neither 'metal' nor 'cuda'")


@functools.cache
def _kernel(backend: Backend) -> Any:
    return build_kernel(backend)


@functools.cache
def _eps_array(eps: float) -> Any:
    # A 1-element float32 array: `const constant float* eps` on Metal, `const float* eps` on CUDA.
    return mx.array([eps], dtype=mx.float32)


@functools.cache
def _no_weight(dtype: Any) -> Any:
    # Stands in for a None weight (HAS_WEIGHT=false: never read).
    return mx.ones((1,), dtype=dtype)


def rms_norm(x: Any, weight: Any, eps: float, *, stream: Any = None) -> Any:
    """`mx.fast.rms_norm` on this module's kernel: x · rsqrt(mean(x², last axis) + eps) · weight.

    Raises RuntimeError where MLX has neither Metal nor CUDA (see SKIP_REASON).
    """
    backend = kernel_backend()
    if backend is None:
        raise RuntimeError(f"custom_rms_norm.rms_norm cannot run here: {SKIP_REASON}")
    if x.ndim == 0:
        raise ValueError("rms_norm: x must have at least 1 dimension (the normalized last axis); got a scalar")
    d = x.shape[-1]
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != d):
        raise ValueError(
            f"rms_norm: weight must be one-dimensional with x's last dimension ({d}); got shape {weight.shape}"
        )
    out_dtype = x.dtype if weight is None else mx.result_type(x, weight)
    if not mx.issubdtype(out_dtype, mx.floating):
        raise ValueError(f"rms_norm: the result dtype {out_dtype} is not a floating type; pass floating arrays")
    if x.size == 0:
        return mx.zeros(x.shape, dtype=out_dtype)
    rows = x.size // d
    threads = launch_threads(d)
    if rows * threads > _MAX_GRID:
        raise ValueError(
            f"rms_norm: {rows} rows x {threads} threads exceed one launch's grid ({_MAX_GRID} "
            "threads); normalize the rows in slices"
        )
    w = weight if weight is not None else _no_weight(x.dtype)
    (out,) = _kernel(backend)(
        inputs=[x.reshape(rows, d), w, _eps_array(float(eps))],
        template=template_args(x.dtype, w.dtype, out_dtype, weight is not None),
        grid=(rows * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(rows, d)],
        output_dtypes=[out_dtype],
        stream=mx.gpu if stream is None else stream,
    )
    return out.reshape(x.shape)


def rms_norm_half_row(x: Any, weight: Any, eps: float, *, stream: Any = None) -> Any:
    """The kernel's known-bad twin (gates/test_custom_kernel.py's KNOWN_BAD): the mean square taken over the
    first half of each row only, what a launch with half the threads per row computes. Composed ops: it
    runs wherever MLX does, so its drift can be shown on any backend."""
    half = max(1, x.shape[-1] // 2)
    xf = x.astype(mx.float32)
    ms = mx.mean(xf[..., :half] * xf[..., :half], axis=-1, keepdims=True)
    out = (xf * mx.rsqrt(ms + eps)).astype(x.dtype)
    return out if weight is None else out * weight  # as mlx's kernel rounds: to x's dtype, then the weight
