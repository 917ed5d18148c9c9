"""A capability task data-parallel over `mx.distributed`: one process per rank, as `mlx.launch` starts them.

Items are dealt round-robin (item i to rank i % size, as mlx_lm's evaluate deals its requests), so
every rank's share mixes the whole tier (task loaders group items, e.g. MMLU by subject) and the
original order is `i = rank + j * size`. Each rank runs both arms on its share; then every rank
gathers every rank's per-item results, rebuilds the run in the original order and computes the
paired statistics itself: every rank reaches the single-process verdict, and only rank 0 writes.

What travels: each rank's `ItemResult`s as JSON bytes in a uint8 array (lengths `all_gather`ed
first, then the buffers zero-padded to the longest and `all_gather`ed, as mlx_lm's evaluate gathers
its completions). Not flags or scores as numeric arrays: the record keeps every item's outputs,
verdicts and prompt hashes (`paired_items`, the flipped items), and the reference cache stores whole
results, so a numeric encoding would make the distributed record poorer than the single-process one.
JSON round-trips Python floats exactly: the gathered scores are the ones each rank computed. A share
batches differently from the whole tier (generation batches, shared choice prefixes), so choice
log-probabilities agree with one process's to float noise (~1e-5), the outcomes exactly bar a near-tie.

Every rank takes part in each exchange even when it failed or cannot run the task (its payload
says so), so one rank's error or skip stops every rank with the same message instead of leaving
the others waiting in a collective.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from ..errors import DistributedRunError
from .base import ItemResult, TaskSkipped, prompt_hash
from .result import CapabilityRun
from .sandbox import SandboxUnavailable

if TYPE_CHECKING:
    from mlx.core.distributed import Group

    from .base import Tier
    from .runner import CapabilityArgs

__all__ = [
    "RANK_VARIABLES",
    "exchange",
    "interleave",
    "launch_rank",
    "run_capability_distributed",
    "run_capability_sequential_distributed",
    "shared_clock",
]

#: What `mlx.launch` exports to each rank it starts (ring, jaccl, nccl); under its mpi backend, mpirun's.
RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK")

T = TypeVar("T")


def launch_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank when a distributed launcher started it, else None.

    Standard library only: the plugin asks at configure time, before anything imports mlx."""
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def exchange(group: Group, value: Any) -> list[Any]:
    """Every rank's JSON-able `value`, in rank order, on every rank (two `all_gather`s of arrays)."""
    import mlx.core as mx
    import numpy as np

    data = json.dumps(value, separators=(",", ":")).encode()
    with mx.stream(mx.cpu):
        lengths = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int32), group=group)
        sizes = [int(x) for x in np.asarray(lengths)]
        width = max(sizes)
        padded = np.frombuffer(data + bytes(width - len(data)), dtype=np.uint8).reshape(1, width)
        rows = np.asarray(mx.distributed.all_gather(mx.array(padded), group=group))
    return [json.loads(rows[r, : sizes[r]].tobytes()) for r in range(len(sizes))]


def interleave(parts: Sequence[Sequence[T]]) -> list[T]:
    """Rank r's j-th result back at position r + j * size: the inverse of `items[rank::size]`."""
    size = len(parts)
    out: list[Any] = [None] * sum(len(p) for p in parts)
    for r, part in enumerate(parts):
        for j, x in enumerate(part):
            out[r + j * size] = x
    return out


def shared_clock(group: Group) -> Callable[[], float]:
    """Seconds since this call, the largest over the ranks: a time budget every rank reads alike, so
    a sequential run stops after the same batch everywhere (each call is a collective: every rank
    calls it as often, which holds since every rank sees the same gathered results)."""
    start = time.monotonic()

    def clock() -> float:
        import mlx.core as mx
        import numpy as np

        with mx.stream(mx.cpu):
            latest = mx.distributed.all_max(mx.array([time.monotonic() - start], dtype=mx.float32), group=group)
            return float(np.asarray(latest)[0])

    return clock


