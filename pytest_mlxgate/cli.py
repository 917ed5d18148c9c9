"""`mlxgate get NAME` puts a verified snapshot in the cache and prints its path; `mlxgate verify NAME`
re-hashes one. NAME is anything `--mlx-candidate` accepts. `mlxgate new-gate NAME --patch mod.attr`
(or `--env VAR --ref V --cand V`) writes `gates/test_NAME.py`, a gate that fails until its limits are
measured and pasted in (`pytest_mlxgate.authoring`). `mlxgate history|compare|report|merge` read the
results history and JSON reports (`pytest_mlxgate.history_cli`, which documents their exit codes).

stdout carries only the result (so `$(mlxgate get e4b)` works); progress and errors go to stderr.
Exit status: 0 ok, 1 the hub failed, verification found problems or a file could not be written,
2 bad usage or name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config.names import CandidateSpec, find_pyproject, load_aliases, parse_name
from .config.options import cache_dir_arg, endpoint_arg
from .errors import MlxgateUsageError

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_HISTORY_COMMANDS = ("history", "compare", "report", "merge")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in _HISTORY_COMMANDS:
        from .history_cli import main as history_main

        return history_main(args)
    if args.command == "new-gate":
        return _new_gate(args)
    if args.command == "plan":
        try:
            return _plan(args)
        except KeyboardInterrupt:  # the search or its verification: nothing half-written (see _plan)
            print(f"\nmlxgate plan kv: interrupted; {args.out} was not written", file=sys.stderr)
            return 130
    try:
        spec = _spec(args)
    except MlxgateUsageError as e:
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _get(spec, args) if args.command == "get" else _verify(spec, args)
    except KeyboardInterrupt:
        print("\nmlxgate: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxgate",
        description="Verified model snapshots, new gates, and the results history, for pytest-mlxgate.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{get,verify,new-gate,plan,history,compare,report,merge}"
    )
    for name, help_ in (
        ("get", "download (or build) a snapshot and print its path"),
        ("verify", "re-hash a cached snapshot and report each problem"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument(
            "name",
            metavar="NAME",
            help="alias, repo id org/name[@revision], or local directory",
        )
        p.add_argument("--revision", metavar="R", help="branch, tag or commit (default: main)")
        p.add_argument("--dataset", action="store_true", help="NAME is a dataset repo")
        p.add_argument("--cache-dir", metavar="D", type=cache_dir_arg, help="hub cache (default: HF_HUB_CACHE, ...)")
        if name == "get":
            p.add_argument(
                "--offline",
                action="store_true",
                default=None,
                help="use the cache only (a file changed since it was verified is an error, exit 1)",
            )
            p.add_argument("--endpoint", metavar="URL", type=endpoint_arg, help="hub endpoint")
        else:
            p.add_argument(
                "--repair",
                action="store_true",
                help="move corrupt blobs aside (never deleted) so the next `get` fetches them again",
            )
    _add_new_gate(sub)
    _add_plan(sub)
    from .history_cli import add_parsers

    add_parsers(sub)
    return parser


def _add_new_gate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_ = "write a new gate module for a patch or environment-variable lever, failing until it has limits"
    p = sub.add_parser("new-gate", help=help_, description=help_ + "; prints the file and what to run next")
    p.add_argument("name", metavar="NAME", help="the lever's name (a Python identifier); the file is test_NAME.py")
    p.add_argument("--patch", metavar="MOD.ATTR", help="the attribute the lever replaces, e.g. mlx.core.fast.rms_norm")
    p.add_argument("--env", metavar="VAR", help="the environment variable the lever sets (needs --ref and --cand)")
    p.add_argument(
        "--ref",
        metavar="V",
        help="reference arm: an object name (--patch; default: pytest_mlxgate.reference_ops' plain version of "
        "an mlx fused op; 'original': the unpatched one) or the variable's value (--env; 'unset')",
    )
    p.add_argument("--cand", metavar="V", help="candidate arm, as --ref (--patch default: the original)")
    p.add_argument(
        "--path",
        choices=("prefill", "serving"),
        default="prefill",
        help="where the drift is measured: prefill (one forward) or serving (the KV cache, then decode); "
        "default: prefill",
    )
    p.add_argument("--dir", metavar="D", type=Path, default=Path("gates"), help="where the gate goes (default: gates)")


def _new_gate(args: argparse.Namespace) -> int:
    from .authoring.new_gate import new_gate, next_steps

    try:
        path = new_gate(
            args.name, patch=args.patch, env=args.env, ref=args.ref, cand=args.cand, path=args.path, directory=args.dir
        )
    except MlxgateUsageError as e:
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"mlxgate: cannot write the gate: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(next_steps(path), end="")
    return EXIT_OK


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_ = "search the cheapest KV plan that passes a KV gate, then verify it by running the gate"
    p = sub.add_parser("plan", help=help_, description=help_ + " (pytest_mlxgate.explain.plan_kv)")
    p.add_argument("kind", choices=("kv",), help="what is planned: kv (a kv_config.json)")
    p.add_argument("--gate", metavar="FILE", type=Path, required=True, help="the KV gate, e.g. gates/test_kv_cache.py")
    p.add_argument("--model", metavar="NAME", help="the model (as --mlx-candidate; default: the embedded model)")
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("kv_config.json"), help="where the plan goes")
    p.add_argument("--bits", metavar="B,B", default="4,6,8", help="bit widths a layer may take (default 4,6,8)")
    p.add_argument("--group-sizes", metavar="G,G", default="32,64", help="group sizes (default 32,64)")
    p.add_argument("--selection", metavar="N", type=int, default=6, help="selection sequences (default 6)")
    p.add_argument(
        "--apart", action="store_true", help="keys and values may take widths of their own (K8/V4: keys wider)"
    )
    p.add_argument(
        "--frontier",
        action="store_true",
        help="measure plans along the whole trade of bytes against drift; the answer is the cheapest that passes",
    )
    p.add_argument("--points", metavar="N", type=int, default=8, help="plans measured along the frontier (default 8)")
    p.add_argument(
        "--budget-bytes",
        metavar="B",
        type=float,
        help="with --frontier: the least drift within B KV bytes per token (the frontier's table shows each plan's)",
    )
    p.add_argument(
        "--long-tokens",
        metavar="N",
        type=int,
        help="the verification's second run, at N tokens (default: 4x the gate's, past a sliding window; 0: none)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip running the gate on the plan (not a verdict)")


def _plan(args: argparse.Namespace) -> int:
    import json

    try:
        bits = tuple(int(b) for b in args.bits.split(","))
        groups = tuple(int(g) for g in args.group_sizes.split(","))
    except ValueError:
        print("mlxgate: error: --bits and --group-sizes take comma-separated whole numbers, e.g. 4,8", file=sys.stderr)
        return EXIT_USAGE
    from .common.atomic import unwritable as unwritable_at

    unwritable = unwritable_at(args.out)
    if unwritable is not None:  # found now, not after a search of many minutes
        print(f"mlxgate: error: --out {args.out}: {unwritable}; give a file in a folder you can write", file=sys.stderr)
        return EXIT_USAGE
    frontier_problem = _frontier_problem(args)
    if frontier_problem is not None:
        print(f"mlxgate: error: {frontier_problem}", file=sys.stderr)
        return EXIT_USAGE
    from .models.loaded import load_mlx
    from .models.materialize import materialize

    try:
        from .explain.plan_frontier import frontier_page, frontier_table, search_frontier
        from .explain.plan_gate import read_gate
        from .explain.plan_kv import check_search_options, plan_summary, search_kv_plan
        from .explain.plan_verify import long_context, verify_plan
        from .serving.caches import sliding_window

        check_search_options(bits, groups, args.selection)  # before the gate and the model load
        cwd = Path.cwd()
        spec = parse_name(
            args.model or "smollm2-135m", aliases=load_aliases(find_pyproject(cwd)), base_dir=cwd, role="model"
        )
        gate = read_gate(args.gate.resolve(), model=args.model)
        snap = materialize(spec, offline=True)
        model, tokenizer = load_mlx(snap)
        asked: dict[str, Any] = dict(bits=bits, groups=groups, selection=args.selection, apart=args.apart)
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        result: Any = (
            search_frontier(
                model, tokenizer, gate, points=args.points, budget_bytes=args.budget_bytes, say=say, **asked
            )
            if args.frontier
            else search_kv_plan(model, tokenizer, gate, say=say, **asked)
        )
    except MlxgateUsageError as e:
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        if not _is_expected(e):
            raise
        print(f"mlxgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    from .common.atomic import atomic_write_bytes

    # --out holds a verified plan or none: the plan is verified from a file beside it, moved there once the
    # gate passes it (an interrupted or failed verification leaves --out as it was)
    plan = (json.dumps(result.kv_config(), indent=1) + "\n").encode()
    unverified = args.out.with_name(f"{args.out.stem}.unverified{args.out.suffix or '.json'}")
    atomic_write_bytes(unverified, plan)
    if not args.no_verify and (result.answer is not None if args.frontier else result.chosen != "none"):
        print(f"plan kv: verifying: {gate.path.name} with {unverified} as its candidate", file=sys.stderr, flush=True)
        report = args.out.with_suffix(".gate-report.json")
        long = args.long_tokens if args.long_tokens is not None else long_context(gate, sliding_window(model))
        result.verification = verify_plan(
            gate, unverified.resolve(), candidate=args.model, report=report, long=long or None
        )
    atomic_write_bytes(args.out.with_suffix(".search.json"), (json.dumps(result.to_json(), indent=1) + "\n").encode())
    if args.frontier:
        page = args.out.with_suffix(".frontier.html")
        atomic_write_bytes(page, frontier_page(result).encode(), new_mode=0o644)
        print(f"plan kv: the frontier plotted in {page}", file=sys.stderr)
    for line in frontier_table(result) if args.frontier else plan_summary(result):
        print(line, file=sys.stderr)
    if result.succeeded:
        unverified.replace(args.out)
        print(args.out)
        return EXIT_OK
    nothing = result.answer is None if args.frontier else result.chosen == "none"
    why = "no plan passed the gate's limits on the selection" if nothing else "not verified"
    print(f"plan kv: {why}: the plan stays at {unverified}; {args.out} was not written", file=sys.stderr)
    return EXIT_FAILED


def _frontier_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with --frontier's options, said before the search starts; None when nothing is."""
    if args.budget_bytes is not None and not args.frontier:
        return "--budget-bytes picks a plan from the frontier: add --frontier"
    if args.frontier and args.points < 1:
        return f"--points {args.points}: give at least 1 plan to measure along the frontier (default 8)"
    if args.long_tokens is not None and args.long_tokens < 0:
        return f"--long-tokens {args.long_tokens}: give the long verification's tokens, or 0 for none"
    if args.budget_bytes is not None and not args.budget_bytes > 0:
        return f"--budget-bytes {args.budget_bytes:g}: give the KV bytes per token a plan may take, above 0"
    return None


