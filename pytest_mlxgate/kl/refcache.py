"""The reference arm's distributions, cached on disk so an unchanged gate runs only its candidate arm.

An entry is keyed by everything that changes the reference distributions: the model (commit, or
a fingerprint of a local directory's files), the tokenizer files' content, the device and BLAS,
mlx and mlx-lm versions, the token ids of every sequence, the path and its sizes, the lever's
reference value, and the compaction's own constants. The key is stored inside the entry and
compared in full on load: a hash collision, a truncated file or a foreign file is a miss, never
a wrong reference. Entries are written atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..common.atomic import atomic_write
from ..common.keys import canonical_json, key_digest

if TYPE_CHECKING:
    from .divergence import RefDistributions

__all__ = ["CACHE_FORMAT", "ReferenceCache"]

CACHE_FORMAT = 1
class ReferenceCache:
    """A directory of `<key-hash>.npz` files, one per (gate configuration, reference arm)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def digest(key: Mapping[str, Any]) -> str:
        return key_digest(key)

    def path_for(self, key: Mapping[str, Any]) -> Path:
        return self.directory / f"{self.digest(key)}.npz"

    def load(self, key: Mapping[str, Any], n_sequences: int) -> list[RefDistributions] | None:
        """The cached reference for `key`, or None (absent, damaged, or written for another key)."""
        from .divergence import RefDistributions

        path = self.path_for(key)
        try:
            with np.load(path, allow_pickle=False) as data:
                stored = json.loads(bytes(data["key"]).decode())
                if stored != json.loads(canonical_json(key)) or int(data["n"]) != n_sequences:
                    return None
                out = []
                for i in range(n_sequences):
                    prefix = f"s{i}_"
                    arrays = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
                    out.append(RefDistributions.from_arrays(arrays))
                return out
        except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError, json.JSONDecodeError):
            return None

    def store(self, key: Mapping[str, Any], refs: Sequence[RefDistributions]) -> Path:
        """Write atomically; a concurrent writer of the same key writes identical content."""
        self.directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {
            "key": np.frombuffer(canonical_json(key).encode(), dtype=np.uint8),
            "n": np.asarray(len(refs)),
        }
        for i, ref in enumerate(refs):
            for name, value in ref.to_arrays().items():
                arrays[f"s{i}_{name}"] = value
        final = self.path_for(key)
        atomic_write(final, lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]
        return final
