"""One capability measurement on two tiny models, as one rank of an `mlx.launch` job or in one process.

`mlx.launch -n 2 --backend ring --python .venv/bin/python distributed_capability.py OUT REF CAND DATA`
runs it on two ranks: each writes `OUT/rank<r>.json`. `measure(...)` is the same measurement, called
in-process by the test with the single-process runners, so the two are compared item by item.
`... distributed_capability.py --probe OUT` only checks that the ranks can `all_sum`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pytest_mlxgate.capability.base import Budget

#: Two tasks: choice items (scored by log-probabilities) and generated ones (scored by a regex on the text).
TASKS = ("pick", "says")
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "tree", "rock", "milk", "fish"]
N_ITEMS = 45  # not a multiple of 2: the ranks' shares differ in length
BUDGET = Budget(items=40, seconds=600.0, batch=16)  # the sequential run: three batches, the last a short one
MAX_DROP, FLOOR, ALPHA = 0.05, 0.3, 0.05


def write_data(directory: Path) -> dict[str, Path]:
    """The tasks' JSONL files: targets from a seeded generator, so a random model is right about half the time."""
    import random

    rng = random.Random(12)
    directory.mkdir(parents=True, exist_ok=True)
    pick = [
        {
            "prompt": f"Item {i}: {WORDS[i % 10]} or {WORDS[(i * 3 + 1) % 10]}?",
            "choices": [f" {WORDS[i % 10]}", f" {WORDS[(i * 3 + 1) % 10]}"],
            "target": rng.randrange(2),
        }
        for i in range(N_ITEMS)
    ]
    # a random model tends to copy the number that ends its prompt, not always: right on some items only
    says = [{"prompt": f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]} {i}", "target": r"^\d"} for i in range(N_ITEMS)]
    paths = {"pick": directory / "pick.jsonl", "says": directory / "says.jsonl"}
    for name, rows in (("pick", pick), ("says", says)):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def register(data: Path) -> None:
    from pytest_mlxgate.capability.user_tasks import jsonl_task

    jsonl_task("pick", data / "pick.jsonl", scoring="choice")
    jsonl_task("says", data / "says.jsonl", scoring="regex", max_new_tokens=3)


def measure(
    models: tuple[Any, Any], data: Path, *, fixed: Any, sequential: Any, cache: Path | None = None
) -> dict[str, Any]:
    """Both tasks through `fixed` (run_capability or its distributed twin), "pick" once more through
    `sequential` (n=Budget); the checks, verdict and failure report as `assert_capability_at_least` makes them."""
    from pytest_mlxgate.capability.assertions import capability_checks, failure_report
    from pytest_mlxgate.capability.refcache import CapabilityCache
    from pytest_mlxgate.levers.lever import Lever
    from pytest_mlxgate.results.verdicts import overall_verdict

    register(data)
    lever = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
    arms: dict[str, Any] = {"reference": models[0], "candidate": models[1], "lever": lever}
    if cache is not None:
        arms |= {"reference_cache": CapabilityCache(cache), "reference_key": {"model": "tiny@seed0", "lever": "0"}}
    runs = {name: fixed(name, "full", n=None, **arms) for name in TASKS}
    checks, stats = capability_checks(runs, floor=FLOOR, max_drop=MAX_DROP, alpha=ALPHA)
    verdict = overall_verdict(checks)
    seq = sequential("pick", "full", budget=BUDGET, max_drop=MAX_DROP, alpha=ALPHA, **arms)
    seq_checks, seq_stats = capability_checks({"pick": seq}, floor=None, max_drop=MAX_DROP, alpha=ALPHA)
    return {
        "runs": {name: _run_json(run) for name, run in {**runs, "pick-sequential": seq}.items()},
        "checks": checks,
        "tasks": stats,
        "verdict": verdict,
        "report": failure_report(runs, stats, checks, verdict=verdict, rerun="", nodeid="gate"),
        "sequential": {"checks": seq_checks, "tasks": seq_stats, "verdict": seq.sequential},
    }


def _run_json(run: Any) -> dict[str, Any]:
    return {
        "ids": [it.id for it in run.items],
        "reference": [r.to_json() for r in run.reference],
        "candidate": [c.to_json() for c in run.candidate],
        "rendered": run.rendered,
        "reference_source": run.reference_source,
        "ranks": run.ranks,
        "durations": run.durations,
    }


def main(argv: list[str]) -> int:
    import mlx.core as mx

    group = mx.distributed.init()
    if argv[0] == "--probe":
        total = mx.distributed.all_sum(mx.array([1.0]), stream=mx.cpu).item()
        Path(argv[1], f"probe{group.rank()}.json").write_text(json.dumps({"size": group.size(), "sum": total}))
        return 0
    import time

    import mlx_lm

    from pytest_mlxgate.capability.distributed import (
        run_capability_distributed,
        run_capability_sequential_distributed,
    )

    out, ref, cand, data = (Path(a) for a in argv[:4])
    cache = Path(argv[4]) if len(argv) > 4 else None
    models = (mlx_lm.load(str(ref))[:2], mlx_lm.load(str(cand))[:2])
    t0 = time.perf_counter()
    found = measure(
        models, data, fixed=run_capability_distributed, sequential=run_capability_sequential_distributed, cache=cache
    )
    found["size"], found["seconds"] = group.size(), round(time.perf_counter() - t0, 3)
    (out / f"rank{group.rank()}.json").write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
