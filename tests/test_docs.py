"""The README and the docs/ pages stay true: every page the README lists exists and every page is listed;
every `--mlx-…` option, `mlxgate` command and flag, `pytest.mark.mlx_…` marker and name imported from
the package that they show exists; every Python example parses; and each whole gate module among them
runs on a tiny model to a verdict (pass, fail or inconclusive), never an error."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def _named(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_the_readme_lists_every_docs_page_and_each_one_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)(?:#[\w-]+)?\)", readme))
    pages = {_named(p) for p in PAGES if p.name != "README.md"}
    assert linked == pages, (sorted(linked - pages), sorted(pages - linked))


def test_every_link_between_pages_reaches_a_page_and_its_heading() -> None:
    missing = []
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w-]+\.md)(?:#([\w-]+))?\)", page.read_text()):
            path = (ROOT / target) if target.startswith("docs/") else (page.parent / target)
            if not path.exists():
                missing.append(f"{_named(page)} -> {target}")
                continue
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    missing.append(f"{_named(page)} -> {target}#{anchor}")
    assert missing == []


def test_every_mlx_option_the_pages_name_exists() -> None:
    from pytest_mlxgate.config.options import OPTIONS

    flags = {o.flag for o in OPTIONS}
    unknown = {
        f"{_named(page)}: {flag}"
        for page in PAGES
        for flag in re.findall(r"(?<![\w-])--mlx-[a-z0-9-]*[a-z0-9]", page.read_text())
        if flag not in flags
    }
    assert unknown == set()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_mlxgate_command_the_pages_show_exists_with_its_flags() -> None:
    """A command line in a bash block: its subcommand (and sub-subcommand) exists and each of its flags
    is one that subcommand takes (a synopsis's [OPTIONAL] parts and NAME placeholders are not parsed)."""
    from pytest_mlxgate.cli import _parser

    shown, wrong = 0, []
    for page in PAGES:
        for block in _blocks(page, "bash"):
            for line in block.splitlines():
                if not line.startswith("mlxgate "):
                    continue
                shown += 1
                words = shlex.split(line.split("  #")[0].replace("[", " ").replace("]", " "))[1:]
                parser = _parser()
                while words and words[0] in _subparsers(parser):
                    parser = _subparsers(parser)[words.pop(0)]
                if _subparsers(parser):
                    wrong.append(f"{_named(page)}: {line} (no such subcommand)")
                    continue
                takes = {s for a in parser._actions for s in a.option_strings}
                wrong += [f"{_named(page)}: {line} ({w})" for w in words if w.startswith("-") and w not in takes]
    assert shown >= 8 and wrong == []


def test_every_marker_and_package_name_the_examples_use_exists() -> None:
    import pytest_mlxgate
    from pytest_mlxgate.plugin import MARKERS

    markers = {line.split("(")[0].split(":")[0] for line in MARKERS}
    examples = [(page, block) for page in PAGES for block in _blocks(page, "python")]
    assert len(examples) >= 4
    for page, block in examples:
        tree = ast.parse(block, filename=_named(page))  # every example parses
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_mlxgate"):
                module = importlib.import_module(node.module or "")
                assert all(hasattr(module, a.name) for a in node.names), (_named(page), node.module)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                assert not node.attr.startswith("mlx_") or node.attr in markers, (_named(page), node.attr)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("assert_"):
                assert node.func.id in pytest_mlxgate.__all__, (_named(page), node.func.id)


def _gate_modules() -> list[tuple[str, str]]:
    return [
        (f"{_named(page)} example {i}", block)
        for page in PAGES
        for i, block in enumerate(_blocks(page, "python"), 1)
        if "pytestmark" in block
        and "def test_" in block
        and "import pytest" in block
        and "mlx_server(" not in block  # a server's gate needs its server: tests/remote/test_server_gate.py
    ]


@pytest.mark.parametrize(("where", "source"), _gate_modules())
def test_each_whole_gate_example_runs_to_a_verdict_on_a_tiny_model(
    where: str, source: str, pytester: pytest.Pytester, tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_example=source)
    report = tmp_path / "r.json"
    pytester.runpytest_inprocess(
        f"--mlx-candidate={tiny_kv_model_dir}", "--mlx-allow-untrained", "--mlx-db=off", f"--mlx-report={report}",
        "--mlx-kl-prompts=3", "--mlx-kl-tokens=24", "--mlx-kl-decode=6", "-p", "no:randomly", "-p", "no:xdist",
    )  # fmt: skip
    records = json.loads(report.read_text())["gates"]
    assert records and {r["verdict"] for r in records} <= {"pass", "fail", "inconclusive"}, (where, records)
