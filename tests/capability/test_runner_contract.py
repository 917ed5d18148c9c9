"""What `capability.runner` promises any task, seen by a probe task that records what it is handed:
choice items are scored from their log-probabilities with no generated text, generated items from
their output; every load of the task is configured with the run's options (the sequential path
too); the run says whether the task is graded; a patch lever's site is counted during the arm."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import runner, user_tasks
from pytest_mlxgate.capability.base import Budget, Item, ItemResult, RunOptions
from pytest_mlxgate.errors import VacuousLeverError
from pytest_mlxgate.levers.lever import Lever

LEVER = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "tree", "rock"]


@dataclass
class Probe:
    """A user task with choice and generated items that records every call the runner makes."""

    name: str = "probe"
    graded: bool = False
    max_new_tokens: int = 3
    options: RunOptions | None = None
    configured_with: list[RunOptions] = field(default_factory=list)
    scored: list[tuple[str, str, int | None]] = field(default_factory=list)  # (id, output, #logprobs)

    def configured(self, options: RunOptions) -> Probe:
        self.configured_with.append(options)
        task = copy.copy(self)  # shares the records
        task.options = options
        return task

    def load(self, tier: Any, *, n: int | None = None, seed: int = 0) -> list[Item]:
        items = []
        for i in range(8):
            a, b = WORDS[i % 8], WORDS[(i * 3 + 1) % 8]
            if i % 2:
                items.append(
                    Item(id=f"c{i}", text=f"Pick {a} or {b}:", kind="choice", choices=(f" {a}", f" {b}"), target=0)
                )
            else:
                items.append(Item(id=f"g{i}", text=f"Say {a} then {b}:", target=a))
        return items[:n] if n else items

    def render(self, item: Item, tokenizer: Any) -> str:
        return str(item.text)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        self.scored.append((item.id, output, None if choice_logprobs is None else len(choice_logprobs)))
        if item.kind == "choice":
            assert choice_logprobs is not None
            ok = max(range(len(choice_logprobs)), key=lambda k: choice_logprobs[k]) == item.target
            return ItemResult(item.id, "", item.choices[0], float(ok), "correct" if ok else "wrong", {})
        return ItemResult(item.id, "", output, float(bool(output)), "correct" if output else "wrong", {})


def _sequential(arm: tuple[Any, Any], name: str = "probe", tier: Any = "full", *, items: int = 4, **kw: Any) -> Any:
    """`run_capability_sequential` of identical arms, batches of 2, margin 0.1: the contract tests' run."""
    return runner.run_capability_sequential(
        name,
        tier,
        budget=Budget(items=items, batch=2),
        max_drop=0.1,
        alpha=0.05,
        reference=arm,
        candidate=arm,
        lever=LEVER,
        **kw,
    )


@pytest.fixture(scope="module")
def arm(tiny_model_dir: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_model_dir))[:2]
    return model, tokenizer


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    task = Probe()
    user_tasks.register_task(task)
    return task


def test_choices_are_scored_without_output_and_generations_with_theirs(arm: tuple[Any, Any], probe: Probe) -> None:
    from pytest_mlxgate.capability.generate import generate_greedy
    from pytest_mlxgate.serving.kv_plan import PLAIN

    model, tok = arm
    items = probe.load("full", n=4)
    results, rendered = runner.run_arm(probe, items, model, tok, LEVER, "candidate")
    assert [r.item_id for r in results] == [it.id for it in items]
    by_id = {it_id: (out, n) for it_id, out, n in probe.scored}
    gen = [it for it in items if it.kind != "choice"]
    expected = generate_greedy(
        model, tok, [rendered[it.id] for it in gen], max_new_tokens=probe.max_new_tokens, kv=PLAIN
    )
    for it in items:
        if it.kind == "choice":
            assert by_id[it.id] == ("", len(it.choices))  # nothing was generated for a choice item
    assert [by_id[it.id] for it in gen] == [(out, None) for out in expected]


@pytest.mark.parametrize("graded", [False, True])
def test_a_run_says_whether_its_task_is_graded(arm: tuple[Any, Any], probe: Probe, graded: bool) -> None:
    probe.graded = graded
    run = runner.run_capability("probe", "full", n=4, reference=arm, candidate=arm, lever=LEVER)
    assert run.graded is graded
    seq = _sequential(arm)
    assert seq.graded is graded and seq.n == 4