def _spec(args: argparse.Namespace) -> CandidateSpec:
    cwd = Path.cwd()
    aliases = load_aliases(find_pyproject(cwd))
    spec = parse_name(args.name, aliases=aliases, base_dir=cwd, role="model").with_revision(args.revision)
    if args.dataset and spec.kind != "hub":
        raise MlxgateUsageError(f"--dataset needs a hub repo id org/name, not '{args.name}'")
    return spec


def _get(spec: CandidateSpec, args: argparse.Namespace) -> int:
    from .models.materialize import materialize

    bar = None
    if sys.stderr.isatty():
        from .models.progress import TerminalBar

        unit = "files" if spec.kind == "embedded" else "B"  # the builder counts files
        bar = TerminalBar(sys.stderr, spec.repo_id or spec.name, unit=unit)
    try:
        snap = materialize(
            spec,
            cache_dir=args.cache_dir,
            endpoint=args.endpoint,
            offline=args.offline,
            progress=bar,
            repo_type="dataset" if args.dataset else "model",
        )
    except Exception as e:
        if bar is not None:
            bar.close()
        if not _is_expected(e):
            raise
        print(f"mlxgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    if bar is not None:
        bar.close()
    print(snap.path)
    return EXIT_OK


def _verify(spec: CandidateSpec, args: argparse.Namespace) -> int:
    if spec.kind == "local":
        print(
            f"mlxgate: error: '{spec.name}' is a local directory: there are no hub checksums to verify it against",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from .hub import HubError, verify_snapshot

    if spec.kind == "embedded":
        from .config.names import BUILT_MODELS

        repo_id, revision = BUILT_MODELS[spec.name], "main"
    else:
        assert spec.repo_id is not None
        repo_id, revision = spec.repo_id, spec.revision or "main"
    try:
        report = verify_snapshot(
            repo_id,
            revision=revision,
            repo_type="dataset" if args.dataset else "model",
            cache_dir=args.cache_dir,
            repair=args.repair,
        )
    except HubError as e:
        print(f"mlxgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    from .common.format import format_bytes

    commit = Path(report.path).name
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"{repo_id}@{commit[:7]}: {report.files_checked} files, "
        f"{format_bytes(report.bytes_checked)} re-hashed: {verdict}"
    )
    for problem in report.problems:
        print(f"  {problem}")
    if not report.ok and not args.repair:
        where = (" --dataset" if args.dataset else "") + (f" --cache-dir {args.cache_dir}" if args.cache_dir else "")
        print(f"fix: mlxgate verify {args.name}{where} --repair, then mlxgate get {args.name}{where}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _is_expected(e: Exception) -> bool:
    """Errors whose message is the whole story: print it, no traceback."""
    from .errors import MlxgateError

    if isinstance(e, (MlxgateError, OSError)):
        return True
    from .hub import HubError

    return isinstance(e, HubError)


if __name__ == "__main__":
    sys.exit(main())
