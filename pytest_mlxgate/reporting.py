"""Gate results after the run: the JSON report, the sqlite history and the terminal summary.

Each gate hands the xdist controller one plain record (a JSON-able dict) through its report's
`user_properties`; everything here works on those records. The controller must never import mlx
(nor numpy), so this module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "REPORT_VERSION",
    "SCHEMA_VERSION",
    "ResultsDB",
    "ResultsDBError",
    "RunInfo",
    "format_value",
    "git_state",
    "summary_lines",
    "write_json_report",
]

#: `mlxgate_report` in the JSON report: bump when a reader would misread the new shape.
REPORT_VERSION = 1
#: `PRAGMA user_version` of the results database this code writes.
SCHEMA_VERSION = 1

_GIT_TIMEOUT_S = 5.0
_DB_BUSY_TIMEOUT_S = 60.0


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RunInfo:
    """What one pytest run was: the same for every gate in it, so stored once per row, not per record."""

    run_id: str  # uuid4 hex, made once per run on the controller
    started: str  # ISO-8601 UTC
    code_commit: str | None  # git commit of the code under test; None outside a git checkout
    code_dirty: bool | None
    argv: list[str]
    config: dict[str, Any]  # the run's mlxgate settings
    machine: dict[str, str]  # device, blas, mlx, mlx_lm, python, platform

    @classmethod
    def new(cls, root: Path, *, argv: Sequence[str], config: Mapping[str, Any],
            machine: Mapping[str, str]) -> RunInfo:
        """A fresh run id, the time now and the git state of `root`: what the controller makes once."""
        commit, dirty = git_state(root)
        return cls(run_id=uuid.uuid4().hex, started=_utc_now(), code_commit=commit, code_dirty=dirty,
                   argv=list(argv), config=dict(config), machine=dict(machine))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# git


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the checkout at `root`; (None, None) without git or outside a repo.

    Never raises: a report without a commit beats a run that dies at its very end. `status` runs
    with --no-optional-locks so that it never takes the index lock from a concurrent `git commit`.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, env=env,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=_GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = git("rev-parse", "--verify", "-q", "HEAD")
    commit = (head.strip() or None) if head is not None else None
    status = git("status", "--porcelain")
    dirty = bool(status.strip()) if status is not None else None
    return commit, dirty


# --------------------------------------------------------------------------------------------
# JSON


def _jsonable(value: Any) -> Any:
    """A strict-JSON copy: non-finite floats become null, tuples lists, numpy-like scalars numbers."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)  # a Path or an enum: keep what it says rather than lose the whole report


