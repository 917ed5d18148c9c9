"""A gate module's speed and memory: both arms' prefill and decode, interleaved, once per module and never
cached across runs (a speed ratio means something only when both arms ran here, now)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..speed.shape import SpeedShape
    from .arms import ModuleArms

__all__ = ["SpeedArms"]


class SpeedArms:
    """`shape` None: the module did not ask for speed (its contexts then default to the device's);
    `aa`: the reference arm against itself."""

    def __init__(self, arms: ModuleArms, shape: SpeedShape | None, *, aa: bool = False) -> None:
        self.arms = arms
        self.shape = shape
        self.aa = aa
        self.measured: dict[str, Any] | None = None

    def speed(self) -> dict[str, Any]:
        """Both arms' speed and memory, as a record carries it. Untrained models are fine here: speed
        does not depend on what the weights predict."""
        if self.measured is None:
            self.arms.refuse_server("speed and memory")
            import uuid

            from ..serving.caches import sliding_window
            from ..speed.measure import ArmModel, measure_speed
            from ..speed.shape import SpeedShape, default_contexts, default_decode, past_the_window

            arms = self.arms
            device = arms.machine.get("device", "cpu")
            shape = self.shape or SpeedShape(
                contexts=past_the_window(default_contexts(device), sliding_window(arms.candidate.model)),
                decode=default_decode(device),
            )
            ref = arms.reference_model()
            candidate = ArmModel(ref.model, "reference") if self.aa else ArmModel(arms.candidate.model, "candidate")
            what = "A/A: reference arm against itself" if self.aa else "both arms interleaved"
            arms.say(
                f"speed ({what}): contexts {', '.join(map(str, shape.contexts))} tokens, "
                f"{shape.decode} decoded, up to {shape.repetitions} pairs each (fewer once decided)"
            )
            with arms.phases.timing("speed"):
                found = measure_speed(
                    lever=arms.lever,
                    reference=ArmModel(ref.model, "reference"),
                    candidate=candidate,
                    token_ids=[t for s in arms.sequences for t in s.ids],
                    shape=shape,
                    say=arms.say,
                    watch=arms.watch,
                )
            self.measured = {"id": uuid.uuid4().hex, **found.to_json()}
        return self.measured
