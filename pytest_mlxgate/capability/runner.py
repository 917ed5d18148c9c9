"""Run one capability task on both arms over the very same items, so outcomes pair item by item.

Each arm runs with its lever applied (env, patch, context) and its KV plan (serving-path caches);
generation is batched and greedy. A task whose data or sandbox is missing is skipped with the
reason (never silently passed).
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, Required, TypedDict, Unpack

from ..common.refstore import store_or_warn
from ..errors import MlxgateUsageError, VacuousLeverError
from ..serving.kv_plan import require_kv_difference
from ..stats.sequential import run_sequential
from . import refcache
from .base import (
    EXTRA_TASK_NAMES,
    TASK_NAMES,
    Budget,
    Item,
    ItemResult,
    RunOptions,
    TaskDataMissing,
    TaskSkipped,
    Tier,
    prompt_hash,
)
from .generate import Progress, choice_logprobs_many, generate_greedy, prompt_length
from .result import CapabilityRun
from .sandbox import SandboxUnavailable
from .served import served_outputs
from .user_tasks import find_user_task, registered_names

if TYPE_CHECKING:
    from ..levers.lever import Arm, Lever
    from ..remote.arm import ServedArm
    from .base import Task
    from .refcache import CapabilityCache

__all__ = [
    "ArmProgress",
    "CapabilityArgs",
    "PreparedRun",
    "load_task",
    "prepare",
    "run_arm",
    "run_capability",
    "run_capability_sequential",
    "sequential_order",
]


class ArmProgress(Protocol):
    """What reports one arm's progress: `(done, total)` as items finish, then one closing line."""

    def __call__(self, done: int, total: int) -> None: ...

    def finish(self, verb: str = ...) -> None: ...


def load_task(name: str, options: RunOptions | None = None) -> Task:
    """Task `name`: its module's shared `TASK`, or with `options`, that task configured for one run
    (a new object where an option applies, so the shared one never carries a caller's options)."""
    task: Task
    if name in TASK_NAMES or name in EXTRA_TASK_NAMES:
        task = importlib.import_module(f"{__package__}.tasks.{name}").TASK
    else:
        found = find_user_task(name)
        if found is None:
            known = ", ".join([*TASK_NAMES, *EXTRA_TASK_NAMES, *registered_names()])
            raise MlxgateUsageError(
                f"'{name}' is not a capability task; known: {known}. Define your own with "
                "pytest_mlxgate.register_task(task) or pytest_mlxgate.jsonl_task(name, path) in a gate "
                "module or conftest.py, or publish it under the entry-point group 'pytest_mlxgate.tasks'"
            )
        task = found
    return task if options is None else task.configured(options)


def run_arm(
    task: Task,
    items: Sequence[Item],
    model: Any,
    tokenizer: Any,
    lever: Lever,
    arm: Arm,
    *,
    max_new_tokens: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
    rendered: Mapping[str, str] | None = None,
    server: ServedArm | None = None,
) -> tuple[list[ItemResult], dict[str, str]]:
    """Score every item on one arm: choice items by their choices' log-probabilities (a prefix the
    items share prefilled once), the rest by greedy generation (batched), each output scored by the task.
    `server`: the arm is that server's (`capability.served`): its outputs, scored the same way."""
    rendered = dict(rendered) if rendered is not None else {it.id: task.render(it, tokenizer) for it in items}
    budget = _budget(task, max_new_tokens)
    if server is not None:
        served = served_outputs(task, items, rendered, server, tokenizer, budget=budget, progress=progress)
        return [_stamp(task.score(it, served[it.id]), rendered[it.id]) for it in items], rendered
    if lever.kind == "kv" and arm == "candidate" and items:
        _require_kv_exercised(task, items, rendered, model, tokenizer, lever, budget)
    results: dict[str, ItemResult] = {}
    calls = [0]

    def count() -> None:
        calls[0] += 1

    with lever.applied(arm, on_call=count if lever.kind == "patch" else None):
        kv = lever.kv_plan(arm)
        peers = [lever.kv_plan(other) for other in ("reference", "candidate") if other != arm]
        choice = [it for it in items if it.kind == "choice"]
        gen = [it for it in items if it.kind != "choice"]
        total = len(items)
        logps = choice_logprobs_many(
            model,
            tokenizer,
            [rendered[it.id] for it in choice],
            [it.choices for it in choice],
            progress=(lambda done, _: progress(done, total)) if progress else None,
        )
        for it, item_logps in zip(choice, logps, strict=True):
            results[it.id] = _stamp(task.score(it, "", choice_logprobs=item_logps), rendered[it.id])
        outputs = generate_greedy(
            model,
            tokenizer,
            [rendered[it.id] for it in gen],
            max_new_tokens=budget,
            kv=kv,
            peers=peers,
            batch_size=batch_size,
            progress=(lambda done, _: progress(len(choice) + done, total)) if progress else None,
        )
    if items:
        lever.require_exercised(arm, calls[0] if lever.kind == "patch" else None, during=f"capability task {task.name}")
    for it, out in zip(gen, outputs, strict=True):
        results[it.id] = _stamp(task.score(it, out), rendered[it.id])
    return [results[it.id] for it in items], rendered


