"""`mlxgate history | compare | report | merge`: the results history and JSON reports, read from the shell.

A RUN is a run id (or a unique prefix of one), `latest`, `latest~N` (N runs before it) from the results
DB, or the path of a JSON report (--mlx-report). A GATE is a node id, or the end of one after a `/` or
`::` (`test_kv.py::test_drift`, `test_drift`, `test_kv.py`), or a gate's name as the summary shows it.
The DB is the plugin's default (.mlxgate/results.sqlite under the rootdir pytest would use here)
unless --db says otherwise.

Exit status, for scripts: 0 ok; 1 the answer is a failure where that is the question (compare: a
gate went from pass to fail or error; merge: the merged run has a failing or erroring gate, a gate
with a verdict mlxgate does not know, a planned module without a record, or an interrupted shard);
2 bad usage, or nothing to read (no DB, no such run or gate, reports that cannot be merged).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .results.history_text import (
    Source,
    commit_text,
    compare_lines,
    history_lines,
    short_run_id,
    when_text,
)
from .results.model import Record
from .results.records import RunInfo
from .results.runs import run_facts

__all__ = [
    "COMMANDS",
    "CliError",
    "EXIT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_parsers",
    "main",
    "match_gates",
    "resolve_run",
]

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
#: Runs per gate `mlxgate history` shows unless --last says otherwise.
DEFAULT_LAST = 20


class CliError(Exception):
    """What to tell the user (exit 2): what was wrong and what to type instead."""


# --- where results come from -----------------------------------------------------------------------


def _db_path(given: Path | None) -> Path:
    if given is not None:
        return given
    from .config.settings import default_db, find_rootdir

    return default_db(find_rootdir(Path.cwd()))


def _open_db(given: Path | None) -> Any:
    from .results.history import ResultsDB, ResultsDBError

    path = _db_path(given)
    if not path.is_file():
        where = "--db" if given is not None else "the default: .mlxgate/results.sqlite under pytest's rootdir here"
        raise CliError(
            f"no results history at {path} ({where}); run the gates first (pytest gates/), or pass "
            "--db PATH (the file --mlx-db wrote)"
        )
    try:
        return ResultsDB(path)
    except ResultsDBError as e:
        raise CliError(str(e)) from None


def resolve_run(runs: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
    """The run `spec` names among `runs` (oldest first): `latest`, `latest~N`, or a run id prefix."""
    if not runs:
        raise CliError("the results history has no runs yet: run the gates first (pytest gates/)")
    text = spec.strip().lower()
    if text == "latest" or text.startswith("latest~"):
        back_text = text.removeprefix("latest").removeprefix("~") or "0"
        if not back_text.isdigit():
            raise CliError(f"'{spec}' is not a run: write latest, latest~1 (the run before), ... or a run id")
        back = int(back_text)
        if back >= len(runs):
            raise CliError(f"'{spec}': the history holds {len(runs)} run(s), so latest~{len(runs) - 1} is the oldest")
        return runs[len(runs) - 1 - back]
    found = [r for r in runs if str(r["run_id"]).lower().startswith(text)] if text else []
    if len(found) == 1:
        return found[0]
    recent = ", ".join(f"{short_run_id(str(r['run_id']))} ({r['started']})" for r in list(runs)[-5:][::-1])
    if not found:
        raise CliError(f"no run '{spec}' in the results history; the latest: {recent} (mlxgate history lists them)")
    raise CliError(
        f"'{spec}' starts {len(found)} run ids: "
        + ", ".join(short_run_id(str(r["run_id"])) for r in found)
        + "; give more of it"
    )


def _looks_like_report(spec: str) -> bool:
    return spec.endswith(".json") or Path(spec).is_file()


def load_source(spec: str, db: Path | None) -> Source:
    """A run from the DB (id, prefix, latest, latest~N) or from a JSON report's path."""
    if _looks_like_report(spec):
        from .results.merge import MergeError, read_report

        try:
            report = read_report(Path(spec))
        except MergeError as e:
            raise CliError(str(e)) from None
        return Source(spec, report.run, report.gates, report.calibrations)
    from .results.history import record_of, run_of

    results = _open_db(db)
    entry = resolve_run(results.runs(), spec)
    rows = sorted(results.rows(run_id=str(entry["run_id"])), key=lambda r: int(r["id"]))  # in the order written
    records = [r for r in (record_of(row) for row in rows) if r is not None]
    return Source("results DB", run_of(rows[0]), records)


