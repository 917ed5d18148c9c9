"""Both arms of a lever over identical token ids, turned into one `KLResult`.

The reference arm comes from the reference cache when its key matches (everything its
distributions depend on); under --mlx-aa the reference runs against itself instead of the
candidate, once as is and once with another prefill chunk size, and the worse is the noise floor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..common.refstore import store_or_warn
from ..errors import ServerArmError, VocabularyMismatchError
from ..levers.naming import source_digest
from ..models.identity import model_identity
from ..serving.kv_plan import require_kv_difference
from ..stats import divergence
from ..stats.kl_profile import kl_profile
from ..stats.kl_stats import KLStats, summarize
from .arms import run_candidate, run_candidate_against, run_reference_against
from .oracle import OracleArm, OracleDistances
from .prompts import texts_of
from .refcache import CACHE_FORMAT, ReferenceCache
from .result import KLResult, aa_floors
from .served import asked_only, logits_width, served_candidate, served_facts, served_reference_arm
from .shape import ArmCounters, RunShape

if TYPE_CHECKING:
    from ..common.watch import ArmWatch, Watcher
    from ..levers.lever import Lever
    from ..models.loaded import LoadedModel
    from ..remote.arm import ServedArm
    from ..stats.divergence import RefDistributions, TokenScores
    from .prompts import TokenSequence

__all__ = ["aa_chunk", "check_same_vocabulary", "chunked_floor", "computed_reference", "measure_kl", "reference_key"]


def measure_kl(
    *,
    lever: Lever,
    shape: RunShape,
    sequences: Sequence[TokenSequence],
    sequences_digest: str,
    reference: LoadedModel,
    candidate: LoadedModel,
    two_models: bool,
    machine: Mapping[str, str],
    cache: ReferenceCache | None,
    refresh_reference: bool,
    aa: bool,
    counters: ArmCounters,
    say: Callable[[str], None],
    watch: Watcher | None = None,
    oracle: LoadedModel | None = None,
    server: ServedArm | None = None,
    ref_server: ServedArm | None = None,
) -> KLResult:
    """Run (or load) the reference arm, then the candidate arm (or the A/A runs), and summarize.
    `watch`: each arm's progress lines and time limit (none: silent, unlimited). `oracle`: the reference
    model computing in float32 (`kl.oracle`); both arms' distances from it come with the result. `server`:
    the candidate arm is that server's, asked teacher-forced (`remote.arm`); its KL a lower bound. `ref_server`:
    the reference arm is that server's, never cached (`kl.served`)."""
    if server is not None or ref_server is not None:
        oracle = None  # the oracle's rules judge a kernel in process: a server's is out of reach
    if aa and ref_server is not None:
        raise ServerArmError("--mlx-aa with --mlx-ref-server: the A/A floor runs the reference in process")
    if lever.kind == "kv" and not aa and server is None and ref_server is None:
        require_kv_difference(
            lever.name,
            lever.kv_plan("reference"),
            lever.kv_plan("candidate"),
            candidate.model,
            shape.tokens,
            where="the serving path",
        )
    started = time.perf_counter()
    source = "cache"
    key = reference_key(model=reference, lever=lever, shape=shape, sequences_digest=sequences_digest, machine=machine)
    judge: OracleArm | None = None
    if oracle is not None and not aa:
        oracle_key = reference_key(
            model=oracle, lever=lever, shape=shape, sequences_digest=sequences_digest, machine=machine
        )
        judge = OracleArm(oracle=oracle, reference=reference, oracle_key=oracle_key, reference_key=key, cache=cache)
        judge.prepare(
            sequences,
            lambda model, label: computed_reference(model, sequences, shape, lever, counters, say, watch, label)[0],
            say,
        )
    refs: list[RefDistributions] | None = None
    served_ref = None
    if ref_server is not None:
        say(f"reference arm: the server at {ref_server.endpoint.url} (top-{ref_server.top_k}, teacher-forced)")
        ref_watch = _arm_watch(watch, f"reference arm (server {ref_server.endpoint.url})", sequences, shape)
        vocab = logits_width(candidate)
        served_ref = served_reference_arm(ref_server, reference, sequences, shape, vocab, ref_watch)
        _finish(ref_watch)
        refs, source = list(served_ref[0].refs), "server"
    if cache is not None and not refresh_reference and refs is None:
        refs = cache.load(key, len(sequences))
    if refs is None:
        with cache.computing(cache.digest(key)) if cache is not None else contextlib.nullcontext():
            if cache is not None and not refresh_reference:  # another worker may have stored it while we waited
                refs = cache.load(key, len(sequences))
            if refs is None:
                against = judge.refs if judge is not None and judge.wants_plain else None
                refs, plain = computed_reference(
                    reference, sequences, shape, lever, counters, say, watch, against=against
                )
                if judge is not None and plain is not None:
                    judge.keep_plain(plain, texts_of(sequences))  # scored in the reference arm's own pass
                if cache is not None:
                    store_or_warn(cache, key, refs)
                source = "computed"
    if judge is not None and judge.wants_plain and judge.refs is not None:
        say(f"plain {reference.dtype} reference arm against the float32 oracle")
        judge.keep_plain(
            run_candidate(reference.model, sequences, shape, lever, judge.refs, counters=counters, arm="reference"),
            texts_of(sequences),
        )
    reference_s = time.perf_counter() - started

    aa_info: dict[str, Any] | None = None
    distances: OracleDistances | None = None
    server_facts: dict[str, Any] | None = None
    if aa:
        scores, aa_info = _aa(
            reference, refs, lever=lever, shape=shape, sequences=sequences, counters=counters, say=say, watch=watch
        )
    elif server is not None:
        say(f"candidate arm: the server at {server.endpoint.url} (top-{server.top_k}, teacher-forced)")
        arm_watch = _arm_watch(watch, f"candidate arm (server {server.endpoint.url})", sequences, shape)
        served = served_candidate(server, candidate, sequences, shape, refs, arm_watch)
        _finish(arm_watch)
        scores = [s.scores for s in served.sequences]
        if served_ref is not None:
            scores = asked_only(scores, served_ref[0], shape)
        server_facts = served_facts(
            scores,
            candidate=(server, served),
            reference=(ref_server, *served_ref) if ref_server is not None and served_ref is not None else None,
        )
    else:
        say(f"candidate arm ({lever.name}={lever.describe_value('candidate')})")
        arm_watch = _arm_watch(
            watch, f"candidate arm ({lever.name}={lever.describe_value('candidate')})", sequences, shape
        )
        sets = [refs] if judge is None or judge.refs is None else [refs, judge.refs]
        scored = run_candidate_against(
            candidate.model, sequences, shape, lever, sets, counters=counters, watch=arm_watch
        )
        scores = scored[0]
        _finish(arm_watch)
        if judge is not None:
            distances = judge.distances(texts_of(sequences), scored[-1])
        if ref_server is not None and served_ref is not None:
            scores = asked_only(scores, served_ref[0], shape)
            server_facts = served_facts(scores, candidate=None, reference=(ref_server, *served_ref))
    stats = summarize(scores, texts=texts_of(sequences))
    profile = {**kl_profile(scores), "worst_context": _worst_contexts(candidate.tokenizer, sequences, stats)}
    total_s = time.perf_counter() - started
    return KLResult(
        stats=stats,
        lever=lever,
        shape=shape,
        candidate=candidate.describe(),
        reference_model=reference.describe() if two_models else None,
        reference_source=source,
        durations={
            "reference_s": round(reference_s, 3),
            "candidate_s": round(total_s - reference_s, 3),
            "total_s": round(total_s, 3),
        },
        counters=counters,
        previews=[s.preview for s in sequences],
        token_text=_token_text(candidate.tokenizer, stats),
        scores=scores,
        aa=aa_info,
        profile=profile,
        oracle=distances,
        server=server_facts,
    )


