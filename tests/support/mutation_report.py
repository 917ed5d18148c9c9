"""The summary line of `./dev mutate`: mutmut's counts (mutants/mutmut-cicd-stats.json, written by
`mutmut export-cicd-stats`), the share killed, and exit status 1 when that share is under the bar.

Killed counts the timeouts too (a mutant that hangs the tests is caught: mutmut's own score does the
same); a mutant no selected test reaches ("no tests"), or one an interrupted run never got to, counts
as a survivor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BAR = 0.90
STATS = Path("mutants/mutmut-cicd-stats.json")


def main() -> int:
    s = json.loads(STATS.read_text())
    tested = s["total"] - s["skipped"]
    caught = s["killed"] + s["timeout"]
    ratio = caught / tested if tested else 0.0
    verdicts = (
        "killed",
        "timeout",
        "survived",
        "no_tests",
        "suspicious",
        "skipped",
        "segfault",
        "check_was_interrupted_by_user",
    )
    unchecked = s["total"] - sum(s[k] for k in verdicts)  # an interrupted run: these count as not killed
    print(
        f"mutants {s['total']}: killed {s['killed']}, timeout {s['timeout']}, survived {s['survived']}, "
        f"no tests {s['no_tests']}, suspicious {s['suspicious']}, skipped {s['skipped']}, "
        f"segfault {s['segfault']}, not checked {unchecked}"
    )
    verdict = "ok" if ratio >= BAR else f"under the bar of {BAR:.0%}"
    print(f"killed {caught}/{tested} = {ratio:.1%} ({verdict})")
    return 0 if ratio >= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
