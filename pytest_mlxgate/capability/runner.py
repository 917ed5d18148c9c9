"""Run one capability task on both arms over the very same items, so outcomes pair item by item.

Each arm runs with its lever applied (env, patch, context) and its KV plan (serving-path caches);
generation is batched and greedy. A task whose data or sandbox is missing is skipped with the
reason (never silently passed).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import MlxgateUsageError
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
from .result import CapabilityRun
from .sandbox import SandboxUnavailable

if TYPE_CHECKING:
    from ..levers.lever import Arm, Lever
    from .base import Task
    from .generate import Progress
    from .refcache import CapabilityCache

__all__ = ["ArmProgress", "load_task", "run_arm", "run_capability", "run_capability_sequential", "sequential_order"]


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
        from .user_tasks import find_user_task, registered_names

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
) -> tuple[list[ItemResult], dict[str, str]]:
    """Score every item on one arm: choice items by their choices' log-probabilities (a prefix the
    items share prefilled once), the rest by greedy generation (batched), each output scored by the task."""
    from .generate import choice_logprobs_many, generate_greedy

    rendered = dict(rendered) if rendered is not None else {it.id: task.render(it, tokenizer) for it in items}
    budget = _budget(task, max_new_tokens)
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
        logps = choice_logprobs_many(model, tokenizer, [rendered[it.id] for it in choice], [it.choices for it in choice],
                                     progress=(lambda done, _: progress(done, total)) if progress else None)
        for it, item_logps in zip(choice, logps):
            results[it.id] = _stamp(task.score(it, "", choice_logprobs=item_logps), rendered[it.id])
        outputs = generate_greedy(model, tokenizer, [rendered[it.id] for it in gen], max_new_tokens=budget, kv=kv,
                                  peers=peers, batch_size=batch_size,
                                  progress=(lambda done, _: progress(len(choice) + done, total)) if progress else None)
    if items:
        lever.require_exercised(arm, calls[0] if lever.kind == "patch" else None, during=f"capability task {task.name}")
    for it, out in zip(gen, outputs):
        results[it.id] = _stamp(task.score(it, out), rendered[it.id])
    return [results[it.id] for it in items], rendered


def _require_kv_exercised(task: Task, items: Sequence[Item], rendered: Mapping[str, str], model: Any,
                          tokenizer: Any, lever: Lever, budget: int) -> None:
    """Refuse a KV lever on a task it cannot change: choices are scored by one plain teacher-forced
    prefill (no KV plan), and generation must run past a quantized spec's start."""
    from ..errors import VacuousLeverError
    from ..levers.kvcache import require_kv_difference
    from .generate import prompt_length

    gen = [it for it in items if it.kind != "choice"]
    if not gen:
        raise VacuousLeverError(
            f"KV lever {lever.name!r} on capability task {task.name}: every item is scored by its choices' "
            "log-probabilities, one teacher-forced prefill with no KV plan, so both arms compute the same "
            "numbers and the gate would pass without testing anything. Fix: a generation task (gsm8k, "
            "ifeval, bfcl, humaneval, hashhop), or a KL gate on the serving path for this lever"
        )
    longest = max(prompt_length(tokenizer, rendered[it.id]) for it in gen) + budget
    require_kv_difference(lever.name, lever.kv_plan("reference"), lever.kv_plan("candidate"), model, longest,
                          where=f"capability task {task.name}'s generation")