def chunked_floor(
    *,
    reference: LoadedModel,
    lever: Lever,
    shape: RunShape,
    sequences: Sequence[TokenSequence],
    sequences_digest: str,
    machine: Mapping[str, str],
    cache: ReferenceCache | None,
    counters: ArmCounters,
    say: Callable[[str], None],
    watch: Watcher | None = None,
) -> tuple[int, dict[str, float]]:
    """(chunk, floors): the reference against itself with another prefill chunk, one arm beside the
    reference distributions the gate's own run left in the cache (computed again when there are none).
    What a limits proof needs of the A/A floor; `--mlx-aa` runs the repeat arm too."""
    key = reference_key(model=reference, lever=lever, shape=shape, sequences_digest=sequences_digest, machine=machine)
    refs = cache.load(key, len(sequences)) if cache is not None else None
    if refs is None:
        refs = computed_reference(reference, sequences, shape, lever, counters, say, watch)[0]
    chunk, scores = _ReferenceAgain(reference, refs, lever, shape, sequences, counters, say, watch).chunked()
    return chunk, aa_floors([summarize(scores, texts=texts_of(sequences))])


def computed_reference(
    reference: LoadedModel,
    sequences: Sequence[TokenSequence],
    shape: RunShape,
    lever: Lever,
    counters: ArmCounters,
    say: Callable[[str], None],
    watch: Watcher | None,
    label: str = "reference arm",
    *,
    against: Sequence[RefDistributions] | None = None,
) -> tuple[list[RefDistributions], list[TokenScores] | None]:
    """The reference arm's distributions, and (`against`) its scores against other distributions in the same
    pass: the float32 oracle's, for the plain path's distance from it."""
    label = f"{label} ({lever.name}={lever.describe_value('reference')})"
    say(f"{label}, {len(sequences)} sequences")
    arm_watch = _arm_watch(watch, label, sequences, shape)
    refs, scores = run_reference_against(
        reference.model, sequences, shape, lever, against, counters=counters, watch=arm_watch
    )
    _finish(arm_watch)
    return refs, scores