@pytest.mark.parametrize("allow", [False, True])
def test_every_load_of_the_task_is_configured_with_the_runs_options(
    arm: tuple[Any, Any], probe: Probe, allow: bool
) -> None:
    """The sequential path loads the pool itself, then runs each batch: each time with the run's options."""
    _sequential(arm, allow_unsandboxed=allow)
    assert len(probe.configured_with) == 1 + 2  # the pool, then one per batch
    assert probe.configured_with == [RunOptions(allow_unsandboxed=allow)] * 3


def test_a_patch_levers_site_is_counted_during_the_arm(arm: tuple[Any, Any], probe: Probe) -> None:
    model, tok = arm
    items = probe.load("full", n=4)
    called = Lever(
        name="sdpa", kind="patch", target="mlx_lm.models.llama:scaled_dot_product_attention", ref=None, cand=None
    )
    results, _ = runner.run_arm(probe, items, model, tok, called, "candidate")
    assert len(results) == len(items)
    never = Lever(name="norm", kind="patch", target="mlx.core.fast.layer_norm", ref=None, cand=None)
    with pytest.raises(VacuousLeverError, match="never called during the candidate arm's capability task probe"):
        runner.run_arm(probe, items, model, tok, never, "candidate")


def test_a_run_names_the_task_and_tier_it_ran(arm: tuple[Any, Any], probe: Probe) -> None:
    """The record says what was run, both ways: all at once and a batch at a time."""
    run = runner.run_capability("probe", "full", n=4, reference=arm, candidate=arm, lever=LEVER)
    seq = _sequential(arm)
    for record in (run, seq):
        assert (record.task, record.tier) == ("probe", "full")
        assert len(record.items) == len(record.reference) == len(record.candidate) == 4
        assert set(record.durations) == {"reference_s", "candidate_s"}


