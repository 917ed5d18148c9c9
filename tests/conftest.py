"""Fixtures shared by the plugin's own tests: the fake hub on loopback, a fast retry policy, an isolated
HF_* environment and the tiny model. Their helpers live in tests/support/ (on pytest's pythonpath)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore  # noqa: F401  # see below
import pytest
from hypothesis import settings

pytest_plugins = ["pytester"]

# CI runs the same examples every time: a red build is reproducible, never a dice roll.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# httpx imports httpcore lazily (its first transport) and caches httpcore's exception classes at the first
# error it maps. An inline pytester run (runpytest) drops the modules it imported when it ends, so a
# transport first made inside one left httpx mapping a dead httpcore's classes: later tests on that
# process saw raw httpcore errors instead of httpx's. Imported here, httpcore outlives every inline run.

# The tests' models are random-weight: gates run on them (tests of the untrained skip unset this).
os.environ["MLXGATE_ALLOW_UNTRAINED"] = "1"
# Many tests plant failing gates to test reports; explaining each one would multiply their cost by up to 4
# (measured: the suite 9 m 43 s -> 16 m 54 s). The attribution tests ask for it with --mlx-explain-budget.
os.environ["MLXGATE_EXPLAIN_BUDGET"] = "0"
# Most tests' gate modules have no calibration file, so each would first prove its limits (an A/A arm and a
# known-bad arm: about its own KL arms again). The proof's tests ask for it with --mlx-prove auto.
os.environ["MLXGATE_PROVE"] = "off"
# Run on GitHub Actions, the pytester sessions would append to the real job summary and annotate this
# project with their gates; the tests that check those outputs set these variables themselves.
for _var in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def fakehub() -> Iterator[FakeHub]:  # noqa: F821
    """One real HTTP hub (and CDN) on 127.0.0.1 for the whole session; tests add their own repos."""
    from fakehub import FakeHub

    with FakeHub(tree_page_size=3) as hub:
        yield hub


@pytest.fixture
def hub(fakehub: FakeHub) -> FakeHub:  # noqa: F821
    """The session's fake hub with an empty request log and no faults left over."""
    fakehub.reset_log()
    fakehub.clear_faults()
    return fakehub


@pytest.fixture
def hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HfEnv:  # noqa: F821
    """The one isolated HF_* environment: every HF_* variable removed, HF_HOME a fresh folder (no token
    file, no default cache), HF_ENDPOINT refusing connections, not offline (tests/support/hfenv.py).

    Subprocesses started with os.environ inherit it. Modules that need more extend it under the same
    name: `hf_env.on_hub(hub)` (HF_ENDPOINT the fake hub, HF_HUB_CACHE a fresh folder) and
    `hf_env.huggingface_hub(xet=...)` (the real huggingface_hub, quiet, its constants patched)."""
    from hfenv import HfEnv

    return HfEnv.isolate(monkeypatch, tmp_path)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "hub-cache"


@pytest.fixture
def fast_policy() -> RetryPolicy:  # noqa: F821
    """Real retry logic with sleeps short enough for tests."""
    from pytest_mlxgate.hub.transport import RetryPolicy

    return RetryPolicy(
        backoff_base=0.01,
        backoff_max=0.05,
        max_retry_after=0.05,
        stall_window=0.5,
        min_bytes_per_window=4096,
        connect_timeout=2.0,
        workers=4,
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama (real mlx_lm model, real tokenizer) that loads in milliseconds."""
    from tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_kv_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with head_dim 64, so its KV cache quantizes at every group size (32/64/128)."""
    from tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-kv-model"), head_dim=64)


@pytest.fixture(scope="session")
def tiny_gemma4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random gemma-4 (mlx_lm's gemma4_text classes: sliding + full layers, KV-shared layers,
    per-layer inputs, softcapping), text-only config form."""
    from tinygemma import build_tiny_gemma4

    return build_tiny_gemma4(tmp_path_factory.mktemp("tiny-gemma4"))


@pytest.fixture(scope="session")
def tiny_gemma4_multimodal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny gemma-4 in the multimodal `gemma4` config form (text model under text_config)."""
    from tinygemma import build_tiny_gemma4

    return build_tiny_gemma4(tmp_path_factory.mktemp("tiny-gemma4-mm"), form="multimodal")


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The embedded SmolLM2 tokenizer (ChatML template), as mlx_lm loads it: what the prompt, task
    and rendering tests encode with. tests/models/test_embedded_model.py has its own (the converted one)."""
    from mlx_lm.utils import load_tokenizer

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    return load_tokenizer(ensure_embedded_snapshot())  # type: ignore[no-untyped-call]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (in their own order, then the rest in theirs): under xdist the long
    ones start at once on every worker and the run ends on short ones, instead of a minutes-long
    test starting last and running alone while the other workers idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
