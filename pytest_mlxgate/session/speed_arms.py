"""A gate module's speed and memory: both arms' prefill and decode, interleaved, once per module and never
cached across runs (a speed ratio means something only when both arms ran here, now)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ServerArmError

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
        if self.measured is None and self.arms.server is not None and self.arms.ref_server is not None:
            self.measured = self._served()
        if self.measured is None:
            self._refuse_one_server()
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

    def _refuse_one_server(self) -> None:
        """One arm served, one in process: a ratio of HTTP against a function call, never measured."""
        for flag, other, server in (
            ("--mlx-cand-server", "--mlx-ref-server", self.arms.server),
            ("--mlx-ref-server", "--mlx-cand-server", self.arms.ref_server),
        ):
            if server is not None:
                raise ServerArmError(
                    f"speed and memory through {flag} {server.endpoint.url} alone: the other arm runs in process, "
                    "and a ratio of a server's streamed tokens to a function call's times HTTP, not the lever. "
                    f"Serve both arms ({other} too) to time them against each other, or select the KL tests "
                    "(-k drift)"
                )

    def _served(self) -> dict[str, Any]:
        """Both servers' speed, streamed and paired (`speed.served`): the record's speed, with the servers."""
        import uuid

        from ..speed.served import CONCURRENT_REQUESTS, measure_served_speed
        from ..speed.shape import SpeedShape, default_contexts, default_decode

        arms = self.arms
        assert arms.server is not None and arms.ref_server is not None
        shape = self.shape or SpeedShape(contexts=default_contexts("cpu"), decode=default_decode("cpu"))
        tokenizer = arms.candidate.tokenizer
        pool = [t for s in arms.sequences for t in s.ids]

        def prompt(context: int, k: int) -> str:
            start = (k * 7919) % len(pool)
            ids = (pool[start:] + pool * (context // len(pool) + 1))[:context]
            return f"{k}. " + str(tokenizer.decode(ids))  # a number first: no prompt cache holds any of it

        arms.say(
            f"speed (served: {arms.ref_server.endpoint.url} against {arms.server.endpoint.url}): contexts "
            f"{', '.join(map(str, shape.contexts))} tokens, {shape.decode} decoded, then {CONCURRENT_REQUESTS} "
            "requests at once"
        )
        with arms.phases.timing("speed"):
            found, served = measure_served_speed(
                reference=arms.ref_server,
                candidate=arms.server,
                prompt=prompt,
                shape=shape,
                never=sorted(getattr(tokenizer, "eos_token_ids", None) or []),
                say=arms.say,
                watch=arms.watch,
            )
        return {"id": uuid.uuid4().hex, **found.to_json(), "served": served.to_json()}