def _require_kv_exercised(
    task: Task,
    items: Sequence[Item],
    rendered: Mapping[str, str],
    model: Any,
    tokenizer: Any,
    lever: Lever,
    budget: int,
) -> None:
    """Refuse a KV lever on a task it cannot change: choices are scored by one plain teacher-forced
    prefill (no KV plan), and generation must run past a quantized spec's start."""
    gen = [it for it in items if it.kind != "choice"]
    if not gen:
        raise VacuousLeverError(
            f"KV lever {lever.name!r} on capability task {task.name}: every item is scored by its choices' "
            "log-probabilities, one teacher-forced prefill with no KV plan, so both arms compute the same "
            "numbers and the gate would pass without testing anything. Fix: a generation task (gsm8k, "
            "ifeval, bfcl, humaneval, hashhop), or a KL gate on the serving path for this lever"
        )
    longest = max(prompt_length(tokenizer, rendered[it.id]) for it in gen) + budget
    require_kv_difference(
        lever.name,
        lever.kv_plan("reference"),
        lever.kv_plan("candidate"),
        model,
        longest,
        where=f"capability task {task.name}'s generation",
    )


class CapabilityArgs(TypedDict, total=False):
    """The keyword arguments of `run_capability`, which `distributed.run_capability_distributed` takes
    too. `reference`/`candidate`: (model, tokenizer); `max_new_tokens` lowers the task's budget;
    `batch_size` (default 16) of generation; `progress_for(arm, total)` reports an arm's progress.
    With `reference_cache` and `reference_key` (what the reference model and lever contribute), the
    reference arm's results come from the cache when the whole key matches, and are stored after a
    run otherwise; `refresh_reference` recomputes them. `items` (already loaded, e.g. one batch of a
    sequential run) replaces loading the tier's."""

    n: Required[int | None]
    reference: Required[tuple[Any, Any]]
    candidate: Required[tuple[Any, Any]]
    lever: Required[Lever]
    max_new_tokens: int | None
    batch_size: int
    allow_unsandboxed: bool
    progress_for: Callable[[Arm, int], ArmProgress] | None
    reference_cache: CapabilityCache | None
    reference_key: Mapping[str, Any] | None
    refresh_reference: bool
    items: Sequence[Item] | None
    servers: Mapping[Arm, ServedArm]  # the arms served over HTTP (--mlx-cand-server, --mlx-ref-server)


