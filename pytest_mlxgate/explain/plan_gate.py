"""What a plan search needs of a gate module (a KV gate for `plan kv`, a weights gate for `plan weights`): its
lever, its sizes and its KL limits (`read_gate`), and sequences like its own that it never reads
(`selection_sequences`); shared by the searches (`plan_kv`, `plan_frontier`, `plan_weights`) and the
verification that runs the gate (`plan_verify`)."""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import zip_longest
from pathlib import Path
from typing import Any, Literal

from ..common.gate_calls import declared_limits
from ..errors import MlxgateUsageError, PromptsError
from ..kl.prompts import Prompt, TokenSequence, build_sequences, default_prompts, tail_sequences
from ..levers.lever import Lever
from ..levers.parsing import lever_from_marker

__all__ = ["SELECTION_SEQUENCES", "GateSpec", "read_gate", "selection_sequences"]

#: Selection sequences (the gate's own prompts are held out for the verification).
SELECTION_SEQUENCES = 6


@dataclass(frozen=True)
class GateSpec:
    """What the search needs of a gate module: its lever, sizes and mean/p99/top-1 limits."""

    path: Path
    lever: Lever
    prompts: int
    tokens: int
    decode: int
    limits: Mapping[str, float]
    kl_tests: tuple[str, ...]
    capability_tests: tuple[str, ...] = ()  # its `assert_capability_at_least` tests (HashHop...): verified too


#: What each plan kind searches, the lever kind its gate must have, and an example gate.
_PLANNED: dict[str, tuple[str, str]] = {
    "kv": ("KV", "gates/test_kv_cache.py"),
    "weights": ("weight", "gates/test_weights_8bit.py"),
}


