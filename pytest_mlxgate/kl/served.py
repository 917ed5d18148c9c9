"""The arms of a KL measurement served over HTTP (`--mlx-cand-server`, `--mlx-ref-server`): each server's
model checked against the local one it stands for, then asked at the gate's own positions (`remote.arm`).

Either arm, or both, may be a server. A reference served gives the rows an in-process reference would
(top-k and one tail bin, or whole distributions by the mlxgate protocol), so the candidate, in process or
served, is scored against it as ever; every figure over top-k rows is a lower bound of the full KL. Positions
a server could not be asked are dropped from both arms' scores and counted, never scored as agreement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from ..common.commits import is_commit
from ..errors import ServerArmError
from ..remote.arm import (
    ServedArm,
    ServedReference,
    ServerScores,
    ask_reference,
    run_protocol_against,
    run_server_against,
    scored_positions,
)
from ..remote.client import ServerClient
from ..stats.topk import kept_scores

if TYPE_CHECKING:
    from ..common.watch import ArmWatch
    from ..models.loaded import LoadedModel
    from ..stats.divergence import RefDistributions, TokenScores
    from .prompts import TokenSequence
    from .shape import RunShape

__all__ = ["asked_only", "logits_width", "names_the_model", "served_candidate", "served_facts", "served_reference_arm"]


def _checked(client: ServerClient, arm: str, model: LoadedModel, vocab_size: int) -> tuple[list[str] | None, Any]:
    """(the models the server lists or None, its mlxgate protocol info or None), after checking both name
    `model`, the local model the server stands in for as the `arm` arm."""
    url = client.endpoint.url
    try:
        served: list[str] | None = client.served_models()
    except ServerArmError:
        served = None  # mlx_lm.server's listing breaks without a hub cache: the tokenizer check still runs
    local = {str(v) for v in (model.snapshot.path, model.snapshot.repo_id, model.snapshot.name) if v}
    flag = "--mlx-candidate" if arm == "candidate" else "--mlx-candidate (the reference arm's model)"
    if served and not any(names_the_model(m, local, model.snapshot.commit) for m in served):
        raise ServerArmError(
            f"server {url} serves {', '.join(served)}, not the {arm} {', '.join(sorted(local))}: its answers "
            f"would be another model's. Serve the same snapshot (mlx_lm.server --model {model.snapshot.path}), "
            f"or pass that model as {flag}"
        )
    info = client.protocol_info()
    if info is not None and str(info["model"]) not in local:
        raise ServerArmError(
            f"server {url} answers the mlxgate protocol for {info['model']}, not the {arm} "
            f"{', '.join(sorted(local))}: serve the same snapshot, or pass that model as {flag}"
        )
    if info is not None and info["vocab_size"] != vocab_size:
        raise ServerArmError(
            f"server {url} has a vocabulary of {info['vocab_size']}, the {arm} {vocab_size}: another model or tokenizer"
        )
    return served, info


def names_the_model(served: str, local: set[str], commit: str | None) -> bool:
    """Whether a model id a server lists is the local model: one of its names or paths, or a hub snapshot
    folder of the same commit wherever its cache is (`.../snapshots/<commit>`: the same files, pinned)."""
    if served in local:
        return True
    return is_commit(commit) and served.rstrip("/").endswith(f"/snapshots/{commit}")


def logits_width(model: LoadedModel) -> int:
    """How many log-probabilities a position of `model` has (its output rows, which may exceed the
    tokenizer's vocabulary): what a served reference's rows must span to score an in-process candidate."""
    return int(model.model(mx.array([[0]])).shape[-1])


def _codec(model: LoadedModel) -> dict[str, Any]:
    tokenizer = model.tokenizer
    return {
        "encode": tokenizer.encode,
        "decode": lambda ids: str(tokenizer.decode(list(ids))),  # special tokens kept: they encode back
        "text_decode": lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
    }


def _tick(arm_watch: ArmWatch | None, shape: RunShape) -> Any:
    return (lambda _: arm_watch.advance(shape.tokens)) if arm_watch is not None else None  # one sequence done


def served_reference_arm(
    server: ServedArm,
    reference: LoadedModel,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    vocab_size: int,
    arm_watch: ArmWatch | None,
) -> tuple[ServedReference, list[str] | None]:
    """The reference arm asked of `server` (its model checked first): each sequence's rows at the gate's
    scored positions, and the models it lists."""
    client = ServerClient(server.endpoint)
    try:
        served, info = _checked(client, "reference", reference, vocab_size)
        found = ask_reference(
            client,
            [s.ids for s in sequences],
            scored_positions(shape.tokens, shape.path, shape.decode),
            top_k=server.top_k,
            vocab_size=vocab_size,
            protocol=info is not None,
            tick=_tick(arm_watch, shape),
            **_codec(reference),
        )
        return found, served
    finally:
        client.close()


def served_candidate(
    server: ServedArm,
    candidate: LoadedModel,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    refs: Sequence[RefDistributions],
    arm_watch: ArmWatch | None,
) -> ServerScores:
    """The candidate arm asked of `server`: the model it says it serves checked first, then every sequence's
    scored positions teacher-forced, scored against the reference rows."""
    client = ServerClient(server.endpoint)
    positions = scored_positions(shape.tokens, shape.path, shape.decode)
    try:
        served, info = _checked(client, "candidate", candidate, refs[0].vocab_size)
        if info is not None:
            scored = run_protocol_against(
                client,
                [s.ids for s in sequences],
                refs,
                positions,
                vocab_size=int(info["vocab_size"]),
                tick=_tick(arm_watch, shape),
            )
        else:
            scored = run_server_against(
                client,
                [s.ids for s in sequences],
                refs,
                positions,
                top_k=server.top_k,
                tick=_tick(arm_watch, shape),
                **_codec(candidate),
            )
        return dataclasses.replace(scored, served=tuple(served) if served is not None else None)
    finally:
        client.close()


def asked_only(scores: Sequence[TokenScores], reference: ServedReference, shape: RunShape) -> list[TokenScores]:
    """Each sequence's scores at the positions the served reference could be asked about (its rows elsewhere
    are placeholders): the candidate's scores there are dropped, never read."""
    positions = scored_positions(shape.tokens, shape.path, shape.decode)
    return [
        kept_scores(s, np.isin(s.positions, positions[asked])) for s, asked in zip(scores, reference.asked, strict=True)
    ]