@dataclass(frozen=True)
class PreparedRun:
    """One capability run up to its arms: the task, its items, the reference arm's rendered inputs
    (the cache key hashes them), the key and what the reference cache holds under it (None: run it).
    `run_capability` runs both arms on it; `distributed` runs each rank's share of the items."""

    name: str
    tier: Tier
    args: CapabilityArgs
    task: Task
    items: list[Item]
    rendered: dict[str, str]
    key: dict[str, Any] | None
    cached: list[ItemResult] | None

    def arm(
        self,
        which: Arm,
        items: Sequence[Item],
        rendered: Mapping[str, str] | None = None,
    ) -> tuple[list[ItemResult], dict[str, str]]:
        """`run_arm` of `which` over `items` (rendered with that arm's tokenizer unless given)."""
        progress_for = self.args.get("progress_for")
        meter = progress_for(which, len(items)) if progress_for else None
        out = run_arm(
            self.task,
            items,
            *self.args[which],
            self.args["lever"],
            which,
            max_new_tokens=self.args.get("max_new_tokens"),
            batch_size=self.args.get("batch_size", 16),
            progress=meter,
            rendered=rendered,
            server=(self.args.get("servers") or {}).get(which),
        )
        if meter is not None:
            meter.finish("scored")
        return out

    def store(self, reference: list[ItemResult]) -> None:
        """Keep the reference arm's results under the key (no cache or no key: nothing to keep)."""
        cache = self.args.get("reference_cache")
        if cache is not None and self.key is not None:
            store_or_warn(cache, self.key, reference)


