"""From a gate test item to its `PairedRun`: which lever, what sizes, which prompts, which models.

Precedence, lowest first: built-in defaults, the ini file, the module's `mlx_kl` marker, the
command line. The lever comes from the module's `mlx_lever` marker; `--mlx-lever` overrides it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config.settings import DEFAULT_KL_DECODE, DEFAULT_KL_PROMPTS, DEFAULT_KL_TOKENS, GateSettings
from ..errors import ContextLengthError, LeverError

if TYPE_CHECKING:
    from ..config.names import Role
    from ..kl.shape import RunShape
    from ..levers.lever import Lever
    from ..models.loaded import LoadedModel
    from ..speed.shape import SpeedShape
    from .paired import PairedRun

__all__ = [
    "RunContext",
    "build_paired_run",
    "check_context",
    "check_lever_override",
    "gate_lever",
    "gate_shape",
    "gate_speed_shape",
    "with_snapshot_plan",
]


def gate_lever(item: pytest.Item, gate: GateSettings) -> Lever:
    from ..levers.parsing import lever_from_marker, lever_from_options, override_applies

    mark = item.get_closest_marker("mlx_lever")
    declared = lever_from_marker(mark, base_dir=item.path.parent) if mark is not None else None
    if gate.lever is not None and override_applies(gate.lever, declared.name if declared else None):
        return lever_from_options(gate.lever, gate.ref_value, gate.cand_value, declared, base_dir=gate.invocation_dir)
    if declared is None:
        raise LeverError(
            f"{item.nodeid} uses `paired` but declares no lever: add "
            "`pytestmark = pytest.mark.mlx_lever(...)` to its module (see pytest --markers), "
            "or pass --mlx-lever NAME --mlx-ref-value V --mlx-cand-value V"
        )
    return declared


def check_lever_override(gate: GateSettings | None, items: list[pytest.Item]) -> None:
    """A bare `--mlx-lever NAME` that no collected gate module declares is a usage error: it would
    override nothing (and, before, turned every module's lever into an environment variable)."""
    if gate is None or gate.lever is None:
        return
    from ..errors import MlxgateUsageError
    from ..levers.parsing import check_override_targets

    declared: dict[str, str | None] = {}
    for item in items:
        if "paired" not in getattr(item, "fixturenames", ()):
            continue
        mark = item.get_closest_marker("mlx_lever")
        name = mark.args[0] if mark is not None and mark.args and isinstance(mark.args[0], str) else None
        declared[item.nodeid.split("::")[0]] = name
    try:
        check_override_targets(gate.lever, declared)
    except MlxgateUsageError as e:
        raise pytest.UsageError(str(e)) from None


def gate_shape(item: pytest.Item, gate: GateSettings, lever: Lever) -> tuple[RunShape, int]:
    """(shape, number of prompts) for the item."""
    from ..kl.shape import RunShape

    mark = item.get_closest_marker("mlx_kl")
    marked: dict[str, Any] = dict(mark.kwargs) if mark is not None else {}
    unknown = set(marked) - {"prompts", "tokens", "decode", "chunk", "batched"}
    if unknown or (mark is not None and mark.args):
        raise LeverError(
            f"mlx_kl marker on {item.nodeid}: takes only prompts=, tokens=, decode=, chunk=, batched= "
            f"(got {sorted(unknown) or list(mark.args if mark else [])})"
        )

    def pick(cli: int | None, name: str, ini: int | None, default: int) -> int:
        value = cli if cli is not None else marked.get(name, ini if ini is not None else default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LeverError(f"mlx_kl({name}={value!r}) on {item.nodeid}: must be a positive whole number")
        return value

    prompts = pick(gate.kl_prompts, "prompts", gate.kl_prompts_ini, DEFAULT_KL_PROMPTS)
    tokens = pick(gate.kl_tokens, "tokens", gate.kl_tokens_ini, DEFAULT_KL_TOKENS)
    decode = pick(gate.kl_decode, "decode", gate.kl_decode_ini, min(DEFAULT_KL_DECODE, max(1, tokens // 2)))
    chunk = marked.get("chunk")
    batched = marked.get("batched", True)
    if not isinstance(batched, bool):
        raise LeverError(f"mlx_kl(batched={batched!r}) on {item.nodeid}: True (the default) or False")
    return RunShape(path=lever.path, tokens=tokens, decode=decode, chunk=chunk, batched=batched), prompts


def gate_speed_shape(
    item: pytest.Item, gate: GateSettings, device: str, window: int | None = None
) -> SpeedShape | None:
    """How the module's speed is measured, or None when nothing asks for it: `--mlx-speed on|off`
    over the module's `mlx_speed` marker; sizes: the options (command line, ini), then marker, then defaults.
    For a model with a sliding window of `window` positions, the default contexts gain one past it
    (`past_the_window`); contexts a module or the options give are taken as they are (a weights gate
    keeps its prefill short: quantized matmuls prefill ~17 tokens/s on this CPU). The goals the
    module's assertions declare (read from its source) tell the trials when a context is decided."""
    from ..common.gate_calls import declared_limits
    from ..speed.shape import (
        DEFAULT_REPETITIONS,
        SAMPLED_GOALS,
        SpeedGoal,
        SpeedShape,
        default_contexts,
        default_decode,
        past_the_window,
    )

    mark = item.get_closest_marker("mlx_speed")
    if gate.speed == "off" or (gate.speed is None and mark is None):
        return None
    marked: dict[str, Any] = dict(mark.kwargs) if mark is not None else {}
    unknown = set(marked) - {"contexts", "decode", "repetitions"}
    if unknown or (mark is not None and mark.args):
        raise LeverError(
            f"mlx_speed marker on {item.nodeid}: takes only contexts=, decode=, repetitions= "
            f"(got {sorted(unknown) or list(mark.args if mark else [])})"
        )
    contexts = gate.speed_contexts or marked.get("contexts") or past_the_window(default_contexts(device), window)
    if isinstance(contexts, int):
        contexts = (contexts,)
    decode = gate.speed_decode or marked.get("decode") or default_decode(device)
    reps = gate.speed_reps or marked.get("repetitions") or DEFAULT_REPETITIONS
    declared, _ = declared_limits(item.path, ("assert_faster", "assert_smaller")) if item.path.is_file() else ([], [])
    goals = tuple(
        SpeedGoal(lim.key, lim.value, lim.at)  # type: ignore[arg-type]
        for lim in declared
        if lim.key in SAMPLED_GOALS
    )
    try:
        return SpeedShape(contexts=tuple(contexts), decode=int(decode), repetitions=int(reps), goals=goals)
    except (TypeError, ValueError) as e:
        raise LeverError(f"mlx_speed on {item.nodeid}: {e}") from None


def _weights_arms(ctx: RunContext, lever: Lever, loaded: LoadedModel) -> tuple[LoadedModel, LoadedModel]:
    """(reference, candidate) of a weights lever: the loaded candidate for an arm that keeps its
    weights, a quantized copy (loaded afresh, once per process and quantization) for one that does not."""
    from ..levers.weights import quantized_copy

    arms = []
    for arm in ("reference", "candidate"):
        spec = lever.weights_spec(arm)
        if spec is None:
            arms.append(loaded)
            continue
        key = f"{loaded.snapshot.pinned}|{spec}"
        if key not in _QUANTIZED:
            if ctx.progress is not None:
                ctx.progress(f"quantizing a copy of {loaded.snapshot.pinned}: {spec.describe()} (mlx_lm's converter)")
            _QUANTIZED[key] = quantized_copy(loaded, spec)
        arms.append(_QUANTIZED[key])
    return arms[0], arms[1]


def with_snapshot_plan(lever: Lever, candidate: LoadedModel, progress: Callable[[str], None] | None) -> Lever:
    """`lever` with the candidate snapshot's own KV plan as its candidate value, when it declares one
    (`mlx_lever(..., snapshot_plan="kv_config.json")`) and the snapshot ships that file: the plan the
    serving stack would run with this model. Otherwise the lever as declared."""
    name = lever.snapshot_plan
    if name is None:
        return lever
    shipped = candidate.snapshot.dir / name
    if not shipped.is_file():
        return lever
    from ..serving.kv_plan import parse_kv_value

    try:
        plan = parse_kv_value(shipped)
    except LeverError as e:
        raise LeverError(f"lever {lever.name!r}: the candidate snapshot's own {name}: {e}") from None
    if progress is not None:
        progress(
            f"KV plan: {candidate.snapshot.pinned} ships {name}, so the candidate arm serves it ({plan.describe()}) "
            f"in place of the gate's {lever.describe_value('candidate')}"
        )
    return replace(lever, cand=shipped)


def check_context(model: LoadedModel, nodeid: str, tokens: int, speed: SpeedShape | None) -> None:
    """Refuse sizes past the positions the model serves, before any arm runs: its logits there are
    out of its trained range, so their drift (or speed) says nothing about the lever."""
    from ..models.context import context_limit

    found = context_limit(model)
    if found is None:
        return
    limit, where = found
    served = f"{model.snapshot.pinned} serves at most {limit} positions ({where})"
    if tokens > limit:
        raise ContextLengthError(
            f"{nodeid}: the KL gate asks for {tokens} tokens per sequence, but {served}; positions past that "
            f"are outside what the model was trained on, so no arm was run. Fix: --mlx-kl-tokens {limit} "
            f"or less (or mlx_kl(tokens=...) in the module)"
        )
    if speed is not None and max(speed.contexts) + speed.decode > limit:
        longest = max(speed.contexts)
        raise ContextLengthError(
            f"{nodeid}: speed is timed at a {longest}-token context plus {speed.decode} decoded tokens "
            f"({longest + speed.decode} positions), but {served}; no arm was run. Fix: --mlx-speed-contexts with "
            f"lengths of at most {limit - speed.decode} (or fewer --mlx-speed-decode tokens)"
        )


#: Quantized copies of the loaded model, per process: gate modules with the same quantization share one.
_QUANTIZED: dict[str, LoadedModel] = {}


@dataclass(frozen=True)
class RunContext:
    """What building a gate module's run needs from the session, and nothing more."""

    gate: GateSettings
    load_model: Callable[[Role], LoadedModel | None]  # None: no model configured for that role
    cache_dir: Path | None  # the reference cache's folder; None without pytest's cache provider
    machine: Mapping[str, str]  # device, BLAS and library versions: the reference depends on them
    progress: Callable[[str], None] | None  # a line for the controller's terminal (from a worker: relayed)
    live: bool = False  # the terminal is a tty: interim progress lines, not only a closing line per task
    distributed: bool = False  # one rank of an mlx.launch job: capability items split over the ranks
    run_dir: Path | None = None  # under xdist: the run's folder (its lock keeps speed trials alone)


def build_paired_run(ctx: RunContext, item: pytest.Item, runs: dict[str, PairedRun]) -> PairedRun:
    """The module's run, made once: gates of one module share their arms' results."""
    from ..common.watch import Watcher, progress_interval
    from ..kl.prompts import build_sequences, load_prompts_file, prompts_for, sequences_digest
    from ..kl.refcache import ReferenceCache
    from ..serving.caches import sliding_window
    from ..speed.load import wait_for_siblings
    from .paired import PairedRun
    from .phases import PhaseClock

    gate = ctx.gate
    lever = gate_lever(item, gate)
    shape, n_prompts = gate_shape(item, gate, lever)
    module = item.nodeid.split("::")[0]
    key = f"{module}|{lever.key('reference')}|{lever.key('candidate')}|{shape}|{n_prompts}"
    if key in runs:
        return runs[key]

    loading = PhaseClock()
    with loading.timing("load"):  # loaded once per process: a later module's share is ~0
        candidate = ctx.load_model("candidate")
        assert candidate is not None  # the candidate always has a default
        reference = None
        if lever.kind == "model":
            reference = ctx.load_model("reference")
            if reference is None:
                raise LeverError("the model lever compares two models: pass --mlx-reference NAME")
        elif lever.kind == "weights":
            reference, candidate = _weights_arms(ctx, lever, candidate)
    lever = with_snapshot_plan(lever, candidate, ctx.progress)

    speed_shape = gate_speed_shape(item, gate, ctx.machine.get("device", "cpu"), sliding_window(candidate.model))
    for model in {id(m): m for m in (candidate, reference) if m is not None}.values():
        check_context(model, item.nodeid, shape.tokens, speed_shape)
    prompts, fewer = prompts_for(
        candidate.tokenizer, load_prompts_file(gate.prompts_file) if gate.prompts_file else None
    )
    sequences = build_sequences(prompts, candidate.tokenizer, n=n_prompts, tokens=shape.tokens, why_fewer=fewer)
    run = PairedRun(
        lever=lever,
        shape=shape,
        sequences=sequences,
        sequences_digest=sequences_digest(sequences),
        candidate=candidate,
        reference=reference,
        machine=dict(ctx.machine),
        cache=(
            ReferenceCache(ctx.cache_dir, max_bytes=gate.reference_cache_max, report=ctx.progress)
            if ctx.cache_dir is not None
            else None
        ),
        refresh_reference=gate.refresh_reference,
        aa=gate.aa,
        calibrate=gate.calibrate,
        inconclusive=gate.inconclusive,
        explain=gate.explain,
        explain_budget=gate.explain_budget,
        prove=gate.prove,
        require_proof=gate.require_proof,
        allow_untrained=gate.allow_untrained,
        progress=ctx.progress,
        live=ctx.live,
        speed_shape=speed_shape,
        watch=Watcher(
            say=ctx.progress,
            interval=progress_interval(gate.progress_interval, ctx.live),
            limit_s=gate.arm_timeout,
            run_dir=ctx.run_dir,
            settle=wait_for_siblings,
        ),
        capability_options={
            "tier": gate.tier or "smoke",
            "tier_from_cli": gate.tier_from_cli,
            "max_new_tokens": gate.max_new_tokens,
            "allow_unsandboxed": gate.allow_unsandboxed,
            "distributed": ctx.distributed,
        },
        phases=loading,
    )
    runs[key] = run
    return run
