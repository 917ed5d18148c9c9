"""Where this run keeps the reference arms' cache: --mlx-reference-cache, else pytest's cache, else off."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from ..config.settings import GateSettings
from ..errors import MlxgateWarning

__all__ = ["ReferenceCacheDir"]


class ReferenceCacheDir:
    """The reference cache's folder, checked once: one that cannot be written is warned about once, with the
    fix (reference arms are then computed every run; the verdicts are the same)."""

    def __init__(self, config: pytest.Config, gate: GateSettings) -> None:
        self.config = config
        self.gate = gate
        self._failed = False

    def plan(self) -> tuple[Path | None, str | None]:
        """(directory, why it is off): --mlx-reference-cache, else pytest's cache, else off."""
        if self.gate.reference_cache_off:
            return None, "--mlx-reference-cache off"
        if self.gate.reference_cache is not None:
            return self.gate.reference_cache, None
        cache = getattr(self.config, "cache", None)  # None under -p no:cacheprovider
        if cache is None:
            return None, "pytest's cacheprovider is disabled; --mlx-reference-cache DIR keeps one"
        return Path(cache._cachedir) / "d" / "mlxgate-reference", None

    def usable(self) -> Path | None:
        """The usable directory, or None: off, or neither writable nor readable."""
        directory, _ = self.plan()
        if directory is None or self._failed:
            return None
        try:
            cache = getattr(self.config, "cache", None)
            if self.gate.reference_cache is None and cache is not None:
                directory = Path(cache.mkdir("mlxgate-reference"))  # pytest's own: its .gitignore comes too
            else:
                directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._failed = True
            readable = directory.is_dir()
            warnings.warn(
                MlxgateWarning(
                    f"reference cache {directory} is not writable ({e.strerror or e}): "
                    + (
                        "its entries are still read, new ones are not stored. "
                        if readable
                        else "reference arms are computed every run. "
                    )
                    + "Fix: --mlx-reference-cache DIR (a writable directory), or --mlx-reference-cache off"
                ),
                stacklevel=2,
            )
            return directory if readable else None
        return directory