def _aa(
    reference: LoadedModel,
    refs: list[RefDistributions],
    *,
    lever: Lever,
    shape: RunShape,
    sequences: Sequence[TokenSequence],
    counters: ArmCounters,
    say: Callable[[str], None],
    watch: Watcher | None = None,
) -> tuple[list[TokenScores], dict[str, Any]]:
    """Reference vs itself, and vs itself with another prefill chunk size: the noise floor."""
    again = _ReferenceAgain(reference, refs, lever, shape, sequences, counters, say, watch)
    repeat = again.repeat()
    chunk, chunked = again.chunked()
    repeat_stats, chunked_stats = (summarize(s, texts=texts_of(sequences)) for s in (repeat, chunked))
    floors = aa_floors([repeat_stats, chunked_stats])
    return chunked, {
        "chunk": chunk,
        "repeat": repeat_stats.to_json(),
        "chunked": chunked_stats.to_json(),
        "floors": floors,
    }


@dataclasses.dataclass(frozen=True)
class _ReferenceAgain:
    """The A/A arms: the reference arm run again and scored against its own distributions (`refs`), as
    it is (`repeat`) and with another prefill chunk (`chunked`, `aa_chunk`), which moves where the sums
    round. Their KL is the noise floor a gate's limits must clear."""

    reference: LoadedModel
    refs: list[RefDistributions]
    lever: Lever
    shape: RunShape
    sequences: Sequence[TokenSequence]
    counters: ArmCounters
    say: Callable[[str], None]
    watch: Watcher | None

    def repeat(self) -> list[TokenScores]:
        return self._arm("A/A reference arm again", None)

    def chunked(self) -> tuple[int, list[TokenScores]]:
        """(chunk, the per-token scores with the reference's prefill split into chunks of that many)."""
        chunk = aa_chunk(self.shape)
        return chunk, self._arm(
            f"A/A reference arm with prefill chunk {chunk}", dataclasses.replace(self.shape, chunk=chunk)
        )

    def _arm(self, label: str, override_shape: RunShape | None) -> list[TokenScores]:
        self.say(label.replace("A/A ", "A/A: ", 1))
        arm_watch = _arm_watch(self.watch, label, self.sequences, self.shape)
        scores = run_candidate(
            self.reference.model,
            self.sequences,
            self.shape,
            self.lever,
            self.refs,
            counters=self.counters,
            arm="reference",
            override_shape=override_shape,
            watch=arm_watch,
        )
        _finish(arm_watch)
        return scores


def _arm_watch(
    watch: Watcher | None, label: str, sequences: Sequence[TokenSequence], shape: RunShape
) -> ArmWatch | None:
    """One KL arm's watch, counting the positions its forwards process (every id but the last)."""
    return watch.arm(f"KL {label}", len(sequences) * shape.tokens, unit="positions") if watch is not None else None


def _finish(arm_watch: ArmWatch | None) -> None:
    if arm_watch is not None:
        arm_watch.finish()


