"""`mlxgate plan kv|weights --gate G`: search the cheapest plan that passes the gate's limits, then have the
gate verify it on its own prompts (`pytest_mlxgate.explain.plan_kv`, `.plan_frontier`, `.plan_weights`).

--out holds a verified plan or none: the plan is written beside it (`NAME.unverified.json`), the gate
runs on that file, and only a plan it passes is moved to --out (an interrupted or failed verification
leaves --out as it was). With --no-verify no gate runs, and the plan at --out says so inside
(`"verified": false`, `common.plan_mark`), as every lever that reads it does. The search's whole record
goes to `NAME.search.json`, the words to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .common.atomic import atomic_write_bytes, unwritable
from .config.names import find_pyproject, load_aliases, parse_name
from .errors import MlxgateError, MlxgateUsageError

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: Per kind: the options' defaults (--bits, --group-sizes, --out, --selection). A weights gate's prompts are
#: its own domain's (8 x 32 tokens: all code), and 8 selection sequences of it keep a plan's p99 and top-1
#: bounds from reading inconclusive where the gate, on 8, would pass it.
_DEFAULTS = {
    "kv": ("4,6,8", "32,64", "kv_config.json", 6),
    "weights": ("2,3,4,6,8", "32,64,128", "weights_config.json", 8),
}


def main(args: argparse.Namespace) -> int:
    bits_text, groups_text, out, selection = _DEFAULTS[args.kind]
    args.out = args.out or Path(out)
    args.selection = selection if args.selection is None else args.selection
    problem = _out_problem(args.out) or _option_problem(args)
    if problem is not None:  # found now, not after a search of many minutes
        return _usage(problem)
    try:
        bits = _numbers("--bits", args.bits, bits_text, args.kind)
        groups = _numbers("--group-sizes", args.group_sizes, groups_text, args.kind)
    except MlxgateUsageError as e:
        return _usage(str(e))
    try:
        return plan_kv(args, bits, groups) if args.kind == "kv" else plan_weights(args, bits, groups)
    except MlxgateUsageError as e:
        return _usage(str(e))
    except Exception as e:  # the gate, the model, the search: a message that is the whole story, else raised
        if not _expected(e):
            raise
        print(f"mlxgate: {e}", file=sys.stderr)
        return EXIT_FAILED


def _usage(message: str) -> int:
    print(f"mlxgate: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _numbers(flag: str, given: str | None, default: str, kind: str) -> tuple[int, ...]:
    """A comma-separated option's whole numbers; left out, the kind's default. Given empty (`--bits ''`, an
    unset shell variable) it is refused, never read as the default: the search would run what was not asked."""
    if given is None:
        given = default
    try:
        return tuple(int(p) for p in given.split(","))
    except ValueError:
        if given.strip():
            what = f"{given}: not comma-separated whole numbers"
        else:
            what = f"{given!r}: empty (an empty value is not the default)"
        raise MlxgateUsageError(
            f"{flag} {what}; give comma-separated whole numbers, e.g. {flag} {default} (`plan {kind}`'s default), "
            f"or leave {flag} out for the default"
        ) from None


def _out_problem(out: Path) -> str | None:
    why = unwritable(out)
    return f"--out {out}: {why}; give a file in a folder you can write" if why is not None else None


def _option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, said before the search starts; None when nothing is."""
    if args.kind == "weights":
        if args.apart:
            return "--apart is a KV plan's option: `plan weights` searches bits and group sizes per module"
        if args.save is not None and args.save.exists():
            return f"--save {args.save}: it exists; give a new folder (a saved model is never overwritten)"
        if args.save is not None and args.no_verify:
            return (
                "--save writes the model of a plan its gate verified, and --no-verify skips the verification: "
                "drop one (a plan written with --no-verify says so inside; quantize from it once its gate passes it)"
            )
    elif args.save is not None or args.no_compare:
        return "--save and --no-compare are `plan weights` options"
    if args.budget_bytes is not None and not args.frontier:
        return "--budget-bytes picks a plan from the frontier: add --frontier"
    if args.points is not None and not args.frontier:
        return (
            f"--points {args.points}: --points is how many plans --frontier measures, and no --frontier was asked "
            "for; add --frontier (with --points 1 or more), or leave --points out"
        )
    if args.frontier and args.points is not None and args.points < 1:
        return f"--points {args.points}: give at least 1 plan to measure along the frontier, or leave --points out (8)"
    if args.long_tokens is not None and args.long_tokens < 0:
        return f"--long-tokens {args.long_tokens}: give the long verification's tokens, or 0 for none"
    if args.budget_bytes is not None and not args.budget_bytes > 0:
        what = "the KV bytes per token" if args.kind == "kv" else "the weight bytes"
        return f"--budget-bytes {args.budget_bytes:g}: give {what} a plan may take, above 0"
    return None


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model named by --model (default: the embedded model), from the cache, offline."""
    from .models.loaded import load_mlx
    from .models.materialize import materialize

    cwd = Path.cwd()
    spec = parse_name(
        args.model or "smollm2-135m", aliases=load_aliases(find_pyproject(cwd)), base_dir=cwd, role="model"
    )
    snap = materialize(spec, offline=True)
    model, tokenizer = load_mlx(snap)
    return model, tokenizer, snap


def reference_cache_dir(args: argparse.Namespace) -> Path | None:
    """--reference-cache: a folder, `off` (None), or by default pytest's own reference cache where the gate's
    verification runs (`.pytest_cache/d/mlxgate-reference` here), so the search and the gate share it."""
    given = args.reference_cache
    if given is not None and str(given).lower() == "off":
        return None
    return Path(given) if given is not None else Path.cwd() / ".pytest_cache" / "d" / "mlxgate-reference"


def _search_cache(args: argparse.Namespace, model: Any, tokenizer: Any, snap: Any) -> Any:
    """What the search keeps beside the reference (`explain.plan_cache`), or None with --reference-cache off."""
    from .explain.plan_cache import SearchCache
    from .kl.refcache import ReferenceCache
    from .models.device import machine_facts, run_machine
    from .models.loaded import LoadedModel

    directory = reference_cache_dir(args)
    if directory is None:
        return None
    device, blas = machine_facts()
    machine = run_machine(device, blas)
    return SearchCache(ReferenceCache(directory), LoadedModel(model, tokenizer, snap), machine)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _expected(e: Exception) -> bool:
    """Errors whose message is the whole story: print it, no traceback."""
    if isinstance(e, (MlxgateError, OSError)):
        return True
    from .hub import HubError

    return isinstance(e, HubError)


def plan_kv(args: argparse.Namespace, bits: tuple[int, ...], groups: tuple[int, ...]) -> int:
    from .explain.plan_frontier import DEFAULT_POINTS, Reach, frontier_page, frontier_table, search_frontier
    from .explain.plan_gate import read_gate
    from .explain.plan_kv import SelectionAsk, check_search_options, plan_summary, search_kv_plan
    from .explain.plan_verify import long_context
    from .serving.caches import sliding_window

    check_search_options(bits, groups, args.selection)  # before the gate and the model load
    gate = read_gate(args.gate.resolve(), model=args.model)
    model, tokenizer, snap = _load(args)
    asked = SelectionAsk(
        bits=bits,
        groups=groups,
        selection=args.selection,
        apart=args.apart,
        cache=_search_cache(args, model, tokenizer, snap),
        say=_say,
    )
    result: Any = (
        search_frontier(
            model,
            tokenizer,
            gate,
            Reach(DEFAULT_POINTS if args.points is None else args.points, args.budget_bytes),
            **asked,
        )
        if args.frontier
        else search_kv_plan(model, tokenizer, gate, **asked)
    )
    found = result.answer is not None if args.frontier else result.chosen != "none"
    long = args.long_tokens if args.long_tokens is not None else long_context(gate, sliding_window(model))
    unverified = _verify(args, gate, result, result.kv_config(), found=found, long=long)
    if args.frontier:
        page = args.out.with_suffix(".frontier.html")
        atomic_write_bytes(page, frontier_page(result).encode(), new_mode=0o644)
        _say(f"plan kv: the frontier plotted in {page}")
    for line in frontier_table(result) if args.frontier else plan_summary(result):
        _say(line)
    return _settle(args, result, unverified, found=found)


def plan_weights(args: argparse.Namespace, bits: tuple[int, ...], groups: tuple[int, ...]) -> int:
    from .explain.plan_frontier import DEFAULT_POINTS, Reach, frontier_page, frontier_table
    from .explain.plan_gate import read_gate
    from .explain.plan_verify import long_context
    from .explain.plan_weights import check_weight_options
    from .explain.plan_weights_compare import search_weights_frontier, search_weights_plan, weights_summary
    from .levers.weights import parse_weights_value, save_quantized
    from .models.loaded import LoadedModel
    from .serving.caches import sliding_window

    check_weight_options(bits, groups, args.selection)
    gate = read_gate(args.gate.resolve(), model=args.model, kind="weights")
    model, tokenizer, snap = _load(args)
    long = args.long_tokens if args.long_tokens is not None else long_context(gate, sliding_window(model))
    cache = _search_cache(args, model, tokenizer, snap)
    asked: dict[str, Any] = dict(
        bits=bits, groups=groups, selection=args.selection, long=long or None, say=_say, cache=cache
    )
    result: Any = (
        search_weights_frontier(
            model,
            tokenizer,
            gate,
            Reach(DEFAULT_POINTS if args.points is None else args.points, args.budget_bytes),
            **asked,
        )
        if args.frontier
        else search_weights_plan(model, tokenizer, gate, compare=not args.no_compare, **asked)
    )
    found = result.answer is not None if args.frontier else result.chosen != "none"
    unverified = _verify(
        args, gate, result, result.kv_config() if args.frontier else result.config(), found=found, long=long
    )
    if args.frontier:
        page = args.out.with_suffix(".frontier.html")
        atomic_write_bytes(
            page, frontier_page(result, title="mlxgate plan weights --frontier").encode(), new_mode=0o644
        )
        _say(f"plan weights: the frontier plotted in {page}")
    for line in frontier_table(result) if args.frontier else weights_summary(result):
        _say(line)
    code = _settle(args, result, unverified, found=found)
    if code == EXIT_OK and args.save is not None:
        _say(f"plan weights: writing the quantized model to {args.save} (as mlx_lm.convert writes it)")
        try:  # what the gate verified: the plan file now at --out
            spec = parse_weights_value(args.out)
            assert spec is not None
            save_quantized(LoadedModel(model, tokenizer, snap), spec, args.save)
        except (MlxgateError, OSError) as e:
            print(f"mlxgate: --save {args.save}: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(args.save)
    return code


def _verify(args: argparse.Namespace, gate: Any, result: Any, plan: dict[str, Any], *, found: bool, long: int) -> Path:
    """Write the plan beside --out, have the gate verify it (unless --no-verify or none was found), and
    write the search's record; the unverified file's path."""
    from .common.plan_mark import mark_unverified
    from .explain.plan_verify import verify_plan

    out: Path = args.out
    unverified = out.with_name(f"{out.stem}.unverified{out.suffix or '.json'}")
    if args.no_verify:  # the file itself says no gate ran on it, and every lever that reads it says so
        plan = mark_unverified(
            plan,
            f"`mlxgate plan {args.kind} --no-verify` chose it on {result.selection} selection sequences; its gate "
            f"{gate.path.name} never ran on it; run it before use: pytest {gate.path.name} "
            f"--mlx-lever={gate.lever.name} --mlx-ref-value=plain --mlx-cand-value={out.name}",
        )
    atomic_write_bytes(unverified, (json.dumps(plan, indent=1) + "\n").encode())
    if not args.no_verify and found:
        tasks = f", then {', '.join(gate.capability_tests)}" if gate.capability_tests and not args.no_capability else ""
        _say(f"plan {args.kind}: verifying: {gate.path.name} with {unverified} as its candidate (KL{tasks})")
        report = args.out.with_suffix(".gate-report.json")
        result.verification = verify_plan(
            gate,
            unverified.resolve(),
            candidate=args.model,
            report=report,
            long=long or None,
            capability=not args.no_capability,
            reference_cache=reference_cache_dir(args) or "off",
        )
    atomic_write_bytes(args.out.with_suffix(".search.json"), (json.dumps(result.to_json(), indent=1) + "\n").encode())
    return unverified


def _settle(args: argparse.Namespace, result: Any, unverified: Path, *, found: bool) -> int:
    """A verified plan moves to --out (its path on stdout); otherwise --out stays as it was, and why."""
    if result.succeeded:
        unverified.replace(args.out)
        print(args.out)
        return EXIT_OK
    why = "no plan passed the gate's limits on the selection" if not found else "not verified"
    _say(f"plan {args.kind}: {why}: the plan stays at {unverified}; {args.out} was not written")
    return EXIT_FAILED
