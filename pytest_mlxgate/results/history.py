"""The results history: an append-only sqlite table (quality_runs), one row per gate per run.

A row keeps its whole record (record_json) and its whole run (the run columns and config_json), so a
run's JSON report, summary or HTML can be made again from the history alone (`mlxgate report`).

A DB another process holds is waited on for DB_BUSY_TIMEOUT_S (said in the message), not a minute;
then `ResultsDBLocked`. The run's rows are not lost: `queue_pending` appends them to `<db>.pending.jsonl`
beside it, and the next `append` that can open the DB adds them in its own transaction.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fields import dumps

if TYPE_CHECKING:
    from .model import Record
    from .record_speed import SpeedContext
    from .records import RunInfo

__all__ = [
    "DB_BUSY_TIMEOUT_S",
    "PENDING_SUFFIX",
    "SCHEMA_VERSION",
    "ResultsDB",
    "ResultsDBError",
    "ResultsDBLocked",
    "lock_holder",
    "pending_path",
    "queue_pending",
    "record_of",
    "run_of",
]

#: `PRAGMA user_version` of the results database this code writes. Version 2 added the speed
#: columns; a version-1 file gains them (ALTER TABLE ADD COLUMN: existing rows keep every value).
SCHEMA_VERSION = 2
#: How long one access waits for a results DB another process holds (sqlite's busy timeout), in seconds.
DB_BUSY_TIMEOUT_S = 5.0
#: The rows a run could not add to a locked DB wait in `<db>` + this, one JSON line per run.
PENDING_SUFFIX = ".pending.jsonl"
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


class ResultsDBError(Exception):
    """The results database cannot be used as it is; the message says what, why and the fix."""


class ResultsDBLocked(ResultsDBError):
    """Another process held the results DB longer than the busy timeout; it is not broken."""

    def __init__(self, path: Path, timeout: float, holder: int | None) -> None:
        self.path, self.timeout, self.holder = Path(path), timeout, holder
        who = f"another process (PID {holder})" if holder is not None else "another process (another run)"
        super().__init__(f"the results database {path} is locked by {who}; waited {timeout:g} s")


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
#: Added in version 2: speed and memory at the longest measured context (candidate / reference).
_SPEED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("speed_context", "INTEGER"),
    ("prefill_ratio", "REAL"),
    ("decode_ratio", "REAL"),
    ("decode_ratio_lo", "REAL"),
    ("decode_ratio_hi", "REAL"),
    ("ref_decode_tps", "REAL"),
    ("cand_decode_tps", "REAL"),
    ("peak_ratio", "REAL"),
    ("ref_kv_bytes", "INTEGER"),
    ("cand_kv_bytes", "INTEGER"),
)
_COLUMNS = _COLUMNS + _SPEED_COLUMNS
_COLUMN_NAMES = tuple(name for name, _ in _COLUMNS)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS quality_runs (id INTEGER PRIMARY KEY, "
    + ", ".join(f"{name} {kind}" for name, kind in _COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS quality_runs_nodeid_time ON quality_runs (nodeid, time)",
)


def _row(run: RunInfo, r: Record) -> tuple[Any, ...]:
    stats, lever = r.stats, r.lever
    values: dict[str, Any] = {
        "run_id": run.run_id,
        "time": r.time or run.started,
        "started": run.started,
        "nodeid": r.nodeid,
        "gate": r.gate,
        "mode": r.mode,
        "candidate": r.candidate.label if r.candidate else None,
        "candidate_commit": r.candidate.commit if r.candidate else None,
        "reference_model": r.reference_model.label if r.reference_model else None,
        "lever_name": lever.name,
        "lever_kind": lever.kind,
        "ref_value": lever.ref,
        "cand_value": lever.cand,
        "path": r.path if r.path is not None else lever.path,
        "verdict": r.verdict,
        "n_prompts": r.n_prompts,
        "n_tokens": stats.n_tokens,
        "mean_kl": stats.mean,
        "mean_kl_lo": stats.mean_ci.lower,
        "mean_kl_hi": stats.mean_ci.upper,
        "p99_kl": stats.p99,
        "max_kl": stats.max,
        "same_top": stats.same_top,
        "top1_lo": stats.top1_ci.lower,
        "ln_ppl_ratio": stats.ln_ppl_ratio,
        "reference_source": r.reference_source,
        "total_s": r.total_s,
        "code_commit": run.code_commit,
        "code_dirty": None if run.code_dirty is None else int(run.code_dirty),
        "config_json": dumps({"config": run.config, "machine": run.machine, "argv": run.argv}),
        "record_json": dumps(r.to_json()),
        **_speed_values(r.speed.longest if r.speed is not None else None),
    }
    return tuple(values[name] for name in _COLUMN_NAMES)


def _speed_values(ctx: SpeedContext | None) -> dict[str, Any]:
    """The speed columns: the longest measured context's figures (None without one)."""
    if ctx is None:
        return {name: None for name, _ in _SPEED_COLUMNS}
    from .record_speed import Ratio

    decode = ctx.decode or Ratio()
    return {
        "speed_context": ctx.length,
        "prefill_ratio": ctx.prefill.ratio if ctx.prefill else None,
        "decode_ratio": decode.ratio,
        "decode_ratio_lo": decode.ci.lower,
        "decode_ratio_hi": decode.ci.upper,
        "ref_decode_tps": ctx.reference.decode_tps,
        "cand_decode_tps": ctx.candidate.decode_tps,
        "peak_ratio": ctx.peak.ratio if ctx.peak else None,
        "ref_kv_bytes": ctx.reference.kv_bytes,
        "cand_kv_bytes": ctx.candidate.kv_bytes,
    }


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction without hiding the error that got us here."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class ResultsDB:
    """Append-only sqlite history of gate results (table quality_runs).

    One connection per call, so an instance can be shared between threads and never holds the
    file open between runs. Writes take the lock up front (BEGIN IMMEDIATE) and wait on a short
    busy timeout (`timeout`, DB_BUSY_TIMEOUT_S), so two runs appending at once both land; a lock
    held longer raises `ResultsDBLocked`. `append` also adds the rows queued beside the DB by runs
    that found it locked (`pending_merged` counts them).
    """

    def __init__(self, path: Path, *, timeout: float = DB_BUSY_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.timeout = float(timeout)
        self.pending_merged = 0  # rows of earlier runs (queued beside the DB) the last append added
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
                            f"another file"
                        )
                    for statement in _SCHEMA:
                        conn.execute(statement)
                elif version == 1:
                    for name, kind in _SPEED_COLUMNS:
                        conn.execute(f"ALTER TABLE quality_runs ADD COLUMN {name} {kind}")
                if version in (0, 1):
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise ResultsDBError(f"cannot open the results database {self.path}: {e}") from e
        try:
            yield conn
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorcode", None) in (_SQLITE_BUSY, _SQLITE_LOCKED):
                raise ResultsDBLocked(self.path, self.timeout, lock_holder(self.path)) from e
            raise ResultsDBError(
                f"the results database {self.path} is unusable: {e}. mlxgate left it as it was; "
                f"point the results option at another file, or move this one aside"
            ) from e
        except sqlite3.DatabaseError as e:
            raise ResultsDBError(
                f"the results database {self.path} is unusable: {e}. mlxgate left it as it was; "
                f"point the results option at another file, or move this one aside"
            ) from e
        finally:
            conn.close()

    def _version(self, conn: sqlite3.Connection) -> int:
        """The schema version; refuses (before writing anything) a file from a newer mlxgate."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version not in (0, 1, SCHEMA_VERSION):
            raise ResultsDBError(
                f"the results database {self.path} has schema version {version}, but this mlxgate "
                f"knows only versions up to {SCHEMA_VERSION}: it was written by a newer (or another) "
                f"program, and writing to it could corrupt its history. mlxgate left it untouched; "
                f"upgrade pytest-mlxgate, or point the results option at another file"
            )
        return version

    def _require_current(self, conn: sqlite3.Connection) -> None:
        """The file is still the one opened: another program may have replaced it since."""
        version = self._version(conn)
        if version != SCHEMA_VERSION:
            raise ResultsDBError(
                f"the results database {self.path} has schema version {version} now, not {SCHEMA_VERSION} as "
                f"when it was opened: something else rewrote the file. mlxgate left it untouched"
            )

    def append(self, run: RunInfo, records: Sequence[Record]) -> int:
        """Add one row per record, all in one transaction (with the rows queued beside the DB by runs
        that found it locked, `pending_merged`); returns the number of this run's rows written."""
        rows = [_row(run, record) for record in records]
        self.pending_merged = 0
        if not rows:
            return 0
        placeholders = ", ".join("?" for _ in _COLUMN_NAMES)
        sql = f"INSERT INTO quality_runs ({', '.join(_COLUMN_NAMES)}) VALUES ({placeholders})"
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._require_current(conn)
                with _pending_taken(pending_path(self.path)) as queued:
                    earlier = [
                        row
                        for q_run, q_records in queued
                        if not self._has_run(conn, q_run.run_id)
                        for row in (_row(q_run, r) for r in q_records)
                    ]
                    conn.executemany(sql, earlier + rows)
                    conn.execute("COMMIT")  # inside: the queue is emptied only once its rows are in
                self.pending_merged = len(earlier)
            except BaseException:
                _rollback(conn)
                raise
        return len(rows)

    @staticmethod
    def _has_run(conn: sqlite3.Connection, run_id: str) -> bool:
        """A queued run already in the DB (merged, then the queue could not be emptied): not added twice."""
        return conn.execute("SELECT 1 FROM quality_runs WHERE run_id = ? LIMIT 1", (run_id,)).fetchone() is not None

    def rows(
        self, *, nodeid: str | None = None, run_id: str | None = None, columns: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Stored rows, oldest first (by the record's time, then insertion); one gate's with `nodeid`,
        one run's with `run_id`; only `columns` (and `id`) when given."""
        wanted = _COLUMN_NAMES if columns is None else tuple(columns)
        unknown = set(wanted) - set(_COLUMN_NAMES)
        if unknown:
            raise ValueError(f"not quality_runs columns: {sorted(unknown)}")
        sql = f"SELECT id, {', '.join(wanted)} FROM quality_runs"
        where = [(name, value) for name, value in (("nodeid", nodeid), ("run_id", run_id)) if value is not None]
        if where:
            sql += " WHERE " + " AND ".join(f"{name} = ?" for name, _ in where)
        sql += " ORDER BY time, id"
        with self._connect() as conn:
            self._require_current(conn)
            conn.row_factory = sqlite3.Row
            out = [dict(row) for row in conn.execute(sql, tuple(value for _, value in where))]
        for row in out:
            if "code_dirty" in row and row["code_dirty"] is not None:
                row["code_dirty"] = bool(row["code_dirty"])
        return out

    def runs(self) -> list[dict[str, Any]]:
        """One entry per run, oldest first (by its start, then its first row): `run_id`, `started`,
        `code_commit`, `code_dirty`, `gates` (its row count)."""
        sql = (
            "SELECT run_id, MIN(started) AS started, MIN(code_commit) AS code_commit, MAX(code_dirty) AS "
            "code_dirty, COUNT(*) AS gates, MIN(id) AS first FROM quality_runs GROUP BY run_id "
            "ORDER BY started, first"
        )
        with self._connect() as conn:
            self._require_current(conn)
            conn.row_factory = sqlite3.Row
            out = [dict(row) for row in conn.execute(sql)]
        for row in out:
            row["code_dirty"] = None if row["code_dirty"] is None else bool(row["code_dirty"])
            del row["first"]
        return out


def pending_path(db: Path) -> Path:
    """Where the rows wait that a run could not add to the locked DB `db`: `<db>.pending.jsonl`."""
    db = Path(db)
    return db.with_name(db.name + PENDING_SUFFIX)


def lock_holder(db: Path) -> int | None:
    """The PID of another process holding a lock on `db`, from Linux's /proc/locks; None elsewhere or unknown."""
    try:
        st = os.stat(db)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # `1: POSIX  ADVISORY  WRITE 12345 fe:00:2146406 0 EOF`; a blocked waiter's line has "->" first
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == ident and fields[4].isdigit():
            pid = int(fields[4])
            if pid not in (0, os.getpid()):
                return pid
    return None


def queue_pending(db: Path, run: RunInfo, records: Sequence[Record]) -> Path:
    """Append the run's records to `<db>.pending.jsonl` (one line, under an exclusive file lock); the next
    append to the DB that gets its lock adds them. Returns the file. OSError when it cannot be written."""
    import fcntl

    path = pending_path(db)
    line = (dumps({"run": run.to_dict(), "records": [r.to_json() for r in records]}) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not the file a merge just took and removed: write into the one that is there
                os.write(fd, line)
                os.fsync(fd)
                return path
        finally:
            os.close(fd)


@contextlib.contextmanager
def _pending_taken(path: Path) -> Iterator[list[tuple[RunInfo, list[Record]]]]:
    """The queued runs, under the queue's exclusive lock; removed when the body (which commits them) ends
    without an error. A line that cannot be read stays in the file, never dropped."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        yield []
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        queued, kept = [], []
        for raw in data.splitlines():
            entry = _queued_run(raw)
            if entry is None:
                if raw.strip():
                    kept.append(raw)
            else:
                queued.append(entry)
        yield queued
        if kept:  # unreadable lines stay for a person to look at
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"\n".join(kept) + b"\n", 0)
        else:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _queued_run(raw: bytes) -> tuple[RunInfo, list[Record]] | None:
    from .runs import pending_entry

    return pending_entry(raw)


def run_of(row: Mapping[str, Any]) -> RunInfo:
    """The run a stored row belongs to, whole: every field of RunInfo is kept (columns and config_json)."""
    from .runs import row_run

    return row_run(row)


def record_of(row: Mapping[str, Any]) -> Record | None:
    """The record a row stores whole (record_json); None where it cannot be read."""
    from .runs import stored_record

    return stored_record(row)
