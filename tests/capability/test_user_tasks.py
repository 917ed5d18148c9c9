"""Tasks a gate author brings: registered from code, read from JSONL, or published by a package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import user_tasks
from pytest_mlxgate.capability.base import RunOptions
from pytest_mlxgate.capability.runner import load_task
from pytest_mlxgate.capability.user_tasks import JsonlTask, jsonl_task, register_task
from pytest_mlxgate.errors import MlxgateUsageError


@pytest.fixture(autouse=True)
def _clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_tasks, "_REGISTRY", {})


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class Echo:
    """A minimal code task: the answer is the prompt's last word."""

    name = "echo"
    graded = False
    max_new_tokens = 4

    def configured(self, options: RunOptions) -> Echo:
        return self

    def load(self, tier: str, *, n: int | None = None, seed: int = 0) -> list[Any]:
        from pytest_mlxgate.capability.base import Item

        return [Item(id=f"echo/{i}", text=f"Say {w}:", target=w) for i, w in enumerate(["red", "blue"])][:n]

    def render(self, item: Any, tokenizer: Any) -> str:
        return str(item.text)

    def score(self, item: Any, output: str, *, choice_logprobs: Any = None) -> Any:
        from pytest_mlxgate.capability.base import ItemResult

        ok = item.target in output
        return ItemResult(item.id, "", output, float(ok), "correct" if ok else "wrong")


def test_a_registered_code_task_is_found_by_name() -> None:
    task = register_task(Echo())
    assert load_task("echo") is task
    assert register_task(task) is task  # the same object again (a module imported twice) is fine
    with pytest.raises(MlxgateUsageError, match="registered already; pass replace=True"):
        register_task(Echo())
    assert load_task("echo", RunOptions()) is task


def test_registration_mistakes_say_what_to_do() -> None:
    with pytest.raises(MlxgateUsageError, match="'mmlu' is a built-in"):
        register_task(Echo(), name="mmlu")
    with pytest.raises(MlxgateUsageError, match="lowercase name"):
        register_task(Echo(), name="Bad Name")

    class Half:
        name = "half"

    with pytest.raises(MlxgateUsageError, match="lacks load, render, score, configured, graded, max_new_tokens"):
        register_task(Half())  # type: ignore[arg-type]


def test_an_unknown_task_lists_what_is_known_and_how_to_add_one() -> None:
    register_task(Echo())
    with pytest.raises(
        MlxgateUsageError,
        match=r"'nope' is not a capability task; known: mmlu, .*hashhop, arc_easy, piqa, sciq, echo\. "
        r"Define your own with pytest_mlxgate.register_task",
    ):
        load_task("nope")


def test_a_jsonl_task_reads_text_and_chat_items_with_stable_ids(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "t.jsonl",
        [
            {"id": "q1", "prompt": "2+2=", "target": "4"},
            {"messages": [{"role": "user", "content": "Capital of France?"}], "target": "Paris"},
        ],
    )
    task = jsonl_task("arith", path)
    items = task.load("smoke")
    assert [i.id for i in items][0] == "q1" and items[1].messages is not None and items[1].text is None
    assert items[1].id == task.load("full")[1].id  # a content hash: the same every run
    assert load_task("arith") is task
    assert task.score(items[0], " 4\n").score == 1.0 and task.score(items[0], "5").score == 0.0


def test_regex_and_choice_scoring(tmp_path: Path) -> None:
    rx = jsonl_task("rx", _jsonl(tmp_path / "rx.jsonl", [{"prompt": "p", "target": r"\b(4|four)\b"}]), scoring="regex")
    item = rx.load("full")[0]
    assert rx.score(item, "it is four.").score == 1.0 and rx.score(item, "fourteen").score == 0.0
    ch = jsonl_task(
        "ch",
        _jsonl(tmp_path / "ch.jsonl", [{"prompt": "p", "choices": [" yes", " no"], "target": " no"}]),
        scoring="choice",
    )
    item = ch.load("full")[0]
    assert item.kind == "choice" and item.target == 1
    assert ch.score(item, "", choice_logprobs=[-2.0, -0.1]).score == 1.0
    assert ch.score(item, "", choice_logprobs=[-0.1, -2.0]).score == 0.0


