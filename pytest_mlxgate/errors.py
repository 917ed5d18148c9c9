"""The errors and warnings mlxgate raises on purpose: each message says what, why, and the fix.

The hub downloader has its own hierarchy (`pytest_mlxgate.hub.HubError`); these cover naming
models and configuring the plugin. The plugin turns `MlxgateUsageError` into `pytest.UsageError`
and the CLI into exit status 2, so the wording lives here once.
"""

from __future__ import annotations

import pytest

__all__ = [
    "MlxgateError",
    "MlxgateUsageError",
    "MlxgateWarning",
    "ModelNameError",
    "ModelUnavailableError",
]


class MlxgateError(Exception):
    """Base of every error mlxgate (outside the hub downloader) raises on purpose."""


class MlxgateUsageError(MlxgateError, ValueError):
    """The user asked for something that cannot work as written (a bad option or config value)."""


class ModelNameError(MlxgateUsageError):
    """A model name is neither a known alias, a valid repo id, nor a local directory."""


class ModelUnavailableError(MlxgateError):
    """A configured model cannot be had (download, build or load failed); the message says why."""


class MlxgateWarning(pytest.PytestWarning):
    """Something makes the gate slow or less trustworthy, but it can still run."""
