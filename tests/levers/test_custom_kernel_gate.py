"""The custom RMSNorm kernel gate (gates/custom_rms_norm.py, gates/test_custom_kernel.py) where there is no GPU.

No test here runs the kernel on a GPU: this machine has neither Metal nor CUDA. What they do show:
- the gate module is collected and skipped with its reason before any fixture runs (no model loads),
  and `rms_norm` refuses with a clear error; the check script says why and exits 0;
- the launch `rms_norm` makes (inputs, grid counted in threads, threadgroup, template arguments, the
  result's dtype and shape), recorded by putting a recorder where MLX's kernel object would be;
- Metal: the source MLX itself generates for the kernel (`mx.export_function` traces a Metal kernel
  without a Metal device and `verbose=True` prints the source), its signature, attributes and template
  instantiation; MLX builds the Metal kernel object here (it refuses only when called), not the CUDA one;
- CUDA: the source as MLX's `cuda_kernel` wraps it (rebuilt after mlx/backend/cuda/custom_kernel.cpp,
  MLX 0.32: its header, namespace, signature, template lines) compiles with nvcc to PTX for every
  dtype pair, against a stand-in for MLX's device/utils.cuh (not in the CPU wheel) with the wheel's
  own config.h (skipped without nvcc);
- both kernel bodies, under a C++ stand-in for the GPU compiled with g++: a group's threads are
  std::threads, groups run one at a time (so a function-local static is the group's shared memory),
  barriers and simdgroup/warp sums and shuffles are built on std::barrier. Run on the launch rms_norm
  chose, they agree with `mx.fast.rms_norm` and float64 (the check script's `compare`), and a planted
  off-by-one in the sum is caught. That checks indexing, loop bounds, the two-level reduction and the
  dtype handling of the real source text; not Apple's compiler, a GPU's memory model or lockstep
  execution, launch limits, or speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gate_modules import load_gate_module

ROOT = Path(__file__).resolve().parents[2]


crn = load_gate_module("custom_rms_norm")
check = load_gate_module("custom_rms_norm_check")

NO_BACKEND = pytest.mark.skipif(
    crn.kernel_backend() is not None,
    reason=f"this machine has MLX's {crn.kernel_backend()} backend: run the gate itself",
)


# --- the gate on this machine --------------------------------------------------------------------


@NO_BACKEND
def test_no_backend_and_the_reason_says_what_it_needs() -> None:
    import mlx.core as mx

    assert crn.kernel_backend() is None
    for needed in ("Metal", "mx.metal.is_available()", "CUDA", "mlx[cuda]", "mx.cuda.is_available()"):
        assert needed in crn.SKIP_REASON
    assert f"mlx {mx.__version__}" in crn.SKIP_REASON and "default device cpu" in crn.SKIP_REASON


@NO_BACKEND
def test_rms_norm_refuses_without_a_backend() -> None:
    import mlx.core as mx

    with pytest.raises(RuntimeError, match="cannot run here") as raised:
        crn.rms_norm(mx.ones((2, 8)), mx.ones((8,)), 1e-5)
    assert crn.SKIP_REASON in str(raised.value)


@NO_BACKEND
def test_gate_module_is_collected_and_skipped_before_any_model_loads(tmp_path: Path) -> None:
    # A candidate that cannot be had offline from an empty cache: anything that tried to load it fails.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MLXGATE_", "PYTEST_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "gates/test_custom_kernel.py",
            "-rs",
            "-q",
            "-p",
            "no:cacheprovider",
            "--mlx-db",
            "off",
            "--mlx-candidate",
            "nobody/no-such-model",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "2 skipped" in out, out
    assert out.count(crn.SKIP_REASON) == 2, out  # -rs: each test's reason, naming both backends


@NO_BACKEND
def test_check_script_says_why_and_exits_0() -> None:
    run = subprocess.run(
        [sys.executable, "gates/custom_rms_norm_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == f"custom_rms_norm_check: skipped: {crn.SKIP_REASON}"


def _rms_norm_float64(x: Any, w: Any, eps: float, *, short: bool = False) -> Any:
    """RMSNorm in float64, rounded once to mlx's result dtype; `short`: the row's last x² left out of the sum."""
    import mlx.core as mx

    xs = np.array(x.astype(mx.float32), dtype=np.float64)
    squares = xs * xs
    total = (squares[..., :-1] if short else squares).sum(-1, keepdims=True)
    y = xs / np.sqrt(total / xs.shape[-1] + eps)
    if w is not None:
        y = y * np.array(w.astype(mx.float32), dtype=np.float64)
    return mx.array(y.astype(np.float32)).astype(x.dtype if w is None else mx.result_type(x, w))


def test_check_accepts_a_correctly_rounded_rms_norm_and_rejects_a_short_sum() -> None:
    """The check script's tolerances, on this CPU against mx.fast.rms_norm's fallback: the float64
    RMSNorm rounded once to the result dtype passes every case; one that leaves the row's last x² out
    of the sum fails every float32 case (in float16/bfloat16 1/(2D) can sit under the dtype's resolution).
    (mlx's plain ops would not do as the passing one: here mx.mean's float32 sum over 4097 terms puts the
    result up to ~3e-6 relative off, more than the kernel's strided two-level sum can and `compare` allows.)"""
    import mlx.core as mx

    for i, (label, shape, dtype, weight, strided) in enumerate(check.cases()):
        x, w = check.make_inputs(shape, dtype, weight, strided, key=i)
        ok, detail = check.compare(x, w, _rms_norm_float64(x, w, check.EPS))
        assert ok, f"{label}: {detail}"
        short = _rms_norm_float64(x, w, check.EPS, short=True)
        if short.dtype == mx.float32:
            ok, detail = check.compare(x, w, short)
            assert not ok, f"{label}: a sum short of one x² passed: {detail}"


def test_check_script_main_runs_every_case(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's own loop, with a float64 RMSNorm standing in for the kernel (not a test of the kernel: of
    the script the next GPU session will run): every case passes, it ends with a timing line, exit 0."""
    monkeypatch.setattr(check, "kernel_backend", lambda: "cuda")
    monkeypatch.setattr(check, "rms_norm", _rms_norm_float64)
    assert check.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("pass  ") for line in out) == len(check.cases())
    assert out[-2] == f"{len(check.cases())} passed, 0 failed" and out[-1].startswith("timing (not a verdict)")


# --- the kernel objects and the sources ----------------------------------------------------------


def test_metal_kernel_object_builds_here_and_cuda_is_refused_by_the_cpu_wheel() -> None:
    """MLX's CPU wheel builds a Metal kernel object (it refuses only when called: no Metal back-end);
    its `cuda_kernel` refuses at construction. Where a backend exists, both build for it."""
    assert callable(crn.build_kernel("metal"))
    if crn.kernel_backend() == "cuda":
        assert callable(crn.build_kernel("cuda"))
    else:
        with pytest.raises(RuntimeError, match="No CUDA back-end"):
            crn.build_kernel("cuda")
    with pytest.raises(ValueError, match="neither 'metal' nor 'cuda'"):
        crn.build_kernel("rocm")


@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_source_names_every_parameter_and_balances(backend: str) -> None:
    """Structure only (the compile and emulation tests below go further): every input and output is
    used, brackets balance, and each barrier is reached by every thread of the group (none is inside
    a branch)."""
    source = crn.METAL_SOURCE if backend == "metal" else crn.CUDA_SOURCE
    for name in (*crn.INPUT_NAMES, *crn.OUTPUT_NAMES, "x_shape", "OutT", "HAS_WEIGHT"):
        assert re.search(rf"\b{name}\b", source), f"{backend} source never uses {name}"
    for opening, closing in ("()", "[]", "{}"):
        assert source.count(opening) == source.count(closing), f"{backend}: unbalanced {opening}{closing}"
    if backend == "metal":  # an input may arrive as `constant` or `device` (test_launch): never name a space
        assert not re.search(r"\b(device|constant)\b", source)
    barrier = "threadgroup_barrier(" if backend == "metal" else "__syncthreads()"
    for line in source.splitlines():
        if barrier in line:
            assert line.startswith("    " + barrier.split("(")[0]), f"{backend}: a barrier not at the top level: {line}"
    assert source.count(barrier) == 2


@pytest.mark.parametrize(
    ("d", "threads"),
    [
        (1, 32),
        (7, 32),
        (64, 32),
        (128, 32),
        (129, 64),
        (576, 160),
        (2048, 512),
        (2560, 640),
        (4096, 1024),
        (4097, 1024),
        (10**6, 1024),
    ],
)
def test_launch_threads(d: int, threads: int) -> None:
    assert crn.launch_threads(d) == threads


# --- the launch rms_norm makes, with a recorder for MLX's kernel object ---------------------------


class _Recorder:
    """Stands where `_kernel(backend)` returns MLX's kernel object: keeps each call's arguments, then
    calls the real object (Metal, traced by export) or returns zeros of the asked shape (CUDA)."""

    def __init__(self, real: Any = None) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> list[Any]:
        import mlx.core as mx

        self.calls.append(kwargs)
        if self.real is not None:
            return self.real(**kwargs, verbose=True)  # type: ignore[no-any-return]
        return [mx.zeros(s, dtype=t) for s, t in zip(kwargs["output_shapes"], kwargs["output_dtypes"], strict=True)]


@contextlib.contextmanager
def _fd1_into(path: Path) -> Iterator[None]:
    """Send file descriptor 1 (where MLX's C++ side prints) to `path` for the body."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _launch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, x: Any, w: Any, metal_source: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """rms_norm(x, w) as `backend` would launch it: the kernel call's arguments, and on Metal the source
    MLX generated for it (traced with mx.export_function: no Metal device needed)."""
    import mlx.core as mx

    real = None
    if backend == "metal":
        if metal_source is not None:
            monkeypatch.setattr(crn, "METAL_SOURCE", metal_source)
        real = crn.build_kernel("metal")
    recorder = _Recorder(real)
    with monkeypatch.context() as m:
        m.setattr(crn, "kernel_backend", lambda: backend)
        m.setattr(crn, "_kernel", lambda _backend: recorder)
        if backend == "cuda":
            out = crn.rms_norm(x, w, check.EPS)
            assert out.shape == x.shape
            return recorder.calls[0], None
        printed = tmp_path / f"metal-{len(list(tmp_path.iterdir()))}.txt"
        args = [x] if w is None else [x, w]
        fn = (
            (lambda xa: crn.rms_norm(xa, None, check.EPS))
            if w is None
            else (lambda xa, wa: crn.rms_norm(xa, wa, check.EPS))
        )
        with _fd1_into(printed):
            mx.export_function(str(printed.with_suffix(".mlxfn")), fn, *args)
    text = printed.read_text()
    found = re.search(r"Generated source code for `mlxgate_rms_norm`:\n```\n(.*)\n```", text, re.S)
    assert found, f"MLX printed no Metal source under export (verbose=True):\n{text}"
    return recorder.calls[0], found.group(1)


#: (x shape, x dtype, weight): idle threads (D < 32), several simdgroups/warps, the 1024-thread cap with a loop
#: over a longer row, no weight, a promoted (float32) result, and an x small enough that MLX passes it to
#: Metal as `constant` (under 8 elements).
LAUNCHES = [
    ((3, 64), "float32", "same"),
    ((2, 3, 576), "float16", "same"),
    ((2, 4097), "bfloat16", "none"),
    ((2, 2560), "float16", "float32"),
    ((3, 7), "float32", "same"),
    ((1, 1, 4), "float16", "same"),
]


def _inputs(shape: tuple[int, ...], dtype: str, weight: str, key: int) -> tuple[Any, Any]:
    import mlx.core as mx

    return check.make_inputs(shape, getattr(mx, dtype), weight, False, key)  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["metal", "cuda"])
@pytest.mark.parametrize(("shape", "dtype", "weight"), LAUNCHES)
def test_launch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, shape: tuple[int, ...], dtype: str, weight: str
) -> None:
    import mlx.core as mx

    x, w = _inputs(shape, dtype, weight, key=1)
    call, source = _launch(monkeypatch, tmp_path, backend, x, w)
    d, rows = shape[-1], int(np.prod(shape[:-1]))
    threads = crn.launch_threads(d)
    x2, w_in, eps = call["inputs"]
    expected = mx.fast.rms_norm(x, w, check.EPS).dtype  # what mlx's kernel returns, promoted dtypes included
    assert (x2.shape, x2.dtype) == ((rows, d), x.dtype)
    assert (w_in.shape, w_in.dtype) == (((d,), w.dtype) if w is not None else ((1,), x.dtype))
    assert (eps.shape, eps.dtype) == ((1,), mx.float32)
    assert call["grid"] == (rows * threads, 1, 1), "grid counts threads: one group of `threads` per row"
    assert call["threadgroup"] == (threads, 1, 1) and threads % 32 == 0 and threads <= crn.MAX_THREADS
    assert call["output_shapes"] == [(rows, d)] and call["output_dtypes"] == [expected]
    assert call["template"] == [("InT", x.dtype), ("WT", w_in.dtype), ("OutT", expected), ("HAS_WEIGHT", w is not None)]
    assert call["stream"] == mx.gpu
    if backend == "metal":
        assert source is not None
        name, params, target = _metal_signature(source)
        types_ = {n: t for t, n in params}
        metal = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t"}

        def space(a: Any) -> str:
            return "device" if a.size >= 8 else "constant"  # MLX passes inputs under 8 elements as constant

        assert types_["x"] == f"const {space(x2)} {metal[x.dtype]}*"
        assert types_["x_shape"] == "const constant int*"
        assert types_["w"] == f"const {space(w_in)} {metal[w_in.dtype]}*"
        assert types_["eps"] == "const constant float*"
        assert types_["out"] == f"device {metal[expected]}*"
        used = {a for a in _METAL_ATTRIBUTES if re.search(rf"\b{a}\b", crn.METAL_SOURCE)}
        assert used <= set(types_), f"attributes used but not declared: {used - set(types_)}"
        targs = f"{metal[x.dtype]}, {metal[w_in.dtype]}, {metal[expected]}, {int(w is not None)}"
        assert target == f"{name}<{targs}>"


def test_rms_norm_validates_like_mx_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx

    monkeypatch.setattr(crn, "kernel_backend", lambda: "cuda")
    monkeypatch.setattr(crn, "_kernel", lambda _backend: _Recorder())
    with pytest.raises(ValueError, match="at least 1 dimension"):
        crn.rms_norm(mx.array(1.0), None, 1e-5)
    with pytest.raises(ValueError, match="weight must be one-dimensional"):
        crn.rms_norm(mx.ones((2, 8)), mx.ones((4,)), 1e-5)
    with pytest.raises(ValueError, match="not a floating type"):
        crn.rms_norm(mx.ones((2, 8), dtype=mx.int32), None, 1e-5)
    empty = crn.rms_norm(mx.ones((0, 8), dtype=mx.float16), mx.ones((8,)), 1e-5)
    assert empty.shape == (0, 8) and empty.dtype == mx.float32
    with pytest.raises(ValueError, match="exceed one launch's grid"):
        crn.rms_norm(mx.zeros((2**21 + 1, 4096), dtype=mx.float16), None, 1e-5)


# --- the CUDA source as MLX's cuda_kernel wraps it -------------------------------------------------

_CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
_TYPE_STRING = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"}  # MLX's get_type_string
_MLX_CUDA_HEADER = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _cuda_text(
    template: list[tuple[str, Any]],
    input_dtypes: list[Any],
    output_dtype: Any,
    source: str,
    header: str = _MLX_CUDA_HEADER,
) -> tuple[str, str]:
    """(kernel name, the translation unit MLX's cuda_kernel compiles) for our inputs x, w, eps and out, as
    build_kernel writes it: its default header, the namespace, the signature (x_shape because the source
    names it), one `using`/`constexpr` line per template argument, then the body."""
    suffix = "".join(
        "_" + (("t" if v else "f") if isinstance(v, bool) else _TYPE_STRING[_dtype_name(v)]) for _, v in template
    )
    name = f"custom_kernel_mlxgate_rms_norm{suffix}"
    x_t, w_t, eps_t = (_CUDA_TYPES[_dtype_name(t)] for t in input_dtypes)
    lines = [
        header,
        "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n",
        f"__global__ void {name}(\n",
        f"    const {x_t}* x,\n",
        "    const __grid_constant__ Shape x_shape,\n",
        f"    const {w_t}* w,\n",
        f"    const {eps_t}* eps,\n",
        f"    {_CUDA_TYPES[_dtype_name(output_dtype)]}* out) {{\n",
    ]
    for arg, value in template:
        if isinstance(value, bool):
            lines.append(f"  constexpr bool {arg} = {'true' if value else 'false'};\n")
        else:
            lines.append(f"  using {arg} = {_CUDA_TYPES[_dtype_name(value)]};\n")
    lines += ["\n", source, "\n}\n\n} // namespace mlx::core::cu\n"]
    return name, "".join(lines)


def _all_cuda_kernels(header: str = _MLX_CUDA_HEADER) -> list[tuple[str, str]]:
    import mlx.core as mx

    kernels = []
    for x_dtype in (mx.float32, mx.float16, mx.bfloat16):
        for w_dtype in (mx.float32, mx.float16, mx.bfloat16):
            for has_weight in (True, False):
                out = mx.result_type(mx.zeros((1,), x_dtype), mx.zeros((1,), w_dtype)) if has_weight else x_dtype
                w_dtype_in = w_dtype if has_weight else x_dtype
                if not has_weight and w_dtype != mx.float32:
                    continue  # no weight: one kernel per x dtype
                kernels.append(
                    _cuda_text(
                        crn.template_args(x_dtype, w_dtype_in, out, has_weight),
                        [x_dtype, w_dtype_in, mx.float32],
                        out,
                        crn.CUDA_SOURCE,
                        header,
                    )
                )
    return kernels


#: Stands in for mlx/backend/cuda/device/utils.cuh, which MLX's CPU wheel does not ship: what the generated
#: signature needs from it (Shape, Strides; the fp16/bf16 and cuda::std headers it includes). config.h
#: (WARP_SIZE, MAX_NDIM) is the wheel's own.
_UTILS_CUH = """#pragma once
#include "mlx/backend/cuda/device/config.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) to compile the CUDA source")
def test_cuda_source_compiles_with_nvcc(tmp_path: Path) -> None:
    import mlx.core as mx

    wheel_include = Path(mx.__file__).parent / "include"  # mlx/core.*.so sits in mlx/, beside include/
    if not (wheel_include / "mlx/backend/cuda/device/config.h").is_file():
        pytest.skip(f"MLX's wheel has no mlx/backend/cuda/device/config.h under {wheel_include}")
    stub = tmp_path / "stub" / "mlx/backend/cuda/device"
    stub.mkdir(parents=True)
    (stub / "utils.cuh").write_text(_UTILS_CUH)
    kernels = _all_cuda_kernels()
    assert len(kernels) == 12  # 9 dtype pairs with a weight, 3 without
    unit = tmp_path / "rms_norm.cu"
    unit.write_text("\n".join(text for _, text in kernels))
    ptx = tmp_path / "rms_norm.ptx"
    run = subprocess.run(
        [
            "nvcc",
            "-std=c++17",
            "--ptx",
            "-arch=sm_80",
            f"-I{tmp_path / 'stub'}",
            f"-I{wheel_include}",
            str(unit),
            "-o",
            str(ptx),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ours = [line for line in (run.stdout + run.stderr).splitlines() if unit.name in line]
    assert not ours, "nvcc warns about the kernel:\n" + "\n".join(ours)  # (the toolkit's own headers may warn)
    entries = re.findall(r"\.entry\s+(\S+)\(", ptx.read_text())
    assert len(entries) == len(kernels)
    for name, _ in kernels:
        assert any(name in entry for entry in entries), f"{name} is not in the PTX"


# --- both bodies under a C++ stand-in for the GPU --------------------------------------------------

#: Metal attributes MLX declares when the source names them (mlx/backend/common/metal_kernel.cpp, 0.32),
#: with how the stand-in computes each: g = the group's index, lid = the thread's index in it.
_METAL_ATTRIBUTES = {
    "threadgroup_position_in_grid": "uint3{uint(g), 0u, 0u}",
    "thread_position_in_threadgroup": "uint3{uint(lid), 0u, 0u}",
    "thread_position_in_grid": "uint3{uint(g * threads + lid), 0u, 0u}",
    "threads_per_threadgroup": "uint3{uint(threads), 1u, 1u}",
    "thread_index_in_threadgroup": "uint(lid)",
    "thread_index_in_simdgroup": "uint(lid % 32)",
    "simdgroup_index_in_threadgroup": "uint(lid / 32)",
    "simdgroups_per_threadgroup": "uint((threads + 31) / 32)",
    "threads_per_simdgroup": "32u",
    "thread_execution_width": "32u",
}

_COMMON_SHIM = r"""
#include <array>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

// bfloat16: the top half of a float32, rounded to nearest even.
struct bf16_emu {
  uint16_t bits;
  bf16_emu() = default;
  explicit bf16_emu(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  explicit operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// One group (threadgroup/block) in flight: its barrier, one barrier per 32-lane subgroup, exchange slots.
struct Group {
  explicit Group(int threads) : all(threads), slots(threads) {
    for (int i = 0; i < threads / 32; ++i) sub.push_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> sub;
  std::vector<float> slots;
};
inline Group* g_group = nullptr;
inline thread_local int t_lid = 0;

inline void group_barrier() { g_group->all.arrive_and_wait(); }
// Every lane of the subgroup publishes v, then reads lane `from`'s (or the sum of all 32).
inline float sub_read(float v, int from) {
  int base = t_lid / 32 * 32;
  g_group->slots[t_lid] = v;
  g_group->sub[t_lid / 32]->arrive_and_wait();
  float r = g_group->slots[base + from];
  g_group->sub[t_lid / 32]->arrive_and_wait();
  return r;
}
inline float sub_sum(float v) {
  int base = t_lid / 32 * 32;
  g_group->slots[t_lid] = v;
  g_group->sub[t_lid / 32]->arrive_and_wait();
  float r = 0.0f;
  for (int i = 0; i < 32; ++i) r += g_group->slots[base + i];
  g_group->sub[t_lid / 32]->arrive_and_wait();
  return r;
}
"""

_METAL_SHIM = (
    _COMMON_SHIM
    + r"""
using uint = unsigned int;
using float16_t = _Float16;
using bfloat16_t = bf16_emu;
struct uint3 { uint x, y, z; };
enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };
inline void threadgroup_barrier(mem_flags) { group_barrier(); }
inline float simd_sum(float v) { return sub_sum(v); }
namespace metal { namespace precise { inline float rsqrt(float v) { return 1.0f / std::sqrt(v); } } }
#define device
#define constant
#define threadgroup static  // one group runs at a time: a function-local static is its threadgroup memory
"""
)

_CUDA_SHIM = (
    _COMMON_SHIM
    + r"""
using __half = _Float16;
using __nv_bfloat16 = bf16_emu;
struct dim3 { unsigned x, y, z; };
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline void __syncthreads() { group_barrier(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) { return sub_read(v, (t_lid % 32) ^ lane_mask); }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
namespace cooperative_groups {}
namespace mlx::core::cu {
using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;
}
#define WARP_SIZE 32
#define __global__
#define __device__
#define __grid_constant__
#define __shared__ static  // one block runs at a time: a function-local static is its shared memory
"""
)

_RUNNER = r"""
static std::vector<unsigned char> slurp(const char* path) {
  std::vector<unsigned char> data;
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  unsigned char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) data.insert(data.end(), buffer, buffer + n);
  std::fclose(f);
  return data;
}

template <class Body>
static void launch(int groups, int threads, Body body) {
  for (int g = 0; g < groups; ++g) {
    Group group(threads);
    g_group = &group;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int lid = 0; lid < threads; ++lid) pool.emplace_back([&body, g, lid] { t_lid = lid; body(g, lid); });
    for (auto& t : pool) t.join();
  }
}

int main(int argc, char** argv) {
  // which groups threads rows d x.bin w.bin eps out.bin out_bytes
  if (argc != 11) { std::fprintf(stderr, "usage\n"); return 2; }
  const int which = std::atoi(argv[1]), groups = std::atoi(argv[2]), threads = std::atoi(argv[3]);
  const int rows = std::atoi(argv[4]), d = std::atoi(argv[5]);
  std::vector<unsigned char> x = slurp(argv[6]), w = slurp(argv[7]);
  const float eps_value = std::strtof(argv[8], nullptr);
  std::vector<unsigned char> out(std::strtoull(argv[10], nullptr, 10));
  const int shape_ptr[2] = {rows, d};
  mlx_shape_t shape_arr{};
  shape_arr[0] = rows;
  shape_arr[1] = d;
  (void)shape_ptr;
  (void)shape_arr;
  switch (which) {
CASES
    default: return 3;
  }
  FILE* f = std::fopen(argv[9], "wb");
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
  return 0;
}
"""


def _metal_signature(source: str) -> tuple[str, list[tuple[str, str]], str]:
    """(function name, [(type, name)] in order, the instantiated call target) of MLX's generated source."""
    head = re.search(r"\[\[kernel\]\] void (\w+)\(\n(.*?)\) \{", source, re.S)
    target = re.search(r"decltype\((\w+<[^>]*>)\)", source)
    assert head and target, source
    params = []
    for raw in head.group(2).split(",\n"):
        decl = re.sub(r"\s*\[\[[^\]]*\]\]", "", raw).strip()
        found = re.match(r"(.*?)\s*(\w+)$", decl)
        assert found, decl
        params.append((found.group(1), found.group(2)))
    return head.group(1), params, target.group(1)


def _cuda_signature(source: str) -> tuple[str, list[tuple[str, str]]]:
    head = re.search(r"__global__ void (\w+)\(\n(.*?)\) \{", source, re.S)
    assert head, source
    params = []
    for raw in head.group(2).split(",\n"):
        found = re.match(r"(.*?)\s*(\w+)$", raw.strip())
        assert found, raw
        params.append((found.group(1).replace("__grid_constant__ ", ""), found.group(2)))
    return head.group(1), params


def _argument(backend: str, type_: str, name: str) -> str:
    buffers = {"x": "x.data()", "w": "w.data()", "out": "out.data()", "eps": "&eps_value"}
    if name in buffers:
        return f"reinterpret_cast<{type_}>({buffers[name]})"
    if name == "x_shape":
        return "shape_ptr" if backend == "metal" else "shape_arr"
    if backend == "metal" and name in _METAL_ATTRIBUTES:
        return _METAL_ATTRIBUTES[name]
    raise AssertionError(f"the stand-in does not know the parameter {type_} {name}: teach it (_argument)")


def _emulator(backend: str, sources: list[str]) -> str:
    """One C++ program running each of `sources` (kernels as MLX would compile them) under the stand-in."""
    units: dict[str, str] = {}  # one definition per kernel name (two launches may share one kernel)
    cases = []
    for which, source in enumerate(sources):
        if backend == "metal":
            name, params, target = _metal_signature(source)
            body = re.sub(r"^template \[\[host_name.*$", "", source, flags=re.M)
            unit = re.sub(r"\s*\[\[[^\]]*\]\]", "", body)
            call = target
            setup = ""
        else:
            name, params = _cuda_signature(source)
            unit = source
            call = f"mlx::core::cu::{name}"
            setup = (
                "threadIdx = {unsigned(lid), 0u, 0u}; blockIdx = {unsigned(g), 0u, 0u}; "
                "blockDim = {unsigned(threads), 1u, 1u}; gridDim = {unsigned(groups), 1u, 1u}; "
            )
        assert units.setdefault(name, unit) == unit, f"two different sources share the kernel name {name}"
        args = ", ".join(_argument(backend, t, n) for t, n in params)
        cases.append(
            f"    case {which}: launch(groups, threads, [&](int g, int lid) {{ (void)g; (void)lid; "
            f"{setup}{call}({args}); }}); break;"
        )
    shim = _METAL_SHIM if backend == "metal" else _CUDA_SHIM
    shape_t = "using mlx_shape_t = std::array<int32_t, 10>;\n"
    return shim + "\n".join(units.values()) + "\n" + shape_t + _RUNNER.replace("CASES", "\n".join(cases))


def _raw(a: Any) -> bytes:
    import mlx.core as mx

    a = mx.contiguous(a)
    if a.dtype in (mx.float16, mx.bfloat16):
        return np.array(a.view(mx.uint16)).tobytes()
    return np.array(a).astype(np.float32).tobytes()


def _from_raw(data: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    import mlx.core as mx

    if dtype == mx.float32:
        return mx.array(np.frombuffer(data, dtype=np.float32).reshape(shape))
    return mx.array(np.frombuffer(data, dtype=np.uint16).reshape(shape)).view(dtype)


def _emulate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, cases: list[tuple[Any, Any]], body: str | None = None
) -> list[Any]:
    """Each (x, w) through rms_norm's own launch, the kernel run under the stand-in; the outputs."""
    import mlx.core as mx

    launches, sources = [], []
    for x, w in cases:
        call, metal_source = _launch(monkeypatch, tmp_path, backend, x, w, metal_source=body)
        if backend == "metal":
            assert metal_source is not None
            sources.append(metal_source)
        else:
            x2, w_in, eps = call["inputs"]
            sources.append(
                _cuda_text(
                    call["template"],
                    [x2.dtype, w_in.dtype, eps.dtype],
                    call["output_dtypes"][0],
                    body if body is not None else crn.CUDA_SOURCE,
                    header="",
                )[1]
            )
        launches.append(call)
    program = tmp_path / f"emulate_{backend}.cpp"
    program.write_text(_emulator(backend, sources))
    binary = tmp_path / f"emulate_{backend}"
    built = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-pthread", "-w", str(program), "-o", str(binary)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"the stand-in did not compile {program}:\n{built.stderr[-6000:]}"
    outputs = []
    for which, ((x, w), call) in enumerate(zip(cases, launches, strict=True)):
        x2, w_in, _ = call["inputs"]
        (gx, gy, gz), (tx, ty, tz) = call["grid"], call["threadgroup"]
        assert gy == gz == ty == tz == 1
        threads = min(tx, gx)  # as MLX sizes the group (Metal: dispatchThreads; CUDA: the block)
        assert gx % threads == 0, "a partial last group is not emulated"
        rows, d = x2.shape
        out_dtype, (out_shape,) = call["output_dtypes"][0], call["output_shapes"]
        (tmp_path / "x.bin").write_bytes(_raw(x.reshape(rows, d)))
        (tmp_path / "w.bin").write_bytes(_raw(w if w is not None else crn._no_weight(x.dtype)))
        out_bytes = rows * d * (4 if out_dtype == mx.float32 else 2)
        ran = subprocess.run(
            [
                str(binary),
                str(which),
                str(gx // threads),
                str(threads),
                str(rows),
                str(d),
                str(tmp_path / "x.bin"),
                str(tmp_path / "w.bin"),
                repr(check.EPS),
                str(tmp_path / "out.bin"),
                str(out_bytes),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
        outputs.append(_from_raw((tmp_path / "out.bin").read_bytes(), out_dtype, tuple(out_shape)).reshape(x.shape))
    return outputs


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20) for the stand-in GPU")


@pytest.mark.slow
@needs_gxx
@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_kernel_body_under_the_stand_in_matches_mx_fast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    cases = [_inputs(shape, dtype, weight, key=k) for k, (shape, dtype, weight) in enumerate(LAUNCHES)]
    for (shape, dtype, weight), (x, w), ours in zip(
        LAUNCHES, cases, _emulate(monkeypatch, tmp_path, backend, cases), strict=True
    ):
        ok, detail = check.compare(x, w, ours)
        assert ok, f"{backend} {shape} {dtype} weight={weight}: {detail}"


@pytest.mark.slow
@needs_gxx
@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_the_stand_in_catches_a_sum_one_element_short(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    source = crn.METAL_SOURCE if backend == "metal" else crn.CUDA_SOURCE
    first_loop = "i < d; i += nthreads) {\n        const float v"
    assert source.count(first_loop) == 1
    broken = source.replace(first_loop, "i + 1 < d; i += nthreads) {\n        const float v")
    cases = [_inputs((3, 64), "float32", "same", key=0), _inputs((2, 2560), "float32", "none", key=1)]
    for (x, w), ours in zip(cases, _emulate(monkeypatch, tmp_path, backend, cases, body=broken), strict=True):
        ok, detail = check.compare(x, w, ours)
        assert not ok, f"{backend}: a sum missing the row's last x² passed: {detail}"


def test_launches_table_covers_the_kernel_paths() -> None:
    threads = [crn.launch_threads(shape[-1]) for shape, _, _ in LAUNCHES]
    assert min(shape[-1] for shape, _, _ in LAUNCHES) < 32 and 1024 in threads
    assert any(shape[-1] > 1024 for shape, _, _ in LAUNCHES) and any(t // 32 not in (1, 32) for t in threads)
    assert {w for _, _, w in LAUNCHES} == {"same", "none", "float32"}
    assert any(int(np.prod(shape)) < 8 for shape, _, _ in LAUNCHES)
    assert json.dumps(LAUNCHES)  # plain data: parametrization identical on every xdist worker


def test_the_known_bad_twin_takes_the_mean_square_over_half_the_row_and_nothing_else() -> None:
    """gates/test_custom_kernel.py's KNOWN_BAD: runs on any backend, differs from mx.fast.rms_norm by its one bug."""
    import mlx.core as mx

    x = mx.random.normal((3, 8), key=mx.random.key(0))
    w = mx.random.normal((8,), key=mx.random.key(1))
    bad = np.array(crn.rms_norm_half_row(x, w, 1e-5))
    xs, ws = np.array(x, dtype=np.float64), np.array(w, dtype=np.float64)
    half = xs / np.sqrt(np.mean(xs[:, :4] ** 2, axis=-1, keepdims=True) + 1e-5) * ws
    np.testing.assert_allclose(bad, half, rtol=1e-5)
    assert not np.allclose(bad, np.array(mx.fast.rms_norm(x, w, 1e-5)), rtol=1e-3)
    gate = (Path(__file__).resolve().parents[2] / "gates" / "test_custom_kernel.py").read_text()
    assert 'KNOWN_BAD = "custom_rms_norm:rms_norm_half_row"' in gate
