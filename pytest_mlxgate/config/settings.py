"""The plugin's settings: one precedence rule, env < ini < command line.

The environment layer is the hub's own (HF_HUB_OFFLINE, HF_ENDPOINT, HF_HUB_CACHE): a setting left
unset here stays None and the hub reads its variable, so the three layers never disagree.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..common.atomic import unwritable
from ..common.refstore import DEFAULT_CACHE_MAX_BYTES
from ..errors import MlxgateUsageError
from .names import DEFAULT_CANDIDATE, check_name_syntax, read_tool_table
from .option_values import check_endpoint, contexts_arg, count_arg, seconds_arg, timeout_arg, times_arg
from .options import OPTIONS
from .shards import Shard, parse_shard

__all__ = [
    "DEFAULT_ARM_TIMEOUT",
    "DEFAULT_DB",
    "DEFAULT_KL_DECODE",
    "DEFAULT_KL_PROMPTS",
    "DEFAULT_KL_TOKENS",
    "GATE_OPTION_NAMES",
    "GateSettings",
    "OPTION_NAMES",
    "Settings",
    "default_db",
    "find_rootdir",
    "read_gate_settings",
    "read_settings",
]

#: dest/ini name -> flag of the options that choose models; any of them set puts mlxgate in use.
OPTION_NAMES: dict[str, str] = {o.dest: o.flag for o in OPTIONS if o.concern == "model"}
#: dest/ini name -> flag of the gates' options; they also put mlxgate in use.
GATE_OPTION_NAMES: dict[str, str] = {o.dest: o.flag for o in OPTIONS if o.concern == "gate"}

#: The anchors' size (llama.cpp's and the project's ancestors'): 64 prompts x 256 tokens.
DEFAULT_KL_PROMPTS = 64
DEFAULT_KL_TOKENS = 256
#: Serving path: how many of the last tokens are fed one at a time (decode is ~15x slower than prefill).
DEFAULT_KL_DECODE = 32
#: Where the results history goes unless --mlx-db/mlx_db says otherwise ("off" turns it off).
DEFAULT_DB = ".mlxgate/results.sqlite"
#: --mlx-arm-timeout's default: an hour per arm, room for a full capability tier on a laptop.
DEFAULT_ARM_TIMEOUT = 3600.0


def default_db(rootdir: Path) -> Path:
    """The results history of a run whose rootdir is `rootdir`: the plugin's default, and the CLI's."""
    return Path(rootdir) / DEFAULT_DB


def find_rootdir(cwd: Path) -> Path:
    """The rootdir pytest would pick when run here with no arguments (for the CLI's default DB)."""
    from _pytest.config.findpaths import determine_setup  # pytest's own rule, not a copy of it

    try:
        rootdir, *_ = determine_setup(
            inifile=None, args=[str(cwd)], rootdir_cmd_arg=None, invocation_dir=cwd, **_override_ini(determine_setup)
        )
    except (pytest.UsageError, TypeError, ValueError, OSError):
        return cwd
    return Path(rootdir)


def _override_ini(func: Callable[..., object]) -> dict[str, Any]:
    import inspect

    return {"override_ini": None} if "override_ini" in inspect.signature(func).parameters else {}


@dataclass(frozen=True)
class Settings:
    """Merged settings; None means 'not set here: let the hub read its environment variable'."""

    candidate: str
    reference: str | None
    names_dir: dict[str, Path]  # role -> where a relative path in that role's name is relative to
    cache_dir: Path | None
    offline: bool | None
    endpoint: str | None
    pyproject: Path  # the rootdir's pyproject.toml: aliases live there (it may not exist)
    tool_table: dict[str, object] | None  # its [tool.mlxgate], None when absent
    in_use: bool  # any mlxgate option/ini set, or a [tool.mlxgate] table exists
    gate: GateSettings | None = None
    dtype: str = "auto"  # --mlx-dtype: the precision the arms compute in (`models.precision`)


@dataclass(frozen=True)
class GateSettings:
    """The KL gate's settings. Sizes left None fall back to the gate's `mlx_kl` marker, then defaults."""

    lever: str | None
    ref_value: str | None
    cand_value: str | None
    prompts_file: Path | None
    kl_prompts: int | None
    kl_tokens: int | None
    kl_decode: int | None
    kl_prompts_ini: int | None  # ini sizes rank below a module's marker; the command line above it
    kl_tokens_ini: int | None
    kl_decode_ini: int | None
    refresh_reference: bool
    aa: bool
    report: Path | None
    db: Path | None  # None: off
    invocation_dir: Path
    tier: str | None = (
        None  # capability tier from the command line/ini (a module's mlx_tier marker ranks below the CLI)
    )
    tier_from_cli: bool = False
    max_new_tokens: int | None = None
    allow_unsandboxed: bool = False
    allow_untrained: bool = False
    reference_cache: Path | None = None  # --mlx-reference-cache DIR (None: pytest's cache)
    reference_cache_off: bool = False  # --mlx-reference-cache off
    reference_cache_max: int | None = DEFAULT_CACHE_MAX_BYTES  # --mlx-reference-cache-max SIZE (None: no cap)
    inconclusive: str = "fail"  # --mlx-inconclusive: fail | warn | xfail
    speed: str | None = None  # --mlx-speed on | off; None: the modules' mlx_speed markers decide
    speed_contexts: tuple[int, ...] | None = None
    speed_decode: int | None = None
    speed_reps: int | None = None
    calibrate: bool = False  # --mlx-calibrate: measure, suggest limits, no verdict
    html: Path | None = None  # --mlx-html PATH: the self-contained HTML report
    shard: Shard | None = None  # --mlx-shard I/N: this run keeps the gate modules of shard I
    arm_timeout: float | None = DEFAULT_ARM_TIMEOUT  # --mlx-arm-timeout SECONDS; None: no limit
    progress_interval: float | None = None  # --mlx-progress-interval; None: 5 s on a terminal, else 30 s
    explain: bool = False  # --mlx-explain: attribute every KL gate's drift, not only a failing one's
    explain_budget: float = 3.0  # --mlx-explain-budget TIMES the gate's two arms; 0: no automatic attribution
    prove: str = "auto"  # --mlx-prove: auto (prove limits where no calibration covers the model) | off
    require_proof: bool = False  # --mlx-require-proof: limits unproven on the judged model are an error
    cand_server: str | None = None  # --mlx-cand-server URL: the candidate arm served over HTTP
    server_key_env: str | None = None  # --mlx-server-key-env NAME: where that server's key is
    ref_server: str | None = None  # --mlx-ref-server URL: the reference arm served over HTTP
    ref_server_key_env: str | None = None  # --mlx-ref-server-key-env NAME
    server_top_k: int = 11  # --mlx-server-top-k K


def _ini_count(config: pytest.Config, name: str) -> int | None:
    value = config.getini(name)
    if value in (None, ""):
        return None
    try:
        return count_arg(str(value))
    except argparse.ArgumentTypeError as e:
        raise MlxgateUsageError(f"{name} in {config.inipath or 'the ini file'}: {e}") from None


def read_gate_settings(config: pytest.Config) -> GateSettings:
    """The KL gate's options, command line over ini; paths relative to where they were written."""
    cli = {name: config.getoption(name) for name in GATE_OPTION_NAMES}
    inidir = config.inipath.parent if config.inipath else config.invocation_params.dir
    here = config.invocation_params.dir

    def path(name: str) -> Path | None:
        if cli[name]:
            return here / Path(cli[name]).expanduser()
        ini = config.getini(name)
        return inidir / Path(str(ini)).expanduser() if ini else None

    prompts_file = path("mlx_prompts_file")
    if prompts_file is not None and not prompts_file.is_file():
        raise MlxgateUsageError(f"mlx_prompts_file: '{prompts_file}' is not a file")
    db_raw = cli["mlx_db"] or config.getini("mlx_db") or None
    db = (
        (None if str(db_raw).lower() in ("off", "none", "0", "false") else path("mlx_db"))
        if db_raw
        else (default_db(config.rootpath))
    )
    # the outputs asked for (the default results DB is a by-product: it only warns when it cannot be written)
    for name, target in (
        ("mlx_report", path("mlx_report")),
        ("mlx_html", path("mlx_html")),
        ("mlx_db", db if db_raw else None),
    ):
        why = unwritable(target, parents_made=True) if target is not None else None
        if why is not None:  # found now, not after the whole run
            flag = "--" + name.replace("_", "-")
            raise MlxgateUsageError(f"{flag} {target}: {why}; give a file in a folder you can write ({name} in ini)")
    ref_cache_raw = cli["mlx_reference_cache"] or config.getini("mlx_reference_cache") or None
    ref_cache_off = str(ref_cache_raw).lower() in ("off", "none", "0", "false") if ref_cache_raw else False
    lever = cli["mlx_lever"] or config.getini("mlx_lever") or None
    ref_value = cli["mlx_ref_value"] if cli["mlx_ref_value"] is not None else (config.getini("mlx_ref_value") or None)
    cand_value = (
        cli["mlx_cand_value"] if cli["mlx_cand_value"] is not None else (config.getini("mlx_cand_value") or None)
    )
    if lever is None and (ref_value is not None or cand_value is not None):
        raise MlxgateUsageError(
            "--mlx-ref-value/--mlx-cand-value need --mlx-lever NAME: say which lever the values are for"
        )
    if lever not in (None, "model") and (ref_value is None or cand_value is None):
        raise MlxgateUsageError(f"--mlx-lever {lever} needs both values: pass --mlx-ref-value V and --mlx-cand-value V")
    aa = bool(cli["mlx_aa"] or config.getini("mlx_aa"))
    calibrate = bool(cli["mlx_calibrate"] or config.getini("mlx_calibrate"))
    if aa and calibrate:
        raise MlxgateUsageError(
            "--mlx-aa and --mlx-calibrate: choose one (--mlx-calibrate runs the A/A floor itself, "
            "beside the lever, and suggests limits; --mlx-aa checks limits you already have)"
        )
    prove = _prove(cli["mlx_prove"] or config.getini("mlx_prove") or None)
    require_proof = bool(cli["mlx_require_proof"] or config.getini("mlx_require_proof"))
    if require_proof and prove == "off":
        raise MlxgateUsageError(
            "--mlx-require-proof with --mlx-prove off: a proof is required but none may run; drop one of them "
            "(MLXGATE_PROVE=off counts as --mlx-prove off)"
        )
    cand_server = cli["mlx_cand_server"] or _ini_server(config, "mlx_cand_server")
    ref_server = cli["mlx_ref_server"] or _ini_server(config, "mlx_ref_server")
    for flag, url in (("--mlx-cand-server", cand_server), ("--mlx-ref-server", ref_server)):
        if url and (aa or calibrate):
            raise MlxgateUsageError(
                f"{flag} with {'--mlx-aa' if aa else '--mlx-calibrate'}: a calibration measures the lever's "
                "arms in process; calibrate the gate as it is, then judge the server against its limits"
            )
    server_key_env = cli["mlx_server_key_env"] or config.getini("mlx_server_key_env") or None
    if server_key_env and not cand_server:
        raise MlxgateUsageError("--mlx-server-key-env names a key for --mlx-cand-server, which is not given")
    ref_server_key_env = cli["mlx_ref_server_key_env"] or config.getini("mlx_ref_server_key_env") or None
    if ref_server_key_env and not ref_server:
        raise MlxgateUsageError("--mlx-ref-server-key-env names a key for --mlx-ref-server, which is not given")
    return GateSettings(
        lever=lever,
        ref_value=ref_value,
        cand_value=cand_value,
        prompts_file=prompts_file,
        kl_prompts=cli["mlx_kl_prompts"],
        kl_tokens=cli["mlx_kl_tokens"],
        kl_decode=cli["mlx_kl_decode"],
        kl_prompts_ini=_ini_count(config, "mlx_kl_prompts"),
        kl_tokens_ini=_ini_count(config, "mlx_kl_tokens"),
        kl_decode_ini=_ini_count(config, "mlx_kl_decode"),
        refresh_reference=bool(cli["mlx_refresh_reference"] or config.getini("mlx_refresh_reference")),
        aa=aa,
        calibrate=calibrate,
        report=path("mlx_report"),
        html=path("mlx_html"),
        db=db,
        invocation_dir=here,
        tier=cli["mlx_tier"] or config.getini("mlx_tier") or None,
        tier_from_cli=bool(cli["mlx_tier"]),
        max_new_tokens=cli["mlx_max_new_tokens"] or _ini_count(config, "mlx_max_new_tokens"),
        allow_unsandboxed=bool(cli["mlx_allow_unsandboxed"] or config.getini("mlx_allow_unsandboxed")),
        reference_cache=None if ref_cache_off or not ref_cache_raw else path("mlx_reference_cache"),
        reference_cache_off=ref_cache_off,
        reference_cache_max=_cache_max(cli["mlx_reference_cache_max"], config),
        allow_untrained=bool(
            cli["mlx_allow_untrained"]
            or config.getini("mlx_allow_untrained")
            or os.environ.get("MLXGATE_ALLOW_UNTRAINED", "").strip() in ("1", "true", "yes")
        ),
        inconclusive=_inconclusive(cli["mlx_inconclusive"] or config.getini("mlx_inconclusive") or "fail", config),
        speed=_speed_switch(cli["mlx_speed"] or config.getini("mlx_speed") or None, config),
        speed_contexts=cli["mlx_speed_contexts"] or _ini_contexts(config),
        speed_decode=cli["mlx_speed_decode"] or _ini_count(config, "mlx_speed_decode"),
        speed_reps=cli["mlx_speed_reps"] or _ini_count(config, "mlx_speed_reps"),
        shard=_shard(cli["mlx_shard"] or config.getini("mlx_shard") or None, config),
        arm_timeout=_arm_timeout(cli["mlx_arm_timeout"], config),
        explain=bool(cli["mlx_explain"] or config.getini("mlx_explain")),
        explain_budget=_explain_budget(cli["mlx_explain_budget"], config),
        prove=prove,
        require_proof=require_proof,
        cand_server=cand_server,
        server_key_env=server_key_env,
        ref_server=ref_server,
        ref_server_key_env=ref_server_key_env,
        server_top_k=cli["mlx_server_top_k"] or _ini_top_k(config),
        progress_interval=(
            cli["mlx_progress_interval"]
            if cli["mlx_progress_interval"] is not None
            else _ini_seconds(config, "mlx_progress_interval", seconds_arg)
        ),
    )


def _ini_server(config: pytest.Config, name: str) -> str | None:
    value = config.getini(name)
    if not value:
        return None
    from ..common.server_endpoint import Endpoint

    return Endpoint.parse(str(value)).url


def _ini_top_k(config: pytest.Config) -> int:
    value = config.getini("mlx_server_top_k")
    if value in (None, ""):
        return 11
    from .option_values import top_k_arg

    try:
        return top_k_arg(str(value))
    except argparse.ArgumentTypeError as e:
        raise MlxgateUsageError(f"mlx_server_top_k in {config.inipath or 'the ini file'}: {e}") from None


def _ini_seconds(config: pytest.Config, name: str, parse: Callable[[str], float]) -> float | None:
    value = config.getini(name)
    if value in (None, ""):
        return None
    try:
        return parse(str(value))
    except argparse.ArgumentTypeError as e:
        raise MlxgateUsageError(f"{name} in {config.inipath or 'the ini file'}: {e}") from None


def _explain_budget(cli: float | None, config: pytest.Config) -> float:
    """Command line, else ini, else MLXGATE_EXPLAIN_BUDGET, else 3 (times the gate's own two arms)."""
    value = cli if cli is not None else _ini_seconds(config, "mlx_explain_budget", times_arg)
    env = os.environ.get("MLXGATE_EXPLAIN_BUDGET", "").strip()
    if value is None and env:
        try:
            value = times_arg(env)
        except argparse.ArgumentTypeError as e:
            raise MlxgateUsageError(f"MLXGATE_EXPLAIN_BUDGET={env!r}: {e}") from None
    return 3.0 if value is None else value


def _prove(given: str | None) -> str:
    """Command line, else ini, else MLXGATE_PROVE, else auto."""
    value = (given or os.environ.get("MLXGATE_PROVE", "").strip() or "auto").lower()
    if value not in ("auto", "off"):
        where = "mlx_prove" if given else "MLXGATE_PROVE"
        raise MlxgateUsageError(f"{where}={value!r}: use auto (prove limits where no calibration covers) or off")
    return value


def _arm_timeout(cli: float | None, config: pytest.Config) -> float | None:
    """Command line, else ini, else the default; 0 (also `none`, `off`) is no limit."""
    value = cli if cli is not None else _ini_seconds(config, "mlx_arm_timeout", timeout_arg)
    if value is None:
        return DEFAULT_ARM_TIMEOUT
    return value or None


def _cache_max(cli_value: str | None, config: pytest.Config) -> int | None:
    """--mlx-reference-cache-max (checked by argparse), else its ini twin (checked here), else the default."""
    from ..common.refstore import parse_cache_max

    value = cli_value or config.getini("mlx_reference_cache_max") or None
    if value is None:
        return DEFAULT_CACHE_MAX_BYTES
    try:
        return parse_cache_max(str(value))
    except ValueError as e:
        raise MlxgateUsageError(f"mlx_reference_cache_max in {config.inipath or 'the ini file'}: {e}") from None


def _shard(value: str | None, config: pytest.Config) -> Shard | None:
    if value is None:
        return None
    try:
        return parse_shard(str(value))
    except ValueError as e:  # the command line's was checked by argparse: this is the ini's
        raise MlxgateUsageError(f"mlx_shard in {config.inipath or 'the ini file'}: {e}") from None


def _speed_switch(value: str | None, config: pytest.Config) -> str | None:
    if value is None or value in ("on", "off"):
        return value
    raise MlxgateUsageError(
        f"mlx_speed = {value!r} in {config.inipath or 'the ini file'}: choose on or off "
        "(or leave it out: modules with an mlx_speed marker measure speed)"
    )


def _ini_contexts(config: pytest.Config) -> tuple[int, ...] | None:
    value = config.getini("mlx_speed_contexts")
    if value in (None, ""):
        return None
    try:
        return contexts_arg(str(value))
    except argparse.ArgumentTypeError as e:
        raise MlxgateUsageError(f"mlx_speed_contexts in {config.inipath or 'the ini file'}: {e}") from None


def _inconclusive(value: str, config: pytest.Config) -> str:
    from ..results.verdicts import INCONCLUSIVE_POLICIES

    if value not in INCONCLUSIVE_POLICIES:
        raise MlxgateUsageError(
            f"mlx_inconclusive = {value!r} in {config.inipath or 'the ini file'}: choose one of "
            f"{', '.join(INCONCLUSIVE_POLICIES)} (an inconclusive gate never passes)"
        )
    return value


def read_settings(config: pytest.Config) -> Settings:
    """Merge command line over ini; relative paths are relative to where each was written."""
    cli = {name: config.getoption(name) for name in OPTION_NAMES}
    ini = {name: config.getini(name) for name in OPTION_NAMES}
    pyproject = config.rootpath / "pyproject.toml"
    try:
        tool_table = read_tool_table(pyproject)
        ini_cand, ini_ref, ini_endpoint = (
            _ini(config, "mlx_candidate", check_name_syntax),
            _ini(config, "mlx_reference", check_name_syntax),
            _ini(config, "mlx_endpoint", check_endpoint),
        )
        ini_dtype = _ini(config, "mlx_dtype", _dtype)
    except MlxgateUsageError as e:
        raise pytest.UsageError(str(e)) from None
    inidir = config.inipath.parent if config.inipath else config.invocation_params.dir
    cache_dir = (
        config.invocation_params.dir / Path(cli["mlx_cache_dir"]).expanduser()
        if cli["mlx_cache_dir"]
        else inidir / Path(ini["mlx_cache_dir"]).expanduser()
        if ini["mlx_cache_dir"]
        else None
    )
    try:
        gate = read_gate_settings(config)
    except MlxgateUsageError as e:
        raise pytest.UsageError(str(e)) from None
    gate_set = [config.getoption(n) for n in GATE_OPTION_NAMES] + [config.getini(n) for n in GATE_OPTION_NAMES]
    in_use = (
        any(v not in (None, "") for v in cli.values())
        or any(v not in (None, "") for v in ini.values())
        or any(v not in (None, "", False) for v in gate_set)
        or tool_table is not None
    )
    return Settings(
        candidate=cli["mlx_candidate"] or ini_cand or DEFAULT_CANDIDATE,
        reference=cli["mlx_reference"] or ini_ref,
        names_dir={
            role: config.invocation_params.dir if cli[f"mlx_{role}"] else inidir for role in ("candidate", "reference")
        },
        cache_dir=cache_dir,
        offline=True if cli["mlx_offline"] else ini["mlx_offline"],
        endpoint=cli["mlx_endpoint"] or ini_endpoint,
        pyproject=pyproject,
        tool_table=tool_table,
        in_use=in_use,
        gate=gate,
        dtype=cli["mlx_dtype"] or ini_dtype or "auto",
    )


def _dtype(value: str) -> str:
    from .dtypes import parse_dtype

    try:
        return parse_dtype(value)
    except ValueError as e:
        raise MlxgateUsageError(str(e)) from None


def _ini(config: pytest.Config, name: str, check: Callable[[str], str]) -> str | None:
    """An ini string value checked like its command-line twin (argparse never sees ini values)."""
    value = config.getini(name)
    if not value:
        return None
    try:
        return check(str(value))
    except MlxgateUsageError as e:
        where = config.inipath or "the ini file"
        raise MlxgateUsageError(f"{name} in {where}: {e}") from None
