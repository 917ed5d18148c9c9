"""From a gate test item to its `PairedRun`: what the module asks for (`gate_request`), its prompts, and
the models each arm runs (a quantized copy for a weights lever, the snapshot's own KV plan)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config.settings import GateSettings
from ..errors import LeverError
from .gate_request import check_context, gate_lever, gate_shape, gate_speed_shape, served_arms

if TYPE_CHECKING:
    from ..config.names import Role
    from ..levers.lever import Lever
    from ..levers.weights import WeightsSpec
    from ..models.loaded import LoadedModel
    from .paired_run import PairedRun

__all__ = [
    "RunContext",
    "build_paired_run",
    "check_plan_modules",
    "with_snapshot_plan",
]


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
            check_plan_modules(spec, loaded.model, f"lever {lever.name!r}, {arm} value")
            if ctx.progress is not None:
                ctx.progress(f"quantizing a copy of {loaded.snapshot.pinned}: {spec.describe()} (mlx_lm's converter)")
            _QUANTIZED[key] = quantized_copy(loaded, spec)
        arms.append(_QUANTIZED[key])
    return arms[0], arms[1]


#: The float32 twins of loaded models, per process: gate modules of one model share one (`oracle_of`).
_ORACLES: dict[int, LoadedModel] = {}


def oracle_of(reference: LoadedModel) -> LoadedModel:
    """The reference model computing in float32: itself where it already does, else an upcast copy, once."""
    from ..models.loaded import LoadedModel
    from ..models.precision import ORACLE_DTYPE, float32_copy

    if reference.dtype == ORACLE_DTYPE:
        return reference
    if id(reference.model) not in _ORACLES:
        _ORACLES[id(reference.model)] = LoadedModel(
            float32_copy(reference.model), reference.tokenizer, reference.snapshot
        )
    return _ORACLES[id(reference.model)]


def asks_for_oracle(module: Path) -> bool:
    """Does the module's source judge a KL gate against the float32 oracle (`assert_kl_below(relative=...)`)?
    Read without importing it, before any arm runs, so the oracle is measured in the same passes."""
    from ..common.gate_calls import declared_limits

    try:
        limits, not_literal = declared_limits(module, {"assert_kl_below"})
    except (OSError, SyntaxError, ValueError):
        return False
    return any(lim.key == "relative" for lim in limits) or any("(relative=" in text for text in not_literal)


def check_plan_modules(spec: WeightsSpec, model: Any, where: str) -> None:
    """Refuse a weights plan whose entries this model cannot take: a path it lacks (a typo, another
    architecture's plan) or a module mlx_lm cannot quantize, or a group that does not divide the module's
    rows. Either would leave that module at the default quantization, and the gate would pass a plan it
    never ran."""
    modules = {str(path): module for path, module in model.named_modules()}
    wrong: list[str] = []
    for path, entry in spec.layers:
        module = modules.get(path)
        if module is None:
            wrong.append(f"{path} (no such module)")
        elif not hasattr(module, "to_quantized") or "weight" not in module:
            wrong.append(f"{path} ({type(module).__name__}: not quantizable)")
        elif entry is not None and module.weight.shape[-1] % entry[1]:
            wrong.append(f"{path} (rows of {module.weight.shape[-1]}: groups of {entry[1]} do not divide them)")
    if wrong:
        shown = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise LeverError(
            f"{where}: the weights plan{f' {spec.source}' if spec.source else ''} names {len(wrong)} "
            f"module(s) this model cannot take as planned: {shown}. A plan is made for one model "
            "(`mlxgate plan weights --gate ...` on this --mlx-candidate writes one); module paths are the "
            "config.json `quantization` block's keys, e.g. model.layers.0.mlp.down_proj"
        )


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
    from .paired_run import PairedRun
    from .phases import PhaseClock

    gate = ctx.gate
    lever = gate_lever(item, gate)
    served = served_arms(item, gate)
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
    oracle = oracle_of(reference or candidate) if asks_for_oracle(Path(str(item.path))) else None

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
        oracle=oracle,
        server=served[1],
        ref_server=served[0],
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
