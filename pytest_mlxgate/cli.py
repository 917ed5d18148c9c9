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

from .config.names import CandidateSpec, find_pyproject, load_aliases, parse_name
from .config.option_values import cache_dir_arg, endpoint_arg
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
    if args.command == "server-check":
        return _server_check(args)
    if args.command == "plan":
        from .plan_cli import main as plan_main

        try:
            return plan_main(args)
        except KeyboardInterrupt:  # the search or its verification: nothing half-written (see plan_cli)
            print(f"\nmlxgate plan {args.kind}: interrupted; {args.out} was not written", file=sys.stderr)
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
        dest="command", required=True, metavar="{get,verify,new-gate,plan,server-check,history,compare,report,merge}"
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
    help_ = "check a server's mlxgate log-probability protocol (docs/server-protocol.md) before a gate believes it"
    check = sub.add_parser("server-check", help=help_, description=help_ + "; exit 0 when every check passes")
    check.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8090")
    check.add_argument("--key-env", metavar="NAME", help="the environment variable holding its key")
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
    help_ = "search the cheapest KV or weight plan that passes a KV or weights gate, then verify it by running the gate"
    p = sub.add_parser("plan", help=help_, description=help_ + " (pytest_mlxgate.explain.plan_kv, .plan_weights)")
    p.add_argument(
        "kind",
        choices=("kv", "weights"),
        help="what is planned: kv (a kv_config.json), weights (mlx_lm's quantization block, weights_config.json)",
    )
    p.add_argument(
        "--gate",
        metavar="FILE",
        type=Path,
        required=True,
        help="the gate, e.g. gates/test_kv_cache.py (kv), gates/test_weights_8bit.py (weights)",
    )
    p.add_argument("--model", metavar="NAME", help="the model (as --mlx-candidate; default: the embedded model)")
    p.add_argument(
        "--out", metavar="FILE", type=Path, help="where the plan goes (default kv_config.json, weights_config.json)"
    )
    p.add_argument("--bits", metavar="B,B", help="bit widths a layer may take (default kv 4,6,8; weights 2,3,4,6,8)")
    p.add_argument("--group-sizes", metavar="G,G", help="group sizes (default kv 32,64; weights 32,64,128)")
    p.add_argument(
        "--save",
        metavar="DIR",
        type=Path,
        help="weights: once verified, write the quantized model there (what mlx_lm.load opens)",
    )
    p.add_argument(
        "--no-compare",
        action="store_true",
        help="weights: skip measuring mlx_lm's recipes and dynamic_quant beside the plan at equal bytes",
    )
    p.add_argument("--selection", metavar="N", type=int, help="selection sequences (default kv 6, weights 8)")
    p.add_argument(
        "--apart", action="store_true", help="keys and values may take widths of their own (K8/V4: keys wider)"
    )
    p.add_argument(
        "--frontier",
        action="store_true",
        help="measure plans along the whole trade of bytes against drift; the answer is the cheapest that passes",
    )
    p.add_argument("--points", metavar="N", type=int, help="with --frontier: plans measured along it (default 8)")
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
    p.add_argument(
        "--reference-cache",
        metavar="DIR|off",
        help="where the search keeps the selection's reference and every plan it measured, and the gate's "
        "verification its reference arms (default: pytest's, .pytest_cache/d/mlxgate-reference here); off: none",
    )
    p.add_argument(
        "--no-capability",
        action="store_true",
        help="verify on the gate's KL tests only, not its capability tests (HashHop: minutes); the summary says so",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help='skip running the gate on the plan (not a verdict): the plan file says "verified": false, and so does '
        "every lever that reads it",
    )


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


def _server_check(args: argparse.Namespace) -> int:
    """`mlxgate server-check URL`: each conformance check, one line, PASS or FAIL; exit 1 on any fail."""
    from .common.server_endpoint import Endpoint
    from .remote.client import ServerClient
    from .remote.conformance import check_server

    try:
        endpoint = Endpoint.parse(args.url, key_env=args.key_env)
    except MlxgateUsageError as e:
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    client = ServerClient(endpoint)
    try:
        checks = check_server(client)
    except MlxgateUsageError as e:  # its key's variable unset
        print(f"mlxgate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()
    for check in checks:
        print(f"{'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    failed = [c.name for c in checks if not c.ok]
    print(
        f"mlxgate server-check {endpoint.url}: "
        + (f"{len(failed)} failed ({', '.join(failed)})" if failed else "conforms")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
