"""The pieces every section of the HTML report (`html_report`) is built from: the sizes it caps its
plots and texts at, a figure, a verdict badge, a record's limits. Standard library only."""

from __future__ import annotations

from .model import Record
from .svg import esc

#: The runs of a gate a sparkline shows: the latest, oldest first.
HISTORY_RUNS = 30
#: A plot draws at most this many points per series, whatever a record holds (records cap theirs too).
MAX_POINTS = 256
#: Flipped capability items shown per task.
MAX_FLIPPED_SHOWN = 20
TEXT_CHARS = 1201  # a prompt or an output shown: 1200 characters and an ellipsis where clipped
NOT_RECORDED = "not recorded (a record from before this plot's data was kept)"


def figure(name: str, caption: str, svg: str) -> str:
    return f'<figure class="plot" data-plot="{esc(name)}">{svg}<figcaption>{caption}</figcaption></figure>'


_LABEL = {"fail": "FAIL", "error": "ERROR", "inconclusive": "INCONCLUSIVE", "pass": "pass", "skipped": "skipped"}


def verdict_badge(verdict: str | None) -> str:
    v = verdict or "measured"
    return f'<span class="badge v-{esc(v)}">{esc(_LABEL.get(v, v))}</span>'


def limits_of(record: Record, *keys: str) -> list[tuple[str, float]]:
    """(metric, limit) of the record's checks on these keys."""
    return [(c.metric or str(c.key), c.limit) for c in record.checks if str(c.key) in keys and c.limit is not None]