# --- the figures a line shows ----------------------------------------------------------------------


# --- history ---------------------------------------------------------------------------------------


def match_gates(nodeids: Sequence[str], pattern: str, names: Mapping[str, str] | None = None) -> list[str]:
    """The node ids `pattern` names: the whole id, its end after `/` or `::`, its module, or its gate name."""
    p = pattern.strip()
    out = []
    for nodeid in nodeids:
        module = nodeid.split("::", 1)[0]
        if (
            nodeid == p
            or nodeid.endswith(("/" + p, "::" + p))
            or module == p
            or module.endswith("/" + p)
            or (names or {}).get(nodeid) == p
        ):
            out.append(nodeid)
    return out


def _history(args: argparse.Namespace) -> int:
    results = _open_db(args.db)
    columns = ("run_id", "time", "started", "nodeid", "gate", "verdict", "code_commit", "code_dirty", "record_json")
    if args.gate is None:
        rows = results.rows(columns=columns)
    else:
        nodeids: dict[str, str] = {}
        for row in results.rows(columns=("nodeid", "gate")):
            nodeids[str(row["nodeid"])] = str(row["gate"] or "")
        wanted = match_gates(sorted(nodeids), args.gate, nodeids)
        if not wanted:
            known = ", ".join(sorted(nodeids)[:12]) + (" ..." if len(nodeids) > 12 else "")
            raise CliError(
                f"no gate '{args.gate}' in the results history ({_db_path(args.db)}); its gates: "
                f"{known or 'none'}. Give a node id or its end, e.g. test_kv.py::test_drift"
            )
        rows = [row for nodeid in wanted for row in results.rows(nodeid=nodeid, columns=columns)]
    if not rows:
        raise CliError(f"the results history {_db_path(args.db)} has no rows yet: run the gates first")
    for line in history_lines(rows, last=args.last or None):
        print(line)
    return EXIT_OK


# --- compare ---------------------------------------------------------------------------------------


def _compare(args: argparse.Namespace) -> int:
    a, b = load_source(args.run_a, args.db), load_source(args.run_b, args.db)
    lines, regressions = compare_lines(a, b)
    for line in lines:
        print(line)
    return EXIT_FOUND if regressions else EXIT_OK


# --- report and merge ------------------------------------------------------------------------------


def _width() -> int:
    return shutil.get_terminal_size((120, 24)).columns


def _summary(source: Source | None, run: RunInfo, records: Sequence[Record]) -> list[str]:
    from .results.summary import summary_lines

    facts = run_facts(run)
    head = (
        f"mlxgate run {short_run_id(run.run_id)} · started {when_text(run.started)} · commit {commit_text(run)} · "
        f"{len(records)} gate record(s)"
        + (f" · shard {facts.shard.name}" if facts.shard else "")
        + (f" · merged from {facts.merged_from} reports" if facts.merged_from is not None else "")
        + (f" · from {source.label}" if source is not None else "")
    )
    if facts.interrupted is not None:
        from .results.summary import interrupted_line

        head += " · " + interrupted_line(facts.interrupted)
    return [head, *summary_lines(records, width=_width())] if records else [head, "(no gate records)"]


