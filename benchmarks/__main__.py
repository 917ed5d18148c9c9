"""python -m benchmarks [name [options]] ...: run the named benchmarks (all by default).

Options after a name go to that benchmark, e.g. `python -m benchmarks hub_vs_hf --repeats 3`.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = (
    "hub_vs_hf",
    "resume_rss",
    "prefill_blas",
    "kl_gate",
    "capability",
    "speed",
    "sliding_batch",
    "explain",
    "plan",
    "gates",
)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip())
        print("benchmarks:", ", ".join(BENCHMARKS))
        return 0
    # Split argv into [name, options...] groups.
    runs: list[tuple[str, list[str]]] = []
    for arg in argv:
        if arg in BENCHMARKS:
            runs.append((arg, []))
        elif runs:
            runs[-1][1].append(arg)
        else:
            print(f"unknown benchmark {arg!r}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
    if not runs:
        runs = [(name, []) for name in BENCHMARKS]
    for name, opts in runs:
        module = importlib.import_module(f"benchmarks.{name}")
        module.main(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
