"""The `paired` fixture's value: what a gate's assertions ask of its module's arms, and the one way a
gate's numbers leave it (its record).

A `PairedRun` (`paired_run`) belongs to one gate module (its lever, sizes and prompts); every test of
the module that asks for `paired` gets a `Paired` over it, so a module with a drift test and a
capability test loads and runs the arms once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..results.records import CALIBRATION_PROPERTY, RECORD_PROPERTY, gate_record
from ..verdicts.conclude import Conclusion
from .transport import stage, staged_records

if TYPE_CHECKING:
    from ..capability.assertions import CapabilitySubject
    from ..capability.base import Budget
    from ..capability.result import CapabilityRun
    from ..kl.assertions import KLSubject
    from ..kl.result import KLResult
    from ..kl.shape import RunShape
    from ..levers.lever import Lever
    from ..speed.assertions import SpeedSubject
    from .paired_run import PairedRun

__all__ = ["Paired"]


class Paired:
    """What the `paired` fixture hands a gate: its module's arms, run on first use, and where the
    gate's numbers go (the test's report, from which the controller writes results)."""

    def __init__(self, run: PairedRun, item: Any, rerun: str) -> None:  # a pytest.Function (test's item)
        self.run = run
        self.item = item
        self.nodeid: str = item.nodeid
        self.rerun = rerun
        self.published = False

    @property
    def lever(self) -> Lever:
        return self.run.lever

    @property
    def inconclusive(self) -> str:
        """What an inconclusive verdict does to this test (--mlx-inconclusive): fail, warn or xfail."""
        return self.run.inconclusive

    @property
    def shape(self) -> RunShape:
        return self.run.shape

    def kl(self) -> KLResult:
        """Run both arms (once per module) and return the statistics."""
        return self.run.kl()

    def capability(
        self, task: str, *, n: int | Budget | None = None, sequential: Mapping[str, float | None] | None = None
    ) -> CapabilityRun:
        """Both arms of a capability task on the same items (`--mlx-tier` picks smoke or full)."""
        tier = None
        mark = self.item.get_closest_marker("mlx_tier")
        if mark is not None and mark.args and not self.run.capability_options.get("tier_from_cli"):
            tier = str(mark.args[0])
        self.run.skip_if_untrained()
        return self.run.capability_arms.capability(task, n=n, tier=tier, sequential=sequential)

    def speed(self) -> dict[str, Any]:
        """Both arms' speed and memory on the serving path (once per module), as its record carries it."""
        return self.run.speed()

    def speed_if_asked(self) -> dict[str, Any] | None:
        return self.run.speed_if_asked()

    def explanation(self, kl: KLResult, verdict: str) -> dict[str, Any] | None:
        """Where the gate's drift comes from (see `PairedRun.explanation`), or None."""
        return self.run.explanation(kl, verdict)

    def vouch(self, conclusion: Conclusion) -> Conclusion:
        """`conclusion` with where its limits come from on this model and backend (`authoring.proof`), its
        verdict settled by that; as it was where nothing vouches (A/A, calibration, a known-bad arm)."""
        return self.run.vouch(conclusion) if self.run.vouch is not None else conclusion

    def publish(self, conclusion: Conclusion, *, measure: bool = True) -> None:
        """The one way a gate's numbers leave it: the conclusion of an assertion (`verdicts.conclude`) becomes
        the test's record, with the arms (model, lever, path) and the re-run command where the measurement
        does not give them, and the module's speed when it asks for it."""
        run = self.run
        lever = self.lever.to_json()
        for side, server in (("ref", run.ref_server), ("cand", run.server)):
            if server is not None:  # that arm was the server's, whatever the module's value for it says
                lever[side] = f"served at {server.endpoint.url}"
        arms: dict[str, Any] = {
            "candidate": run.candidate.describe(),
            "reference_model": run.reference.describe() if self.lever.two_models and run.reference else None,
            "lever": lever,
            "path": self.shape.path,
        }
        fields = {**arms, **conclusion.fields}
        asked = run.speed_shape is not None and "speed" not in fields
        speed = (run.speed() if measure else run.speed_arms.measured) if asked else None
        if speed is not None:
            fields["speed"] = speed
        record = gate_record(
            nodeid=self.nodeid,
            mode=conclusion.mode,
            verdict=conclusion.verdict,
            checks=conclusion.checks,
            bounds=conclusion.bounds,
            rerun=self.rerun,
            phases=run.phases.take(),  # after the speed above: its trials are this record's work too
            **fields,
        )
        stage(self.item, RECORD_PROPERTY, record)
        self.published = True

    def calibrate(self, keep: Callable[[Paired, dict[str, Any]], None] | None = None) -> None:
        """--mlx-calibrate: measure (once per module), hand the first test the calibration, skip every test.
        `keep` (the calibration file's writer, `authoring.calibration_run`) sees the measurement once, first."""
        import pytest

        from ..verdicts.calibration import accept_broken_from

        run = self.run
        first = not run.calibrated
        calibration = run.calibration(self.nodeid.split("::")[0], accept_broken_from(self.item))
        if first:
            if keep is not None:
                keep(self, calibration)
            stage(self.item, CALIBRATION_PROPERTY, calibration)
            pytest.skip(
                "--mlx-calibrate: measured, no verdict; the suggested limits are in the mlxgate calibration section"
            )
        pytest.skip("--mlx-calibrate: no verdict; this module was measured once, for its first test")

    def finish(self) -> None:
        """At teardown: a gate that measured but asserted nothing still reports what it measured, and only
        that: teardown starts no measurement (a Ctrl-C in a speed trial would run it again), and a test
        that raised already has its error record (a second, "measured", would stand beside it)."""
        if self.published or staged_records(self.item):
            return
        measured_kl, measured_speed = self.run.kl_arms.result, self.run.speed_arms.measured
        if measured_kl is not None:
            self.publish(measured_kl.conclusion(bounds={}, checks=[], verdict="measured"), measure=False)
        elif measured_speed is not None:
            from ..speed.assertions import speed_conclusion

            self.publish(speed_conclusion(measured_speed, {}, [], verdict="measured"), measure=False)

    def __repr__(self) -> str:
        return f"<paired {self.run.lever.describe()}>"


if TYPE_CHECKING:

    def _takes_every_assertion(paired: Paired) -> tuple[KLSubject, SpeedSubject, CapabilitySubject]:
        """mypy checks here that `Paired` offers what each assertion asks of the `paired` fixture."""
        return paired, paired, paired