def run_capability_distributed(
    name: str, tier: Tier, *, group: Group | None = None, **args: Unpack[CapabilityArgs]
) -> CapabilityRun:
    """`run_capability` with the items split over the ranks of `group` (default: `mx.distributed.init()`).

    With one rank it is `run_capability`. Otherwise every rank returns the same whole run, in the
    items' original order. The reference cache is keyed over the whole item list, exactly as one
    process keys it (either serves the other); it is used when every rank finds the entry, and
    only rank 0 stores one. `progress_for` counts this rank's share."""
    from .runner import prepare, run_capability

    if group is None:
        import mlx.core as mx

        group = mx.distributed.init()
    size, rank = group.size(), group.rank()
    if size == 1:
        return run_capability(name, tier, **args)

    where = f"capability {name} ({tier}) over {size} ranks"
    # 1. every rank loads and renders the whole tier (deterministic), then they compare what they hold
    failure: Exception | None = None
    said: dict[str, Any] = {"task": name, "tier": tier, "n": args["n"]}
    try:
        run = prepare(name, tier, args)
        said["items"] = _digest([(it.id, prompt_hash(run.rendered[it.id])) for it in run.items])
        said["count"] = len(run.items)
        said["cached"] = run.cached is not None
    except TaskSkipped as e:
        said["skip"] = str(e)
    except Exception as e:  # noqa: BLE001 - reported to every rank, then raised here as itself
        said["error"], failure = f"{type(e).__name__}: {e}", e
    views = exchange(group, said)
    _settle(views, where, failure)
    _agree(views, where)
    from_cache = all(v["cached"] for v in views)

    # 2. both arms on this rank's share, then every rank's results to every rank
    mine = run.items[rank::size]
    done: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        ref_part = None if from_cache else run.arm("reference", mine, {it.id: run.rendered[it.id] for it in mine})[0]
        t1 = time.perf_counter()
        cand_part, _ = run.arm("candidate", mine)  # rendered with the candidate's tokenizer, as run_capability
        t2 = time.perf_counter()
        done = {
            "reference": None if ref_part is None else [r.to_json() for r in ref_part],
            "candidate": [r.to_json() for r in cand_part],
            "seconds": [t1 - t0, t2 - t1],
        }
    except SandboxUnavailable as e:
        done = {"skip": f"{name}: {e}"}
    except TaskSkipped as e:
        done = {"skip": str(e)}
    except Exception as e:  # noqa: BLE001 - as above
        done, failure = {"error": f"{type(e).__name__}: {e}"}, e
    parts = exchange(group, done)
    _settle(parts, where, failure)

    def joined(which: str) -> list[ItemResult]:
        return interleave([[ItemResult.from_json(d) for d in p[which]] for p in parts])

    candidates = joined("candidate")
    if from_cache:
        assert run.cached is not None
        references = run.cached
    else:
        references = joined("reference")
        if rank == 0:
            run.store(references)
    return CapabilityRun(
        task=name,
        tier=tier,
        graded=run.task.graded,
        items=run.items,
        reference=references,
        candidate=candidates,
        # wall time of each phase: the slowest rank's
        durations={
            "reference_s": round(max(p["seconds"][0] for p in parts), 3),
            "candidate_s": round(max(p["seconds"][1] for p in parts), 3),
        },
        rendered=run.rendered,
        reference_source="cache" if from_cache else "computed",
        ranks=size,
    )


def run_capability_sequential_distributed(
    name: str, tier: Tier, *, group: Group | None = None, **args: Any
) -> CapabilityRun:
    """`run_capability_sequential` (`args`: its keyword arguments) with each batch split over the ranks;
    every rank stops after the same batch (the same gathered pairs, and a time budget read on `shared_clock`)."""
    from .runner import run_capability_sequential

    if group is None:
        import mlx.core as mx

        group = mx.distributed.init()
    if group.size() == 1:
        return run_capability_sequential(name, tier, **args)
    return run_capability_sequential(
        name, tier, batch_runner=partial(run_capability_distributed, group=group), clock=shared_clock(group), **args
    )


def _digest(pairs: Sequence[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


def _settle(views: Sequence[Mapping[str, Any]], where: str, failure: Exception | None) -> None:
    """Stop every rank alike: a rank's error fails all (this rank's own error raised as itself), a skip skips all."""
    errors = [(r, v["error"]) for r, v in enumerate(views) if "error" in v]
    if failure is not None:
        raise failure
    if errors:
        r, message = errors[0]
        raise DistributedRunError(
            f"{where}: rank {r} failed ({message}); every rank stops here — its output has the traceback"
        )
    skips = [(r, v["skip"]) for r, v in enumerate(views) if "skip" in v]
    if skips:
        r, message = skips[0]
        raise TaskSkipped(message if len(skips) == len(views) else f"{message} (on rank {r}; every rank skips)")


def _agree(views: Sequence[Mapping[str, Any]], where: str) -> None:
    """Every rank must be at the same task with the same items, or the pairs would be nonsense."""
    fields = ("task", "tier", "n", "count", "items")
    first = {k: views[0].get(k) for k in fields}
    for r, v in enumerate(views[1:], start=1):
        other = {k: v.get(k) for k in fields}
        if other != first:
            raise DistributedRunError(
                f"{where}: the ranks disagree on what they run: rank 0 has {first}, rank {r} has {other}. Every "
                "rank must run the same gates in the same order on the same data and models: the same command "
                "on each (no xdist, no random test order), with the same dataset files and tokenizer"
            )
