"""`unwritable`: the question a long command asks of each output before it starts, asked of the real
filesystem (a file where a folder should be, a folder where the file should be, a folder without
write permission, a missing folder the writer would or would not create)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_mlxgate.common.atomic import atomic_write_bytes, unwritable


def test_a_file_in_a_writable_folder_can_be_written_and_is(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    assert unwritable(target) is None
    atomic_write_bytes(target, b"{}")  # the answer is the writer's: it writes there
    assert unwritable(target) is None  # an existing file is replaced, not refused


@pytest.mark.parametrize(
    ("where", "parents_made", "why"),
    [
        ("a-folder", False, "it is a folder"),
        ("afile/r.json", True, "afile is a file, not a folder"),
        ("afile/deeper/r.json", True, "afile is a file, not a folder"),
        ("missing/r.json", False, "the folder {tmp}/missing does not exist"),
    ],
)
def test_what_cannot_be_written_says_why(tmp_path: Path, where: str, parents_made: bool, why: str) -> None:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "afile").write_text("x")
    got = unwritable(tmp_path / where, parents_made=parents_made)
    assert got is not None and got.endswith(why.format(tmp=tmp_path)), got
    if not got.startswith("it is"):  # and the writer agrees: it cannot write there
        with pytest.raises(OSError):
            (tmp_path / where).parent.mkdir(parents=True, exist_ok=True) if parents_made else None
            atomic_write_bytes(tmp_path / where, b"x")


def test_a_missing_folder_the_writer_makes_is_no_problem_and_nothing_is_created(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "r.json"
    assert unwritable(target, parents_made=True) is None
    assert not (tmp_path / "new").exists()


def test_a_read_only_folder_cannot_be_written(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    if os.access(folder, os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    assert unwritable(folder / "r.json") == f"the folder {folder} cannot be written"
