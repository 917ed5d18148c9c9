"""The reference arm's distributions, cached on disk so an unchanged gate runs only its candidate arm.

An entry is keyed by everything that changes the reference distributions: the model (commit, or
a fingerprint of a local directory's files), the tokenizer files' content, the device and BLAS,
mlx and mlx-lm versions, the token ids of every sequence, the path and its sizes, the lever's
reference value, and the compaction's own constants. The key is stored inside the entry and
compared in full on load: a hash collision or a foreign file is a miss, never a wrong reference.
The file is sealed with its payload's sha256 (`common.refstore`): a damaged entry is a miss,
reported once and replaced by the recomputed one; written atomically, evicted least recently used
first beyond the cache's cap.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..common.keys import canonical_json, key_digest
from ..common.refstore import CacheFolder
from ..stats.divergence import RefDistributions

__all__ = ["CACHE_FORMAT", "ReferenceCache"]

CACHE_FORMAT = 1


class ReferenceCache(CacheFolder):
    """A directory of `<key-hash>.npz` files, one per (gate configuration, reference arm).

    `files` (shared with the run's capability cache, whose folder sits inside this one) reads,
    writes and evicts them; by default one over `directory` with `max_bytes` and `report`."""

    @staticmethod
    def digest(key: Mapping[str, Any]) -> str:
        return key_digest(key)

    def path_for(self, key: Mapping[str, Any]) -> Path:
        return self.directory / f"{self.digest(key)}.npz"

    def load(self, key: Mapping[str, Any], n_sequences: int) -> list[RefDistributions] | None:
        """The cached reference for `key`, or None: absent, written for another key, or damaged
        in any way (said once; the store after the recomputed arm replaces it)."""
        return self.files.load(self.path_for(key), lambda payload: _decode(payload, key, n_sequences))

    def store(self, key: Mapping[str, Any], refs: Sequence[RefDistributions]) -> Path:
        """Write atomically; a concurrent writer of the same key writes identical content."""
        arrays: dict[str, np.ndarray] = {
            "key": np.frombuffer(canonical_json(key).encode(), dtype=np.uint8),
            "n": np.asarray(len(refs)),
        }
        for i, ref in enumerate(refs):
            for name, value in ref.to_arrays().items():
                arrays[f"s{i}_{name}"] = value
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        final = self.path_for(key)
        self.files.write(final, buffer.getvalue())
        return final


def _decode(payload: bytes, key: Mapping[str, Any], n_sequences: int) -> list[RefDistributions] | None:
    """The sequences of a checked payload; None when it was written for another key."""
    with np.load(io.BytesIO(payload), allow_pickle=False) as data:
        stored = json.loads(bytes(data["key"]).decode())
        if stored != json.loads(canonical_json(key)) or int(data["n"]) != n_sequences:
            return None
        out = []
        for i in range(n_sequences):
            prefix = f"s{i}_"
            arrays = {k[len(prefix) :]: data[k] for k in data.files if k.startswith(prefix)}
            out.append(RefDistributions.from_arrays(arrays))
        return out
