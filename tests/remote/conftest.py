"""The embedded model behind real mlx_lm.server processes, shared by the server tests of a worker."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mlx_server import RunningServer, answers_by_its_cache, hub_env, mlx_server


@pytest.fixture(scope="package")
def embedded() -> Path:
    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    return Path(ensure_embedded_snapshot())


@pytest.fixture(scope="package")
def server_pool(embedded: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RunningServer]]:
    """The embedded model behind `mlx_lm server ARGS`, started on first ask (~10 s) and kept until this
    folder's tests are done: one process a setting, whichever tests ask it, as a user's server serves request
    after request. Only for settings whose answers are a function of the prompt (`served`)."""
    logs = tmp_path_factory.mktemp("servers")
    started: dict[tuple[str, ...], RunningServer] = {}
    with contextlib.ExitStack() as stack:

        def serve(*args: str) -> RunningServer:
            if args not in started:
                started[args] = stack.enter_context(mlx_server(embedded, logs, *args, env=hub_env(logs)))
            return started[args]

        yield serve


@pytest.fixture
def served(
    server_pool: Callable[..., RunningServer], embedded: Path, tmp_path: Path
) -> Iterator[Callable[..., RunningServer]]:
    """`served(*ARGS)`: the embedded model behind `mlx_lm server ARGS`. From the pool where its answers are a
    function of the prompt; where they depend on what it has cached (`answers_by_its_cache`: a quantized KV
    cache), a server of this test's own, stopped after it: what another test asked must not change this one's
    verdict. A test that stops its server starts its own (`mlx_server`)."""
    with contextlib.ExitStack() as stack:
        own: dict[tuple[str, ...], RunningServer] = {}

        def serve(*args: str) -> RunningServer:
            if not answers_by_its_cache(args):
                return server_pool(*args)
            if args not in own:
                own[args] = stack.enter_context(mlx_server(embedded, tmp_path, *args, env=hub_env(tmp_path)))
            return own[args]

        yield serve
