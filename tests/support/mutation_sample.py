"""A seeded sample of the mutants, for `./dev mutate --sample N`: the widened set is 5,530 mutants and
~14 hours of tests on two cores, so a sample checks it, and the kill rate is stated with its bound.

Proportional allocation over the mutated modules (largest remainder, at least one a module), each
module's mutants drawn without replacement with a fixed seed, so the same tree gives the same sample.
Proportional stratified sampling without replacement has no more variance than a simple random sample,
so the pooled Wilson bound is conservative; the report gives the population estimate weighted by
module size beside it.

    python tests/support/mutation_sample.py pick N [SEED] [WITHIN]  # the names, one a line (mutmut run's
                                                       # args); WITHIN: comma-separated module prefixes
    python tests/support/mutation_sample.py report FILE [DOC]  # kill rate over the names in FILE, exit 1
                                                               # when its lower bound is under the bar

The mutation score leaves out the equivalent mutants (no input tells them from the code): DOC (by
default benchmarks/mutation-log.md) names them, one triage line each, `NAME`: E: the reason. The report
gives the raw share of the sample beside the score, so what the triage removed stays in view.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

from mutation_report import BAR
from mutmut.stats import status_by_exit_code

from pytest_mlxgate.stats.intervals import wilson_lower

MUTANTS = Path("mutants")
TRIAGE = Path("benchmarks/mutation-log.md")
#: A triage line that calls a mutant equivalent: the name in backticks (the package prefix may be left
#: out), then `E:` and a reason.
_EQUIVALENT = re.compile(r"`(?:pytest_mlxgate\.)?([^`\s]+__mutmut_\d+)`: E(?: in practice)?: \S")
CONFIDENCE = 0.95
CAUGHT = {"killed", "timeout"}  # as mutation_report.py counts: a mutant that hangs the tests is caught


def mutant_exit_codes() -> dict[str, int | None]:
    """Every generated mutant's name and its last exit code (None: never checked)."""
    codes: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.glob("pytest_mlxgate/**/*.meta")):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    if not codes:
        raise SystemExit("no mutants under mutants/: run `./dev mutate --sample N` (it generates them first)")
    return codes


def module_of(name: str) -> str:
    return name.rsplit(".", 1)[0]


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """n draws over strata of these sizes: one each, the rest in proportion to what each has left
    (largest remainder: never over a stratum's size, as a share of the rest is at most its room).
    Exactly n in all; fewer draws than strata go one each to the largest."""
    total = sum(sizes.values())
    if not 0 < n <= total:
        raise SystemExit(f"a sample of {n} from {total} mutants: ask for 1..{total}")
    if n < len(sizes):
        return dict.fromkeys(sorted(sizes, key=lambda m: (-sizes[m], m))[:n], 1)
    rest, room = n - len(sizes), {m: s - 1 for m, s in sizes.items()}
    quotas = {m: rest * r / max(1, total - len(sizes)) for m, r in room.items()}
    alloc = {m: 1 + int(q) for m, q in quotas.items()}
    by_remainder = sorted(sizes, key=lambda m: (-(quotas[m] - int(quotas[m])), m))
    for m in by_remainder[: n - sum(alloc.values())]:
        alloc[m] += 1
    return alloc


def pick(n: int, seed: int, within: str = "") -> list[str]:
    """n names, stratified by module; `within` ("explain,speed.measure,...") keeps only the modules under
    those prefixes of the package (a sample of one part of the mutated set)."""
    prefixes = tuple(f"pytest_mlxgate.{p.strip()}" for p in within.split(",") if p.strip())
    by_module: dict[str, list[str]] = defaultdict(list)
    for name in mutant_exit_codes():
        module = module_of(name)
        if not prefixes or any(module == p or module.startswith(p + ".") for p in prefixes):
            by_module[module].append(name)
    if not by_module:
        raise SystemExit(f"no mutated module under {within!r}: see [tool.mutmut] only_mutate")
    alloc = allocate({m: len(v) for m, v in by_module.items()}, n)
    rng = random.Random(seed)
    return [name for m in sorted(by_module) for name in sorted(rng.sample(sorted(by_module[m]), alloc[m]))]


def equivalents(triage: str) -> set[str]:
    """The mutants the triage text calls equivalent, each with a reason (a bare `E` does not count)."""
    return {f"pytest_mlxgate.{name}" for name in _EQUIVALENT.findall(triage)}


def report(names: list[str], equivalent: frozenset[str] | set[str] = frozenset()) -> int:
    codes = mutant_exit_codes()
    sizes: dict[str, int] = defaultdict(int)
    for name in codes:
        sizes[module_of(name)] += 1
    killed: dict[str, int] = defaultdict(int)
    drawn: dict[str, int] = defaultdict(int)
    survivors: list[str] = []
    unchecked = 0
    left_out = sorted(n for n in names if n in equivalent and status_by_exit_code[codes.get(n)] not in CAUGHT)
    raw_n, raw_k = len(names), sum(status_by_exit_code[codes.get(n)] in CAUGHT for n in names)
    names = [n for n in names if n not in left_out]
    for name in names:
        code = codes.get(name)
        drawn[module_of(name)] += 1
        status = status_by_exit_code[code]
        if status in CAUGHT:
            killed[module_of(name)] += 1
        else:
            unchecked += code is None
            survivors.append(f"{name}: {status}")
    for m in sorted(drawn):
        print(f"  {m:42s} {killed[m]:3d}/{drawn[m]:<3d} of {sizes[m]} mutants")
    n, k = len(names), sum(killed.values())
    weighted = sum(sizes[m] * killed[m] / drawn[m] for m in drawn) / sum(sizes[m] for m in drawn)
    lower = wilson_lower(k, n, CONFIDENCE)
    print(f"not killed ({len(survivors)}, {unchecked} never checked: counted as not killed):")
    for s in survivors:
        print(f"  {s}")
    print(f"equivalent, left out ({len(left_out)}, each triaged with its reason in {TRIAGE}):")
    for name in left_out:
        print(f"  {name}")
    verdict = "ok" if lower >= BAR else f"not shown >= {BAR:.0%}"
    print(
        f"sample of {raw_n} of {len(codes)} mutants: killed {raw_k}/{raw_n} = {raw_k / raw_n:.1%}; "
        f"of the {n} not equivalent: killed {k}/{n} = {k / n:.1%} (weighted by module size {weighted:.1%}); "
        f"one-sided {CONFIDENCE:.0%} lower bound {lower:.1%} ({verdict})"
    )
    return 0 if lower >= BAR else 1


def main(argv: list[str]) -> int:
    if 2 <= len(argv) <= 4 and argv[0] == "pick":
        print("\n".join(pick(int(argv[1]), int(argv[2]) if len(argv) > 2 else 19, argv[3] if len(argv) > 3 else "")))
        return 0
    if len(argv) in (2, 3) and argv[0] == "report":
        triage = Path(argv[2]) if len(argv) == 3 else TRIAGE
        return report(Path(argv[1]).read_text().split(), equivalents(triage.read_text()))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
