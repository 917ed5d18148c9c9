"""n=Budget(...): both arms batch by batch on the tiny model until the drop is shown either way; an
unchanged gate's batches come from the reference cache; a planted regression is shown, not outvoted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import runner, user_tasks
from pytest_mlxgate.capability.base import Budget
from pytest_mlxgate.capability.refcache import CapabilityCache
from pytest_mlxgate.capability.user_tasks import jsonl_task
from pytest_mlxgate.levers.lever import Lever

LEVER = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
KEY = {"model": "org/tiny@" + "0" * 40, "lever": "ref"}
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "tree", "rock", "milk", "fish"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    import mlx_lm
    from tinymodel import build_tiny_model

    a = mlx_lm.load(str(build_tiny_model(tmp_path_factory.mktemp("a"), seed=0)))
    b = mlx_lm.load(str(build_tiny_model(tmp_path_factory.mktemp("b"), seed=7)))
    return a, b


def _task(path: Path, targets: list[int] | None = None, n: int = 120) -> None:
    rows = [
        {
            "prompt": f"Item {i}: {WORDS[i % 10]} or {WORDS[(i * 3 + 1) % 10]}?",
            "choices": [f" {WORDS[i % 10]}", f" {WORDS[(i * 3 + 1) % 10]}"],
            "target": 0 if targets is None else targets[i],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    jsonl_task("pick", path, scoring="choice")


def _seq(reference: Any, candidate: Any, *, budget: Budget, max_drop: float = 0.10, **kw: Any) -> Any:
    said: list[str] = []
    run = runner.run_capability_sequential(
        "pick",
        "full",
        budget=budget,
        max_drop=max_drop,
        alpha=0.05,
        reference=reference,
        candidate=candidate,
        lever=LEVER,
        say=said.append,
        **kw,
    )
    return run, said


def test_identical_arms_stop_as_soon_as_the_drop_is_bounded(
    models: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    _task(tmp_path / "t.jsonl")
    cache = CapabilityCache(tmp_path / "cache")
    run, said = _seq(models[0], models[0], budget=Budget(items=120, batch=8), reference_cache=cache, reference_key=KEY)
    seq = run.sequential
    # no discordant pair: the betting sequence bounds the drop at 0.10 after 38 items, i.e. the 5th batch
    assert seq["verdict"] == "pass" and seq["stopped_by"] == "verdict" and seq["batches"] == 5
    assert run.n == 40 and seq["n"] == 40 and seq["upper"] <= 0.10
    assert run.scores("reference") == run.scores("candidate") and run.reference_source == "computed"
    assert len(said) == 5 and said[-1].endswith("vs max_drop 0.100: shown") and "going on" in said[0]
    again, _ = _seq(models[0], models[0], budget=Budget(items=120, batch=8), reference_cache=cache, reference_key=KEY)
    assert again.reference_source == "cache" and [it.id for it in again.items] == [it.id for it in run.items]


def test_items_come_in_a_seeded_shuffled_order(
    models: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    _task(tmp_path / "t.jsonl", n=40)
    task = runner.load_task("pick")
    pool = task.load("full")
    order = runner.sequential_order("pick", pool)
    assert sorted(it.id for it in order) == sorted(it.id for it in pool) and order != pool
    assert runner.sequential_order("pick", pool) == order


def test_a_planted_regression_is_shown_and_a_small_budget_is_inconclusive(
    models: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mlxgate.capability.generate import choice_logprobs_many

    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    _task(tmp_path / "t.jsonl")
    items = runner.load_task("pick").load("full")
    model, tok = models[0]
    prompts = [runner.load_task("pick").render(it, tok) for it in items]
    logps = choice_logprobs_many(model, tok, prompts, [it.choices for it in items])
    _task(tmp_path / "t.jsonl", targets=[max(range(2), key=lambda k: lp[k]) for lp in logps])  # the reference is right
    # another random model as the candidate: it picks the other answer on ~13% of the items
    run, _ = _seq(models[0], models[1], budget=Budget(items=120, batch=8), max_drop=0.02)
    seq = run.sequential
    assert run.scores("reference") == [1.0] * run.n
    assert seq["verdict"] == "fail" and seq["lower"] > 0.02 and run.n < 120, seq and seq["stopped_by"] == "verdict"
    assert "regression shown" in seq["message"]
    small, _ = _seq(models[0], models[1], budget=Budget(items=8, batch=8), max_drop=0.02)
    assert small.sequential["verdict"] == "inconclusive" and small.sequential["stopped_by"] == "max_items"
    assert small.n == 8 and "items" in small.sequential["message"]
