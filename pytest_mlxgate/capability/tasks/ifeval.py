"""IFEval: does the lever keep the model following verifiable instructions ("no commas", "3 bullets")?

Prompts: google/IFEval's `ifeval_input_data.jsonl` for tier "full" when that dataset is already in
the local hub cache (no download is attempted); otherwise our own prompt set in the same record
format, shipped with the package (`ifeval_prompts.jsonl`), which covers every instruction type.
Scoring is the reference's: the item passes when every instruction is followed (prompt-level strict);
instruction-level and loose results go to `detail` for reporting.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import Item, ItemResult, RunOptions, Tier, chat_render, prompt_hash, stable_id
from ..data import cached_hub_dataset
from ..ifeval_checks import INSTRUCTION_TYPES, evaluate_response, language_detection_available

__all__ = ["IfevalTask", "TASK", "hub_records", "load_records", "packaged_records"]

PACKAGED = Path(__file__).resolve().parent.parent / "ifeval_prompts.jsonl"
HUB_REPO = "google/IFEval"
HUB_FILE = "ifeval_input_data.jsonl"
_NEEDS_LANGDETECT = {"language:response_language"}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file, validated enough that scoring cannot trip on them later."""
    records: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        ids, kwargs = rec.get("instruction_id_list"), rec.get("kwargs")
        if (
            not isinstance(rec.get("prompt"), str)
            or not isinstance(ids, list)
            or not isinstance(kwargs, list)
            or len(ids) != len(kwargs)
        ):
            raise ValueError(f"{path}:{n}: not an IFEval record (prompt, instruction_id_list, kwargs)")
        unknown = [i for i in ids if i not in INSTRUCTION_TYPES]
        if unknown:
            raise ValueError(f"{path}:{n}: unknown instruction types {unknown}")
        records.append(rec)
    return records


def packaged_records() -> list[dict[str, Any]]:
    """Our own prompt set (shipped with the package)."""
    return _read_jsonl(PACKAGED)


def hub_records() -> list[dict[str, Any]] | None:
    """google/IFEval's prompts when the dataset is already in the hub cache; None otherwise."""
    try:
        snapshot = cached_hub_dataset(HUB_REPO)
        if snapshot is None:
            return None
        path = snapshot / HUB_FILE
        return _read_jsonl(path) if path.exists() else None
    except Exception:  # not cached, partial, or unreadable: our own set stands in
        return None


def load_records(tier: Tier) -> list[dict[str, Any]]:
    """The records a tier draws from: the hub's full set for "full" when cached, else ours."""
    if tier == "full":
        return hub_records() or packaged_records()
    return packaged_records()


def _item(rec: Mapping[str, Any]) -> Item:
    kwargs = [{k: v for k, v in (kw or {}).items() if v is not None} for kw in rec["kwargs"]]
    key = rec.get("key")
    return Item(
        id=f"ifeval-{key}" if key is not None else f"ifeval-{stable_id(rec['prompt'], rec['instruction_id_list'])}",
        messages=({"role": "user", "content": rec["prompt"]},),
        target={"instruction_id_list": list(rec["instruction_id_list"]), "kwargs": kwargs, "prompt": rec["prompt"]},
        meta={"instructions": len(rec["instruction_id_list"])},
    )


class IfevalTask:
    """The `Task` for IFEval (see the module docstring)."""

    name = "ifeval"
    graded = False
    max_new_tokens = 384
    smoke_n = 20

    def configured(self, options: RunOptions) -> IfevalTask:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """Items of `tier`; smoke is a seeded sample of `smoke_n`, full is everything (or n of it)."""
        records = load_records(tier)
        if not language_detection_available():  # items that could not be checked at all are dropped
            records = [r for r in records if not set(r["instruction_id_list"]) <= _NEEDS_LANGDETECT]
        items = sorted((_item(r) for r in records), key=lambda it: it.id)
        count = n if n is not None else (self.smoke_n if tier == "smoke" else len(items))
        if count >= len(items):
            return items
        picked = random.Random(f"ifeval:{seed}").sample(range(len(items)), count)
        return [items[i] for i in sorted(picked)]

    def render(self, item: Item, tokenizer: Any) -> str:
        """The chat template applied to the single user turn."""
        assert item.messages is not None
        return chat_render(tokenizer, item.messages)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """1.0 when every verifiable instruction is followed (strict); loose and per-instruction in detail."""
        target = item.target
        verdict = evaluate_response(target["instruction_id_list"], target["kwargs"], output)
        unverifiable = [iid for iid, s in zip(verdict.instruction_ids, verdict.strict, strict=True) if s is None]
        if not verdict.verifiable:
            label = "unverifiable"
        elif not output.strip():
            label = "no_answer"
        else:
            label = "correct" if verdict.prompt_strict else "wrong"
        # The protocol's score() never sees the rendered input: hash the messages (stable per item).
        text = json.dumps([dict(m) for m in item.messages or ()], sort_keys=True)
        return ItemResult(
            item_id=item.id,
            prompt_hash=prompt_hash(text),
            output=output,
            score=1.0 if verdict.prompt_strict else 0.0,
            verdict=label,
            detail={
                "instructions": list(verdict.instruction_ids),
                "strict": list(verdict.strict),
                "loose": list(verdict.loose),
                "prompt_strict": verdict.prompt_strict,
                "prompt_loose": verdict.prompt_loose,
                "unverifiable": unverifiable,
            },
        )


TASK = IfevalTask()
