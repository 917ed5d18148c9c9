"""Every mutant of one function against the tests you name, for `./dev mutate --function FUNC TESTS...`:
how the verdict folders' tests are written to a kill rate (benchmarks/mutation-log.md). A sampled
survivor is one mutant of a function; the tests that kill the rest of its function are found by
running them all, which takes minutes, not the sample's hour.

Runs in mutmut's copy of the package (`mutants/`, made by `./dev mutate --sample` or `mutmut run`),
with the tests named copied in first, one pytest process per mutant (`MUTANT_UNDER_TEST`, as mutmut
selects one); prints the survivors with their diffs against the original function.

    python tests/support/mutation_kill.py FUNC [-j N] [--only 3,7] TESTS...
    FUNC: mutmut's name of the function, e.g. pytest_mlxgate.verdicts.known_bad_step.x_known_bad_step
          (a method: pytest_mlxgate.speed.result.xǁTrialǁto_json)
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import difflib
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MUTANTS = Path("mutants")


def mutant_numbers(source: str, function: str) -> list[int]:
    """The numbers of `function`'s mutants in a mutated module's source (`def NAME__mutmut_N(`)."""
    return sorted({int(n) for n in re.findall(rf"def {re.escape(function)}__mutmut_(\d+)\(", source)})


def mutant_body(source: str, function: str, which: int | str) -> str:
    """The text of one mutant's definition (`which`: its number, or "orig" for the original); "" when
    absent. Found by the syntax tree, so a signature over several lines or a method in its class ends
    where its definition does."""
    wanted = f"{function}__mutmut_{which}"
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == wanted:
            lines = source.splitlines(keepends=True)
            return "".join(lines[node.lineno - 1 : node.end_lineno])
    return ""


@functools.lru_cache(maxsize=4)
def _tree(source: str) -> ast.Module:
    return ast.parse(source)


def mutant_diff(source: str, function: str, which: int) -> list[str]:
    """The lines a mutant changes: `-` the original's, `+` the mutant's."""
    original = mutant_body(source, function, "orig").splitlines()
    mutated = mutant_body(source, function, which).replace(f"__mutmut_{which}(", "__mutmut_orig(").splitlines()
    return [
        line
        for line in difflib.unified_diff(original, mutated, lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]


def _run(name: str, tests: list[str]) -> int:
    env = dict(os.environ, MUTANT_UNDER_TEST=name, PY_IGNORE_IMPORTMISMATCH="1")
    # Each run imports the mutated modules (megabytes each): compiled once into a cache of their own,
    # ~2 s a run rather than ~20 s where PYTHONDONTWRITEBYTECODE is set.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str((MUTANTS / ".pycache").resolve())
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    command += ["-n", "0", "--no-header", "-o", "addopts=", *tests]
    return subprocess.run(command, cwd=MUTANTS, env=env, capture_output=True, timeout=900).returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate --function", description=__doc__.splitlines()[0])
    parser.add_argument("function")
    parser.add_argument("tests", nargs="+")
    parser.add_argument("-j", type=int, default=1, help="mutants at once (default 1)")
    parser.add_argument("--only", default="", help="these mutant numbers, comma-separated")
    args = parser.parse_args(argv)
    module, _, qualified = args.function.rpartition(".")
    path = MUTANTS / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run `./dev mutate --sample N` first (it generates mutants/)")
    for test in {t.split("::")[0] for t in args.tests}:
        target = MUTANTS / test
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(test).is_dir():
            shutil.copytree(test, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(test, target)
    source = path.read_text(encoding="utf-8")
    function = qualified  # a method's mutants too are defined under mutmut's whole name (xǁClassǁmethod)
    numbers = [int(n) for n in args.only.split(",")] if args.only else mutant_numbers(source, function)
    if not numbers:
        raise SystemExit(f"no mutants of {function} in {path}")
    if _run("", args.tests) != 0:
        raise SystemExit("the tests fail on the unmutated code: every mutant would read as killed")
    with concurrent.futures.ThreadPoolExecutor(args.j) as pool:
        codes = dict(
            zip(
                numbers, pool.map(lambda n: _run(f"{module}.{qualified}__mutmut_{n}", args.tests), numbers), strict=True
            )
        )
    survivors = [n for n, code in codes.items() if code == 0]
    odd = {n: code for n, code in codes.items() if code not in (0, 1)}
    print(f"{args.function}: {len(numbers) - len(survivors)}/{len(numbers)} killed")
    for n, code in odd.items():
        print(f"  mutant {n}: pytest exit {code} (counted killed)")
    for n in survivors:
        print(f"survived: {n}")
        print("\n".join(f"    {line}" for line in mutant_diff(source, function, n)))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
