"""The README's layout table tells the truth about the tree: every folder and module of the package
has its row or its mention, and every file or folder a row names exists where the row says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_mlxgate"
#: A backticked name that stands for a file or a folder (`calibration/<module>.json` is a pattern, not one).
_PATH = re.compile(r"`([\w./-]+(?:\.(?:py|json|jsonl|md)|/))`")


def layout_rows(readme: str) -> dict[str, str]:
    """The Layout section's table: the folder in the first column -> the rest of its row."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\|(?:\s*\d+\s*\|)?\s*`([^`]+)`\s*\|(.*)\|\s*$", line)  # an optional floor first
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def missing_and_wrong(root: Path, package: str, rows: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the package's folders and modules the table does not name, the names in it that do not exist).

    A package folder has a row of its own (`pkg/sub/`) or, nested deeper, a mention in its parent's
    row (`tasks/`); a module is named in its folder's row (`name.py`; a package's `__init__` needs none)."""
    missing, wrong = [], []
    for folder in sorted(p for p in (root / package).rglob("*") if p.is_dir() and (p / "__init__.py").exists()):
        rel = folder.relative_to(root).as_posix() + "/"
        if rel not in rows:
            parent = folder.parent.relative_to(root).as_posix() + "/"
            if f"`{folder.name}/`" not in rows.get(parent, ""):
                missing.append(rel)
            continue
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py" and f"`{module.name}`" not in rows[rel]:
                missing.append(module.relative_to(root).as_posix())
    for folder, text in rows.items():
        if not (root / folder).is_dir():
            wrong.append(f"the row {folder}")
            continue
        for name in _PATH.findall(text):
            if not ((root / folder / name).exists() or (root / name).exists()):
                wrong.append(f"{name} (row {folder})")
    return missing, wrong


def test_the_layout_table_lists_every_folder_and_module_and_nothing_else() -> None:
    missing, wrong = missing_and_wrong(ROOT, PACKAGE.name, layout_rows((ROOT / "README.md").read_text()))
    assert (missing, wrong) == ([], []), (
        f"README.md's Layout table: not named: {', '.join(missing) or 'none'}; named but not there: "
        f"{', '.join(wrong) or 'none'}. Add a few words for each new module to its folder's row; drop what went."
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in (
        "pkg/__init__.py",
        "pkg/plugin.py",
        "pkg/sub/__init__.py",
        "pkg/sub/a.py",
        "pkg/sub/deep/__init__.py",
        "pkg/sub/deep/x.py",
        "docs/notes.md",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    return tmp_path


def test_a_planted_table_is_checked_both_ways(tree: Path) -> None:
    readme = (
        "# x\n\n## Layout\n\n| folder | what |\n|---|---|\n| `pkg/` | `plugin.py` |\n"
        "| `pkg/sub/` | `a.py`, `deep/` (nested: named, its modules not) |\n| `docs/` | `notes.md` |\n\n## Next\n"
        "| `gone/` | not in the layout section |\n"
    )
    rows = layout_rows(readme)
    assert set(rows) == {"pkg/", "pkg/sub/", "docs/"}
    assert missing_and_wrong(tree, "pkg", rows) == ([], [])
    (tree / "pkg/sub/b.py").write_text("")
    (tree / "pkg/new/__init__.py").parent.mkdir()
    (tree / "pkg/new/__init__.py").write_text("")
    (tree / "pkg/plugin.py").unlink()
    rows["lost/"] = " nothing "
    assert missing_and_wrong(tree, "pkg", rows) == (
        ["pkg/new/", "pkg/sub/b.py"],
        ["plugin.py (row pkg/)", "the row lost/"],
    )
