"""Both arms of a gate's lever over identical token ids, run once, turned into one `KLResult`.

A `PairedRun` belongs to one gate module (its lever, sizes and prompts); every test of the module
that asks for `paired` shares it, so a module with a drift test and a capability test loads and
runs the arms once. The reference arm comes from the reference cache when its key matches.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .arms import ArmCounters, RunShape, run_candidate, run_reference
from .errors import VocabularyMismatchError

if TYPE_CHECKING:
    from .kl import RefDistributions, TokenScores
    from .levers import Lever
    from .prompts import TokenSequence
    from .refcache import ReferenceCache
    from .snapshots import ResolvedSnapshot
    from .stats import KLStats

__all__ = ["KLResult", "LoadedModel", "PairedRun", "aa_chunk", "reference_key"]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model with the snapshot it came from."""

    model: Any
    tokenizer: Any
    snapshot: ResolvedSnapshot

    def describe(self) -> dict[str, Any]:
        s = self.snapshot
        return {"name": s.name, "repo_id": s.repo_id, "commit": s.commit, "pinned": s.pinned}


@dataclass
class KLResult:
    """Everything one gate measured: statistics, where they came from, and what to show on failure."""

    stats: KLStats
    lever: Lever
    shape: RunShape
    candidate: dict[str, Any]
    reference_model: dict[str, Any] | None
    reference_source: str  # "computed" | "cache"
    durations: dict[str, float]
    counters: ArmCounters
    previews: list[str]  # per sequence, for failure reports
    token_text: dict[int, str]  # ids named in the report -> their text
    scores: list[TokenScores] = field(repr=False)
    aa: dict[str, Any] | None = None  # --mlx-aa: {"chunk": c, "repeat": stats, "chunked": stats, "floors": {...}}

    @property
    def mode(self) -> str:
        return "aa" if self.aa is not None else "gate"

    def token(self, token_id: int) -> str:
        return self.token_text.get(token_id, f"<{token_id}>")

    def record(
        self,
        *,
        nodeid: str,
        bounds: Mapping[str, float],
        checks: Sequence[Mapping[str, Any]],
        verdict: str,
        rerun: str,
    ) -> dict[str, Any]:
        """The plain-JSON record that rides the test report to the controller (report, DB, summary)."""
        return {
            "nodeid": nodeid,
            "gate": _gate_name(nodeid),
            "mode": self.mode,
            "candidate": self.candidate,
            "reference_model": self.reference_model,
            "lever": self.lever.to_json(),
            "path": self.shape.path,
            "sizes": {"prompts": self.stats.n_prompts, "tokens": self.shape.tokens,
                      "decode": self.shape.decode if self.shape.path == "serving" else None,
                      "chunk": self.shape.chunk},
            "stats": self.stats.to_json(),
            "bounds": dict(bounds),
            "checks": [dict(c) for c in checks],
            "verdict": verdict,
            "reference_source": self.reference_source,
            "durations": dict(self.durations),
            "forwards": {"reference": self.counters.reference_forwards,
                         "candidate": self.counters.candidate_forwards},
            "aa": self.aa,
            "tokens": {str(k): v for k, v in self.token_text.items()},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rerun": rerun,
        }


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
    """Everything the reference arm's distributions depend on (see `refcache`)."""
    from . import kl
    from .refcache import CACHE_FORMAT, model_fingerprint, tokenizer_fingerprint

    snap = model.snapshot
    return {
        "format": CACHE_FORMAT,
        "model": model_fingerprint(snap.dir, snap.commit, snap.repo_id),
        "tokenizer": tokenizer_fingerprint(snap.dir),
        "dtype": _model_dtype(model.model),
        "machine": dict(machine),
        "sequences": sequences_digest,
        "shape": shape.to_json(),
        "lever": lever.key("reference"),
        "compaction": {"tau": kl.INITIAL_TAU, "min_keep": kl.MIN_KEEP, "max_keep": kl.MAX_KEEP,
                       "tail_mass_target": kl.TAIL_MASS_TARGET},
    }


