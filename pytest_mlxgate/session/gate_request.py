"""What a gate module asks for, read from its marks, the ini file and the command line: its lever, its KL
sizes and prompt count, its speed contexts; and the check that the model serves those sizes.

Precedence, lowest first: built-in defaults, the ini file, the module's `mlx_kl` marker, the
command line. The lever comes from the module's `mlx_lever` marker; `--mlx-lever` overrides it. The
served arms from its `mlx_server` marker; `--mlx-ref-server`/`--mlx-cand-server` override them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pytest

from ..config.settings import DEFAULT_KL_DECODE, DEFAULT_KL_PROMPTS, DEFAULT_KL_TOKENS, GateSettings
from ..errors import ContextLengthError, LeverError, MlxgateUsageError

if TYPE_CHECKING:
    from ..kl.shape import RunShape
    from ..levers.lever import Lever
    from ..models.loaded import LoadedModel
    from ..remote.arm import ServedArm
    from ..speed.shape import SpeedShape

__all__ = ["check_context", "check_lever_override", "gate_lever", "gate_shape", "gate_speed_shape", "served_arms"]


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


_SERVER_KWARGS = frozenset({"ref", "cand", "key_env", "ref_key_env", "top_k"})


def served_arms(item: pytest.Item, gate: GateSettings) -> tuple[ServedArm | None, ServedArm | None]:
    """(reference, candidate): each arm's server, from --mlx-ref-server/--mlx-cand-server, else the module's
    `mlx_server(ref=, cand=)` marker (None: that arm runs in process). LeverError names the marker and the fix."""
    from ..common.server_endpoint import Endpoint
    from ..config.option_values import top_k_arg
    from ..remote.arm import ServedArm

    mark = item.get_closest_marker("mlx_server")
    kwargs = dict(mark.kwargs) if mark is not None else {}
    where = f"{item.nodeid.split('::')[0]}'s mlx_server marker"
    if mark is not None and (mark.args or set(kwargs) - _SERVER_KWARGS or not kwargs.keys() & {"ref", "cand"}):
        raise LeverError(
            f"{where}: takes ref=, cand= (a server's URL, or None: in process), key_env=, ref_key_env= and "
            f"top_k=, keywords only; got {mark.args or ''}{sorted(kwargs)}. E.g. "
            "pytest.mark.mlx_server(cand='http://127.0.0.1:8081')"
        )
    try:
        top_k = gate.server_top_k if "top_k" not in kwargs else top_k_arg(str(kwargs["top_k"]))
    except (argparse.ArgumentTypeError, TypeError, ValueError) as e:  # argparse's words for a bad K
        raise LeverError(f"{where}: top_k={kwargs['top_k']!r}: {e}") from None

    def arm(flag: str | None, key: str | None, value: object, key_env: object) -> ServedArm | None:
        if flag:
            return ServedArm(Endpoint.parse(flag, key_env=key), gate.server_top_k)
        if value is None:
            return None
        if not isinstance(value, str) or (key_env is not None and not isinstance(key_env, str)):
            raise LeverError(f"{where}: a server is its URL as a string (and its key's variable name), got {value!r}")
        try:
            return ServedArm(Endpoint.parse(value, key_env=key_env), top_k)
        except MlxgateUsageError as e:
            raise LeverError(f"{where}: {e}") from None

    return (
        arm(gate.ref_server, gate.ref_server_key_env, kwargs.get("ref"), kwargs.get("ref_key_env")),
        arm(gate.cand_server, gate.server_key_env, kwargs.get("cand"), kwargs.get("key_env")),
    )
