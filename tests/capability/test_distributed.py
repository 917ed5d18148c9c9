"""Capability data-parallel over `mx.distributed`: items dealt by rank, results gathered to every rank,
one verdict. The end-to-end test runs two ranks on MLX's ring backend (`mlx.launch`, both on
127.0.0.1) and compares rank 0's run with the single-process one item by item."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import distributed as D
from pytest_mlxgate.capability import user_tasks
from pytest_mlxgate.capability.base import TaskSkipped
from pytest_mlxgate.errors import DistributedRunError

SCRIPT = Path(__file__).parents[1] / "support" / "distributed_capability.py"
LAUNCH = Path(sys.executable).parent / "mlx.launch"


def test_dealing_by_rank_and_interleaving_restore_the_order() -> None:
    items = list(range(11))
    for size in (1, 2, 3, 4, 11, 13):
        parts = [items[r::size] for r in range(size)]
        assert D.interleave(parts) == items


def test_the_rank_comes_from_what_the_launcher_exports() -> None:
    assert D.launch_rank({}) is None
    assert D.launch_rank({"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/x"}) == 1
    assert D.launch_rank({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert D.launch_rank({"MLX_RANK": ""}) is None


def test_one_rank_failing_or_skipping_stops_every_rank_alike() -> None:
    ok = {"task": "t", "seconds": [0, 0]}
    with pytest.raises(DistributedRunError, match=r"rank 1 failed \(ValueError: bad\); every rank stops"):
        D._settle([ok, {"error": "ValueError: bad"}], "capability t (full) over 2 ranks", None)
    mine = KeyError("mine")
    with pytest.raises(KeyError):  # the failing rank raises its own error, traceback and all
        D._settle([ok, {"error": "KeyError: 'mine'"}], "w", mine)
    with pytest.raises(TaskSkipped, match=r"^t: no sandbox \(on rank 1; every rank skips\)$"):
        D._settle([ok, {"skip": "t: no sandbox"}], "w", None)
    with pytest.raises(TaskSkipped, match=r"^t: no data$"):
        D._settle([{"skip": "t: no data"}, {"skip": "t: no data"}], "w", None)
    D._settle([ok, ok], "w", None)


def test_ranks_holding_different_items_refuse_to_pair_them() -> None:
    a = {"task": "t", "tier": "full", "n": None, "count": 3, "items": "abc"}
    D._agree([a, dict(a)], "w")
    with pytest.raises(DistributedRunError, match=r"rank 1 has .*'items': 'xyz'.*same order on the same data"):
        D._agree([a, {**a, "items": "xyz"}], "w")


def test_exchange_and_one_rank_are_the_plain_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx.core as mx
    import mlx_lm

    from pytest_mlxgate.capability.runner import run_capability
    from pytest_mlxgate.levers.lever import Lever

    group = mx.distributed.init()
    assert group.size() == 1
    value = {"text": "é ☃ \x00", "score": 0.1 + 0.2, "nan": float("nan")}
    (back,) = D.exchange(group, value)
    assert back["text"] == value["text"] and back["score"] == value["score"] and back["nan"] != back["nan"]
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Item {i}:", "target": "x"}) + "\n" for i in range(3)))
    user_tasks.jsonl_task("one", data, max_new_tokens=2)
    model = mlx_lm.load(str(tiny_model_dir))[:2]
    lever = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
    plain = run_capability("one", "full", n=None, reference=model, candidate=model, lever=lever)
    one = D.run_capability_distributed("one", "full", n=None, reference=model, candidate=model, lever=lever)
    assert [r.to_json() for r in one.candidate] == [r.to_json() for r in plain.candidate] and one.ranks == 1


def _free_base_port(count: int) -> int:
    """A port p with p .. p+count-1 free on loopback now (the ring backend listens on one per rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65536:
            continue
        try:
            socks = []
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free loopback ports")


def _launch(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [
        str(LAUNCH),
        "-n",
        "2",
        "--backend",
        "ring",
        "--starting-port",
        str(_free_base_port(2)),
        "--python",
        sys.executable,
        str(SCRIPT),
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def _without_timings(found: dict[str, Any], *, details: bool = True) -> dict[str, Any]:
    """What must be equal: everything but wall times and the rank count; `details=False` also drops
    the per-item details (choice log-probabilities: compared apart, to a tolerance)."""
    found = json.loads(json.dumps(found))
    for key in ("size", "seconds"):
        found.pop(key, None)
    for run in found["runs"].values():
        for key in ("durations", "ranks"):
            run.pop(key)
        if not details:
            for arm in ("reference", "candidate"):
                for result in run[arm]:
                    result.pop("detail")
    for tasks in (found["tasks"], found["sequential"]["tasks"]):
        for info in tasks.values():
            info.pop("durations")
            info.pop("ranks", None)
    return found


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two local ranks that can `all_sum` over MLX's ring backend, or a skip saying why not."""
    where = tmp_path_factory.mktemp("probe")
    probe = _launch(["--probe", str(where)], where, timeout=60)
    sums = [where / f"probe{r}.json" for r in range(2)]
    if not all(p.is_file() for p in sums):
        pytest.skip(
            f"MLX's ring backend cannot run two local ranks here: mlx.launch exited {probe.returncode}: "
            f"{(probe.stderr or probe.stdout).strip()[-800:]}"
        )
    assert [json.loads(p.read_text()) for p in sums] == [{"size": 2, "sum": 2.0}] * 2


@pytest.mark.slow  # two mlx.launch jobs (ring backend, 2 local ranks) and the same run in this process: ~20 s
def test_two_ranks_on_the_ring_backend_equal_one_process_item_by_item(
    ring: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx_lm
    from distributed_capability import measure, write_data
    from tinymodel import build_tiny_model

    from pytest_mlxgate.capability.runner import run_capability, run_capability_sequential

    # the planted difference: the candidate is another random model (seed 7), so outcomes flip on some items
    ref, cand = build_tiny_model(tmp_path / "ref", seed=0), build_tiny_model(tmp_path / "cand", seed=7)
    data = tmp_path / "data"
    write_data(data)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.perf_counter()
    job = _launch([str(out), str(ref), str(cand), str(data), str(tmp_path / "cache")], tmp_path, timeout=150)
    launched_s = time.perf_counter() - t0
    assert (out / "rank0.json").is_file() and (out / "rank1.json").is_file(), job.stdout + job.stderr
    rank0, rank1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))

    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    models = (mlx_lm.load(str(ref))[:2], mlx_lm.load(str(cand))[:2])
    t1 = time.perf_counter()
    single = measure(models, data, fixed=run_capability, sequential=run_capability_sequential)
    single_s = time.perf_counter() - t1

    assert rank0["size"] == 2 and {r["ranks"] for r in rank0["runs"].values()} == {2}
    assert all(r["reference_source"] == "computed" for r in rank0["runs"].values())
    # every rank holds the whole run, and it is the one-process run: same items in the same order, the
    # same per-item outputs, scores and verdicts on both arms, the same statistics, verdict and report.
    # Choice log-probabilities agree to float noise, not bit for bit: a rank's share batches (and
    # shares prefixes) differently, as choice_logprobs_many already does against whole prompts.
    assert _without_timings(rank1) == _without_timings(rank0)
    for name, run in single["runs"].items():
        got = rank0["runs"][name]
        assert got["ids"] == run["ids"] and got["rendered"] == run["rendered"], name
        for arm in ("reference", "candidate"):
            for mine, theirs in zip(got[arm], run[arm], strict=True):
                assert {**mine, "detail": None} == {**theirs, "detail": None}, (name, arm, mine["item_id"])
                assert mine["detail"].keys() == theirs["detail"].keys()
                for a, b in zip(mine["detail"].get("logprobs", []), theirs["detail"].get("logprobs", []), strict=True):
                    assert a == pytest.approx(b, abs=1e-4), (name, arm, mine["item_id"])
    assert rank0["checks"] == single["checks"] and rank0["verdict"] == single["verdict"]
    assert rank0["report"] == single["report"]
    assert _without_timings(rank0, details=False) == _without_timings(single, details=False)

    # the run is worth comparing: both arms right and wrong on some items, and some flip between them
    for name in ("pick", "says"):
        ref_s = [r["score"] for r in single["runs"][name]["reference"]]
        cand_s = [r["score"] for r in single["runs"][name]["candidate"]]
        assert 0 < sum(ref_s) < len(ref_s) and 0 < sum(cand_s) < len(cand_s), name
        assert ref_s != cand_s, name
    (drop,) = [c for c in single["checks"] if c["metric"] == "pick drop"]
    assert drop["lower"] < drop["value"] < drop["upper"]
    assert single["sequential"]["verdict"]["n"] == rank0["sequential"]["verdict"]["n"] > 16

    # rank 0 stored the reference arm under the whole item list's key: one process finds it
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    again = measure(models, data, fixed=run_capability, sequential=run_capability_sequential, cache=tmp_path / "cache")
    assert {again["runs"][t]["reference_source"] for t in ("pick", "says")} == {"cache"}
    assert _without_timings(again, details=False)["runs"]["pick"] == _without_timings(single, details=False)["runs"][
        "pick"
    ] | {"reference_source": "cache"}
    print(
        f"mlx.launch job (2 ranks, incl. start-up) {launched_s:.1f} s, rank 0 measuring {rank0['seconds']:.1f} s; "
        f"one process measuring {single_s:.1f} s"
    )


GATE = """
import pytest
from pytest_mlxgate import assert_capability_at_least

from distributed_capability import register

pytestmark = pytest.mark.mlx_lever("model")
register(__import__("pathlib").Path("data"))


def test_capability(paired):
    assert_capability_at_least(paired, ["pick", "says"], max_drop=0.05)
"""


@pytest.mark.slow  # a pytest gate session as two mlx.launch ranks, and the same session in one process: ~25 s
def test_a_gate_session_under_mlx_launch_splits_items_and_only_rank_0_writes(ring: None, tmp_path: Path) -> None:
    import sqlite3

    from distributed_capability import write_data
    from tinymodel import build_tiny_model

    ref, cand = build_tiny_model(tmp_path / "ref", seed=0), build_tiny_model(tmp_path / "cand", seed=7)
    write_data(tmp_path / "data")
    (tmp_path / "test_gate.py").write_text(GATE)
    env = {**__import__("os").environ, "PYTHONPATH": str(SCRIPT.parent)}

    def session(report: str, db: str) -> list[str]:
        return [
            "-m",
            "pytest",
            "test_gate.py",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--mlx-candidate={cand}",
            f"--mlx-reference={ref}",
            "--mlx-inconclusive=warn",
            f"--mlx-report={report}",
            f"--mlx-db={db}",
            "-rA",
        ]

    launched = subprocess.run(
        [
            str(LAUNCH),
            "-n",
            "2",
            "--backend",
            "ring",
            "--starting-port",
            str(_free_base_port(2)),
            "--python",
            sys.executable,
            "--",
            *session("dist.json", "dist.sqlite"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    said = launched.stdout + launched.stderr
    one = subprocess.run(
        [sys.executable, *session("single.json", "off")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert (tmp_path / "single.json").is_file(), one.stdout + one.stderr
    assert (tmp_path / "dist.json").is_file(), said
    assert "mlxgate: rank 1: the summary and reports are rank 0's" in said
    assert said.count("mlxgate: JSON report →") == 1, said  # written once, by rank 0
    with sqlite3.connect(tmp_path / "dist.sqlite") as db:  # one run's rows, not one per rank
        assert db.execute("select count(distinct run_id), count(*) from quality_runs").fetchone() == (1, 1)
    (dist,) = json.loads((tmp_path / "dist.json").read_text())["gates"]
    (single,) = json.loads((tmp_path / "single.json").read_text())["gates"]
    assert dist["verdict"] == single["verdict"] and dist["checks"] == single["checks"]
    for name in ("pick", "says"):
        mine, theirs = dist["tasks"][name], single["tasks"][name]
        assert mine["ranks"] == 2 and "ranks" not in theirs
        for key in ("n", "items", "flipped", "ref_ci", "cand_ci", "drop_test", "drop_verdict"):
            assert mine[key] == theirs[key], (name, key)