def read_gate(path: Path, *, model: str | None = None, kind: Literal["kv", "weights"] = "kv") -> GateSpec:
    """Import the gate module and read its `mlx_lever`/`mlx_kl` marks and `assert_kl_below` limits (a
    `models=` entry for `model` replaces the gate's own). MlxgateUsageError when its lever is not of `kind`,
    or its reference arm is not what the plans are priced against (the plain cache, the weights as loaded)."""
    what, example = _PLANNED[kind]
    if not path.is_file():
        raise MlxgateUsageError(f"--gate {path}: no such file; give a gate module, e.g. {example}")
    spec = importlib.util.spec_from_file_location(f"_mlxgate_plan_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's module: whatever it raises is its own fault, said as such
        raise MlxgateUsageError(_import_failure(path, e)) from None
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    lever_mark = next((m.mark for m in marks if getattr(m, "name", "") == "mlx_lever"), None)
    if lever_mark is None:
        raise MlxgateUsageError(f"{path} declares no mlx_lever: give a {what} gate module, e.g. {example}")
    lever = lever_from_marker(lever_mark, base_dir=path.parent)
    if lever.kind != kind:
        raise MlxgateUsageError(
            f"{path}'s lever {lever.name!r} is a {lever.kind} lever: `plan {kind}` searches {what} plans; give a "
            f"{what} gate module, e.g. {example}"
        )
    if kind == "kv" and not lever.kv_plan("reference").is_plain:
        raise MlxgateUsageError(f"{path}'s reference arm is not the plain cache: the search prices plans against it")
    if kind == "weights" and lever.weights_spec("reference") is not None:
        raise MlxgateUsageError(
            f"{path}'s reference arm is not the weights as loaded: the search prices plans against them"
        )
    kl_mark = next((m.mark for m in marks if getattr(m, "name", "") == "mlx_kl"), None)
    sizes = dict(kl_mark.kwargs) if kl_mark is not None else {}
    found, _ = declared_limits(path, {"assert_kl_below"})
    limits: dict[str, float] = {}
    for limit in found:
        if limit.model is None:
            limits.setdefault(limit.key, limit.value)
    for limit in found:
        if limit.model is not None and limit.model == model:
            limits[limit.key] = limit.value
    if "mean" not in limits:
        raise MlxgateUsageError(f"{path} asserts no mean KL limit (assert_kl_below(paired, mean=...)): nothing to meet")
    return GateSpec(
        path=path,
        lever=lever,
        prompts=int(sizes.get("prompts", 64)),
        tokens=int(sizes.get("tokens", 256)),
        decode=int(sizes.get("decode", 32)),
        limits=limits,
        kl_tests=tuple(sorted({limit.test for limit in found})),
        capability_tests=tuple(sorted({c.test for c in declared_limits(path, {"assert_capability_at_least"})[0]})),
    )


def selection_sequences(tokenizer: Any, gate: GateSpec, n: int, *, reserve: int | None = None) -> list[Any]:
    """`n` sequences like the gate's own, none of which the gate reads: the gate's prompts stay held out for
    the verification, so a plan is never judged on what chose it. Like: the gate's prompts set the domains
    (8 prompts of 32 tokens are all code, and code drifts more than prose under quantization: a selection
    of the other domains chose weight plans that then failed the gate). So, one per text, in this order:
    free prompts of the gate's domains; the gate's own prompts past every id its runs read (the first
    `reserve` + 1, default its own tokens), a domain at a time; free prompts of other domains."""
    prompts = default_prompts()
    used: set[str] = set()
    for tokens in {gate.tokens, reserve or gate.tokens}:
        used |= {
            source for s in build_sequences(prompts, tokenizer, n=gate.prompts, tokens=tokens) for source in s.sources
        }
    by_domain: dict[str, list[Prompt]] = {}
    for p in prompts:
        if p.id in used:
            by_domain.setdefault(p.domain, []).append(p)
    domains = set(by_domain)
    # the gate's prompts a domain at a time, round robin: the selection's mix of domains is the gate's
    read = [p for group in zip_longest(*by_domain.values()) for p in group if p is not None]
    pool: list[TokenSequence] = []
    for part in (
        [p for p in prompts if p.id not in used and p.domain in domains],
        None,
        [p for p in prompts if p.id not in used and p.domain not in domains],
    ):
        if part is None:
            pool += tail_sequences(read, tokenizer, skip=(reserve or gate.tokens) + 1, tokens=gate.tokens)
        elif part:
            try:
                pool += build_sequences(part, tokenizer, n=len(part), tokens=gate.tokens)
            except PromptsError:  # too few or too short to give one sequence each: fewer candidates
                pass
    chosen: list[TokenSequence] = []
    for seq in pool:
        if seq.text not in {c.text for c in chosen} and seq.ids not in {c.ids for c in chosen}:
            chosen.append(replace(seq, index=len(chosen)))
    if len(chosen) < n:
        raise MlxgateUsageError(
            f"--selection {n}: the default prompts give {len(chosen)} sequences of {gate.tokens + 1} tokens that the "
            f"gate's own {gate.prompts} sequences never read (its prompts are held out for its verification); "
            f"lower --selection (default {SELECTION_SEQUENCES})"
        )
    return chosen[:n]


def _import_failure(path: Path, e: Exception) -> str:
    """Why the gate module did not import, where (its file and line, or the line of the gate that reached it),
    and how to see it again: the search reads the gate's marks by importing it, as pytest would."""
    if isinstance(e, SyntaxError):
        where = f"{e.filename or path}, line {e.lineno}"
        what = f"{type(e).__name__}: {e.msg}" + (f": {e.text.strip()}" if e.text and e.text.strip() else "")
    else:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        where = f"{path}, line {lines[-1]}" if lines else str(path)
        what = f"{type(e).__name__}: {e}"
    return (
        f"--gate {path}: the gate module does not import ({what}, at {where}); the search reads its lever and "
        f"limits by importing it, as pytest does: fix it (`python -m pytest --collect-only {path}` shows the "
        "same error), then run the plan again"
    )
