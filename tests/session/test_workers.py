"""One gate module, one worker: which items are gates, the scheduler xdist is given (xdist's own when
no gate is collected), and real `-n 2` sessions whose tests record the worker they ran on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.session.workers import (
    GateModuleScheduling,
    gate_modules,
    make_scheduler,
    read_gate_modules,
    write_gate_modules,
)

pytest.importorskip("xdist")

GATES = """
import os
import pytest

pytestmark = pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1")


@pytest.mark.parametrize("i", range(4))
def test_gate(i):
    with open(os.environ["MLXGATE_TEST_WORKERS_LOG"], "a") as f:
        f.write(f"gate {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""

OTHERS = """
import os
import pytest


@pytest.mark.parametrize("i", range(4))
def test_other(i):
    with open(os.environ["MLXGATE_TEST_WORKERS_LOG"], "a") as f:
        f.write(f"other {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_gates_are_items_using_paired_or_carrying_a_gate_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="import pytest\npytestmark = pytest.mark.mlx_kl(prompts=2)\ndef test_x(): pass\n",
        test_b="import pytest\n@pytest.fixture\ndef paired(): return 1\ndef test_y(paired): pass\ndef test_z(): pass\n",
        test_c="def test_plain(): pass\n",
    )
    items = pytester.getitems(pytester.path)
    assert sorted(gate_modules(items)) == ["test_a.py", "test_b.py"]


def test_workers_publish_their_gate_modules_whole(tmp_path: Path) -> None:
    assert read_gate_modules(tmp_path) == set() and read_gate_modules(None) == set()
    write_gate_modules(tmp_path, "gw0", ["gates/test_kv.py"])
    write_gate_modules(tmp_path, "gw1", ["gates/test_kv.py", "gates/test_attention.py"])
    (tmp_path / "gates-gw2.json").write_text("{half")  # a broken one is ignored
    assert read_gate_modules(tmp_path) == {"gates/test_kv.py", "gates/test_attention.py"}
    assert not list(tmp_path.glob("*.tmp"))


def _config(pytester: pytest.Pytester, dist: str) -> pytest.Config:
    """A controller's config as xdist leaves it after `-n 2 --dist DIST` (parseconfig skips that step)."""
    return pytester.parseconfig("--tx", "2*popen", "--dist", dist)


class _Node:
    shutting_down = False


@pytest.mark.parametrize("dist", ["load", "loadscope", "loadgroup"])
def test_gate_modules_become_one_work_unit_and_other_tests_keep_their_scope(
    pytester: pytest.Pytester, tmp_path: Path, dist: str
) -> None:
    config = _config(pytester, dist)
    write_gate_modules(tmp_path, "gw0", ["test_gate.py"])
    sched = make_scheduler(config, None, tmp_path)
    assert isinstance(sched, GateModuleScheduling)
    node = _Node()
    sched.add_node(node)  # type: ignore[arg-type]
    assert sched.nodes == [node] and not sched.collection_is_completed and not sched.tests_finished
    sched.add_node_collection(node, ["test_gate.py::test_a"])  # type: ignore[arg-type]
    inner: Any = sched.inner
    assert inner.nodes == [node]  # the node added before the choice was handed over
    split = inner._split_scope
    assert split("test_gate.py::test_a") == split("test_gate.py::Case::test_b[1]") == "test_gate.py"
    expected_other = {
        "load": "test_other.py::Case::test_c",
        "loadscope": "test_other.py::Case",
        "loadgroup": "test_other.py::Case::test_c",
    }[dist]
    assert split("test_other.py::Case::test_c") == expected_other
    if dist == "loadgroup":
        assert split("test_gate.py::test_a@mine") == "mine"  # a test's own xdist_group still wins


def test_without_gates_xdist_keeps_its_own_scheduler(pytester: pytest.Pytester, tmp_path: Path) -> None:
    from xdist.scheduler import LoadScheduling, WorkStealingScheduling

    config = _config(pytester, "load")  # what plain -n 2 runs
    sched = make_scheduler(config, None, tmp_path)
    assert sched is not None
    node = _Node()
    sched.add_node(node)  # type: ignore[arg-type]
    sched.add_node_collection(node, ["test_other.py::test_a"])  # type: ignore[arg-type]
    assert type(sched.inner) is LoadScheduling
    warned: list[str] = []
    write_gate_modules(tmp_path, "gw0", ["test_gate.py"])
    steal = make_scheduler(_config(pytester, "worksteal"), None, tmp_path, warn=warned.append)
    assert steal is not None
    steal.add_node(node)  # type: ignore[arg-type]
    steal.add_node_collection(node, ["test_gate.py::test_a"])  # type: ignore[arg-type]
    assert type(steal.inner) is WorkStealingScheduling and "--dist load keeps each gate module" in warned[0]
    for dist in ("each", "loadfile"):  # whole modules already (or everything everywhere): xdist's own
        assert make_scheduler(_config(pytester, dist), None, tmp_path) is None


@pytest.mark.slow  # a pytester session under -n 2 (no model: the tests only say where they ran)
def test_under_plain_n2_a_gate_modules_tests_share_a_worker_and_the_run_folder_goes(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, temp = tmp_path / "workers.log", tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("MLXGATE_TEST_WORKERS_LOG", str(log))
    monkeypatch.setenv("TMPDIR", str(temp))  # where the controller makes the run folder
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_gates=GATES, test_others=OTHERS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=8)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len({worker for kind, worker in lines if kind == "gate"}) == 1, lines  # 4 tests, one worker
    assert sum(kind == "other" for kind, _ in lines) == 4
    assert "scheduling tests via GateModuleScheduling" in result.stdout.str()
    assert not [p for p in os.listdir(temp) if p.startswith("mlxgate-run-")]  # removed at the end