@dataclass
class PairedRun:
    """One gate module's arms; `kl()` runs them on first use and remembers the result."""

    lever: Lever
    shape: RunShape
    sequences: list[TokenSequence]
    sequences_digest: str
    candidate: LoadedModel
    reference: LoadedModel | None  # two-model mode only
    machine: dict[str, str]
    cache: ReferenceCache | None = None
    refresh_reference: bool = False
    aa: bool = False
    progress: Callable[[str], None] | None = None
    capability_options: dict[str, Any] = field(default_factory=dict)  # tier, max_new_tokens, allow_unsandboxed
    counters: ArmCounters = field(default_factory=ArmCounters)
    _capability: dict[tuple[str, str, int | None], Any] = field(default_factory=dict)
    _result: KLResult | None = None
    _error: BaseException | None = None

    def kl(self) -> KLResult:
        if self._error is not None:
            raise self._error
        if self._result is None:
            try:
                self._result = self._run()
            except BaseException as e:
                self._error = e
                raise
        return self._result

    def capability(self, task: str, *, n: int | None = None, tier: str | None = None) -> Any:
        """Both arms of one capability task on the same items (once per module, task, tier and n)."""
        from .capability.runner import run_capability

        opts = self.capability_options
        tier = tier or opts.get("tier", "smoke")
        key = (task, str(tier), n)
        if key not in self._capability:
            ref = self._reference_model()
            self._say(f"capability {task} ({tier}): reference and candidate arms")
            self._capability[key] = run_capability(
                task, tier,  # type: ignore[arg-type]
                n=n,
                reference=(ref.model, ref.tokenizer),
                candidate=(self.candidate.model, self.candidate.tokenizer),
                lever=self.lever,
                max_new_tokens=opts.get("max_new_tokens"),
                allow_unsandboxed=bool(opts.get("allow_unsandboxed")),
            )
        return self._capability[key]

    def _reference_model(self) -> LoadedModel:
        if self.lever.kind != "model":
            return self.candidate
        if self.reference is None:
            raise VocabularyMismatchError(
                "two-model mode needs a reference model: pass --mlx-reference NAME"
            )
        check_same_vocabulary(self.reference, self.candidate)
        return self.reference

    def _run(self) -> KLResult:
        from .stats import summarize

        started = time.perf_counter()
        ref_model = self._reference_model()
        key = reference_key(model=ref_model, lever=self.lever, shape=self.shape,
                            sequences_digest=self.sequences_digest, machine=self.machine)
        refs: list[RefDistributions] | None = None
        if self.cache is not None and not self.refresh_reference:
            refs = self.cache.load(key, len(self.sequences))
        source = "cache" if refs is not None else "computed"
        if refs is None:
            self._say(f"reference arm ({self.lever.name}={self.lever.describe_value('reference')}), "
                      f"{len(self.sequences)} sequences")
            refs = run_reference(ref_model.model, self.sequences, self.shape, self.lever, counters=self.counters)
            if self.cache is not None:
                self.cache.store(key, refs)
        reference_s = time.perf_counter() - started

        aa: dict[str, Any] | None = None
        if self.aa:
            scores, aa = self._aa(ref_model, refs)
        else:
            self._say(f"candidate arm ({self.lever.name}={self.lever.describe_value('candidate')})")
            scores = run_candidate(self.candidate.model, self.sequences, self.shape, self.lever, refs,
                                   counters=self.counters)
        stats = summarize(scores)
        total_s = time.perf_counter() - started
        return KLResult(
            stats=stats,
            lever=self.lever,
            shape=self.shape,
            candidate=self.candidate.describe(),
            reference_model=self.reference.describe() if self.lever.kind == "model" and self.reference else None,
            reference_source=source,
            durations={"reference_s": round(reference_s, 3), "candidate_s": round(total_s - reference_s, 3),
                       "total_s": round(total_s, 3)},
            counters=self.counters,
            previews=[s.preview for s in self.sequences],
            token_text=_token_text(self.candidate.tokenizer, stats),
            scores=scores,
            aa=aa,
        )

    def _aa(self, ref_model: LoadedModel, refs: list[RefDistributions]) -> tuple[list[TokenScores], dict[str, Any]]:
        """Reference vs itself, and vs itself with another prefill chunk size: the noise floor."""
        from .stats import summarize

        chunk = aa_chunk(self.shape)
        self._say("A/A: reference arm again")
        repeat = run_candidate(ref_model.model, self.sequences, self.shape, self.lever, refs,
                               counters=self.counters, arm="reference")
        self._say(f"A/A: reference arm with prefill chunk {chunk}")
        chunked = run_candidate(ref_model.model, self.sequences, self.shape, self.lever, refs,
                                counters=self.counters, arm="reference",
                                override_shape=dataclasses.replace(self.shape, chunk=chunk))
        repeat_stats, chunked_stats = summarize(repeat), summarize(chunked)
        floors = aa_floors([repeat_stats, chunked_stats])
        return chunked, {"chunk": chunk, "repeat": repeat_stats.to_json(), "chunked": chunked_stats.to_json(),
                         "floors": floors}

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


