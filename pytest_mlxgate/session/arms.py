"""What every measurement of one gate module shares: its lever, prompts and sizes, both models, where
the reference arm is cached, and where progress and time go. The KL, capability and speed runners
(`kl_arms`, `capability_arms`, `speed_arms`) each take one of these; `paired_run.PairedRun` is one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ServerArmError, VocabularyMismatchError
from ..kl.shape import ArmCounters, RunShape
from .phases import PhaseClock

if TYPE_CHECKING:
    from ..common.watch import Watcher
    from ..kl.prompts import TokenSequence
    from ..kl.refcache import ReferenceCache
    from ..levers.lever import Lever
    from ..models.loaded import LoadedModel
    from ..remote.arm import ServedArm

__all__ = ["ModuleArms"]


@dataclass
class ModuleArms:
    """A gate module's two arms and what they run on."""

    lever: Lever
    shape: RunShape
    sequences: list[TokenSequence]
    sequences_digest: str
    candidate: LoadedModel
    reference: LoadedModel | None  # two-model mode only
    machine: dict[str, str]
    cache: ReferenceCache | None = None
    refresh_reference: bool = False
    progress: Callable[[str], None] | None = None
    live: bool = False  # interim progress lines (a terminal); else only a closing line per task and arm
    watch: Watcher | None = None  # the arms' progress lines, time limit and the run's speed-trial lock
    counters: ArmCounters = field(default_factory=ArmCounters)
    phases: PhaseClock = field(default_factory=PhaseClock)  # where the module's time went (each record's share)
    oracle: LoadedModel | None = None  # the reference model in float32, when the module's gates ask for it
    server: ServedArm | None = None  # --mlx-cand-server: the candidate arm served over HTTP
    ref_server: ServedArm | None = None  # --mlx-ref-server: the reference arm served over HTTP

    def reference_model(self) -> LoadedModel:
        """The reference arm's model: the candidate's own (one-model levers) or the second model."""
        if not self.lever.two_models:
            return self.candidate
        if self.reference is None:
            raise VocabularyMismatchError("two-model mode needs a reference model: pass --mlx-reference NAME")
        from ..kl.measure import check_same_vocabulary

        check_same_vocabulary(self.reference, self.candidate)
        return self.reference

    def refuse_server(self, what: str) -> None:
        """A measurement the server arm cannot make yet: an error naming it, never one made in process and
        read as the server's."""
        for flag, server in (("--mlx-cand-server", self.server), ("--mlx-ref-server", self.ref_server)):
            if server is not None:
                raise ServerArmError(
                    f"{what} through {flag} {server.endpoint.url}: not measured through a server; its in-process "
                    f"arms would not be the server's. Run it without {flag}, or in one process"
                )

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)
