"""Where a gate module's time goes: seconds per phase, charged to the test whose call did the work.

A module's tests share its arms (`PairedRun`): the first test to ask for the drift pays for both KL
arms, the next one reads the result for free. So each record carries `phases`: the seconds spent since
the module's previous record, per phase — summed over a module's records, the module's whole work.
`./dev bench gates` reads them to say, per gate, what a run spent on loading, the reference and the
candidate arms, the speed trials and the capability tasks. Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

__all__ = ["PHASES", "Phase", "PhaseClock"]

#: load: models loaded and quantized copies made (once per process: a later module finds them loaded);
#: check: the untrained-model check; reference / candidate: the KL arms (A/A: the reference again, as
#: candidate); speed: the interleaved trials; capability: both arms' tasks; explain: drift attribution;
#: proof: the A/A and known-bad arms that show a gate's limits work on a model no calibration covers.
Phase = Literal["load", "check", "reference", "candidate", "speed", "capability", "explain", "proof"]
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass
class PhaseClock:
    """Seconds per phase of one module's run, and how much of it a record has already been charged."""

    spent: dict[str, float] = field(default_factory=dict)
    _charged: dict[str, float] = field(default_factory=dict)

    def add(self, phase: Phase, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {PHASES}")
        self.spent[phase] = self.spent.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def timing(self, phase: Phase) -> Iterator[None]:
        """Charge the body's wall time to `phase`, raise or not (a failed arm's time was spent too)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def take(self) -> dict[str, float]:
        """The seconds per phase not charged yet (rounded to ms; phases with nothing to charge left out)."""
        fresh: dict[str, float] = {}
        for phase in PHASES:
            delta = round(self.spent.get(phase, 0.0) - self._charged.get(phase, 0.0), 3)
            if delta > 0:  # what rounds to nothing waits for the next record
                fresh[phase] = delta
                self._charged[phase] = self._charged.get(phase, 0.0) + delta
        return fresh