def aa_chunk(shape: RunShape) -> int:
    """The other prefill chunk size the A/A calibration uses: a third of what is prefilled at once."""
    prefilled = shape.tokens - shape.decode if shape.path == "serving" else shape.tokens
    current = shape.chunk or prefilled
    return max(1, min(current, prefilled) // 3)


def reference_key(
    *,
    model: LoadedModel,
    lever: Lever,
    shape: RunShape,
    sequences_digest: str,
    machine: Mapping[str, str],
) -> dict[str, Any]:
    """Everything the reference arm's distributions depend on (see `refcache`). The lever's part names only
    what its reference arm switches (`Lever.key`): gates whose reference runs the model as loaded share one.
    The model's own code (its mlx_lm architecture module) is keyed by its source: an edited checkout of
    mlx_lm under the same version is a miss, not a stale reference."""
    return {
        "format": CACHE_FORMAT,
        **model_identity(model),
        "model_code": source_digest(type(model.model)),
        "machine": dict(machine),
        "sequences": sequences_digest,
        "shape": shape.to_json(),
        "lever": lever.key("reference"),
        "compaction": {
            "tau": divergence.INITIAL_TAU,
            "min_keep": divergence.MIN_KEEP,
            "max_keep": divergence.MAX_KEEP,
            "tail_mass_target": divergence.TAIL_MASS_TARGET,
        },
    }


def check_same_vocabulary(reference: LoadedModel, candidate: LoadedModel) -> None:
    """Two-model KL is only meaningful over one vocabulary with the same ids."""
    ref_vocab, cand_vocab = _vocab(reference.tokenizer), _vocab(candidate.tokenizer)
    if ref_vocab != cand_vocab:
        only_ref = len(set(ref_vocab.items()) - set(cand_vocab.items()))
        only_cand = len(set(cand_vocab.items()) - set(ref_vocab.items()))
        raise VocabularyMismatchError(
            f"the reference {reference.snapshot.pinned} and the candidate {candidate.snapshot.pinned} use "
            f"different tokenizers ({len(ref_vocab)} vs {len(cand_vocab)} tokens; {only_ref} (token, id) pairs "
            f"only in the reference, {only_cand} only in the candidate): per-token KL between them would "
            "compare unrelated distributions. Use a reference from the same model family (same tokenizer)."
        )


def _vocab(tokenizer: Any) -> dict[str, int]:
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    get_vocab = getattr(inner, "get_vocab", None)
    return dict(get_vocab()) if get_vocab else {}


def _token_text(tokenizer: Any, stats: KLStats) -> dict[int, str]:
    j = stats.to_json()
    ids = {int(j["max_at"]["token_id"])} if j.get("max_at") else set()
    for w in j.get("worst", []):
        ids.update(int(w[k]) for k in ("token_id", "ref_top1", "cand_top1"))
    out = {}
    for i in sorted(ids):
        try:
            out[i] = tokenizer.decode([i])
        except Exception:  # a tokenizer that cannot decode one id still gets a report
            out[i] = f"<{i}>"
    return out


#: The worst tokens' context in the record: this many tokens before the one scored, and after it...
_CONTEXT_BEFORE, _CONTEXT_AFTER = 16, 4
#: ...each side clipped to this many characters (the far end cut: the text next to the token stays).
_CONTEXT_CHARS = 200


def _worst_contexts(tokenizer: Any, sequences: Sequence[TokenSequence], stats: KLStats) -> list[dict[str, Any]]:
    """Each of the worst tokens in its text: the tokens before it, the text's token there, a few after.

    The distribution at position p predicts id p + 1 of the sequence, so "token" is ids[p + 1]."""
    out = []
    for w in stats.worst:
        if not 0 <= w.prompt < len(sequences):
            continue
        ids = sequences[w.prompt].ids
        at = w.position + 1
        before = _decode(tokenizer, ids[max(0, at - _CONTEXT_BEFORE) : at])
        after = _decode(tokenizer, ids[at + 1 : at + 1 + _CONTEXT_AFTER])
        out.append(
            {
                "prompt": w.prompt,
                "position": w.position,
                "before": before[-_CONTEXT_CHARS:],
                "token": _decode(tokenizer, ids[at : at + 1]),
                "after": after[:_CONTEXT_CHARS],
            }
        )
    return out


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    try:
        return str(tokenizer.decode(list(ids)))
    except Exception:  # a tokenizer that cannot decode still gets a report
        return " ".join(f"<{i}>" for i in ids)
