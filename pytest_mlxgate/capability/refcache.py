"""The reference arm's capability results, cached so an unchanged gate runs only its candidate arm.

The KL reference cache's discipline: an entry is keyed by everything the reference outputs depend
on — the model (commit or local fingerprint), tokenizer and dtype, the device, BLAS and mlx /
mlx-lm versions, the lever's reference value, the task (name and the hash of its code), tier and
n, every item's id and the hash of its exact rendered prompt (so the data and the chat template
are in it), and the generation settings. The full key is stored inside and compared on load: a
foreign file is a miss, never a wrong reference. Sealed with its payload's sha256, written
atomically and evicted like a KL entry (`common.refstore`): a damaged entry is a miss, said once
and replaced by the recomputed one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common.keys import canonical_json, key_digest
from ..common.refstore import CacheFolder
from ..serving import batch, caches
from ..serving import kv_plan as kvcache
from . import generate
from .base import ItemResult

__all__ = ["CAPABILITY_CACHE_FORMAT", "CapabilityCache", "generation_code_digest", "task_code_digest"]

#: Bump when an entry's layout or the meaning of a stored field changes.
CAPABILITY_CACHE_FORMAT = 1


def task_code_digest(task: object) -> str:
    """sha256 of the source files that define the task's class and its bases (a shared scorer such
    as `cloze.ClozeTask` lives in another file than the task): a changed scorer is a miss. A class
    defined in one file hashes exactly that file's bytes."""
    own = type(task)
    sources: list[str] = []
    for cls in own.__mro__:
        if cls is not own and cls.__module__.partition(".")[0] in sys.stdlib_module_names:
            continue  # object, Protocol, Generic: not the task's code
        try:
            source = inspect.getsourcefile(cls)
        except TypeError:  # a builtin class
            source = None
        if source is None and cls is own:
            return f"unhashable:{own.__module__}.{own.__qualname__}"
        if source is not None and source not in sources:
            sources.append(source)
    digests = [hashlib.sha256(Path(source).read_bytes()).hexdigest() for source in sources]
    return digests[0] if len(digests) == 1 else hashlib.sha256(" ".join(digests).encode()).hexdigest()


def generation_code_digest() -> str:
    """sha256 of the code that turns a rendered prompt into an arm's output (greedy generation,
    choice scoring, the batched serving loop): a changed path is a miss, even for an unchanged task."""
    modules = (generate, batch, caches, kvcache)
    digests = [hashlib.sha256(Path(m.__file__ or "").read_bytes()).hexdigest() for m in modules]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


class CapabilityCache(CacheFolder):
    """A directory of `cap-<key-hash>.json` files, one per (gate configuration, task, reference arm).

    `files`: the run's KL cache's (this folder sits inside it, under one cap); by default one over
    `directory` with `max_bytes` and `report`."""

    def path_for(self, key: Mapping[str, Any]) -> Path:
        return self.directory / f"cap-{key_digest(key)}.json"

    def load(self, key: Mapping[str, Any], n_items: int) -> list[ItemResult] | None:
        """The stored results, or None: absent, another key, the wrong size, or damaged in any
        way (said once; the store after the recomputed arm replaces it)."""
        return self.files.load(self.path_for(key), lambda payload: _decode(payload, key, n_items))

    def store(self, key: Mapping[str, Any], results: Sequence[ItemResult]) -> Path:
        path = self.path_for(key)
        doc = {"key": json.loads(canonical_json(key)), "results": [r.to_json() for r in results]}
        self.files.write(path, json.dumps(doc, ensure_ascii=False).encode("utf-8"))
        return path


def _decode(payload: bytes, key: Mapping[str, Any], n_items: int) -> list[ItemResult] | None:
    """The results of a checked payload; None when written for another key or another item count."""
    doc = json.loads(payload.decode("utf-8"))
    if doc.get("key") != json.loads(canonical_json(key)):
        return None
    results = [ItemResult.from_json(r) for r in doc["results"]]
    return results if len(results) == n_items else None
