"""A K/V-apart plan never displaces a user's own quantized attention (issue 55).

mlxgate's width-reading attention takes mlx_lm's place only from mlx_lm's own function, known by its
definition, not by what the name held when mlxgate's module was imported. A conftest that installs its own
kernel first (a kernel under test) used to be taken for mlx_lm's: the K8/V4 gate never ran it and passed,
while the 8-bit gate of the same run went through it. Both cases here run where the kernel is installed
before anything of mlxgate's serving code is imported: a fresh interpreter, and a real pytest session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mlxgate.serving.attention import is_mlx_lms_own

#: A kernel under test in mlx_lm's place, installed at import: it counts its calls and defers to mlx_lm's.
KERNEL = """
from mlx_lm.models import base

CALLS = []
_theirs = base.quantized_scaled_dot_product_attention


def my_quantized_attention(*args, **kwargs):
    CALLS.append(kwargs.get("bits"))
    return _theirs(*args, **kwargs)


base.quantized_scaled_dot_product_attention = my_quantized_attention
"""


def test_only_mlx_lm_s_own_definition_is_mlx_lm_s() -> None:
    import functools

    from mlx_lm.models import base

    from pytest_mlxgate.serving.attention import width_reading_attention

    own = base.__dict__["quantized_scaled_dot_product_attention"]
    if own is width_reading_attention:  # put in place by an earlier test of this process
        from pytest_mlxgate.serving import attention

        own = attention._ONE_WIDTH
    assert is_mlx_lms_own(own)
    assert not is_mlx_lms_own(width_reading_attention)

    @functools.wraps(own)  # a wrapper that borrows mlx_lm's name, module and docstring is still not mlx_lm's
    def wrapped(*args: object, **kwargs: object) -> object:
        return own(*args, **kwargs)

    assert wrapped.__qualname__ == own.__qualname__ and not is_mlx_lms_own(wrapped)
    assert not is_mlx_lms_own(None) and not is_mlx_lms_own(print)


@pytest.mark.slow  # a fresh interpreter
def test_a_kernel_installed_before_mlxgate_is_imported_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "my_kernel.py").write_text(KERNEL)
    script = (
        "import my_kernel\n"
        "from pytest_mlxgate.errors import LeverError\n"
        "from pytest_mlxgate.serving.caches import QuantizedApartKVCache\n"
        "QuantizedApartKVCache(64, 8, 8)\n"  # one width: nothing read, nothing displaced
        "try:\n"
        "    QuantizedApartKVCache(64, 8, 4)\n"
        "except LeverError as e:\n"
        "    print('refused:', e)\n"
        "from mlx_lm.models import base\n"
        "print('in place:', base.quantized_scaled_dot_product_attention.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "refused: mlx_lm.models.base.quantized_scaled_dot_product_attention is " in done.stdout
    assert "'my_kernel.my_quantized_attention', not mlx_lm's own" in done.stdout
    assert "in place: my_quantized_attention" in done.stdout  # the user's kernel stays where it was put


GATES = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = pytest.mark.mlx_kl(prompts=2, tokens=16, decode=4)


@pytest.mark.mlx_lever("kv_apart", kv=True, ref="plain", cand="K8V4", path="serving")
def test_apart(paired):
    assert_kl_below(paired, mean=1e9)


@pytest.mark.mlx_lever("kv_one", kv=True, ref="plain", cand="K8V8", path="serving")
def test_one_width(paired):
    assert_kl_below(paired, mean=1e9)
"""


@pytest.mark.slow  # a pytester session in a subprocess on the tiny model
def test_in_a_session_a_conftest_kernel_makes_the_k_v_apart_gate_an_error_naming_it(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeconftest(KERNEL)
    pytester.makepyfile(test_kv=GATES)
    pytester.makeini("[pytest]\n")
    report = tmp_path / "r.json"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_kv_model_dir}",
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp_path / 'refcache'}",
        "--mlx-allow-untrained",
        "--mlx-prove=off",
        "--mlx-speed=off",
        f"--mlx-report={report}",
        "-p",
        "no:randomly",
    )
    records = {g["nodeid"]: g for g in json.loads(report.read_text())["gates"]}
    apart, one = records["test_kv.py::test_apart"], records["test_kv.py::test_one_width"]
    assert apart["verdict"] == "error", apart  # never a pass measured past the kernel under test
    assert "conftest.my_quantized_attention" in apart["error"]["message"]
    assert "not mlx_lm's own" in apart["error"]["message"]
    assert one["verdict"] == "pass", one  # the one-width gate goes through the user's kernel, as before
    result.assert_outcomes(passed=1, failed=1)
