"""The HumanEval task: its items, code extraction, and scoring through the real sandbox."""

from __future__ import annotations

import pytest

from pytest_mlxgate.capability.base import Item
from pytest_mlxgate.capability.sandbox import Limits, isolation_available
from pytest_mlxgate.capability.tasks.humaneval import (
    TASK,
    HumanEval,
    build_program,
    extract_code,
    load_problems,
)

needs_sandbox = pytest.mark.skipif(
    isolation_available()[0] is None, reason=f"no sandbox isolation here: {isolation_available()[1]}"
)


@pytest.fixture(scope="module")
def problems() -> dict[str, dict[str, str]]:
    return {p["task_id"]: dict(p) for p in load_problems()}


def _item(task_id: str) -> Item:
    return next(i for i in TASK.load("full") if i.id == task_id)


def _fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}\n```\n\nIt handles the edge cases."


def test_smoke_and_full_counts_and_determinism() -> None:
    full = TASK.load("full")
    assert len(full) == 164 and full[0].id == "HumanEval/0" and full[-1].id == "HumanEval/163"
    smoke = TASK.load("smoke")
    assert len(smoke) == 20 and [i.id for i in smoke] == [i.id for i in TASK.load("smoke")]
    assert [i.id for i in TASK.load("smoke", seed=1)] != [i.id for i in smoke]
    assert [i.id for i in TASK.load("smoke", n=5)] == [i.id for i in TASK.load("smoke", n=5)]
    assert set(i.id for i in TASK.load("smoke", n=5)) <= set(i.id for i in TASK.load("smoke", n=12))
    assert len(TASK.load("full", n=7)) == 7
    with pytest.raises(ValueError, match="tier"):
        TASK.load("medium")  # type: ignore[arg-type]


def test_items_carry_the_prompt_and_what_scoring_needs() -> None:
    item = _item("HumanEval/0")
    assert item.messages is not None and "```python" in item.messages[0]["content"]
    assert "def has_close_elements(" in item.messages[0]["content"]
    assert set(item.target) == {"prompt", "test", "entry_point"} and item.target["entry_point"] == "has_close_elements"
    assert TASK.graded is False and TASK.max_new_tokens == 384


def test_extraction_from_fenced_and_unfenced_outputs() -> None:
    body = "def f(x):\n    return x + 1\n"
    assert extract_code(_fenced(body), "f") == (body + "\n", "fence")
    # several blocks: the one defining the entry point wins over an earlier usage example
    two = "```python\nprint(f(1))\n```\nand\n```\n" + body + "```"
    assert extract_code(two, "f") == (body, "fence")
    # a fence cut off by the token budget runs to the end
    assert extract_code("```python\n" + body, "f") == (body, "fence")
    assert extract_code("```py\nx = 1\n```", "f") == ("x = 1\n", "fence")
    # raw code, a raw function body, prose, nothing
    assert extract_code(body, "f") == (body, "raw")
    assert extract_code("    return x + 1\n", "f")[1] == "raw"
    assert extract_code("I am sorry, I cannot help with that.", "f") == (None, "none")
    assert extract_code("   \n", "f") == (None, "none")


def test_program_keeps_the_prompts_preamble_or_appends_a_body(problems: dict[str, dict[str, str]]) -> None:
    p = problems["HumanEval/38"]  # the tests call encode_cyclic, defined in the prompt before the entry point
    program, mode = build_program(p["prompt"], "def decode_cyclic(s):\n    return s\n", p["test"], p["entry_point"])
    assert mode == "function" and "def encode_cyclic(" in program and program.endswith("check(decode_cyclic)\n")
    program, mode = build_program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"])
    assert mode == "body" and program.startswith(p["prompt"])


@needs_sandbox
@pytest.mark.parametrize(
    "task_id",
    [
        "HumanEval/0",
        "HumanEval/2",
        "HumanEval/10",
        "HumanEval/32",
        "HumanEval/38",
        "HumanEval/53",
        "HumanEval/87",
        "HumanEval/107",
        "HumanEval/129",
        "HumanEval/163",
    ],
)
def test_canonical_solutions_pass(task_id: str, problems: dict[str, dict[str, str]]) -> None:
    p = problems[task_id]
    result = TASK.score(_item(task_id), _fenced(p["prompt"] + p["canonical_solution"]))
    assert (result.verdict, result.score) == ("passed", 1.0), result.detail
    assert result.detail["returncode"] == 0 and result.detail["mode"] == "function"


@needs_sandbox
def test_canonical_body_alone_passes_as_a_raw_continuation(problems: dict[str, dict[str, str]]) -> None:
    p = problems["HumanEval/10"]
    result = TASK.score(_item("HumanEval/10"), p["canonical_solution"])
    assert (result.verdict, result.detail["source"], result.detail["mode"]) == ("passed", "raw", "body")


@needs_sandbox
def test_a_wrong_solution_fails_with_the_assertion_in_detail() -> None:
    wrong = (
        "from typing import List\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    return False\n"
    )
    result = TASK.score(_item("HumanEval/0"), _fenced(wrong))
    assert (result.verdict, result.score, result.passed) == ("failed", 0.0, False)
    assert result.detail["returncode"] == 1 and "AssertionError" in result.detail["stderr"]
    assert result.detail["seconds"] > 0


@pytest.mark.slow  # runs into its time limit
@needs_sandbox
def test_a_hanging_solution_times_out() -> None:
    hang = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    task = HumanEval()
    task.limits = Limits(cpu_s=1, wall_s=3.0)
    result = task.score(_item("HumanEval/0"), _fenced(hang))
    assert (result.verdict, result.score) == ("timeout", 0.0), result.detail


def test_malformed_outputs_get_their_verdict_without_running() -> None:
    item = _item("HumanEval/0")
    no_code = TASK.score(item, "The function should compare every pair of numbers.")
    assert (no_code.verdict, no_code.score) == ("no_code", 0.0)
    broken = TASK.score(item, _fenced("def has_close_elements(numbers, threshold)\n    return True"))
    assert (broken.verdict, broken.score) == ("syntax_error", 0.0)
    assert "SyntaxError" in broken.detail["error"] and "status" not in broken.detail  # never ran
    assert no_code.prompt_hash == broken.prompt_hash and len(no_code.prompt_hash) == 16