def aa_floors(runs: Sequence[KLStats]) -> dict[str, float]:
    """The worst of the A/A runs, at the confidence bound a gate compares against."""
    floors: dict[str, float] = {}
    for stats in runs:
        j = stats.to_json()
        candidates = {"mean": j["mean_ci"][1], "max": j["max"], "ln_ppl": j["ln_ppl_ratio_ci"][1]}
        for q in ("median", "p90", "p95", "p99", "p999"):
            candidates[q] = j["quantile_ci"][q][1]
        for name, value in candidates.items():
            if value is not None:
                floors[name] = max(floors.get(name, float("-inf")), float(value))
        for name in ("top1", "same_top"):
            lo = j[f"{name}_ci"][0]
            if lo is not None:
                floors[name] = min(floors.get(name, float("inf")), float(lo))
    return floors


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


def _model_dtype(model: Any) -> str:
    from mlx.utils import tree_flatten

    import mlx.core as mx

    leaves: Any = tree_flatten(model.parameters())
    for _, value in leaves:
        if mx.issubdtype(value.dtype, mx.floating):  # quantized weights are uint32; their scales say
            return str(value.dtype).rsplit(".", 1)[-1]
    return "unknown"


def _gate_name(nodeid: str) -> str:
    """`gates/test_kv_cache.py::test_drift` -> `test_kv_cache::test_drift`."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).stem}::{rest}" if rest else Path(path).stem


class Paired:
    """What the `paired` fixture hands a gate: its module's arms, run on first use, and where the
    gate's numbers go (the test's report, from which the controller writes results)."""

    def __init__(self, run: PairedRun, item: Any, rerun: str) -> None:
        self.run = run
        self.item = item
        self.nodeid: str = item.nodeid
        self.rerun = rerun
        self.published = False

    @property
    def lever(self) -> Lever:
        return self.run.lever

    @property
    def shape(self) -> RunShape:
        return self.run.shape

    def kl(self) -> KLResult:
        """Run both arms (once per module) and return the statistics."""
        return self.run.kl()

    def capability(self, task: str, *, n: int | None = None) -> Any:
        """Both arms of a capability task on the same items (`--mlx-tier` picks smoke or full)."""
        tier = None
        mark = self.item.get_closest_marker("mlx_tier")
        if mark is not None and mark.args and not self.run.capability_options.get("tier_from_cli"):
            tier = str(mark.args[0])
        return self.run.capability(task, n=n, tier=tier)

    def publish_capability(self, *, tasks: Mapping[str, Any], checks: Sequence[Mapping[str, Any]], verdict: str,
                           skipped: Mapping[str, str], bounds: Mapping[str, Any]) -> None:
        """A capability gate's record: per-task scores, paired tests, the checks and the verdict."""
        import time as _time

        n_items = sum(int(t["n"]) for t in tasks.values())
        record = {
            "nodeid": self.nodeid,
            "gate": _gate_name(self.nodeid),
            "mode": "capability",
            "candidate": self.run.candidate.describe(),
            "reference_model": self.run.reference.describe() if self.lever.kind == "model" and self.run.reference else None,
            "lever": self.lever.to_json(),
            "path": self.shape.path,
            "sizes": {"prompts": n_items},
            "stats": {"n_prompts": n_items},
            "tasks": dict(tasks),
            "skipped": dict(skipped),
            "bounds": {k: v for k, v in bounds.items() if v is not None},
            "checks": [dict(c) for c in checks],
            "verdict": verdict,
            "durations": {"total_s": round(sum(sum(t["durations"].values()) for t in tasks.values()), 3)},
            "time": _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime()),
            "rerun": self.rerun,
        }
        self.item.user_properties.append(("mlxgate", record))
        self.published = True

    def publish(self, *, bounds: Mapping[str, float], checks: Sequence[Mapping[str, Any]], verdict: str) -> None:
        record = self.kl().record(nodeid=self.nodeid, bounds=bounds, checks=checks, verdict=verdict,
                                  rerun=self.rerun)
        self.item.user_properties.append(("mlxgate", record))
        self.published = True

    def finish(self) -> None:
        """At teardown: a gate that measured but asserted nothing still reports what it measured."""
        if not self.published and self.run._result is not None:
            self.publish(bounds={}, checks=[], verdict="measured")

    def __repr__(self) -> str:
        return f"<paired {self.run.lever.describe()}>"
