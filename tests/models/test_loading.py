"""A model whose files cannot be read fails with the file, the reason and the fix, never a traceback
from inside mlx_lm: `load_mlx` on copies of the tiny model, each broken one way."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_mlxgate.errors import ModelUnavailableError
from pytest_mlxgate.models.loaded import load_mlx
from pytest_mlxgate.models.materialize import ResolvedSnapshot
from pytest_mlxgate.models.readable import unreadable_file

WEIGHTS = "model.safetensors"


def _local(path: Path) -> ResolvedSnapshot:
    return ResolvedSnapshot(name=str(path), kind="local", repo_id=None, commit="local", path=str(path))


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, out)
    return out


def _truncate_to(n: int | Callable[[int], int]) -> Callable[[Path], None]:
    def cut(d: Path) -> None:
        size = (d / WEIGHTS).stat().st_size
        with open(d / WEIGHTS, "r+b") as f:
            f.truncate(n(size) if callable(n) else n)

    return cut


def _dangling(d: Path) -> None:
    (d / WEIGHTS).unlink()  # a snapshot copied without its blobs: the link leads nowhere
    (d / WEIGHTS).symlink_to("../../blobs/0123456789abcdef")


def _header_len(d: Path) -> int:
    with open(d / WEIGHTS, "rb") as f:
        return int(struct.unpack("<Q", f.read(8))[0])


BROKEN = {
    # what mlx raises for each, left as it comes: RuntimeError [load_safetensors] / [read], OSError, ValueError
    "tail cut": (_truncate_to(lambda size: size - 1), WEIGHTS, "bytes missing): truncated"),
    "half": (_truncate_to(lambda size: size // 2), WEIGHTS, "bytes missing): truncated"),
    "header cut": (_truncate_to(100), WEIGHTS, "but the file holds 100 bytes in all: truncated"),
    "4 bytes": (_truncate_to(4), WEIGHTS, "it is 4 bytes: too short even for a safetensors header"),
    "empty": (_truncate_to(0), WEIGHTS, "it is empty (0 bytes); truncated"),
    "dangling link": (_dangling, WEIGHTS, "it cannot be opened: it is missing"),
    "config not json": (lambda d: (d / "config.json").write_text("{bad"), "config.json", "it is not valid JSON"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_an_unreadable_file_is_named_with_its_reason_and_the_fix(model_copy: Path, case: str) -> None:
    break_it, name, why = BROKEN[case]
    break_it(model_copy)
    with pytest.raises(ModelUnavailableError) as info:
        load_mlx(_local(model_copy), "candidate")
    message = str(info.value)
    assert message.startswith(f"mlxgate: cannot load the candidate '{model_copy}' ({model_copy}): {name}: ")
    assert why in message
    assert f"Fix: copy or convert the model into {model_copy} again" in message
    assert "[load_safetensors]" not in message and "[read]" not in message  # mlx's words are not the story


def test_the_byte_count_of_a_truncation_is_the_files_own(model_copy: Path) -> None:
    size = (model_copy / WEIGHTS).stat().st_size
    _truncate_to(size - 4096)(model_copy)
    assert unreadable_file(model_copy) == (
        WEIGHTS,
        (
            f"it holds {size - 4096} bytes but its header says its tensors end at byte {size} (4096 bytes missing): "
            "truncated, an incomplete copy or download"
        ),
    )
    assert _header_len(model_copy) > 0


def test_a_whole_model_reads_whole_and_loads(model_copy: Path) -> None:
    assert unreadable_file(model_copy) is None
    model, tokenizer = load_mlx(_local(model_copy), "candidate")
    assert tokenizer.encode("hello") and model is not None


def test_a_model_mlx_lm_does_not_take_says_so_with_its_version(model_copy: Path) -> None:
    config = json.loads((model_copy / "config.json").read_text())
    config["model_type"] = "no-such-architecture"
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelUnavailableError) as info:
        load_mlx(_local(model_copy), "reference")
    message = str(info.value)
    assert message.startswith(f"mlxgate: mlx_lm.load could not load the reference '{model_copy}'")
    assert "Model type no-such-architecture not supported" in message and "upgrade mlx-lm" in message


def test_a_hub_snapshot_that_cannot_be_read_points_at_verify_and_get(model_copy: Path, tmp_path: Path) -> None:
    _truncate_to(lambda size: size - 10)(model_copy)
    commit = "ab" * 20
    snap = ResolvedSnapshot(name="tiny", kind="hub", repo_id="org/tiny", commit=commit, path=str(model_copy))
    with pytest.raises(ModelUnavailableError) as info:
        load_mlx(snap, "candidate")
    message = str(info.value)
    assert message.startswith(
        f"mlxgate: cannot load the candidate 'tiny' (org/tiny@{commit[:7]} at {model_copy}): {WEIGHTS}: it holds"
    )
    assert "`mlxgate verify tiny --repair`" in message and "`mlxgate get tiny`" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file whatever its mode")
def test_a_file_without_read_permission_is_named(model_copy: Path) -> None:
    os.chmod(model_copy / WEIGHTS, 0)
    assert unreadable_file(model_copy) == (WEIGHTS, "it cannot be read (Permission denied)")