def served_facts(
    scores: Sequence[TokenScores],
    *,
    candidate: tuple[ServedArm, ServerScores] | None,
    reference: tuple[ServedArm, ServedReference, list[str] | None] | None,
) -> dict[str, Any]:
    """The record's `server` part (`results.record_server`): which arms were served where, and what the KL
    rests on (k, the mass each side left outside the rows, positions not asked)."""
    facts: dict[str, Any] = {
        "url": None,
        "ref_url": None,
        "top_k": None,
        "k": None,
        "bound": "exact",
        "asked": sum(len(s) for s in scores),
        "unaskable": 0,
        "next_unlisted": 0,
        "chosen_disagreed": 0,
        "ref_tail": None,
        "cand_tail": None,
        "served": None,
        "ref_served": None,
        "max_kl": max((float(s.kl.max()) for s in scores if len(s)), default=0.0),
    }
    ks = []
    if candidate is not None:
        arm, got = candidate
        ref_tail, cand_tail = got.mean_tails()
        facts.update(
            url=arm.endpoint.url,
            top_k=arm.top_k,
            unaskable=got.unaskable,
            next_unlisted=got.next_unlisted,
            chosen_disagreed=got.chosen_disagreed,
            ref_tail=round(ref_tail, 6),
            cand_tail=round(cand_tail, 6),
            served=list(got.served) if got.served is not None else None,
        )
        facts["asked"] += got.unaskable
        if not got.exact:
            facts["bound"] = "lower"
            ks.append(got.k)
    if reference is not None:
        arm, ref, listed = reference
        facts.update(ref_url=arm.endpoint.url, ref_served=listed)
        facts["top_k"] = facts["top_k"] or arm.top_k
        if candidate is None:
            facts["unaskable"] = ref.unaskable
            facts["asked"] += ref.unaskable
            facts["next_unlisted"] = int(sum(int(np.isnan(s.ref_next_logprob).sum()) for s in scores))
        facts["chosen_disagreed"] += ref.chosen_disagreed
        if not ref.exact:
            facts["bound"] = "lower"
            facts["ref_tail"] = round(ref.mean_tail(), 6) if candidate is None else facts["ref_tail"]
            ks.append(ref.k)
    facts["k"] = min(ks) if ks else None
    return facts