def run_capability(
    name: str,
    tier: Tier,
    *,
    n: int | None,
    reference: tuple[Any, Any],
    candidate: tuple[Any, Any],
    lever: Lever,
    max_new_tokens: int | None = None,
    batch_size: int = 16,
    allow_unsandboxed: bool = False,
    progress_for: Callable[[Arm, int], ArmProgress] | None = None,
    reference_cache: CapabilityCache | None = None,
    reference_key: Mapping[str, Any] | None = None,
    refresh_reference: bool = False,
    items: Sequence[Item] | None = None,
) -> CapabilityRun:
    """Both arms of one task; raises TaskSkipped when the task cannot run here.

    With `reference_cache` and `reference_key` (what the reference model and lever contribute),
    the reference arm's results come from the cache when the whole key matches, and are stored
    after a run otherwise; `refresh_reference` recomputes them. `items` (already loaded, e.g. one
    batch of a sequential run) replaces loading the tier's."""
    task = load_task(name, RunOptions(allow_unsandboxed=allow_unsandboxed))
    if items is None:
        items = _load_items(task, name, tier, n)

    def arm(model_tok: tuple[Any, Any], which: Arm, rendered: Mapping[str, str] | None = None,
            ) -> tuple[list[ItemResult], dict[str, str]]:
        meter = progress_for(which, len(items)) if progress_for else None
        out = run_arm(task, items, *model_tok, lever, which, max_new_tokens=max_new_tokens, batch_size=batch_size,
                      progress=meter, rendered=rendered)
        if meter is not None:
            meter.finish("scored")
        return out

    key: dict[str, Any] | None = None
    cached: list[ItemResult] | None = None
    ref_rendered = {it.id: task.render(it, reference[1]) for it in items}  # once: the key hashes it too
    if reference_cache is not None and reference_key is not None:
        key = _cache_key(task, name, tier, n, items, ref_rendered, dict(reference_key),
                         max_new_tokens=max_new_tokens, batch_size=batch_size, lever=lever)
        if not refresh_reference:
            cached = reference_cache.load(key, len(items))
    t0 = time.perf_counter()
    try:
        if cached is not None:
            ref, rendered = cached, ref_rendered
        else:
            ref, rendered = arm(reference, "reference", ref_rendered)
            if reference_cache is not None and key is not None:
                from ..common.refstore import store_or_warn

                store_or_warn(reference_cache, key, ref)
        t1 = time.perf_counter()
        cand, _ = arm(candidate, "candidate")
    except SandboxUnavailable as e:
        raise TaskSkipped(f"{name}: {e}") from None
    t2 = time.perf_counter()
    return CapabilityRun(task=name, tier=tier, graded=task.graded, items=list(items), reference=ref, candidate=cand,
                         durations={"reference_s": round(t1 - t0, 3), "candidate_s": round(t2 - t1, 3)},
                         rendered=rendered, reference_source="cache" if cached is not None else "computed")


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
    import random

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
    from ..stats.sequential import run_sequential

    task = load_task(name, RunOptions(allow_unsandboxed=bool(arms.get("allow_unsandboxed"))))
    pool = sequential_order(name, _load_items(task, name, tier, budget.items))
    batches: list[CapabilityRun] = []

    def next_batch(k: int) -> list[tuple[float, float]]:
        start = sum(b.n for b in batches)
        chunk = pool[start:start + k]
        if not chunk:
            return []
        run = (batch_runner or run_capability)(name, tier, n=None, items=chunk, **arms)
        batches.append(run)
        return list(zip(run.scores("reference"), run.scores("candidate")))

    def report(v: Any) -> None:
        if say is not None:
            say(f"capability {name} ({tier}): {v.n} items, drop {v.drop:+.3f} within [{v.lower:.3f}, {v.upper:.3f}] "
                f"vs max_drop {max_drop:.3f}: {'shown' if v.verdict != 'inconclusive' else 'going on'}")

    verdict = run_sequential(next_batch, max_drop=max_drop, alpha=alpha, fail_alpha=fail_alpha,
                             batch_size=budget.batch, max_items=budget.items,
                             max_seconds=budget.seconds, on_batch=report, clock=clock or time.monotonic)
    if not batches:
        raise TaskSkipped(f"{name}: the {tier} tier has no items")
    sources = {b.reference_source for b in batches}
    return CapabilityRun(
        task=name, tier=tier, graded=batches[0].graded,
        items=[it for b in batches for it in b.items],
        reference=[r for b in batches for r in b.reference],
        candidate=[c for b in batches for c in b.candidate],
        durations={k: round(sum(b.durations.get(k, 0.0) for b in batches), 3) for k in ("reference_s", "candidate_s")},
        rendered={k: v for b in batches for k, v in b.rendered.items()},
        reference_source=sources.pop() if len(sources) == 1 else "mixed",
        sequential={**verdict.to_json(), "budget": budget.to_json()}, ranks=batches[0].ranks,
    )


def _cache_key(task: Task, name: str, tier: Tier, n: int | None, items: Sequence[Item], rendered: Mapping[str, str],
               base: dict[str, Any], *, max_new_tokens: int | None, batch_size: int, lever: Lever) -> dict[str, Any]:
    """Everything the reference arm's results depend on, beyond the model and lever in `base`."""
    from .refcache import CAPABILITY_CACHE_FORMAT, generation_code_digest, task_code_digest

    return {**base, "format": CAPABILITY_CACHE_FORMAT, "task": name, "task_code": task_code_digest(task),
            "generation_code": generation_code_digest(),
            # the generation loop is chosen from both arms' KV plans (generate.generation_route)
            "kv_plans": [lever.kv_plan(a).source for a in ("reference", "candidate")] if lever.kind == "kv" else [],
            "tier": tier, "n": n, "max_new_tokens": _budget(task, max_new_tokens), "batch_size": batch_size,
            "items": [[it.id, prompt_hash(rendered[it.id])] for it in items]}


def _budget(task: Task, max_new_tokens: int | None) -> int:
    """The generation budget: the task's own, lowered by --mlx-max-new-tokens."""
    return min(task.max_new_tokens, max_new_tokens) if max_new_tokens else task.max_new_tokens


def _stamp(result: ItemResult, rendered: str) -> ItemResult:
    """Every result carries the hash of the exact rendered input it answered (the runner knows it)."""
    from dataclasses import replace

    return replace(result, prompt_hash=prompt_hash(rendered))
