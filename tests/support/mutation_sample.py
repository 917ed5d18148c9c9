"""A seeded sample of the mutants, for `./dev mutate --sample N`: the widened set is 5,530 mutants and
~14 hours of tests on two cores, so a sample checks it, and the kill rate is stated with its bound.

Proportional allocation over the mutated modules (largest remainder, at least one a module), each
module's mutants drawn without replacement with a fixed seed, so the same tree gives the same sample.
Proportional stratified sampling without replacement has no more variance than a simple random sample,
so the pooled Wilson bound is conservative; the report gives the population estimate weighted by
module size beside it.

    python tests/support/mutation_sample.py pick N [SEED]   # the names, one a line (mutmut run's args)
    python tests/support/mutation_sample.py report FILE     # kill rate over the names in FILE, exit 1
                                                            # when its lower bound is under the bar
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

from mutation_report import BAR
from mutmut.stats import status_by_exit_code

from pytest_mlxgate.stats.intervals import wilson_lower

MUTANTS = Path("mutants")
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
    """Proportional allocation of n draws over strata of these sizes: largest remainder, one at least."""
    total = sum(sizes.values())
    if not 0 < n <= total:
        raise SystemExit(f"a sample of {n} from {total} mutants: ask for 1..{total}")
    quotas = {m: n * s / total for m, s in sizes.items()}
    alloc = {m: max(1, int(q)) for m, q in quotas.items()}
    by_remainder = sorted(sizes, key=lambda m: quotas[m] - int(quotas[m]), reverse=True)
    i = 0
    while sum(alloc.values()) < n:
        m = by_remainder[i % len(by_remainder)]
        if alloc[m] < sizes[m]:
            alloc[m] += 1
        i += 1
    return {m: min(a, sizes[m]) for m, a in alloc.items()}


def pick(n: int, seed: int) -> list[str]:
    by_module: dict[str, list[str]] = defaultdict(list)
    for name in mutant_exit_codes():
        by_module[module_of(name)].append(name)
    alloc = allocate({m: len(v) for m, v in by_module.items()}, n)
    rng = random.Random(seed)
    return [name for m in sorted(by_module) for name in sorted(rng.sample(sorted(by_module[m]), alloc[m]))]


def report(names: list[str]) -> int:
    codes = mutant_exit_codes()
    sizes: dict[str, int] = defaultdict(int)
    for name in codes:
        sizes[module_of(name)] += 1
    killed: dict[str, int] = defaultdict(int)
    drawn: dict[str, int] = defaultdict(int)
    survivors: list[str] = []
    unchecked = 0
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
    verdict = "ok" if lower >= BAR else f"not shown >= {BAR:.0%}"
    print(
        f"sample of {n} of {len(codes)} mutants: killed {k}/{n} = {k / n:.1%} (weighted by module size "
        f"{weighted:.1%}); one-sided {CONFIDENCE:.0%} lower bound {lower:.1%} ({verdict})"
    )
    return 0 if lower >= BAR else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "pick":
        print("\n".join(pick(int(argv[1]), int(argv[2]) if len(argv) > 2 else 19)))
        return 0
    if len(argv) == 2 and argv[0] == "report":
        return report(Path(argv[1]).read_text().split())
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
