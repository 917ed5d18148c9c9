"""pytest-mlxgate's wiring: options, configure, xdist glue, fixtures.

pytest imports this module in every run of every project where the package is installed, the
xdist controller included; so it imports neither mlx, mlx_lm nor httpx. Fixtures import their
implementation inside their bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from .settings import cache_dir_arg, count_arg, endpoint_arg, file_arg, name_arg

if TYPE_CHECKING:
    from .paired import Paired
    from .session import MlxgateSession, Role
    from .snapshots import ResolvedSnapshot

SESSION_KEY = pytest.StashKey["MlxgateSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mlxgate", "mlxgate: quality gates for MLX inference levers")
    group.addoption(
        "--mlx-candidate",
        dest="mlx_candidate",
        metavar="NAME",
        type=name_arg,
        default=None,
        help="model under test: an alias (e2b, e4b, smollm2-135m, or [tool.mlxgate.aliases]), "
        "a repo id org/name[@revision], or a local directory. Default: smollm2-135m.",
    )
    group.addoption(
        "--mlx-reference",
        dest="mlx_reference",
        metavar="NAME",
        type=name_arg,
        default=None,
        help="reference model, same forms as --mlx-candidate. Default: none.",
    )
    group.addoption(
        "--mlx-cache-dir",
        dest="mlx_cache_dir",
        metavar="DIR",
        type=cache_dir_arg,
        default=None,
        help="hub cache directory. Default: HF_HUB_CACHE, else $HF_HOME/hub, else "
        "~/.cache/huggingface/hub.",
    )
    group.addoption(
        "--mlx-offline",
        dest="mlx_offline",
        action="store_true",
        default=None,
        help="never touch the network; use complete cached snapshots only. Default: HF_HUB_OFFLINE.",
    )
    group.addoption(
        "--mlx-endpoint",
        dest="mlx_endpoint",
        metavar="URL",
        type=endpoint_arg,
        default=None,
        help="hub endpoint. Default: HF_ENDPOINT, else https://huggingface.co.",
    )
    group.addoption(
        "--mlx-lever",
        dest="mlx_lever",
        metavar="NAME",
        default=None,
        help="override the gates' lever: a module's lever name (new values for it), an environment "
        "variable (env:VAR or a bare NAME), patch:module.attr, kv, or model. Needs both values below.",
    )
    group.addoption("--mlx-ref-value", dest="mlx_ref_value", metavar="V", default=None,
                    help="the lever's reference value (with --mlx-lever)")
    group.addoption("--mlx-cand-value", dest="mlx_cand_value", metavar="V", default=None,
                    help="the lever's candidate value (with --mlx-lever)")
    group.addoption(
        "--mlx-prompts-file",
        dest="mlx_prompts_file",
        metavar="JSONL",
        type=file_arg,
        default=None,
        help='KL prompts, one JSON object per line: {"text": ...} or {"messages": [...]} (chat '
        "template). Default: the built-in domain-diverse set.",
    )
    group.addoption("--mlx-kl-prompts", dest="mlx_kl_prompts", metavar="N", type=count_arg, default=None,
                    help="sequences per KL gate (default: the gate's mlx_kl marker, else 64)")
    group.addoption("--mlx-kl-tokens", dest="mlx_kl_tokens", metavar="T", type=count_arg, default=None,
                    help="tokens per sequence (default: the gate's mlx_kl marker, else 256)")
    group.addoption("--mlx-kl-decode", dest="mlx_kl_decode", metavar="D", type=count_arg, default=None,
                    help="serving path: the last D tokens are decoded one at a time (default: marker, else 32)")
    group.addoption("--mlx-refresh-reference", dest="mlx_refresh_reference", action="store_true", default=None,
                    help="recompute the reference arm even when the reference cache has it")
    group.addoption("--mlx-aa", dest="mlx_aa", action="store_true", default=None,
                    help="A/A calibration: run each gate's reference arm against itself (and with another "
                    "prefill chunk size) and check every limit sits above that noise floor")
    group.addoption("--mlx-report", dest="mlx_report", metavar="PATH", default=None,
                    help="write a JSON report, one record per gate")
    group.addoption("--mlx-db", dest="mlx_db", metavar="PATH", default=None,
                    help="sqlite results history (table quality_runs); 'off' disables. "
                    "Default: .mlxgate/results.sqlite under the rootdir")
    group.addoption("--mlx-tier", dest="mlx_tier", choices=("smoke", "full"), default=None,
                    help="capability tier: smoke (small subsets, minutes on CPU) or full (default: the module's "
                    "mlx_tier marker, else smoke)")
    group.addoption("--mlx-max-new-tokens", dest="mlx_max_new_tokens", metavar="N", type=count_arg, default=None,
                    help="cap on generated tokens per capability item (default: each task's own)")
    group.addoption("--mlx-allow-unsandboxed", dest="mlx_allow_unsandboxed", action="store_true", default=None,
                    help="run model-written HumanEval code even where no isolation (network namespace, "
                    "sandbox-exec) is available; only rlimits and a temp dir then contain it")
    parser.addini("mlx_candidate", "default for --mlx-candidate", default=None)
    parser.addini("mlx_reference", "default for --mlx-reference", default=None)
    parser.addini("mlx_cache_dir", "default for --mlx-cache-dir (relative to this file)", default=None)
    parser.addini("mlx_offline", "default for --mlx-offline", type="bool", default=None)
    parser.addini("mlx_endpoint", "default for --mlx-endpoint", default=None)
    for name in ("mlx_lever", "mlx_ref_value", "mlx_cand_value", "mlx_prompts_file", "mlx_kl_prompts",
                 "mlx_kl_tokens", "mlx_kl_decode", "mlx_report", "mlx_db", "mlx_tier", "mlx_max_new_tokens"):
        parser.addini(name, f"default for --{name.replace('_', '-')}", default=None)
    parser.addini("mlx_refresh_reference", "default for --mlx-refresh-reference", type="bool", default=False)
    parser.addini("mlx_aa", "default for --mlx-aa", type="bool", default=False)
    parser.addini("mlx_allow_unsandboxed", "default for --mlx-allow-unsandboxed", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    from .session import MlxgateSession
    from .settings import read_settings

    config.addinivalue_line(
        "markers",
        "mlx_lever(name, *, env=VAR | patch='mod.attr' | kv=True | context=factory, ref=..., cand=..., "
        "path='prefill'|'serving'): the lever a gate module's `paired` fixture switches between its arms",
    )
    config.addinivalue_line(
        "markers", "mlx_tier(name): the capability tier of a gate module, 'smoke' or 'full' (--mlx-tier overrides)"
    )
    config.addinivalue_line(
        "markers",
        "mlx_kl(prompts=N, tokens=T, decode=D, chunk=C): a KL gate's sizes (the command line overrides them)",
    )
    state = MlxgateSession(config, read_settings(config))
    config.stash[SESSION_KEY] = state
    config.pluginmanager.register(state, "mlxgate-session")
    if config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin"):
        config.pluginmanager.register(XdistHooks(state), "mlxgate-xdist")
    state.warn_if_reference_blas()


class XdistHooks:
    """xdist-only hooks; registered only when xdist is loaded, else pytest rejects the unknown hook."""

    def __init__(self, state: MlxgateSession) -> None:
        self.state = state

    def pytest_configure_node(self, node: Any) -> None:
        """Ship the controller's pinned snapshots (JSON) so workers never resolve or download."""
        node.workerinput.update(self.state.worker_payload())


