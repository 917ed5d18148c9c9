"""From a gate test item to its `PairedRun`: which lever, what sizes, which prompts, which models.

Precedence, lowest first: built-in defaults, the ini file, the module's `mlx_kl` marker, the
command line. The lever comes from the module's `mlx_lever` marker; `--mlx-lever` overrides it.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

import pytest

from .errors import LeverError
from .settings import DEFAULT_KL_DECODE, DEFAULT_KL_PROMPTS, DEFAULT_KL_TOKENS, GateSettings

if TYPE_CHECKING:
    from .arms import RunShape
    from .levers import Lever
    from .paired import PairedRun
    from .session import MlxgateSession

__all__ = ["build_paired_run", "gate_lever", "gate_shape", "rerun_command"]

#: Options whose value is a separate argument (for rebuilding a re-run command line).
_VALUED = {
    "--mlx-candidate", "--mlx-reference", "--mlx-cache-dir", "--mlx-endpoint", "--mlx-lever",
    "--mlx-ref-value", "--mlx-cand-value", "--mlx-prompts-file", "--mlx-kl-prompts", "--mlx-kl-tokens",
    "--mlx-kl-decode", "--mlx-tier", "--mlx-max-new-tokens",
}
_FLAGS = {"--mlx-offline", "--mlx-aa", "--mlx-refresh-reference", "--mlx-allow-unsandboxed"}


def gate_lever(item: pytest.Item, gate: GateSettings) -> Lever:
    from .levers import lever_from_marker, lever_from_options

    mark = item.get_closest_marker("mlx_lever")
    declared = lever_from_marker(mark, base_dir=item.path.parent) if mark is not None else None
    if gate.lever is not None:
        return lever_from_options(gate.lever, gate.ref_value, gate.cand_value, declared,
                                  base_dir=gate.invocation_dir)
    if declared is None:
        raise LeverError(
            f"{item.nodeid} uses `paired` but declares no lever: add "
            "`pytestmark = pytest.mark.mlx_lever(...)` to its module (see pytest --markers), "
            "or pass --mlx-lever NAME --mlx-ref-value V --mlx-cand-value V"
        )
    return declared


def gate_shape(item: pytest.Item, gate: GateSettings, lever: Lever) -> tuple[RunShape, int]:
    """(shape, number of prompts) for the item."""
    from .arms import RunShape

    mark = item.get_closest_marker("mlx_kl")
    marked: dict[str, Any] = dict(mark.kwargs) if mark is not None else {}
    unknown = set(marked) - {"prompts", "tokens", "decode", "chunk"}
    if unknown or (mark is not None and mark.args):
        raise LeverError(
            f"mlx_kl marker on {item.nodeid}: takes only prompts=, tokens=, decode=, chunk= "
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
    return RunShape(path=lever.path, tokens=tokens, decode=decode, chunk=chunk), prompts


def build_paired_run(state: MlxgateSession, item: pytest.Item, runs: dict[str, PairedRun]) -> PairedRun:
    """The module's run, made once: gates of one module share their arms' results."""
    from .paired import LoadedModel, PairedRun
    from .prompts import build_sequences, default_prompts, load_prompts_file, sequences_digest
    from .refcache import ReferenceCache

    gate = state.settings.gate
    assert gate is not None
    lever = gate_lever(item, gate)
    shape, n_prompts = gate_shape(item, gate, lever)
    module = item.nodeid.split("::")[0]
    key = f"{module}|{lever.key('reference')}|{lever.key('candidate')}|{shape}|{n_prompts}"
    if key in runs:
        return runs[key]

    model, tokenizer = state.model("candidate")
    snap = state.snapshot("candidate")
    assert snap is not None
    candidate = LoadedModel(model, tokenizer, snap)
    reference = None
    if lever.kind == "model":
        ref_snap = state.snapshot("reference")
        if ref_snap is None:
            raise LeverError("the model lever compares two models: pass --mlx-reference NAME")
        ref_model, ref_tok = state.model("reference")
        reference = LoadedModel(ref_model, ref_tok, ref_snap)

    prompts = load_prompts_file(gate.prompts_file) if gate.prompts_file else default_prompts()
    sequences = build_sequences(prompts, tokenizer, n=n_prompts, tokens=shape.tokens)
    cache_dir = state.config.cache.mkdir("mlxgate-reference") if state.config.cache is not None else None
    device, blas = state.machine()
    run = PairedRun(
        lever=lever,
        shape=shape,
        sequences=sequences,
        sequences_digest=sequences_digest(sequences),
        candidate=candidate,
        reference=reference,
        machine={"device": device, "blas": blas, **_versions()},
        cache=ReferenceCache(cache_dir) if cache_dir is not None else None,
        refresh_reference=gate.refresh_reference,
        aa=gate.aa,
        progress=_progress(state),
        capability_options={"tier": gate.tier or "smoke", "tier_from_cli": gate.tier_from_cli,
                            "max_new_tokens": gate.max_new_tokens, "allow_unsandboxed": gate.allow_unsandboxed},
    )
    runs[key] = run
    return run


def rerun_command(config: pytest.Config, nodeid: str) -> str:
    """`pytest 'nodeid' <the run's --mlx-* options>`: what re-runs just this gate."""
    args = [str(a) for a in config.invocation_params.args]
    kept: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in _VALUED and "=" not in a and i + 1 < len(args):
            kept += [a, args[i + 1]]
            i += 2
            continue
        if name in _VALUED or name in _FLAGS:
            kept.append(a)
        i += 1
    return " ".join(["pytest", shlex.quote(_from_invocation_dir(config, nodeid)), *(shlex.quote(k) for k in kept)])


def _from_invocation_dir(config: pytest.Config, nodeid: str) -> str:
    """Node ids are relative to the rootdir; the command must work where the user typed theirs."""
    path, sep, rest = nodeid.partition("::")
    try:
        rel = os.path.relpath(config.rootpath / path, config.invocation_params.dir)
    except ValueError:  # another drive (Windows)
        return nodeid
    return rel + sep + rest


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("mlx", "mlx-lm"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


def _progress(state: MlxgateSession) -> Any:
    """Arm progress on the controller's terminal (workers print nothing)."""
    if state.is_worker:
        return None

    def say(text: str) -> None:
        with state.terminal_line_writer() as write:
            if write is not None:
                write(f"mlxgate: {text}")

    return say
