"""Which process of the run this one is: the xdist controller or a worker, one rank of an mlx.launch job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Process"]


@dataclass(frozen=True, eq=False)
class Process:
    """Only `workerinput` says "worker"; only rank 0 of an mlx.launch job prints and writes."""

    workerinput: dict[str, Any] | None  # an xdist worker's: what the controller shipped down (None elsewhere)
    rank: int | None  # this process's rank in an mlx.launch job (None: a plain run)

    @property
    def is_worker(self) -> bool:
        return self.workerinput is not None

    @property
    def is_quiet_rank(self) -> bool:
        """A rank other than 0 of an mlx.launch job: it runs its share of the items, prints and writes nothing."""
        return self.rank is not None and self.rank != 0