def _state(request: pytest.FixtureRequest) -> MlxgateSession:
    return request.config.stash[SESSION_KEY]


def _snapshot_or_fail(request: pytest.FixtureRequest, role: Role) -> ResolvedSnapshot | None:
    """The role's snapshot, or a test failure whose text is the whole story (no traceback)."""
    from .errors import ModelUnavailableError

    try:
        return _state(request).snapshot(role)
    except ModelUnavailableError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained tracebacks in the report


@pytest.fixture(scope="session")
def mlx_snapshot(request: pytest.FixtureRequest) -> ResolvedSnapshot:
    """The candidate model's snapshot (`--mlx-candidate`, default `smollm2-135m`), pinned to its
    commit and hash-verified (a local directory is used as is): `.path`, `.repo_id`, `.commit`.

    Resolved once per run: on the xdist controller before workers start (workers receive it), or
    on first use without xdist. A download or build is reported on the terminal.
    """
    snap = _snapshot_or_fail(request, "candidate")
    assert snap is not None
    return snap


@pytest.fixture(scope="session")
def mlx_reference_snapshot(request: pytest.FixtureRequest) -> ResolvedSnapshot:
    """The reference model's snapshot (`--mlx-reference`), like `mlx_snapshot`; tests that use it
    are skipped when no reference is configured."""
    snap = _snapshot_or_fail(request, "reference")
    if snap is None:
        pytest.skip("no reference model: pass --mlx-reference NAME or set mlx_reference in the ini")
    return snap


@pytest.fixture
def paired(request: pytest.FixtureRequest) -> Iterator[Paired]:
    """Both arms of the module's lever (`pytestmark = pytest.mark.mlx_lever(...)`) over identical
    token ids: pass it to `assert_kl_below(paired, mean=..., p99=...)`.

    The arms run once per module on first use, with one weight load of the candidate (two in
    two-model mode); the reference arm comes from the reference cache when nothing it depends on
    changed. Sizes: `pytest.mark.mlx_kl(prompts=, tokens=, decode=)`, or --mlx-kl-prompts/-tokens/-decode.
    Under xdist every worker that runs a gate loads the model once.
    """
    from .errors import MlxgateError

    try:
        value = _state(request).paired(request.node)
    except MlxgateError as e:
        message = str(e)
    else:
        yield value
        value.finish()
        return
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def mlx_model(request: pytest.FixtureRequest, mlx_snapshot: ResolvedSnapshot) -> tuple[Any, Any]:
    """`(model, tokenizer)` of the candidate, from `mlx_lm.load(mlx_snapshot.path)`; loaded once
    per process and shared by every test in it."""
    from .errors import ModelUnavailableError

    try:
        return _state(request).model()
    except ModelUnavailableError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained tracebacks in the report