@pytest.fixture(scope="module")
def kv_arm(tiny_kv_model_dir: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    return model, tokenizer


def _kv(start: int) -> Lever:
    return Lever(name="kv8", kind="kv", target=None, ref="plain", cand={"bits": 8, "start": start}, path="serving")


def test_a_kv_lever_runs_only_where_the_tasks_generation_reaches_its_start(
    kv_arm: tuple[Any, Any], probe: Probe
) -> None:
    """Choices are one plain prefill, so a KV lever changes only generated items, and only once
    generation (the longest prompt, then the budget) runs past the plan's start: else it is refused
    before the arm runs, naming the task and how many tokens its generation feeds."""
    import re

    from pytest_mlxgate.capability.generate import prompt_length

    model, tok = kv_arm
    items = probe.load("full", n=4)
    results, rendered = runner.run_arm(probe, items, model, tok, _kv(0), "candidate")
    assert len(results) == len(items)
    longest_prompt = max(prompt_length(tok, rendered[it.id]) for it in items if it.kind != "choice")
    start = longest_prompt + probe.max_new_tokens + 1
    scored = len(probe.scored)
    with pytest.raises(VacuousLeverError, match="capability task probe's generation") as info:
        runner.run_arm(probe, items, model, tok, _kv(start), "candidate")
    fed = int(re.search(rf"starts at token {start}, beyond the (\d+) tokens", str(info.value)).group(1))
    assert longest_prompt <= fed <= longest_prompt + probe.max_new_tokens
    assert len(probe.scored) == scored  # refused before any item was scored
    with pytest.raises(VacuousLeverError, match="scored by its choices' log-probabilities"):
        runner.run_arm(probe, [it for it in items if it.kind == "choice"], model, tok, _kv(0), "candidate")
    runner.run_arm(probe, items, model, tok, _kv(start), "reference")  # the reference arm is not judged


def test_a_sequential_run_s_phase_times_are_its_batches_summed(arm: tuple[Any, Any], probe: Probe) -> None:
    """What the record's speed line says a capability gate cost: every batch's time, each arm's own."""
    batches: list[Any] = []

    def recording(*args: Any, **kw: Any) -> Any:
        run = runner.run_capability(*args, **kw)
        run.durations = {"reference_s": 0.25 * (len(batches) + 1), "candidate_s": 1.5}  # what each batch took
        run.ranks = 2  # as the distributed batch runner splits each batch
        batches.append(run)
        return run

    seq = _sequential(arm, items=6, batch_runner=recording)
    assert len(batches) == 3
    assert seq.durations == {"reference_s": 0.25 + 0.5 + 0.75, "candidate_s": 4.5}
    assert seq.ranks == 2  # the record says the items were split over ranks


def test_a_run_s_phase_times_are_its_own_arms_and_lines_say_how_the_verdict_stands(
    arm: tuple[Any, Any], probe: Probe
) -> None:
    """Each arm's time lies within the call's wall time (not a clock reading), and the progress lines
    of a sequential run say, after every batch, that it is still going on until the drop is shown."""
    import time

    start = time.perf_counter()
    run = runner.run_capability("probe", "full", n=4, reference=arm, candidate=arm, lever=LEVER)
    wall = time.perf_counter() - start
    assert 0 <= run.durations["reference_s"] <= wall and 0 <= run.durations["candidate_s"] <= wall
    assert run.durations["reference_s"] + run.durations["candidate_s"] <= wall + 0.002  # each rounded to ms
    lines: list[str] = []
    _sequential(arm, say=lines.append)
    assert [line.split(": ")[-1] for line in lines] == ["going on", "going on"]  # 4 agreeing items show nothing yet
    assert lines[0].startswith("capability probe (full): 2 items, drop +0.000 within [")


def test_both_arms_phase_times_are_seconds_kept_to_the_millisecond(arm: tuple[Any, Any], probe: Probe) -> None:
    """Each arm's time is a float of seconds rounded to 3 places: an arm that took a few milliseconds
    says so (not a whole second rounded to 0)."""
    run = runner.run_capability("probe", "full", n=4, reference=arm, candidate=arm, lever=LEVER)
    for phase in ("reference_s", "candidate_s"):
        t = run.durations[phase]
        assert type(t) is float and t == round(t, 3) and t > 0, (phase, t)


def test_a_sequential_run_keeps_every_items_exact_input_from_every_batch(arm: tuple[Any, Any], probe: Probe) -> None:
    """The record of a sequential run holds, for the reports, what each item was rendered to, whichever
    batch it came in (the probe renders an item as its text)."""
    seq = _sequential(arm, items=6)
    assert seq.sequential["batches"] == 3 and len(seq.items) == 6
    assert seq.rendered == {it.id: it.text for it in seq.items}


@dataclass
class EmptyProbe(Probe):
    """A task whose tier holds no items (a user task on an empty file, a tier with nothing selected)."""

    name: str = "empty-probe"

    def load(self, tier: Any, *, n: int | None = None, seed: int = 0) -> list[Item]:
        return []


def test_a_tier_with_no_items_skips_saying_which_task_and_tier(arm: tuple[Any, Any], probe: Probe) -> None:
    from pytest_mlxgate.capability.base import TaskSkipped

    user_tasks.register_task(EmptyProbe())
    with pytest.raises(TaskSkipped, match=r"^empty-probe: the full tier has no items$"):
        runner.run_capability("empty-probe", "full", n=None, reference=arm, candidate=arm, lever=LEVER)
    with pytest.raises(TaskSkipped, match=r"^empty-probe: the smoke tier has no items$"):
        _sequential(arm, "empty-probe", "smoke")


def test_max_new_tokens_lowers_every_generation_of_both_arms(arm: tuple[Any, Any], probe: Probe) -> None:
    """--mlx-max-new-tokens reaches the arms: each generated answer is cut to it (the task allows 3)."""
    from pytest_mlxgate.capability.generate import generate_greedy
    from pytest_mlxgate.serving.kv_plan import PLAIN

    model, tok = arm
    run = runner.run_capability("probe", "full", n=4, reference=arm, candidate=arm, lever=LEVER, max_new_tokens=1)
    gen = [it for it in run.items if it.kind != "choice"]
    one = generate_greedy(model, tok, [str(it.text) for it in gen], max_new_tokens=1, kv=PLAIN)
    three = generate_greedy(model, tok, [str(it.text) for it in gen], max_new_tokens=3, kv=PLAIN)
    assert one != three  # the cut shows in the text
    for results in (run.reference, run.candidate):
        assert [r.output for r in results if r.item_id in {it.id for it in gen}] == one
