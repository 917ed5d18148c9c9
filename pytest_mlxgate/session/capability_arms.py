"""A gate module's capability tasks: both arms on the same items, once per task, tier, n and stopping rule,
with the reference arm cached beside the KL one and per-arm progress lines."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..capability.base import Budget
    from ..capability.result import CapabilityRun
    from ..capability.runner import ArmProgress
    from ..levers.lever import Arm
    from ..models.loaded import LoadedModel
    from .arms import ModuleArms

__all__ = ["CapabilityArms"]

#: How a capability run's reference arm was obtained, in the progress line's words.
_SOURCE_WORDS = {"cache": "from the reference cache", "computed": "computed", "mixed": "partly cached"}


class CapabilityArms:
    """`options`: the session's tier, max_new_tokens, allow_unsandboxed and whether this is one rank of an
    `mlx.launch` job (distributed)."""

    def __init__(self, arms: ModuleArms, options: Mapping[str, Any]) -> None:
        self.arms = arms
        self.options = options
        self._runs: dict[tuple[Any, ...], CapabilityRun] = {}

    def capability(
        self,
        task: str,
        *,
        n: int | Budget | None = None,
        tier: str | None = None,
        sequential: Mapping[str, float | None] | None = None,
    ) -> CapabilityRun:
        """Both arms of one capability task on the same items (once per module, task, tier and n).

        With `n=Budget(...)`, `sequential` holds the gate's max_drop, alpha and fail_alpha: the
        procedure stops on them, so they are part of what is remembered."""
        from ..capability.base import Budget

        tier = tier or self.options.get("tier", "smoke")
        seq = tuple(sorted((sequential or {}).items())) if isinstance(n, Budget) else ()
        key = (task, str(tier), n, seq)
        if self.options.get("distributed") and (self.arms.server or self.arms.ref_server):
            self.arms.refuse_server(f"capability task {task} split over mlx.launch ranks")
        if key not in self._runs:
            with self.arms.phases.timing("capability"):
                self._runs[key] = self._run(task, tier, n, sequential)
        return self._runs[key]

    def _run(
        self, task: str, tier: str, n: int | Budget | None, sequential: Mapping[str, float | None] | None
    ) -> CapabilityRun:
        from ..capability.base import Budget

        opts, say = self.options, self.arms.say
        if not opts.get("distributed"):
            from ..capability.runner import run_capability, run_capability_sequential
        else:  # one rank of an mlx.launch job: the items split over the ranks, the whole run on each
            from ..capability.distributed import run_capability_distributed as run_capability
            from ..capability.distributed import run_capability_sequential_distributed as run_capability_sequential
        ref = self.arms.reference_model()
        candidate = self.arms.candidate
        both: dict[str, Any] = dict(
            reference=(ref.model, ref.tokenizer),
            candidate=(candidate.model, candidate.tokenizer),
            lever=self.arms.lever,
            max_new_tokens=opts.get("max_new_tokens"),
            allow_unsandboxed=bool(opts.get("allow_unsandboxed")),
            servers={
                arm: server
                for arm, server in (("reference", self.arms.ref_server), ("candidate", self.arms.server))
                if server is not None
            },
            **self._cache(ref),
        )
        if isinstance(n, Budget):
            if not sequential or sequential.get("max_drop") is None:
                raise TypeError("n=Budget(...) sizes the drop test: it needs max_drop=")
            say(f"capability {task} ({tier}): batch by batch ({n.describe()})")
            found = run_capability_sequential(
                task,
                tier,  # type: ignore[arg-type]
                budget=n,
                max_drop=float(sequential["max_drop"]),  # type: ignore[arg-type]
                alpha=float(sequential.get("alpha") or 0.05),
                fail_alpha=sequential.get("fail_alpha"),
                say=say if self.arms.live else None,
                progress_for=self._arm_progress(f"capability {task} ({tier}) batch", closing=False),
                **both,
            )
            verdict = found.sequential or {}
            say(
                f"capability {task} ({tier}): {verdict.get('verdict')} after {found.n} items in "
                f"{verdict.get('batches')} batches ({verdict.get('stopped_by')}), drop bounds "
                f"[{verdict.get('lower', float('nan')):.3f}, {verdict.get('upper', float('nan')):.3f}]; "
                f"reference arm: {_SOURCE_WORDS.get(found.reference_source, found.reference_source)}"
            )
            return found
        say(f"capability {task} ({tier}): both arms, the same items")
        return run_capability(
            task,
            tier,  # type: ignore[arg-type]
            n=n,
            progress_for=self._arm_progress(
                f"capability {task} ({tier}{', rank 0 share' if opts.get('distributed') else ''})"
            ),
            **both,
        )

    def _cache(self, reference: LoadedModel) -> dict[str, Any]:
        """The capability reference cache beside the KL one, with the model's and lever's part of its key."""
        arms = self.arms
        if arms.cache is None or arms.ref_server is not None:  # a served reference is asked now, never cached
            return {}
        from ..capability.refcache import CapabilityCache
        from ..models.identity import model_identity

        return {
            "reference_cache": CapabilityCache(arms.cache.directory / "capability", files=arms.cache.files),
            "reference_key": {
                **model_identity(reference),
                "machine": dict(arms.machine),
                "lever": arms.lever.key("reference"),
            },
            "refresh_reference": arms.refresh_reference,
        }

    def _arm_progress(self, label: str, *, closing: bool = True) -> Callable[[Arm, int], ArmProgress] | None:
        """Per arm: items done / total, rate and ETA every interval (--mlx-progress-interval), the time
        limit checked as items finish, then one closing line (`closing`; the controller's terminal: a
        worker's lines are relayed there)."""
        watch = self.arms.watch
        if watch is None:
            if self.arms.progress is None:
                return None
            from ..common.watch import Watcher, progress_interval

            watch = Watcher(say=self.arms.progress, interval=progress_interval(None, self.arms.live), limit_s=None)

        def meter(arm: Arm, total: int) -> ArmProgress:
            line = watch.arm(
                f"{label} {arm} arm", total, unit="items", action="scoring", verb="scored", closing=closing
            )
            line(0, total)
            return line

        return meter
