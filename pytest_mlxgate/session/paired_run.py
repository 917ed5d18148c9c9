"""A gate module's run of both arms, shared by its tests: the module's `ModuleArms` and one runner per
measurement (KL, capability, speed), each run on first use; the untrained-model check before KL and
capability; and, under --mlx-calibrate, the measurement that sizes limits. It composes; each runner
measures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .arms import ModuleArms
from .capability_arms import CapabilityArms
from .kl_arms import KLArms
from .speed_arms import SpeedArms

if TYPE_CHECKING:
    from ..kl.result import KLResult
    from ..speed.shape import SpeedShape
    from ..verdicts.conclude import Conclusion

__all__ = ["PairedRun"]


@dataclass
class PairedRun(ModuleArms):
    """One gate module's arms and the options that say what its gates measure and how they conclude."""

    aa: bool = False
    calibrate: bool = False  # --mlx-calibrate: `calibration()` instead of verdicts
    inconclusive: str = "fail"  # --mlx-inconclusive: what a gate that could not tell does
    allow_untrained: bool = False  # --mlx-allow-untrained: gates run on a model that predicts nothing
    explain: bool = False  # --mlx-explain: attribute every KL gate's drift; else only a failing gate's
    explain_budget: float = 0.0  # --mlx-explain-budget (the builder passes the session's); 0: never automatically
    capability_options: dict[str, Any] = field(default_factory=dict)  # tier, max_new_tokens, allow_unsandboxed
    speed_shape: SpeedShape | None = None  # None: the module's speed is not asked for (mlx_speed, --mlx-speed)
    prove: str = "auto"  # --mlx-prove: show the limits work where no calibration covers the model (auto) or not
    require_proof: bool = False  # --mlx-require-proof: limits unproven on the model are an error
    # where the module's limits come from (`authoring.proof.LimitsProof.vouch`, set by the `paired` fixture);
    # None: verdicts go out as the assertions made them (A/A, calibration, a known-bad arm)
    vouch: Callable[[Conclusion], Conclusion] | None = None
    # the untrained-model check's answer, once asked (`dataclasses.replace` keeps it: same reference arm)
    untrained: str | None = field(default=None, repr=False)
    untrained_checked: bool = field(default=False, repr=False)
    # the runners: made from the fields above (`dataclasses.replace` makes fresh ones)
    kl_arms: KLArms = field(init=False, repr=False)
    capability_arms: CapabilityArms = field(init=False, repr=False)
    speed_arms: SpeedArms = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.kl_arms = KLArms(self, aa=self.aa)
        self.capability_arms = CapabilityArms(self, self.capability_options)
        self.speed_arms = SpeedArms(self, self.speed_shape, aa=self.aa)
        self._calibration: dict[str, Any] | None = None

    def skip_if_untrained(self) -> None:
        """Skip the gate (once checked, every gate of the module) when the reference model predicts
        the gate's prompts no better than chance, unless allowed (see `kl.untrained`)."""
        import pytest

        if self.allow_untrained:
            return
        if not self.untrained_checked:
            from ..kl.untrained import untrained_reason

            ref = self.reference_model()
            with self.phases.timing("check"):
                self.untrained = untrained_reason(ref.model, [s.ids for s in self.sequences])
            self.untrained_checked = True
        if self.untrained is not None:
            pytest.skip(self.untrained)

    def kl(self) -> KLResult:
        self.skip_if_untrained()
        return self.kl_arms.kl()

    def speed(self) -> dict[str, Any]:
        """Both arms' prefill and decode speed and memory (`SpeedArms.speed`), once per module."""
        return self.speed_arms.speed()

    def speed_if_asked(self) -> dict[str, Any] | None:
        """The module's speed when it asks for it (its records then carry it), else None."""
        return self.speed() if self.speed_shape is not None else None

    def explanation(self, kl: KLResult, verdict: str) -> dict[str, Any] | None:
        """Drift attribution for this gate, once per module: under --mlx-explain, or when the gate failed
        and the budget allows; None otherwise (A/A and calibration runs never)."""
        wanted = self.explain or (verdict == "fail" and self.explain_budget > 0)
        if not wanted or kl.aa is not None or self.calibrate:
            return None
        return self.kl_arms.explanation(kl, self.explain_budget if self.explain_budget > 0 else 3.0)

    def calibration(self, module: str, accept_broken: str | None = None) -> dict[str, Any]:
        """--mlx-calibrate: the lever's drift, the A/A floor, speed and memory, and the limits they suggest.

        The A/A floor is a second measurement with the reference against itself (the reference arm
        comes from the cache the first one filled, when there is one). Speed is measured even when the
        module does not ask for it: sizing its goals is what calibration is for. `accept_broken` is the
        module's reason (`mlx_calibrate(accept_broken=...)`) to size limits for a lever beyond the
        quality bounds; without it such a lever gets none (`verdicts.calibration`)."""
        if self._calibration is None:
            from ..verdicts.calibration import suggest_limits

            lever_kl = self.kl()
            self.say("calibration: the A/A floor (reference against itself, and with another prefill chunk)")
            with self.phases.timing("candidate"):
                floor_kl = self.kl_arms.measure(aa=True)
            assert floor_kl.aa is not None
            speed = self.speed()
            stats = lever_kl.stats.to_json()
            self._calibration = {
                "module": module,
                "lever": self.lever.describe(),
                "shape": {**self.shape.to_json(), "prompts": len(self.sequences)},
                "candidate": self.candidate.describe(),
                "kl": stats,
                "floors": floor_kl.aa["floors"],
                "aa_chunk": floor_kl.aa["chunk"],
                "speed": speed,
                "accept_broken": accept_broken,
                "suggested": suggest_limits(
                    stats,
                    floor_kl.aa["floors"],
                    speed,
                    module=module,
                    lever=self.lever.to_json(),
                    accept_broken=accept_broken,
                    tokens={str(k): v for k, v in lever_kl.token_text.items()},
                ),
            }
        return self._calibration

    @property
    def calibrated(self) -> bool:
        """The module's calibration was measured (its first test hands it on; the others only skip)."""
        return self._calibration is not None
