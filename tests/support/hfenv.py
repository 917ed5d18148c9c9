"""The isolated HF_* environment behind the `hf_env` fixture (tests/conftest.py).

One place says what "isolated" means: every HF_* variable (and TRANSFORMERS_OFFLINE) removed, HF_HOME a
fresh empty folder (no token file, no default cache), HF_ENDPOINT the discard port on loopback (so a call
that lost its endpoint fails here instead of reaching the internet), not offline. Subprocesses started
with the test's os.environ inherit it. The two views some tests need on top of that are methods.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

NO_HUB = "http://127.0.0.1:9"  # discard port on loopback: connection refused


@dataclass(frozen=True)
class HfEnv:
    home: Path  # HF_HOME: exists only once a test creates it (e.g. to put a token file in it)
    cache: Path  # where `on_hub` points HF_HUB_CACHE; unset until then
    monkeypatch: pytest.MonkeyPatch

    @classmethod
    def isolate(cls, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HfEnv:
        for var in [v for v in os.environ if v.startswith("HF_")] + ["TRANSFORMERS_OFFLINE"]:
            monkeypatch.delenv(var, raising=False)
        env = cls(home=tmp_path / "hf-home", cache=tmp_path / "env-cache", monkeypatch=monkeypatch)
        monkeypatch.setenv("HF_HOME", str(env.home))
        monkeypatch.setenv("HF_ENDPOINT", NO_HUB)
        return env

    def on_hub(self, hub: Any) -> Path:
        """HF_ENDPOINT is the fake hub, HF_HUB_CACHE a fresh folder (returned): the environment layer
        alone now finds the hub and the cache, for code (and inner pytest runs) given neither."""
        self.monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        self.monkeypatch.setenv("HF_HUB_CACHE", str(self.cache))
        return self.cache

    def huggingface_hub(self, *, xet: bool) -> ModuleType:
        """The real huggingface_hub, quiet, online and token-free (xet off unless `xet`), whatever was
        imported before: it reads its environment once, at import, so its constants are patched too.
        Endpoint, cache dir and token are always passed to its functions explicitly."""
        mp = self.monkeypatch
        quiet = {
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
        }
        for k, v in {**quiet, **({} if xet else {"HF_HUB_DISABLE_XET": "1"})}.items():
            mp.setenv(k, v)
        hf: ModuleType = pytest.importorskip("huggingface_hub")
        from huggingface_hub import constants

        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", not xet)
        mp.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        mp.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        mp.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
        # utils/tqdm.py did `from ..constants import HF_HUB_DISABLE_PROGRESS_BARS` at import time.
        mp.setattr(importlib.import_module("huggingface_hub.utils.tqdm"), "HF_HUB_DISABLE_PROGRESS_BARS", True)
        return hf
