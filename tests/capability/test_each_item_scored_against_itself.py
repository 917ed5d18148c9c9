"""Every capability output is scored against its own item, in the fast lane.

A task mixing generated and choice items of many lengths runs through the runner (generation
batched and re-sorted by length, choice rows batched and sorted, the two kinds recombined) and
through the sequential runner (shuffled, batch by batch). The oracle for each item is computed
alone and by other code: `mlx_lm.stream_generate` on that item's prompt for a generated answer, a
plain forward of prompt + choice for each choice's log-probability. Each item's target is its own
oracle answer, so every item scores 1 exactly when it is scored against itself; an output moved to
a neighbour scores 0 and names the item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.capability import user_tasks
from pytest_mlxgate.capability.base import (
    Budget,
    Item,
    ItemResult,
    RunOptions,
    prompt_hash,
)
from pytest_mlxgate.levers.lever import Lever

WORDS = ["red", "blue", "green", "cat", "dog", "sun", "tree", "rock", "milk", "fish", "stone", "river"]
N_ITEMS = 14
MAX_NEW_TOKENS = 4


def _choices(i: int) -> tuple[str, ...]:
    """Per item: two one-token words and a two-token one (choice rows per choice, not one per prompt)."""
    return (f" {WORDS[i % len(WORDS)]}", f" {WORDS[(i * 3 + 1) % len(WORDS)]}", " no thanks")


def _prompt(i: int) -> str:
    """Prompts of 2 to ~12 words, so batching by length reorders them."""
    words = [WORDS[(i * 5 + j) % len(WORDS)] for j in range((i * 7) % 11 + 1)]
    return f"Item {i}: " + " ".join(words)


@dataclass
class AlignedTask:
    """Generated items (even) and choice items (odd), each item's target its own oracle answer."""

    targets: dict[str, Any]
    name: str = "aligned"
    graded: bool = False
    max_new_tokens: int = MAX_NEW_TOKENS

    def configured(self, options: RunOptions) -> AlignedTask:
        return self

    def load(self, tier: str, *, n: int | None = None, seed: int = 0) -> list[Item]:
        items = [
            Item(
                id=f"item{i:02d}",
                text=_prompt(i),
                kind="choice" if i % 2 else "generate",
                choices=_choices(i) if i % 2 else (),
                target=self.targets.get(f"item{i:02d}"),
            )
            for i in range(N_ITEMS)
        ]
        return items[:n] if n is not None else items

    def render(self, item: Item, tokenizer: Any) -> str:
        return str(item.text)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        if item.kind == "choice":
            assert choice_logprobs is not None
            pred = int(np.argmax(choice_logprobs))
            ok = pred == item.target["pick"]
            return ItemResult(
                item.id,
                "",
                item.choices[pred],
                float(ok),
                "correct" if ok else "wrong",
                {"logprobs": [float(v) for v in choice_logprobs]},
            )
        ok = output == item.target
        return ItemResult(item.id, "", output, float(ok), "correct" if ok else "wrong", {})


def _oracle(model: Any, tok: Any) -> dict[str, Any]:
    """Each item's answer computed alone: stream_generate for generated items, one plain forward of
    prompt + choice (float64 log-softmax) for each choice."""
    import mlx.core as mx
    from mlx_lm import stream_generate

    out: dict[str, Any] = {}
    for i in range(N_ITEMS):
        text = _prompt(i)
        prompt = list(tok.encode(text))
        if i % 2 == 0:
            tokens = [r.token for r in stream_generate(model, tok, prompt, max_tokens=MAX_NEW_TOKENS)]
            out[f"item{i:02d}"] = tok.decode(tokens)  # the runner's detokenization of the same tokens
            continue
        logps = []
        for choice in _choices(i):
            full = list(tok.encode(text + choice))
            assert full[: len(prompt)] == prompt
            read = list(range(len(prompt), len(full)))  # position p - 1 predicts token p
            rows = np.asarray(model(mx.array(full)[None])[0].astype(mx.float32), dtype=np.float64)[
                [p - 1 for p in read]
            ]
            top = rows.max(axis=-1, keepdims=True)
            logp = rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))
            logps.append(float(sum(logp[k, full[p]] for k, p in enumerate(read))))
        out[f"item{i:02d}"] = {"logprobs": logps, "pick": int(np.argmax(logps))}
    return out


@pytest.fixture(scope="module")
def model_and_oracle(tiny_model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    import mlx_lm

    model, tok = mlx_lm.load(str(tiny_model_dir))[:2]
    oracle = _oracle(model, tok)
    generated = [oracle[f"item{i:02d}"] for i in range(0, N_ITEMS, 2)]
    assert len(set(generated)) == len(generated), generated  # the check can fail: no two answers alike
    assert len({o["pick"] for o in oracle.values() if isinstance(o, dict)}) > 1  # not always the same choice
    return model, tok, oracle


@pytest.fixture
def task(model_and_oracle: tuple[Any, Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> AlignedTask:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    aligned = AlignedTask(targets=model_and_oracle[2])
    user_tasks.register_task(aligned)
    return aligned


def _check_each_against_its_own(
    items: Sequence[Item], results: Sequence[ItemResult], oracle: dict[str, Any], arm: str
) -> None:
    assert len(results) == len(items)
    for item, result in zip(items, results, strict=True):
        where = f"{arm} arm, {item.id} ({item.text!r})"
        assert result.item_id == item.id, where
        assert result.prompt_hash == prompt_hash(str(item.text)), where
        want = oracle[item.id]
        if item.kind == "choice":
            np.testing.assert_allclose(
                result.detail["logprobs"], want["logprobs"], atol=1e-3, err_msg=where
            )  # float32 sums
            assert result.output == item.choices[want["pick"]], where
        else:
            assert result.output == want, where
        assert result.score == 1.0, where


@pytest.mark.parametrize("batch_size", [3, 16])
def test_each_output_is_scored_against_its_own_item(
    model_and_oracle: tuple[Any, Any, dict[str, Any]], task: AlignedTask, batch_size: int
) -> None:
    from pytest_mlxgate.capability.runner import run_capability

    model, tok, oracle = model_and_oracle
    lever = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="1")
    run = run_capability(
        "aligned", "full", n=None, reference=(model, tok), candidate=(model, tok), lever=lever, batch_size=batch_size
    )
    assert [it.id for it in run.items] == [f"item{i:02d}" for i in range(N_ITEMS)]
    _check_each_against_its_own(run.items, run.reference, oracle, "reference")
    _check_each_against_its_own(run.items, run.candidate, oracle, "candidate")
    assert run.rendered == {it.id: it.text for it in run.items}


def test_each_output_is_scored_against_its_own_item_batch_by_batch(
    model_and_oracle: tuple[Any, Any, dict[str, Any]], task: AlignedTask
) -> None:
    from pytest_mlxgate.capability.runner import (
        run_capability_sequential,
        sequential_order,
    )

    model, tok, oracle = model_and_oracle
    lever = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="1")
    # max_drop 0 is never shown for equal arms: every batch runs (5 + 5 + 4 items)
    run = run_capability_sequential(
        "aligned",
        "full",
        budget=Budget(items=N_ITEMS, batch=5),
        max_drop=0.0,
        alpha=0.05,
        reference=(model, tok),
        candidate=(model, tok),
        lever=lever,
    )
    assert [it.id for it in run.items] == [it.id for it in sequential_order("aligned", task.load("full"))]
    assert run.sequential is not None and run.sequential["batches"] == 3
    _check_each_against_its_own(run.items, run.reference, oracle, "reference")
    _check_each_against_its_own(run.items, run.candidate, oracle, "candidate")