def _write_outputs(
    args: argparse.Namespace,
    run: RunInfo,
    records: Sequence[Record],
    calibrations: Sequence[Mapping[str, Any]],
    history: Callable[[], Mapping[str, Sequence[Mapping[str, Any]]] | None],
) -> list[str]:
    """--json, --html: written atomically; returns the lines saying where. `history` gives the HTML
    report's sparklines (called only for it)."""
    from .results.json_report import write_json_report

    said = []
    if args.json is not None:
        try:
            write_json_report(args.json, run, records, calibrations)
        except OSError as e:
            raise _Failed(f"JSON report {args.json} not written: {e.strerror or e}") from None
        said.append(f"mlxgate: JSON report → {args.json}")
    if args.html is not None:
        try:
            from .results.html_report import write_html_report
        except ImportError:  # pragma: no cover - a build without the renderer
            raise CliError(
                "this pytest-mlxgate has no HTML report renderer: leave out --html; --json writes the JSON report"
            ) from None
        try:
            write_html_report(args.html, records, history=history(), run=run)
        except OSError as e:
            raise _Failed(f"HTML report {args.html} not written: {e.strerror or e}") from None
        said.append(f"mlxgate: HTML report → {args.html}")
    return said


class _Failed(Exception):
    """An output could not be written (exit 1, as for `mlxgate get`); the message says which and why."""


def _history_until(
    db: Path | None, records: Sequence[Record], until: str | None
) -> dict[str, list[dict[str, Any]]] | None:
    """Each gate's rows in the DB (--db, else the default) for the HTML report's sparklines: up to run
    `until` and including it where the DB has it (a report rendered again shows the history as it stood
    then), else the latest rows; None without a DB."""
    from .results.history import ResultsDB, ResultsDBError
    from .results.html_parts import HISTORY_RUNS

    path = _db_path(db)
    if not path.is_file():
        return None
    try:
        results = ResultsDB(path)
        out = {}
        for nodeid in sorted({r.nodeid for r in records}):
            rows = results.rows(nodeid=nodeid)
            if until is not None:
                ends = [i for i, row in enumerate(rows) if row["run_id"] == until]
                rows = rows[: ends[-1] + 1] if ends else rows
            out[nodeid] = rows[-HISTORY_RUNS:]
    except (OSError, ResultsDBError):
        return None  # sparklines are a by-product: the report goes on without them
    return out


def _report(args: argparse.Namespace) -> int:
    source = load_source(args.run, args.db)
    for line in _summary(source, source.run, source.records):
        print(line)

    def history() -> dict[str, list[dict[str, Any]]] | None:
        return _history_until(args.db, source.records, source.run.run_id)

    for line in _write_outputs(args, source.run, source.records, source.calibrations, history):
        print(line)
    return EXIT_OK


def _merge(args: argparse.Namespace) -> int:
    from .results.merge import MergeError, merge_reports, read_report

    try:
        merged = merge_reports([read_report(p) for p in args.reports])
    except MergeError as e:
        raise CliError(str(e)) from None
    for note in merged.notes:
        print(f"mlxgate merge: {note}", file=sys.stderr)
    for line in _summary(None, merged.run, merged.records):
        print(line)
    if args.db is not None:  # first: the HTML report's sparklines then end at the merged run
        print(_append(args.db, merged.run, merged.records))

    def history() -> dict[str, list[dict[str, Any]]] | None:
        return _history_until(args.db, merged.records, merged.run.run_id)

    for line in _write_outputs(args, merged.run, merged.records, merged.calibrations, history):
        print(line)
    from .results.verdicts import is_failing

    policy = run_facts(merged.run).inconclusive_policy
    failed = [r.nodeid for r in merged.records if r.mode != "score" and is_failing(r.verdict, policy)]
    for problem in merged.problems:
        print(f"mlxgate merge: FAIL: {problem}", file=sys.stderr)
    if failed:
        print(f"mlxgate merge: {len(failed)} gate(s) failing: {', '.join(failed)}", file=sys.stderr)
    return EXIT_FOUND if failed or merged.problems else EXIT_OK