@pytest.mark.parametrize(
    ("row", "scoring", "message"),
    [
        ({"target": "x"}, "exact", 'exactly one of "prompt"'),
        ({"prompt": "p", "messages": [], "target": "x"}, "exact", 'exactly one of "prompt"'),
        ({"prompt": "p", "target": 3}, "exact", "is a string"),
        ({"prompt": "p", "target": "("}, "regex", "not a regular expression"),
        ({"prompt": "p", "target": 0}, "choice", 'needs "choices"'),
        ({"prompt": "p", "choices": ["a", "b"], "target": "c"}, "choice", "one of the choices or its index"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path: Path, row: dict[str, Any], scoring: Any, message: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "target": "a", "choices": ["a", "b"]}, row])
    with pytest.raises(MlxgateUsageError, match=rf"bad\.jsonl:2: .*{message}"):
        JsonlTask("bad", path, scoring=scoring).load("full")


def test_duplicate_ids_and_a_missing_file(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "p", "target": "x"}] * 2)
    with pytest.raises(MlxgateUsageError, match="ids must be unique; repeated: a"):
        JsonlTask("d", path).load("full")
    from pytest_mlxgate.capability.base import TaskDataMissing

    with pytest.raises(TaskDataMissing, match="does not exist"):
        JsonlTask("m", tmp_path / "missing.jsonl").load("full")


def test_smoke_size_and_n_take_the_same_seeded_sample(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "many.jsonl", [{"prompt": f"p{i}", "target": str(i)} for i in range(20)])
    task = JsonlTask("many", path, smoke_n=5)
    smoke = [i.id for i in task.load("smoke")]
    assert len(smoke) == 5 and smoke == [i.id for i in task.load("full", n=5)] and len(task.load("full")) == 20
    assert smoke != [i.id for i in task.load("smoke", seed=1)]


def test_an_installed_package_publishes_a_task_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_tasks.py").write_text(
        "from pytest_mlxgate.capability.user_tasks import JsonlTask\n"
        f"TASK = JsonlTask('pkgtask', __import__('pathlib').Path({str(tmp_path / 'x.jsonl')!r}))\n"
    )
    dist = tmp_path / "my_tasks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tasks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pytest_mlxgate.tasks]\npkgtask = my_tasks:TASK\nbroken = no_such_mod:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "pkgtask" in user_tasks.registered_names()
    assert load_task("pkgtask").name == "pkgtask"  # type: ignore[attr-defined]
    with pytest.raises(MlxgateUsageError, match="'broken' from entry point 'no_such_mod:X' did not load"):
        load_task("broken")


GATE = """
import pytest
from pytest_mlxgate import assert_capability_at_least, jsonl_task, register_task

pytestmark = pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1")
jsonl_task("colors", "colors.jsonl", max_new_tokens=3)
jsonl_task("pick", "pick.jsonl", scoring="choice")


def test_user_tasks(paired):
    assert_capability_at_least(paired, ["colors", "pick"], max_drop=0.6)  # 2 agreeing items bound a drop at 0.575
"""


@pytest.mark.slow  # two pytester gate sessions on the tiny model
def test_user_tasks_run_paired_through_a_gate(pytester: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path) -> None:
    pytester.makeini("[pytest]\n")
    _jsonl(pytester.path / "colors.jsonl", [{"prompt": f"Say {w}:", "target": w} for w in ("red", "blue", "green")])
    _jsonl(
        pytester.path / "pick.jsonl",
        [{"prompt": "Pick:", "choices": [" a", " b"], "target": 0}] * 1
        + [{"prompt": "Pick again:", "choices": [" a", " b"], "target": " b"}],
    )
    pytester.makepyfile(test_gate=GATE)
    report = tmp_path / "r.json"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", f"--mlx-report={report}", "--mlx-db=off", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*mlxgate: scored capability colors (smoke) reference arm: 3 items in * s (*items/s)",
            "*mlxgate: scored capability colors (smoke) candidate arm: 3 items in *",
        ]
    )
    records = {r["mode"]: r for r in json.loads(report.read_text())["gates"]}
    tasks = records["capability"]["tasks"]
    assert tasks["colors"]["n"] == 3 and tasks["pick"]["n"] == 2
    assert tasks["colors"]["ref_score"] == tasks["colors"]["cand_score"]  # a flag nothing reads: same outputs
    assert "score" not in records  # the Capability Score is the six built-in tasks: none of them ran here
    assert tasks["colors"]["reference_source"] == "computed"
    again = pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", f"--mlx-report={report}", "--mlx-db=off", "-p", "no:randomly"
    )
    again.assert_outcomes(passed=1)
    cached = {r["mode"]: r for r in json.loads(report.read_text())["gates"]}["capability"]["tasks"]
    assert cached["colors"]["reference_source"] == "cache"  # an unchanged gate runs only its candidate arm
    assert [i["reference"] for i in cached["colors"]["items"]] == [i["reference"] for i in tasks["colors"]["items"]]
