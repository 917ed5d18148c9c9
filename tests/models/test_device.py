"""Device and BLAS facts: which BLAS MLX really calls, and the one warning with its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mlxgate.models import device
from pytest_mlxgate.models.device import REFERENCE_BLAS, classify_blas, mapped_libraries

SITE = "/venv/lib/python3.11/site-packages"
MLX_REF = f"{SITE}/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"
NUMPY_OPENBLAS = f"{SITE}/numpy.libs/libscipy_openblas64_-ff651d7f.so"
OLD_NUMPY_OPENBLAS = f"{SITE}/numpy.libs/libopenblas64_p-r0-0cf96a72.3.23.dev.so"
DEBIAN_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ([MLX_REF, f"{SITE}/mlx/lib/libmlx.so"], REFERENCE_BLAS),
        # numpy's vendored OpenBLAS has prefixed symbols: MLX cannot use it
        ([MLX_REF, NUMPY_OPENBLAS, OLD_NUMPY_OPENBLAS], REFERENCE_BLAS),
        ([MLX_REF, DEBIAN_OPENBLAS, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"], "OpenBLAS"),
        ([MLX_REF, "/opt/intel/lib/libmkl_rt.so.2"], "MKL"),
        ([MLX_REF, "/usr/lib/libblis.so.4"], "BLIS"),
        (["/usr/lib/libopenblas.so.0"], "OpenBLAS"),  # MLX built against a system OpenBLAS
        ([f"{SITE}/mlx/lib/libmlx.so"], "unknown"),
    ],
)
def test_classify_blas(paths: list[str], expected: str) -> None:
    assert classify_blas(paths) == expected


def test_mapped_libraries_parses_proc_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3\n"
        "7f01-7f02 r-xp 00001000 08:01 123 /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f03-7f04 r--p 00000000 08:01 9 /tmp/dir with space/lib.so (deleted)\n"
        "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"
    )
    assert mapped_libraries(maps) == {DEBIAN_OPENBLAS, "/tmp/dir with space/lib.so"}
    assert mapped_libraries(tmp_path / "absent") == set()


def test_warning_only_for_the_reference_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device.reference_blas_warning("OpenBLAS") is None
    assert device.reference_blas_warning("Accelerate") is None
    monkeypatch.setattr(device.os.path, "exists", lambda p: True)
    text = device.reference_blas_warning(REFERENCE_BLAS)
    assert text is not None and f"LD_PRELOAD={device.openblas_preload_path()}" in text
    assert "./dev" in text and "apt-get" not in text  # installed: only the preload is missing
    monkeypatch.setattr(device.os.path, "exists", lambda p: False)
    text = device.reference_blas_warning(REFERENCE_BLAS)
    assert text is not None and "apt-get install libopenblas0-pthread" in text


def _blas_in_subprocess(preload: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    code = "from pytest_mlxgate.models.device import blas_in_use, mlx_device; print(blas_in_use(), '|', mlx_device())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MLX's reference BLAS is a Linux wheel thing")
def test_blas_in_use_sees_the_preload() -> None:
    mlx = pytest.importorskip("mlx")
    if not (Path(mlx.__path__[0]).parent / "mlx_cpu.libs").is_dir():
        pytest.skip("not MLX's Linux CPU wheel")
    blas, _, dev = _blas_in_subprocess(None).partition(" | ")
    assert blas == REFERENCE_BLAS
    assert dev in ("cpu", "gpu · CUDA")
    lib = device.openblas_preload_path()
    if not os.path.exists(lib):
        pytest.skip(f"{lib} not installed")
    assert _blas_in_subprocess(lib).partition(" | ")[0] == "OpenBLAS"
