"""pytest-mlxgate's wiring: options, configure, xdist glue, fixtures.

pytest imports this module in every run of every project where the package is installed, the
xdist controller included; so it imports neither mlx, mlx_lm nor httpx. Fixtures import their
implementation inside their bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from .config.options import add_options

if TYPE_CHECKING:
    from pathlib import Path

    from .models.materialize import ResolvedSnapshot
    from .session.paired import Paired
    from .session.state import MlxgateSession, Role

SESSION_KEY = pytest.StashKey["MlxgateSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)  # every --mlx-… option and its ini twin: config/options.py's table


#: The markers a gate module declares, as `pytest --markers` lists them.
MARKERS = (
    "mlx_lever(name, *, env=VAR | patch='mod.attr' | kv=True | context=factory, ref=..., cand=..., "
    "path='prefill'|'serving'): the lever a gate module's `paired` fixture switches between its arms",
    "mlx_tier(name): the capability tier of a gate module, 'smoke' or 'full' (--mlx-tier overrides)",
    "mlx_kl(prompts=N, tokens=T, decode=D, chunk=C, batched=True): a KL gate's sizes (the command line "
    "overrides them); batched=False runs the serving path one sequence at a time",
    "mlx_speed(contexts=(600, 8192), decode=D, repetitions=N): measure the module's prefill and decode speed "
    "and memory, both arms interleaved (--mlx-speed on|off overrides)",
    "mlx_server(ref=URL|None, cand=URL|None, key_env=NAME, ref_key_env=NAME, top_k=K): the module's arms served "
    "over HTTP (None: in process; --mlx-ref-server/--mlx-cand-server override); the lever still says what the "
    "served candidate changes, and runs in process for the limits proof",
    "mlx_calibrate(accept_broken='why'): --mlx-calibrate sizes limits for this module's lever even beyond the "
    "quality bounds (a lever that breaks the model), saying so in the suggestion and the record",
)


def pytest_configure(config: pytest.Config) -> None:
    from .config.settings import read_settings
    from .session.state import MlxgateSession

    for line in MARKERS:
        config.addinivalue_line("markers", line)
    state = MlxgateSession(config, read_settings(config))
    config.stash[SESSION_KEY] = state
    for name, plugin in state.plugins().items():  # the session and each concern with hooks (session/state.py)
        config.pluginmanager.register(plugin, name)
    if config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin"):
        config.pluginmanager.register(XdistHooks(state), "mlxgate-xdist")
    state.warn_if_reference_blas()


class XdistHooks:
    """xdist-only hooks; registered only when xdist is loaded, else pytest rejects the unknown hook."""

    def __init__(self, state: MlxgateSession) -> None:
        self.state = state
        self.run_dir: Path | None = None  # the controller's folder for this run (session/workers.py)

    def pytest_configure_node(self, node: Any) -> None:
        """Ship the controller's pinned snapshots (JSON) so workers never resolve or download, and
        the run folder (speed trials' lock, the workers' gate modules)."""
        from .session.workers import RUN_DIR_KEY, make_run_dir

        node.workerinput.update(self.state.worker_payload())
        if self.run_dir is None:
            self.run_dir = make_run_dir()
        node.workerinput[RUN_DIR_KEY] = str(self.run_dir)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Each gate module's tests on one worker (its run built once, its speed timed once)."""
        from .session.workers import make_scheduler

        reporter = config.pluginmanager.getplugin("terminalreporter")
        warn = (lambda text: reporter.write_line(f"mlxgate: {text}")) if reporter is not None else None
        return make_scheduler(config, log, self.run_dir, warn=warn)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """On a worker: tell the controller's scheduler which collected modules are gates."""
        from .session.workers import gate_modules, run_dir_of, write_gate_modules

        workerinput = getattr(config, "workerinput", None)
        run_dir = run_dir_of(workerinput)
        if run_dir is None or workerinput is None:
            return
        try:
            write_gate_modules(run_dir, str(workerinput.get("workerid", "worker")), gate_modules(items))
        except OSError:
            pass  # the scheduler then keeps xdist's own order: slower, never wrong

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        from .session.workers import remove_run_dir

        if not hasattr(self.state.config, "workerinput"):
            remove_run_dir(self.run_dir)
            self.run_dir = None

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The controller collects nothing itself: a worker's node ids tell it what should run."""
        self.state.outcome.collected(ids)

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """What a worker sends back (the --mlx-shard plan it applied)."""
        output = getattr(node, "workeroutput", None)
        if isinstance(output, dict):
            self.state.worker_done(output)


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
def mlx_trained_model(request: pytest.FixtureRequest, mlx_model: tuple[Any, Any]) -> tuple[Any, Any]:
    """`mlx_model`, for tests whose assertions presume a trained model (it answers a question): they
    skip, saying so, when the candidate predicts text no better than chance (random-weight test
    models), unless --mlx-allow-untrained."""
    gate = _state(request).settings.gate
    if gate is None or not gate.allow_untrained:
        from .kl.untrained import untrained_reason_for_prompts

        reason = untrained_reason_for_prompts(*mlx_model)
        if reason is not None:
            pytest.skip(reason.replace("the reference model", "the candidate model"))
    return mlx_model


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
    from .errors import LeverNotApplicableError, MlxgateError

    skip = False
    try:
        value = _state(request).paired(request.node)
    except LeverNotApplicableError as e:
        message, skip = str(e), True
    except MlxgateError as e:
        message = str(e)
    else:
        if value.run.calibrate:
            from .authoring.calibration_run import keep_calibration

            failed = None
            try:  # skips: a calibration run measures and suggests, it gives no verdict; it writes the file
                value.calibrate(keep=keep_calibration)
            except MlxgateError as e:
                failed = str(e)
            if failed is not None:  # outside `except`: no chained tracebacks in the report
                pytest.fail(failed, pytrace=False)
        elif value.run.aa:
            from .authoring.calibration_run import check_before_aa

            check_before_aa(request.node)  # the test's limits against its calibration file, if it has one
        elif value.run.vouch is None:  # once per module: where its limits come from on this model and backend
            from .authoring.proof import limits_proof

            run = value.run
            run.vouch = limits_proof(value, prove=run.prove, require=run.require_proof).vouch
        yield value
        value.finish()
        return
    if skip:
        pytest.skip(message)
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
