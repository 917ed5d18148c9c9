"""Every mlxgate option, declared once: its flag, ini twin, help, parse-time check, and whether a
re-run command carries it. `plugin.pytest_addoption`, the settings reader and the re-run command
all read this table, so an option cannot be added to one of them and forgotten in another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from ..results.history import DB_BUSY_TIMEOUT_S
from .option_values import (
    cache_dir_arg,
    cache_max_arg,
    contexts_arg,
    count_arg,
    dtype_arg,
    endpoint_arg,
    file_arg,
    name_arg,
    seconds_arg,
    server_url_arg,
    shard_arg,
    timeout_arg,
    times_arg,
    top_k_arg,
)

__all__ = ["OPTIONS", "Option", "add_options", "option"]


# --- the table ---------------------------------------------------------------------------------------

Concern = Literal["model", "gate"]


@dataclass(frozen=True)
class Option:
    """One `--mlx-…` option and its ini twin (named like its dest)."""

    flag: str
    help: str
    concern: Concern  # model: which models, from where; gate: how gates run and report
    metavar: str | None = None  # None: a flag without a value (store_true)
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    ini_help: str | None = None  # default: "default for --flag"
    ini_bool_default: bool | None = False  # flags only: the ini twin's default
    in_rerun: bool = True  # a re-run command of one gate carries it

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def takes_value(self) -> bool:
        return self.metavar is not None or self.choices is not None


OPTIONS: tuple[Option, ...] = (
    Option(
        "--mlx-candidate",
        "model under test: an alias (e2b, e4b, smollm2-135m, gemma3-270m, or [tool.mlxgate.aliases]), "
        "a repo id org/name[@revision], or a local directory. Default: smollm2-135m.",
        "model",
        metavar="NAME",
        type=name_arg,
    ),
    Option(
        "--mlx-reference",
        "reference model, same forms as --mlx-candidate. Default: none.",
        "model",
        metavar="NAME",
        type=name_arg,
    ),
    Option(
        "--mlx-cache-dir",
        "hub cache directory. Default: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.",
        "model",
        metavar="DIR",
        type=cache_dir_arg,
        ini_help="default for --mlx-cache-dir (relative to this file)",
    ),
    Option(
        "--mlx-offline",
        "never touch the network; use complete cached snapshots only. Default: HF_HUB_OFFLINE.",
        "model",
        ini_bool_default=None,
    ),
    Option(
        "--mlx-endpoint",
        "hub endpoint. Default: HF_ENDPOINT, else https://huggingface.co.",
        "model",
        metavar="URL",
        type=endpoint_arg,
    ),
    Option(
        "--mlx-dtype",
        "the precision the arms compute in: auto (the model as shipped), bfloat16, float16 or float32 (every "
        "floating parameter cast at load, as mlx_lm.convert --dtype does; quantized weights stay quantized). "
        "Judge a kernel in the precision you ship it in. Default: auto",
        "model",
        metavar="DTYPE",
        type=dtype_arg,
    ),
    Option(
        "--mlx-lever",
        "override the gates' lever: a module's lever name (new values for it), an environment "
        "variable (env:VAR or a bare NAME), patch:module.attr, kv, or model. Needs both values below.",
        "gate",
        metavar="NAME",
    ),
    Option("--mlx-ref-value", "the lever's reference value (with --mlx-lever)", "gate", metavar="V"),
    Option("--mlx-cand-value", "the lever's candidate value (with --mlx-lever)", "gate", metavar="V"),
    Option(
        "--mlx-prompts-file",
        'KL prompts, one JSON object per line: {"text": ...} or {"messages": [...]} '
        "(chat template). Default: the built-in domain-diverse set.",
        "gate",
        metavar="JSONL",
        type=file_arg,
    ),
    Option(
        "--mlx-kl-prompts",
        "sequences per KL gate (default: the gate's mlx_kl marker, else 64)",
        "gate",
        metavar="N",
        type=count_arg,
    ),
    Option(
        "--mlx-kl-tokens",
        "tokens per sequence (default: the gate's mlx_kl marker, else 256)",
        "gate",
        metavar="T",
        type=count_arg,
    ),
    Option(
        "--mlx-kl-decode",
        "serving path: the last D tokens are decoded one at a time (default: marker, else 32)",
        "gate",
        metavar="D",
        type=count_arg,
    ),
    Option(
        "--mlx-speed",
        "speed and memory beside drift: on (every gate), off (none). Default: the gate modules "
        "with an mlx_speed marker",
        "gate",
        choices=("on", "off"),
    ),
    Option(
        "--mlx-speed-contexts",
        "context lengths speed is measured at (default: the marker's, else 600,8192 on a GPU, 64,256 on a CPU)",
        "gate",
        metavar="N,N",
        type=contexts_arg,
    ),
    Option(
        "--mlx-speed-decode",
        "tokens decoded (and timed) per speed trial (default: marker, else 64 GPU / 8 CPU)",
        "gate",
        metavar="N",
        type=count_arg,
    ),
    Option(
        "--mlx-speed-reps",
        "interleaved pairs of speed trials per context, at least 3 (default: marker, else 9)",
        "gate",
        metavar="N",
        type=count_arg,
    ),
    Option(
        "--mlx-reference-cache",
        "where reference arms are cached: a directory, or 'off'. Default: pytest's "
        "cache (.pytest_cache/d/mlxgate-reference); off when pytest's cacheprovider is disabled "
        "(-p no:cacheprovider)",
        "gate",
        metavar="DIR",
    ),
    Option(
        "--mlx-reference-cache-max",
        "cap on the reference cache's size, e.g. 2GiB or 500MB: after each store "
        "the least recently used entries are deleted until it fits (never the one just written; 0 keeps only "
        "that one); 'none': no cap. Default: 2GiB",
        "gate",
        metavar="SIZE",
        type=cache_max_arg,
    ),
    Option("--mlx-refresh-reference", "recompute the reference arm even when the reference cache has it", "gate"),
    Option(
        "--mlx-aa",
        "A/A calibration: run each gate's reference arm against itself (and with another "
        "prefill chunk size) and check every limit sits above that noise floor; a module with a calibration file "
        "(calibration/<module>.json) is first held to it (a stale file warns)",
        "gate",
    ),
    Option(
        "--mlx-calibrate",
        "size a gate's limits: measure each module's lever drift, its A/A floor, speed and "
        "memory, print suggested limits as code (and the rule) and give no verdict (its tests skip); write what "
        "was measured to calibration/<module>.json beside the module",
        "gate",
        in_rerun=False,
    ),
    # Not carried by a re-run of one gate: an investigation must not overwrite the run's report with
    # a report of one gate, nor add rows to a history file chosen for the whole run.
    Option(
        "--mlx-report",
        "write a JSON report, one record per gate (an error record for a gate that raised). "
        "A file already at PATH is renamed PATH.stale when the run starts (on the controller), so a run "
        "that cannot write its report leaves none to mistake for it; a report not written fails the run",
        "gate",
        metavar="PATH",
        in_rerun=False,
    ),
    Option(
        "--mlx-html",
        "write an HTML report: one self-contained file (plots as inline SVG, nothing loaded "
        "from the network), a section per gate. Like --mlx-report, a file already at PATH becomes "
        "PATH.stale at the start, and a report not written fails the run",
        "gate",
        metavar="PATH",
        in_rerun=False,
    ),
    Option(
        "--mlx-db",
        "sqlite results history (table quality_runs); 'off' disables. "
        "Default: .mlxgate/results.sqlite under the rootdir. Locked by another process for more than "
        f"{DB_BUSY_TIMEOUT_S:g} s: the run's rows wait in PATH.pending.jsonl and the next run adds them",
        "gate",
        metavar="PATH",
        in_rerun=False,
    ),
    # Not carried by a re-run either: the gate being re-run may well sit in another shard.
    Option(
        "--mlx-shard",
        "run shard I of N (1-based): whole gate modules, the same split in every process, "
        "balanced by the modules' recorded durations when the results DB has them; `mlxgate merge` joins "
        "the shards' reports",
        "gate",
        metavar="I/N",
        type=shard_arg,
        in_rerun=False,
    ),
    Option(
        "--mlx-tier",
        "capability tier: smoke (small subsets, minutes on CPU) or full (default: the module's "
        "mlx_tier marker, else smoke)",
        "gate",
        choices=("smoke", "full"),
    ),
    Option(
        "--mlx-max-new-tokens",
        "cap on generated tokens per capability item (default: each task's own)",
        "gate",
        metavar="N",
        type=count_arg,
    ),
    Option(
        "--mlx-inconclusive",
        "what a gate that could not tell does: fail (the default: an inconclusive "
        "verdict showed nothing), warn (a warning; the record keeps 'inconclusive') or xfail (for exploratory "
        "runs). It never turns into a pass.",
        "gate",
        choices=("fail", "warn", "xfail"),
    ),
    Option(
        "--mlx-explain",
        "attribute every KL gate's drift to layers (the lever on one scope of layers at a time; each "
        "layer's output error; KL by position per attention type), pass or fail. A failing KL gate is "
        "explained without it, within --mlx-explain-budget",
        "gate",
    ),
    Option(
        "--mlx-explain-budget",
        "what attribution may cost, in multiples of the gate's own two arms (sequences through an arm). "
        "0 turns off the automatic explanation of failing gates. Default: 3 (also MLXGATE_EXPLAIN_BUDGET)",
        "gate",
        metavar="TIMES",
        type=times_arg,
    ),
    Option(
        "--mlx-prove",
        "auto (the default): where no calibration file of the judged model on this backend covers a gate "
        "module, first show its limits work there (the A/A floor, and its KNOWN_BAD must fail them); off: "
        "skip that, and every verdict says its limits are unproven. Also MLXGATE_PROVE",
        "gate",
        choices=("auto", "off"),
    ),
    Option(
        "--mlx-require-proof",
        "a gate whose limits are neither calibrated nor proven on the judged model (no KNOWN_BAD, a "
        "two-model lever) is an error, not a pass: for CI required checks",
        "gate",
    ),
    Option(
        "--mlx-cand-server",
        "the candidate arm is the model served at URL (mlx_lm.server or any OpenAI-compatible server with "
        "logprobs): each KL gate's positions are asked of it teacher-forced and scored against the reference "
        "arm in process; its KL is a lower bound from the server's top-k (docs/server-arm.md)",
        "gate",
        metavar="URL",
        type=server_url_arg,
    ),
    Option(
        "--mlx-server-key-env",
        "the environment variable holding the --mlx-cand-server key: sent as a bearer header to that server's "
        "origin alone, written nowhere",
        "gate",
        metavar="NAME",
    ),
    Option(
        "--mlx-ref-server",
        "the reference arm is the model served at URL (both arms may be servers): asked at each KL gate's "
        "positions like --mlx-cand-server, never cached; scored against its top-k, the KL is a lower bound "
        "(docs/server-arm.md)",
        "gate",
        metavar="URL",
        type=server_url_arg,
    ),
    Option(
        "--mlx-ref-server-key-env",
        "the environment variable holding the --mlx-ref-server key: sent as a bearer header to that server's "
        "origin alone, written nowhere",
        "gate",
        metavar="NAME",
    ),
    Option(
        "--mlx-server-top-k",
        "how many log-probabilities per position to ask of --mlx-cand-server and --mlx-ref-server (1-11; "
        "mlx_lm.server's bound). Default: 11",
        "gate",
        metavar="K",
        type=top_k_arg,
    ),
    Option(
        "--mlx-allow-untrained",
        "run gates on a reference model that predicts text no better than chance "
        "(random-weight test models); by default such gates skip, saying so. Also MLXGATE_ALLOW_UNTRAINED=1",
        "gate",
    ),
    Option(
        "--mlx-arm-timeout",
        "end an arm (KL, speed trials, a capability task) that runs longer than this many "
        "seconds, with an error saying how far it got; checked between forwards, never mid-operation. 0 or none: "
        "no limit. Default: 3600",
        "gate",
        metavar="SECONDS",
        type=timeout_arg,
    ),
    Option(
        "--mlx-progress-interval",
        "seconds between an arm's progress lines (rate, ETA) on the terminal. "
        "Default: 5 on a terminal, 30 otherwise (CI logs)",
        "gate",
        metavar="SECONDS",
        type=seconds_arg,
        in_rerun=False,
    ),
    Option(
        "--mlx-allow-unsandboxed",
        "run model-written HumanEval code even where no isolation (network "
        "namespace, sandbox-exec) is available; only rlimits and a temp dir then contain it",
        "gate",
    ),
)

_BY_DEST = {o.dest: o for o in OPTIONS}


def option(dest: str) -> Option:
    """The option whose dest (and ini name) is `dest`."""
    return _BY_DEST[dest]


def add_options(parser: pytest.Parser) -> None:
    """Declare every option and its ini twin, in one `mlxgate` group."""
    group = parser.getgroup("mlxgate", "mlxgate: quality gates for MLX inference levers")
    for o in OPTIONS:
        if o.takes_value:
            group.addoption(
                o.flag, dest=o.dest, metavar=o.metavar, type=o.type, choices=o.choices, default=None, help=o.help
            )
        else:
            group.addoption(o.flag, dest=o.dest, action="store_true", default=None, help=o.help)
        ini_help = o.ini_help or f"default for {o.flag}"
        if o.takes_value:
            parser.addini(o.dest, ini_help, default=None)
        else:
            parser.addini(o.dest, ini_help, type="bool", default=o.ini_bool_default)