def _append(path: Path, run: RunInfo, records: Sequence[Record]) -> str:
    from .results.history import ResultsDB, ResultsDBError

    try:
        results = ResultsDB(path)
        if any(r["run_id"] == run.run_id for r in results.runs()):
            return f"mlxgate: run {short_run_id(run.run_id)} is already in {path} (these reports were merged before)"
        rows = results.append(run, records)
    except (OSError, ResultsDBError) as e:
        raise _Failed(f"results DB {path} not written: {e}") from None
    return f"mlxgate: {rows} row(s) → {path} (quality_runs), run {short_run_id(run.run_id)}"


# --- the parsers -----------------------------------------------------------------------------------


def _last_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (every run) or more, got {n}")
    return n


_RUN_HELP = "a run id or its prefix, latest, latest~N, or a JSON report's path"
_DB_HELP = "the results DB (default: .mlxgate/results.sqlite under the rootdir, as pytest's mlxgate writes it)"


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The four commands' parsers, on `mlxgate`'s subcommands."""
    help_ = "each gate's key figures run by run: verdict, mean KL, top-1, capability, decode and KV ratios"
    p = sub.add_parser("history", help=help_, description=help_)
    p.add_argument(
        "gate",
        metavar="GATE",
        nargs="?",
        help="a node id or its end (test_kv.py::test_drift, test_kv.py); default: every gate",
    )
    p.add_argument(
        "--last",
        metavar="N",
        type=_last_arg,
        default=DEFAULT_LAST,
        help=f"the last N runs of each gate (default {DEFAULT_LAST}; 0: all)",
    )
    p.add_argument("--db", metavar="PATH", type=Path, help=_DB_HELP)

    help_ = "what changed per gate from run A to run B; exit 1 when a gate went from pass to fail or error"
    p = sub.add_parser("compare", help=help_, description=help_)
    p.add_argument("run_a", metavar="RUN_A", help=_RUN_HELP)
    p.add_argument("run_b", metavar="RUN_B", help=_RUN_HELP)
    p.add_argument("--db", metavar="PATH", type=Path, help=_DB_HELP)

    help_ = "a stored run again: its summary table, its JSON report, its HTML report"
    p = sub.add_parser("report", help=help_, description=help_)
    p.add_argument("run", metavar="RUN", help=_RUN_HELP)
    p.add_argument("--json", metavar="PATH", type=Path, help="write the run's JSON report here")
    p.add_argument(
        "--html",
        metavar="PATH",
        type=Path,
        help="write the run's HTML report here (with each gate's history up to that run, from the DB)",
    )
    p.add_argument("--db", metavar="PATH", type=Path, help=_DB_HELP)

    help_ = (
        "join shard reports (--mlx-shard I/N) into one run: its summary, JSON, HTML, DB rows; the worst "
        "verdict of a gate wins; exit 1 when a gate fails or errors, a planned module has no record, a "
        "shard was interrupted, or a verdict is not one mlxgate writes"
    )
    p = sub.add_parser("merge", help=help_, description=help_)
    p.add_argument("reports", metavar="REPORT", nargs="+", type=Path, help="the shards' JSON reports (--mlx-report)")
    p.add_argument("--json", metavar="OUT", type=Path, help="write the merged JSON report here")
    p.add_argument("--html", metavar="OUT", type=Path, help="write the merged HTML report here")
    p.add_argument(
        "--db",
        metavar="PATH",
        type=Path,
        help="append the merged run to this results DB (default: none; "
        "the shards may have written their own rows already)",
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "history": _history,
    "compare": _compare,
    "report": _report,
    "merge": _merge,
}


def main(args: argparse.Namespace) -> int:
    """Run one of COMMANDS; errors the user can fix are one line on stderr."""
    try:
        return COMMANDS[args.command](args)
    except CliError as e:
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except _Failed as e:
        print(f"mlxgate: {e}", file=sys.stderr)
        return EXIT_FOUND