def _dumps(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(_jsonable(value), allow_nan=False, ensure_ascii=False, indent=indent)


def _nodeid(record: Mapping[str, Any]) -> str:
    return str(record.get("nodeid") or "")


def write_json_report(path: Path, run: RunInfo, records: Sequence[Mapping[str, Any]]) -> None:
    """Write the run's report atomically: readers see the old file or the whole new one, never half.

    Strict JSON (NaN/inf become null) so that any JSON parser, not only Python's, can read it.
    """
    path = Path(path)
    doc = {
        "mlxgate_report": REPORT_VERSION,
        "run": run.to_dict(),
        "gates": sorted(records, key=_nodeid),
    }
    data = (_dumps(doc, indent=2) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600: a report is for everyone who could read the old one
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); best effort where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# sqlite history


class ResultsDBError(Exception):
    """The results database cannot be used as it is; the message says what, why and the fix."""


#: (column, SQL type) after `id`, in table order.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "TEXT NOT NULL"),
    ("time", "TEXT NOT NULL"),
    ("started", "TEXT NOT NULL"),
    ("nodeid", "TEXT NOT NULL"),
    ("gate", "TEXT"),
    ("mode", "TEXT"),
    ("candidate", "TEXT"),
    ("candidate_commit", "TEXT"),
    ("reference_model", "TEXT"),
    ("lever_name", "TEXT"),
    ("lever_kind", "TEXT"),
    ("ref_value", "TEXT"),
    ("cand_value", "TEXT"),
    ("path", "TEXT"),
    ("verdict", "TEXT"),
    ("n_prompts", "INTEGER"),
    ("n_tokens", "INTEGER"),
    ("mean_kl", "REAL"),
    ("mean_kl_lo", "REAL"),
    ("mean_kl_hi", "REAL"),
    ("p99_kl", "REAL"),
    ("max_kl", "REAL"),
    ("same_top", "REAL"),
    ("top1_lo", "REAL"),
    ("ln_ppl_ratio", "REAL"),
    ("reference_source", "TEXT"),
    ("total_s", "REAL"),
    ("code_commit", "TEXT"),
    ("code_dirty", "INTEGER"),
    ("config_json", "TEXT NOT NULL"),
    ("record_json", "TEXT NOT NULL"),
)
_COLUMN_NAMES = tuple(name for name, _ in _COLUMNS)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS quality_runs (id INTEGER PRIMARY KEY, "
    + ", ".join(f"{name} {kind}" for name, kind in _COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS quality_runs_nodeid_time ON quality_runs (nodeid, time)",
)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _real(value: Any) -> float | None:
    """A finite number or None: a string or NaN in a stats field must not poison a numeric column."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    f = _real(value)
    return int(f) if f is not None and f == int(f) else None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else _dumps(value)


def _interval(value: Any, end: int) -> float | None:
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return _real(value[end])
    return None


def _model(value: Any) -> str | None:
    """A model's pinned id (repo@commit), else whatever names it."""
    if isinstance(value, Mapping):
        for key in ("pinned", "repo_id", "name"):
            if value.get(key):
                return str(value[key])
        return None
    return _text(value)


def _row(run: RunInfo, record: Mapping[str, Any]) -> tuple[Any, ...]:
    stats = _map(record.get("stats"))
    lever = _map(record.get("lever"))
    candidate = record.get("candidate")
    sizes = _map(record.get("sizes"))
    n_prompts = stats.get("n_prompts", sizes.get("prompts"))
    values: dict[str, Any] = {
        "run_id": run.run_id,
        "time": _text(record.get("time")) or run.started,
        "started": run.started,
        "nodeid": _nodeid(record),
        "gate": _text(record.get("gate")),
        "mode": _text(record.get("mode")),
        "candidate": _model(candidate),
        "candidate_commit": _text(_map(candidate).get("commit")),
        "reference_model": _model(record.get("reference_model")),
        "lever_name": _text(lever.get("name")),
        "lever_kind": _text(lever.get("kind")),
        "ref_value": _text(lever.get("ref")),
        "cand_value": _text(lever.get("cand")),
        "path": _text(record.get("path", lever.get("path"))),
        "verdict": _text(record.get("verdict")),
        "n_prompts": _int(n_prompts),
        "n_tokens": _int(stats.get("n_tokens")),
        "mean_kl": _real(stats.get("mean")),
        "mean_kl_lo": _interval(stats.get("mean_ci"), 0),
        "mean_kl_hi": _interval(stats.get("mean_ci"), 1),
        "p99_kl": _real(stats.get("p99")),
        "max_kl": _real(stats.get("max")),
        "same_top": _real(stats.get("same_top")),
        "top1_lo": _interval(stats.get("top1_ci"), 0),
        "ln_ppl_ratio": _real(stats.get("ln_ppl_ratio")),
        "reference_source": _text(record.get("reference_source")),
        "total_s": _real(_map(record.get("durations")).get("total_s")),
        "code_commit": run.code_commit,
        "code_dirty": None if run.code_dirty is None else int(run.code_dirty),
        "config_json": _dumps({"config": run.config, "machine": run.machine, "argv": run.argv}),
        "record_json": _dumps(record),
    }
    return tuple(values[name] for name in _COLUMN_NAMES)


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction without hiding the error that got us here."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class ResultsDB:
    """Append-only sqlite history of gate results (table quality_runs).

    One connection per call, so an instance can be shared between threads and never holds the
    file open between runs. Writes take the lock up front (BEGIN IMMEDIATE) and wait on a busy
    timeout, so two runs appending at once both land instead of one failing with "locked".
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            if self._version(conn) == SCHEMA_VERSION:
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = self._version(conn)  # again, under the lock: another run may have created it
                if version == 0:
                    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'quality_runs'").fetchone():
                        raise ResultsDBError(
                            f"the results database {self.path} has a quality_runs table but no "
                            f"schema version: another program made it, and mlxgate will not guess "
                            f"its columns. mlxgate left it untouched; point the results option at "
                            f"another file")
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=_DB_BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise ResultsDBError(f"cannot open the results database {self.path}: {e}") from e
        try:
            yield conn
        except sqlite3.DatabaseError as e:
            raise ResultsDBError(
                f"the results database {self.path} is unusable: {e}. mlxgate left it as it was; "
                f"point the results option at another file, or move this one aside") from e
        finally:
            conn.close()

    def _version(self, conn: sqlite3.Connection) -> int:
        """The schema version; refuses (before writing anything) a file from a newer mlxgate."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version not in (0, SCHEMA_VERSION):
            raise ResultsDBError(
                f"the results database {self.path} has schema version {version}, but this mlxgate "
                f"knows only version {SCHEMA_VERSION}: it was written by a newer (or another) "
                f"program, and writing to it could corrupt its history. mlxgate left it untouched; "
                f"upgrade pytest-mlxgate, or point the results option at another file")
        return version

    def append(self, run: RunInfo, records: Sequence[Mapping[str, Any]]) -> int:
        """Add one row per record, all in one transaction; returns the number of rows written."""
        rows = [_row(run, record) for record in records]
        if not rows:
            return 0
        placeholders = ", ".join("?" for _ in _COLUMN_NAMES)
        sql = f"INSERT INTO quality_runs ({', '.join(_COLUMN_NAMES)}) VALUES ({placeholders})"
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self._version(conn) != SCHEMA_VERSION:
                    raise ResultsDBError(
                        f"the results database {self.path} lost its quality_runs table (schema "
                        f"version 0) since it was opened: something else rewrote the file")
                conn.executemany(sql, rows)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        return len(rows)

    def rows(self, *, nodeid: str | None = None) -> list[dict[str, Any]]:
        """Stored rows, oldest first (by the record's time, then insertion); one gate's with `nodeid`."""
        sql = f"SELECT id, {', '.join(_COLUMN_NAMES)} FROM quality_runs"
        params: tuple[str, ...] = ()
        if nodeid is not None:
            sql += " WHERE nodeid = ?"
            params = (nodeid,)
        sql += " ORDER BY time, id"
        with self._connect() as conn:
            self._version(conn)
            conn.row_factory = sqlite3.Row
            out = [dict(row) for row in conn.execute(sql, params)]
        for row in out:
            if row["code_dirty"] is not None:
                row["code_dirty"] = bool(row["code_dirty"])
        return out


# --------------------------------------------------------------------------------------------
# terminal summary

_PERCENT_KEYS = frozenset({"top1", "same_top", "top1_lo", "same_top_lo"})
_KL_KEYS = frozenset({"mean", "median", "p90", "p95", "p99", "p999", "max"})
_SIGNED_KEYS = frozenset({"ln_ppl_ratio", "delta_p"})
_COUNT_KEYS = frozenset({"n_prompts", "n_tokens", "flips", "near_tie_flips", "near_ties"})

_DASH = "—"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _percent(v: float) -> str:
    """One decimal, more where rounding would say 100% (or 0%) of something that is not."""
    pct = v * 100
    digits = 1
    while digits < 4 and 0 < v < 1 and round(pct, digits) in (0.0, 100.0):
        digits += 1
    return f"{pct:.{digits}f}%"


def _is_kl(key: str) -> bool:
    return key in _KL_KEYS or "kl" in key.lower()


def format_value(metric_key: str, value: Any) -> str:
    """A metric's value for the summary: KL in scientific form, top-1 agreement in percent."""
    v = _number(value)
    if v is None:
        return _DASH
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "inf"
    if metric_key in _PERCENT_KEYS:
        return _percent(v)
    if metric_key in _COUNT_KEYS and v == int(v):
        return str(int(v))
    if metric_key in _SIGNED_KEYS or metric_key.startswith("delta_p"):
        return "0" if v == 0 else f"{v:+.1e}"
    if _is_kl(metric_key):
        return "0" if v == 0 else f"{v:.1e}"
    return f"{v:.3g}"


def _format_limit(key: str, value: Any) -> str:
    """A limit is a number somebody typed: `1e-03`, not `1.0e-03` (which claims a measured digit)."""
    text = format_value(key, value)
    v = _number(value)
    if v is None or not math.isfinite(v) or key in _PERCENT_KEYS or "e" not in text:
        return text
    mantissa, exponent = f"{v:.2e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


def _format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


_Row = tuple[str, str, str, str, str]  # metric, value, bound, limit, verdict


def _bound(direction: Any, key: str, value: Any) -> str:
    text = format_value(key, value)
    if text == _DASH:
        return text
    sign = {"max": "≤ ", "min": "≥ "}.get(str(direction), "")
    return sign + text


def _check_rows(checks: Sequence[Any]) -> list[_Row]:
    rows: list[_Row] = []
    for check in checks:
        c = _map(check)
        key = str(c.get("key") or "")
        metric = str(c.get("metric") or key or _DASH)
        passed = c.get("passed")
        verdict = "pass" if passed is True else "FAIL" if passed is False else _DASH
        rows.append((metric, format_value(key, c.get("value")), _bound(c.get("direction"), key, c.get("bound")),
                     _format_limit(key, c.get("limit")), verdict))
    return rows


def _measured_rows(stats: Mapping[str, Any], verdict: str) -> list[_Row]:
    """Without checks: what the gate measured, with the CI side a bound would use."""
    qci = _map(stats.get("quantile_ci"))
    spec = (
        ("mean KL", "mean", "max", _interval(stats.get("mean_ci"), 1)),
        ("p99 KL", "p99", "max", _interval(qci.get("p99"), 1)),
        ("max KL", "max", "max", None),
        ("same-top", "same_top", "min", _interval(stats.get("same_top_ci"), 0)),
    )
    return [(metric, format_value(key, stats.get(key)), _bound(direction, key, bound), _DASH, verdict)
            for metric, key, direction, bound in spec if key in stats]


def _floor_rows(aa: Mapping[str, Any]) -> list[_Row]:
    floors = _map(aa.get("floors"))
    order = [k for k in ("mean", "p99", "max") if k in floors] + sorted(k for k in floors
                                                                       if k not in ("mean", "p99", "max"))
    names = {"mean": "mean KL", "p99": "p99 KL", "max": "max KL"}
    return [(names.get(k, str(k)), format_value(k, floors[k]), _DASH, _DASH, "floor") for k in order]


def _score_pair(d: Mapping[str, Any]) -> str:
    """`ref% → cand%` for the Capability Score rows."""
    ref, cand = _real(d.get("reference")), _real(d.get("candidate"))
    return f"{_pct_or_dash(ref)} → {_pct_or_dash(cand)}"


def _pct_or_dash(x: float | None) -> str:
    return _DASH if x is None else f"{100 * x:.1f}%"


def _verdict_label(verdict: Any) -> str:
    v = str(verdict or "")
    return {"fail": "FAIL", "error": "ERROR", "pass": "pass", "measured": "measured"}.get(v, v or _DASH)


def _gate_rows(record: Mapping[str, Any]) -> list[_Row]:
    stats = _map(record.get("stats"))
    checks = record.get("checks")
    verdict = record.get("verdict")
    rows: list[_Row]
    has_checks = isinstance(checks, Sequence) and not isinstance(checks, str) and bool(checks)
    if record.get("mode") == "score":
        score = _map(record.get("capability_score"))
        rows = [(str(t), _score_pair(_map(v)), _DASH, _DASH, "ran") for t, v in _map(score.get("tasks")).items()]
        rows.append(("score", _score_pair(score), _DASH, _DASH, "partial" if score.get("partial") else "complete"))
    elif record.get("mode") == "aa" and has_checks:
        # A/A with limits: each limit against the noise floor it must sit above
        rows = [(m, v, _DASH, lim, "above floor" if verdict_ == "pass" else verdict_)
                for m, v, _, lim, verdict_ in _check_rows(checks)]  # type: ignore[arg-type]
    elif record.get("mode") == "aa":
        rows = _floor_rows(_map(record.get("aa")))
    elif isinstance(checks, Sequence) and not isinstance(checks, str) and checks:
        rows = _check_rows(checks)
    else:
        rows = _measured_rows(stats, _verdict_label(verdict or "measured"))
    if verdict in ("fail", "error") and not any(r[4] in ("FAIL", "ERROR") for r in rows):
        rows.append(("verdict", _DASH, _DASH, _DASH, _verdict_label(verdict)))  # never show all-pass
    if not rows:
        rows.append((_DASH, _DASH, _DASH, _DASH, _verdict_label(verdict)))
    return rows


def _n_parts(record: Mapping[str, Any]) -> list[str]:
    stats = _map(record.get("stats"))
    sizes = _map(record.get("sizes"))
    parts: list[str] = []
    n_prompts = _int(stats.get("n_prompts", sizes.get("prompts")))
    if n_prompts is not None:
        parts.append(f"{n_prompts} prompts")
    n_tokens = _int(stats.get("n_tokens"))
    if n_tokens is not None:
        parts.append(f"{n_tokens} tokens")
    if record.get("reference_source"):
        parts.append(f"ref: {record['reference_source']}")
    total = _real(_map(record.get("durations")).get("total_s"))
    if total is not None:
        parts.append(_format_duration(total))
    return parts


def _pack(parts: Sequence[str], width: int, sep: str = " · ") -> list[str]:
    """Join parts into lines of at most `width`, breaking only between parts (clipping a lone giant)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(_clip(part, width))
    return lines


def _truncate(text: str, width: int) -> str:
    """Shorten a gate name from the middle, keeping the test name after the last `::` whole when it fits.

    The test name (with any [param]) tells gates apart; the module prefix is context.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    keep = width - 1  # characters kept around the "…"
    head = keep // 3
    _, sep, func = text.rpartition("::")
    if sep and len(func) <= keep:
        head = min(head, keep - len(func))  # the tail keeps at least the whole test name
    return text[:head] + "…" + text[len(text) - (keep - head):]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


_GAP = "  "
_MIN_GATE_WIDTH = 12


def summary_lines(records: Sequence[Mapping[str, Any]], *, width: int = 120) -> list[str]:
    """The controller's end-of-run table: a header, then one block per gate, columns aligned."""
    confidences = {_real(_map(r.get("stats")).get("confidence")) for r in records} - {None}
    bound_title = "bound"
    if len(confidences) == 1:
        (c,) = confidences
        assert c is not None
        bound_title = f"{c * 100:g}% bound"
    header: tuple[str, str, str, str, str, str] = ("gate", "metric", "value", bound_title, "limit", "verdict")

    blocks: list[tuple[str, list[_Row], list[str]]] = []
    for record in sorted(records, key=_nodeid):
        name = str(record.get("gate") or record.get("nodeid") or _DASH)
        blocks.append((name, _gate_rows(record), _n_parts(record)))

    cols = [[row[i] for _, rows, _ in blocks for row in rows] for i in range(5)]
    widths = [max([len(header[i + 1])] + [len(v) for v in cols[i]]) for i in range(5)]
    widths[0] = max(widths[0], len("n"))
    rest = sum(widths) + len(_GAP) * 5
    gate_width = max([len(header[0])] + [len(name) for name, _, _ in blocks])
    gate_width = min(gate_width, max(_MIN_GATE_WIDTH, width - rest))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells, [gate_width, *widths])]
        return _GAP.join(padded).rstrip()

    lines = [line(header)]
    detail_start = gate_width + len(_GAP) + widths[0] + len(_GAP)
    for name, rows, n_parts in blocks:
        for i, row in enumerate(rows):
            lines.append(line((_truncate(name, gate_width) if i == 0 else "", *row)))
        for i, detail in enumerate(_pack(n_parts, max(len(_DASH), width - detail_start))):
            lines.append(line(("", "n" if i == 0 else "", detail)))
    return lines
