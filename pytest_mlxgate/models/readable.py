"""Why a model directory cannot be loaded: the first file `mlx_lm.load` would trip on, and what is wrong.

mlx's own messages name a tensor or a byte count, not the file ("[read] Unable to read 8 bytes from
file."); this reads only what it must (config.json, each safetensors header and its size) to say
which file is short, empty, unreadable or not what its name says.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

__all__ = ["unreadable_file"]

_HEADER_LIMIT = 100 << 20  # the safetensors format caps its JSON header at 100 MB


def unreadable_file(directory: Path) -> tuple[str, str] | None:
    """(file name, why) for the first file of `directory` that cannot be read as a model; None if none."""
    problem = _config_problem(directory / "config.json")
    if problem:
        return "config.json", problem
    weights = sorted(directory.glob("model*.safetensors"))  # what mlx_lm.load reads
    if not weights:
        return "model.safetensors", "there is no model*.safetensors weights file in the directory"
    for path in weights:
        problem = _safetensors_problem(path)
        if problem:
            return path.name, problem
    return None


def _read_error(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "it cannot be opened: it is missing (a link whose target is gone?)"
    return f"it cannot be read ({e.strerror or e})"


def _config_problem(path: Path) -> str | None:
    try:
        text = path.read_bytes()
    except OSError as e:
        return _read_error(e)
    try:
        doc = json.loads(text)
    except ValueError as e:
        return f"it is not valid JSON ({e}); {len(text)} bytes"
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    return None


def _safetensors_problem(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            if len(head) < 8:
                return (
                    f"it is {size} bytes: too short even for a safetensors header (8 bytes); truncated"
                    if size
                    else "it is empty (0 bytes); truncated"
                )
            (n,) = struct.unpack("<Q", head)
            if n > _HEADER_LIMIT:
                return f"its first 8 bytes announce a {n}-byte header: it is not a safetensors file"
            if 8 + n > size:
                return f"its header says it is {n} bytes but the file holds {size} bytes in all: truncated"
            header = f.read(n)
    except OSError as e:
        return _read_error(e)
    try:
        doc = json.loads(header)
    except ValueError:
        return "its header is not valid JSON: the file is corrupt"
    if not isinstance(doc, dict):
        return "its header is not a JSON object: the file is corrupt"
    end = 0
    for name, entry in doc.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"its header gives tensor {name!r} no usable data_offsets: the file is corrupt"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        return (
            f"it holds {size} bytes but its header says its tensors end at byte {expected} "
            f"({expected - size} bytes missing): truncated, an incomplete copy or download"
        )
    return None
