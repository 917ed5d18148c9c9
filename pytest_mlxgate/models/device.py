"""Which device and which BLAS MLX runs on: facts for the header line and the slow-BLAS warning.

Named `device`, not `platform`, so that it can never shadow the standard library's `platform`.
Only these functions import mlx, and only when called.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = [
    "REFERENCE_BLAS",
    "backend_of",
    "blas_in_use",
    "classify_blas",
    "mapped_libraries",
    "mlx_device",
    "installed_versions",
    "machine_facts",
    "mlx_chip",
    "openblas_preload_path",
    "precision_facts",
    "reference_blas_warning",
    "run_machine",
]

#: How long the device probe of `machine_facts(in_subprocess=True)` may take (importing mlx: ~0.3 s).
_PROBE_TIMEOUT_S = 60.0
#: What `blas_in_use` says when MLX's Linux CPU wheel uses the netlib BLAS it bundles.
REFERENCE_BLAS = "reference BLAS"


def installed_versions(dists: Iterable[str] = ("mlx", "mlx-lm")) -> dict[str, str]:
    """Distribution name -> installed version ("absent" when not installed), without importing it."""
    out = {}
    for dist in dists:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


def machine_facts(*, in_subprocess: bool = False) -> tuple[str, str]:
    """(device, BLAS). `in_subprocess`: ask a short-lived interpreter instead, for a process that
    must not load mlx itself (the xdist controller only prints the header; its workers run gates)."""
    if not in_subprocess:
        return mlx_device(), blas_in_use()
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    code = (
        "import json; from pytest_mlxgate.models.device import blas_in_use, mlx_device; "
        "print(json.dumps([mlx_device(), blas_in_use()]))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=True
        )
        device, blas = json.loads(out.stdout.strip().splitlines()[-1])
        return str(device), str(blas)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "unknown device", "unknown"


def run_machine(device: str, blas: str) -> dict[str, str]:
    """What a run's numbers depend on besides the model: device, BLAS, the chip and MLX's float32 switch
    (`precision_facts`), the library versions. Reference arms and proofs are keyed by it."""
    return {"device": device, "blas": blas, **precision_facts(), **installed_versions(("mlx", "mlx-lm"))}


def precision_facts() -> dict[str, str]:
    """{"chip", "tf32"}: the processor MLX computes on (rounding differs between chip generations: masked
    SDPA in bf16 differs by 2^-8 between an M5 and an M3 Max) and `MLX_ENABLE_TF32` (on unless set to 0:
    float32 matmuls then run at reduced precision on chips with matrix units)."""
    return {"chip": mlx_chip(), "tf32": "off" if os.environ.get("MLX_ENABLE_TF32", "1").strip() == "0" else "on"}


def mlx_chip() -> str:
    """The default device's name as MLX reports it ('Apple M3 Max', 'NVIDIA H100 ...', a CPU's model)."""
    try:
        import mlx.core as mx

        info = mx.device_info()
    except (ImportError, AttributeError, RuntimeError):
        return platform.machine() or "unknown"
    return str(info.get("device_name") or info.get("architecture") or platform.machine() or "unknown")


def mlx_device() -> str:
    """MLX's default device: 'gpu · Metal', 'gpu · CUDA', 'cpu' (or 'no mlx')."""
    try:
        import mlx.core as mx
    except ImportError:
        return "no mlx"
    if mx.default_device().type != mx.gpu:
        return "cpu"
    if mx.metal.is_available():
        return "gpu · Metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "gpu · CUDA"
    return "gpu"


def backend_of(device: str) -> str:
    """The backend a device string (`mlx_device`) names: cpu, metal, cuda, or the string itself. A
    calibration covers one backend: rounding differs between them."""
    lowered = device.lower()
    for backend in ("metal", "cuda"):
        if backend in lowered:
            return backend
    return "cpu" if lowered.startswith("cpu") else device


def blas_in_use() -> str:
    """The BLAS MLX's CPU matmuls call: 'Accelerate', 'OpenBLAS', REFERENCE_BLAS, 'MKL', 'BLIS', 'unknown'."""
    if sys.platform == "darwin":
        return "Accelerate"
    if not sys.platform.startswith("linux"):
        return "unknown"
    try:
        import mlx.core  # noqa: F401  (maps MLX's libraries, which is what we inspect)
    except ImportError:
        return "unknown"
    return classify_blas(mapped_libraries())


def mapped_libraries(maps: Path = Path("/proc/self/maps")) -> set[str]:
    """Paths of the files mapped into this process (Linux)."""
    paths: set[str] = set()
    try:
        text = maps.read_text()
    except OSError:
        return paths
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.add(fields[5].removesuffix(" (deleted)"))
    return paths


def classify_blas(paths: Iterable[str]) -> str:
    """Which BLAS wins symbol lookup, given the mapped library paths.

    Libraries vendored into wheels (`*.libs/`, auditwheel) have private hashed names and
    prefixed symbols (numpy's `scipy_openblas`), so they cannot serve MLX -- except MLX's own
    `mlx*.libs/libblas-*`, the reference BLAS. A system OpenBLAS/MKL/BLIS mapped next to it
    came in through LD_PRELOAD (or MLX was built against it) and wins.
    """
    vendored_reference = False
    for raw in sorted(paths):
        path = Path(raw)
        base = path.name.lower()
        if path.parent.name.endswith(".libs"):
            vendored_reference |= path.parent.name.startswith("mlx") and base.startswith("libblas")
            continue
        if base.startswith("libopenblas") or (base.startswith("libblas") and "openblas" in raw.lower()):
            return "OpenBLAS"
        if base.startswith("libmkl_rt") or base.startswith("libmkl_core"):
            return "MKL"
        if base.startswith("libblis"):
            return "BLIS"
    return REFERENCE_BLAS if vendored_reference else "unknown"


def openblas_preload_path() -> str:
    """Debian's multi-arch path of the pthread OpenBLAS that provides libblas.so.3 (as ./dev uses)."""
    return f"/usr/lib/{platform.machine()}-linux-gnu/openblas-pthread/libblas.so.3"


def reference_blas_warning(blas: str | None = None) -> str | None:
    """The one warning, with the fix, when MLX runs on the reference BLAS; None otherwise."""
    blas = blas_in_use() if blas is None else blas
    if blas != REFERENCE_BLAS:
        return None
    lib = openblas_preload_path()
    install = "" if os.path.exists(lib) else "install it with `apt-get install libopenblas0-pthread`, then "
    return (
        "MLX runs on the reference BLAS bundled in its Linux CPU wheel (~8 GFLOP/s): CPU gates run "
        f"~20x slower than with OpenBLAS. Fix: {install}run with LD_PRELOAD={lib} "
        "-- or run through ./dev, which does this for you."
    )