def prepare(name: str, tier: Tier, args: CapabilityArgs) -> PreparedRun:
    """The task configured for the run, its items (loaded unless given) rendered for the reference
    arm, and the reference cache's entry; raises TaskSkipped when the task cannot run here."""
    unknown = sorted(set(args) - set(CapabilityArgs.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    task = load_task(name, RunOptions(allow_unsandboxed=args.get("allow_unsandboxed", False)))
    given = args.get("items")
    items = list(given) if given is not None else _load_items(task, name, tier, args["n"])
    rendered = {it.id: task.render(it, args["reference"][1]) for it in items}  # once: the key hashes it too
    cache, base = args.get("reference_cache"), args.get("reference_key")
    key: dict[str, Any] | None = None
    cached: list[ItemResult] | None = None
    if cache is not None and base is not None:
        key = _cache_key(
            task,
            name,
            tier,
            args["n"],
            items,
            rendered,
            dict(base),
            max_new_tokens=args.get("max_new_tokens"),
            batch_size=args.get("batch_size", 16),
            lever=args["lever"],
        )
        if not args.get("refresh_reference"):
            cached = cache.load(key, len(items))
    return PreparedRun(name, tier, args, task, items, rendered, key, cached)


def run_capability(name: str, tier: Tier, **args: Unpack[CapabilityArgs]) -> CapabilityRun:
    """Both arms of one task over the same items (`CapabilityArgs`: the models, the lever, the
    reference cache...); raises TaskSkipped when the task cannot run here."""
    run = prepare(name, tier, args)
    t0 = time.perf_counter()
    try:
        if run.cached is not None:
            ref, rendered = run.cached, run.rendered
        else:
            ref, rendered = run.arm("reference", run.items, run.rendered)
            run.store(ref)
        t1 = time.perf_counter()
        cand, _ = run.arm("candidate", run.items)
    except SandboxUnavailable as e:
        raise TaskSkipped(f"{name}: {e}") from None
    t2 = time.perf_counter()
    return CapabilityRun(
        task=name,
        tier=tier,
        graded=run.task.graded,
        items=run.items,
        reference=ref,
        candidate=cand,
        durations={"reference_s": round(t1 - t0, 3), "candidate_s": round(t2 - t1, 3)},
        rendered=rendered,
        reference_source="cache" if run.cached is not None else "computed",
    )


def _load_items(task: Task, name: str, tier: Tier, n: int | None) -> list[Item]:
    try:
        items = task.load(tier, n=n)
    except TaskDataMissing as e:
        raise TaskSkipped(f"{name}: {e}") from None
    if not items:
        raise TaskSkipped(f"{name}: the {tier} tier has no items")
    return items


def sequential_order(name: str, items: Sequence[Item]) -> list[Item]:
    """The pool in a seeded shuffled order, fixed before any item is scored.

    The anytime-valid bound needs items whose outcomes do not drift with their position; task
    loaders may group items (MMLU by subject, for prefix reuse), so the order is shuffled here."""
    order = list(items)
    random.Random(f"mlxgate-sequential:{name}").shuffle(order)
    return order


def run_capability_sequential(
    name: str,
    tier: Tier,
    *,
    budget: Budget,
    max_drop: float,
    alpha: float,
    fail_alpha: float | None = None,
    say: Callable[[str], None] | None = None,
    batch_runner: Callable[..., CapabilityRun] | None = None,
    clock: Callable[[], float] | None = None,
    **arms: Any,
) -> CapabilityRun:
    """Both arms, a batch at a time, until the drop is shown either way or `budget` is spent.

    `arms` are `run_capability`'s keyword arguments (models, lever, cache...). Every batch is an
    ordinary paired run of its items, so the reference cache serves each batch of an unchanged gate.
    The returned run carries every item scored and `sequential`, the procedure's verdict.
    `batch_runner` (default `run_capability`) and `clock` (of the time budget) let
    `distributed.py` split each batch over ranks that all stop after the same one."""
    task = load_task(name, RunOptions(allow_unsandboxed=bool(arms.get("allow_unsandboxed"))))
    pool = sequential_order(name, _load_items(task, name, tier, budget.items))
    batches: list[CapabilityRun] = []

    def next_batch(k: int) -> list[tuple[float, float]]:
        start = sum(b.n for b in batches)
        chunk = pool[start : start + k]
        if not chunk:
            return []
        run = (batch_runner or run_capability)(name, tier, n=None, items=chunk, **arms)
        batches.append(run)
        return list(zip(run.scores("reference"), run.scores("candidate"), strict=True))

    def report(v: Any) -> None:
        if say is not None:
            say(
                f"capability {name} ({tier}): {v.n} items, drop {v.drop:+.3f} within [{v.lower:.3f}, {v.upper:.3f}] "
                f"vs max_drop {max_drop:.3f}: {'shown' if v.verdict != 'inconclusive' else 'going on'}"
            )

    verdict = run_sequential(
        next_batch,
        max_drop=max_drop,
        alpha=alpha,
        fail_alpha=fail_alpha,
        batch_size=budget.batch,
        max_items=budget.items,
        max_seconds=budget.seconds,
        on_batch=report,
        clock=clock or time.monotonic,
    )
    if not batches:
        raise TaskSkipped(f"{name}: the {tier} tier has no items")
    sources = {b.reference_source for b in batches}
    return CapabilityRun(
        task=name,
        tier=tier,
        graded=batches[0].graded,
        items=[it for b in batches for it in b.items],
        reference=[r for b in batches for r in b.reference],
        candidate=[c for b in batches for c in b.candidate],
        durations={k: round(sum(b.durations.get(k, 0.0) for b in batches), 3) for k in ("reference_s", "candidate_s")},
        rendered={k: v for b in batches for k, v in b.rendered.items()},
        reference_source=sources.pop() if len(sources) == 1 else "mixed",
        sequential={**verdict.to_json(), "budget": budget.to_json()},
        ranks=batches[0].ranks,
    )


def _cache_key(
    task: Task,
    name: str,
    tier: Tier,
    n: int | None,
    items: Sequence[Item],
    rendered: Mapping[str, str],
    base: dict[str, Any],
    *,
    max_new_tokens: int | None,
    batch_size: int,
    lever: Lever,
) -> dict[str, Any]:
    """Everything the reference arm's results depend on, beyond the model and lever in `base`."""
    return {
        **base,
        "format": refcache.CAPABILITY_CACHE_FORMAT,
        "task": name,
        "task_code": refcache.task_code_digest(task),
        "generation_code": refcache.generation_code_digest(),
        # the generation loop is chosen from both arms' KV plans (generate.generation_route)
        "kv_plans": [lever.kv_plan(a).source for a in ("reference", "candidate")] if lever.kind == "kv" else [],
        "tier": tier,
        "n": n,
        "max_new_tokens": _budget(task, max_new_tokens),
        "batch_size": batch_size,
        "items": [[it.id, prompt_hash(rendered[it.id])] for it in items],
    }


def _budget(task: Task, max_new_tokens: int | None) -> int:
    """The generation budget: the task's own, lowered by --mlx-max-new-tokens."""
    return min(task.max_new_tokens, max_new_tokens) if max_new_tokens else task.max_new_tokens


def _stamp(result: ItemResult, rendered: str) -> ItemResult:
    """Every result carries the hash of the exact rendered input it answered (the runner knows it)."""
    return replace(result, prompt_hash=prompt_hash(rendered))
