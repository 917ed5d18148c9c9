"""The `paired` fixture's value: a gate module's run of both arms, shared by its tests.

A `PairedRun` belongs to one gate module (its lever, sizes and prompts); every test of the module
that asks for `paired` shares it, so a module with a drift test and a capability test loads and
runs the arms once: KL through `kl.measure`, capability tasks through `capability.runner`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import VocabularyMismatchError
from ..kl.shape import ArmCounters, RunShape
from ..results.records import CALIBRATION_PROPERTY, RECORD_PROPERTY, gate_record
from ..verdicts.conclude import Conclusion
from .phases import PhaseClock
from .transport import stage, staged_records

if TYPE_CHECKING:
    from ..capability.assertions import CapabilitySubject
    from ..capability.base import Budget
    from ..capability.result import CapabilityRun
    from ..capability.runner import ArmProgress
    from ..common.watch import Watcher
    from ..kl.assertions import KLSubject
    from ..kl.prompts import TokenSequence
    from ..kl.refcache import ReferenceCache
    from ..kl.result import KLResult
    from ..levers.lever import Arm, Lever
    from ..models.loaded import LoadedModel
    from ..speed.assertions import SpeedSubject
    from ..speed.shape import SpeedShape

__all__ = ["Paired", "PairedRun"]


@dataclass
class PairedRun:
    """One gate module's arms; `kl()` runs them on first use and remembers the result."""

    lever: Lever
    shape: RunShape
    sequences: list[TokenSequence]
    sequences_digest: str
    candidate: LoadedModel
    reference: LoadedModel | None  # two-model mode only
    machine: dict[str, str]
    cache: ReferenceCache | None = None
    refresh_reference: bool = False
    aa: bool = False
    calibrate: bool = False  # --mlx-calibrate: `calibration()` instead of verdicts
    inconclusive: str = "fail"  # --mlx-inconclusive: what a gate that could not tell does
    allow_untrained: bool = False  # --mlx-allow-untrained: gates run on a model that predicts nothing
    explain: bool = False  # --mlx-explain: attribute every KL gate's drift; else only a failing gate's
    explain_budget: float = 0.0  # --mlx-explain-budget (the builder passes the session's); 0: never automatically
    progress: Callable[[str], None] | None = None
    live: bool = False  # interim progress lines (a terminal); else only a closing line per task and arm
    capability_options: dict[str, Any] = field(default_factory=dict)  # tier, max_new_tokens, allow_unsandboxed
    speed_shape: SpeedShape | None = None  # None: the module's speed is not asked for (mlx_speed, --mlx-speed)
    watch: Watcher | None = None  # the arms' progress lines, time limit and the run's speed-trial lock
    counters: ArmCounters = field(default_factory=ArmCounters)
    phases: PhaseClock = field(default_factory=PhaseClock)  # where the module's time went (each record's share)
    prove: str = "auto"  # --mlx-prove: show the limits work where no calibration covers the model (auto) or not
    require_proof: bool = False  # --mlx-require-proof: limits unproven on the model are an error
    # where the module's limits come from (`authoring.proof.LimitsProof.vouch`, set by the `paired` fixture);
    # None: verdicts go out as the assertions made them (A/A, calibration, a known-bad arm)
    vouch: Callable[[Conclusion], Conclusion] | None = None
    _capability: dict[tuple[Any, ...], CapabilityRun] = field(default_factory=dict)
    _result: KLResult | None = None
    _error: BaseException | None = None
    _untrained: str | None = None
    _untrained_checked: bool = False
    _speed: dict[str, Any] | None = None
    _calibration: dict[str, Any] | None = None
    _attribution: dict[str, Any] | None = None

    def skip_if_untrained(self) -> None:
        """Skip the gate (once checked, every gate of the module) when the reference model predicts
        the gate's prompts no better than chance, unless allowed (see `kl.untrained`)."""
        import pytest

        if self.allow_untrained:
            return
        if not self._untrained_checked:
            from ..kl.untrained import untrained_reason

            ref = self._reference_model()
            with self.phases.timing("check"):
                self._untrained = untrained_reason(ref.model, [s.ids for s in self.sequences])
            self._untrained_checked = True
        if self._untrained is not None:
            pytest.skip(self._untrained)

    def kl(self) -> KLResult:
        self.skip_if_untrained()
        if self._error is not None:
            raise self._error
        if self._result is None:
            try:
                self._result = self._timed_run()
            except BaseException as e:
                self._error = e
                raise
        return self._result

    def _timed_run(self) -> KLResult:
        """`_run`, its time charged to the reference and candidate phases (all to the candidate if it raised)."""
        import time

        started = time.perf_counter()
        try:
            found = self._run()
        except BaseException:
            self.phases.add("candidate", time.perf_counter() - started)
            raise
        reference_s = float(found.durations.get("reference_s", 0.0))
        self.phases.add("reference", reference_s)
        self.phases.add("candidate", time.perf_counter() - started - reference_s)
        return found

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
        self.skip_if_untrained()
        from ..capability.base import Budget

        tier = tier or self.capability_options.get("tier", "smoke")
        seq = tuple(sorted((sequential or {}).items())) if isinstance(n, Budget) else ()
        key = (task, str(tier), n, seq)
        if key not in self._capability:
            with self.phases.timing("capability"):
                self._capability[key] = self._capability_run(task, tier, n, sequential)
        return self._capability[key]

    def _capability_run(
        self, task: str, tier: str, n: int | Budget | None, sequential: Mapping[str, float | None] | None
    ) -> CapabilityRun:
        from ..capability.base import Budget

        opts = self.capability_options
        if not opts.get("distributed"):
            from ..capability.runner import run_capability, run_capability_sequential
        else:  # one rank of an mlx.launch job: the items split over the ranks, the whole run on each
            from ..capability.distributed import run_capability_distributed as run_capability
            from ..capability.distributed import run_capability_sequential_distributed as run_capability_sequential
        ref = self._reference_model()
        arms: dict[str, Any] = dict(
            reference=(ref.model, ref.tokenizer),
            candidate=(self.candidate.model, self.candidate.tokenizer),
            lever=self.lever,
            max_new_tokens=opts.get("max_new_tokens"),
            allow_unsandboxed=bool(opts.get("allow_unsandboxed")),
            **self._capability_cache(ref),
        )
        if isinstance(n, Budget):
            if not sequential or sequential.get("max_drop") is None:
                raise TypeError("n=Budget(...) sizes the drop test: it needs max_drop=")
            self._say(f"capability {task} ({tier}): batch by batch ({n.describe()})")
            found = run_capability_sequential(
                task,
                tier,  # type: ignore[arg-type]
                budget=n,
                max_drop=float(sequential["max_drop"]),  # type: ignore[arg-type]
                alpha=float(sequential.get("alpha") or 0.05),
                fail_alpha=sequential.get("fail_alpha"),
                say=self._say if self.live else None,
                progress_for=self._arm_progress(f"capability {task} ({tier}) batch", closing=False),
                **arms,
            )
            verdict = found.sequential or {}
            self._say(
                f"capability {task} ({tier}): {verdict.get('verdict')} after {found.n} items in "
                f"{verdict.get('batches')} batches ({verdict.get('stopped_by')}), drop bounds "
                f"[{verdict.get('lower', float('nan')):.3f}, {verdict.get('upper', float('nan')):.3f}]; "
                f"reference arm: {_SOURCE_WORDS.get(found.reference_source, found.reference_source)}"
            )
            return found
        self._say(f"capability {task} ({tier}): both arms, the same items")
        return run_capability(
            task,
            tier,  # type: ignore[arg-type]
            n=n,
            progress_for=self._arm_progress(
                f"capability {task} ({tier}{', rank 0 share' if opts.get('distributed') else ''})"
            ),
            **arms,
        )

    def speed(self) -> dict[str, Any]:
        """Both arms' prefill and decode speed and memory, interleaved (once per module; never
        cached across runs: a speed ratio means something only when both arms ran here, now).

        Untrained models are fine here: speed does not depend on what the weights predict."""
        if self._speed is None:
            import uuid

            from ..serving.caches import sliding_window
            from ..speed.measure import ArmModel, measure_speed
            from ..speed.shape import SpeedShape, default_contexts, default_decode, past_the_window

            device = self.machine.get("device", "cpu")
            shape = self.speed_shape or SpeedShape(
                contexts=past_the_window(default_contexts(device), sliding_window(self.candidate.model)),
                decode=default_decode(device),
            )
            ref = self._reference_model()
            candidate = ArmModel(ref.model, "reference") if self.aa else ArmModel(self.candidate.model, "candidate")
            what = "A/A: reference arm against itself" if self.aa else "both arms interleaved"
            self._say(
                f"speed ({what}): contexts {', '.join(map(str, shape.contexts))} tokens, "
                f"{shape.decode} decoded, up to {shape.repetitions} pairs each (fewer once decided)"
            )
            with self.phases.timing("speed"):
                found = measure_speed(
                    lever=self.lever,
                    reference=ArmModel(ref.model, "reference"),
                    candidate=candidate,
                    token_ids=[t for s in self.sequences for t in s.ids],
                    shape=shape,
                    say=self._say,
                    watch=self.watch,
                )
            self._speed = {"id": uuid.uuid4().hex, **found.to_json()}
        return self._speed

    def speed_if_asked(self) -> dict[str, Any] | None:
        """The module's speed when it asks for it (its records then carry it), else None."""
        return self.speed() if self.speed_shape is not None else None

    def calibration(self, module: str, accept_broken: str | None = None) -> dict[str, Any]:
        """--mlx-calibrate: the lever's drift, the A/A floor, speed and memory, and the limits they suggest.

        The A/A floor is a second `measure_kl` with the reference against itself (the reference arm
        comes from the cache the first one filled, when there is one). Speed is measured even when the
        module does not ask for it: sizing its goals is what calibration is for. `accept_broken` is the
        module's reason (`mlx_calibrate(accept_broken=...)`) to size limits for a lever beyond the
        quality bounds; without it such a lever gets none (`verdicts.calibration`)."""
        if self._calibration is None:
            from dataclasses import replace

            from ..verdicts.calibration import suggest_limits

            lever_kl = self.kl()
            self._say("calibration: the A/A floor (reference against itself, and with another prefill chunk)")
            with self.phases.timing("candidate"):
                floor_kl = replace(self, aa=True, _result=None, _error=None, _speed=None, _calibration=None)._run()
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

    def explanation(self, kl: KLResult, verdict: str) -> dict[str, Any] | None:
        """Drift attribution for this gate (`explain.attribute`), once per module: under --mlx-explain, or
        when the gate failed and the budget allows; None otherwise (A/A and calibration runs never)."""
        wanted = self.explain or (verdict == "fail" and self.explain_budget > 0)
        if not wanted or kl.aa is not None or self.calibrate:
            return None
        if self._attribution is not None:  # the module's arms, explained once for all its KL tests
            return self._attribution
        from ..explain.attribute import attribute
        from ..kl.measure import reference_key

        reference = self._reference_model()
        key = reference_key(
            model=reference,
            lever=self.lever,
            shape=self.shape,
            sequences_digest=self.sequences_digest,
            machine=self.machine,
        )
        refs = self.cache.load(key, len(self.sequences)) if self.cache is not None else None
        budget = self.explain_budget if self.explain_budget > 0 else 3.0
        try:
            with self.phases.timing("explain"):
                found = attribute(
                    lever=self.lever,
                    shape=self.shape,
                    sequences=self.sequences,
                    whole=kl.scores,
                    reference=reference,
                    candidate=self.candidate,
                    budget=budget,
                    refs=refs,
                    cache=self.cache,
                    cache_key=key,
                    say=self._say,
                    # the gate's own cost, both arms computed (a cached reference arm costs what the candidate's does)
                    gate_seconds=2 * float(kl.durations.get("candidate_s", 0.0)) or None,
                ).to_json()
        except Exception as e:  # attribution is a by-product: it never turns the gate's verdict into an error
            found = {
                "version": 0,
                "scopes": [],
                "residual": {"layers": []},
                "notes": [f"attribution could not run ({type(e).__name__}: {e}); the gate's verdict stands"],
            }
        self._attribution = found
        return found

    def _reference_model(self) -> LoadedModel:
        if not self.lever.two_models:
            return self.candidate
        if self.reference is None:
            raise VocabularyMismatchError("two-model mode needs a reference model: pass --mlx-reference NAME")
        from ..kl.measure import check_same_vocabulary

        check_same_vocabulary(self.reference, self.candidate)
        return self.reference

    def _run(self) -> KLResult:
        from ..kl.measure import measure_kl

        return measure_kl(
            lever=self.lever,
            shape=self.shape,
            sequences=self.sequences,
            sequences_digest=self.sequences_digest,
            reference=self._reference_model(),
            candidate=self.candidate,
            two_models=self.lever.two_models and self.reference is not None,
            machine=self.machine,
            cache=self.cache,
            refresh_reference=self.refresh_reference,
            aa=self.aa,
            counters=self.counters,
            say=self._say,
            watch=self.watch,
        )

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def _capability_cache(self, reference: LoadedModel) -> dict[str, Any]:
        """The capability reference cache beside the KL one, with the model's and lever's part of its key."""
        if self.cache is None:
            return {}
        from ..capability.refcache import CapabilityCache
        from ..models.identity import model_identity

        return {
            "reference_cache": CapabilityCache(self.cache.directory / "capability", files=self.cache.files),
            "reference_key": {
                **model_identity(reference),
                "machine": dict(self.machine),
                "lever": self.lever.key("reference"),
            },
            "refresh_reference": self.refresh_reference,
        }

    def _arm_progress(self, label: str, *, closing: bool = True) -> Callable[[Arm, int], ArmProgress] | None:
        """Per arm: items done / total, rate and ETA every interval (--mlx-progress-interval), the time
        limit checked as items finish, then one closing line (`closing`; the controller's terminal: a
        worker's lines are relayed there)."""
        watch = self.watch
        if watch is None:
            if self.progress is None:
                return None
            from ..common.watch import Watcher, progress_interval

            watch = Watcher(say=self.progress, interval=progress_interval(None, self.live), limit_s=None)

        def meter(arm: Arm, total: int) -> ArmProgress:
            line = watch.arm(
                f"{label} {arm} arm", total, unit="items", action="scoring", verb="scored", closing=closing
            )
            line(0, total)
            return line

        return meter


#: How a capability run's reference arm was obtained, in the progress line's words.
_SOURCE_WORDS = {"cache": "from the reference cache", "computed": "computed", "mixed": "partly cached"}


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
        return self.run.capability(task, n=n, tier=tier, sequential=sequential)

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
        arms: dict[str, Any] = {
            "candidate": run.candidate.describe(),
            "reference_model": run.reference.describe() if self.lever.two_models and run.reference else None,
            "lever": self.lever.to_json(),
            "path": self.shape.path,
        }
        record = gate_record(
            nodeid=self.nodeid,
            mode=conclusion.mode,
            verdict=conclusion.verdict,
            checks=conclusion.checks,
            bounds=conclusion.bounds,
            rerun=self.rerun,
            **{**arms, **conclusion.fields},
        )
        asked = run.speed_shape is not None and "speed" not in record
        speed = (run.speed() if measure else run._speed) if asked else None
        if speed is not None:
            record["speed"] = speed
        record["phases"] = run.phases.take()  # after the speed above: its trials are this record's work too
        stage(self.item, RECORD_PROPERTY, record)
        self.published = True

    def calibrate(self, keep: Callable[[Paired, dict[str, Any]], None] | None = None) -> None:
        """--mlx-calibrate: measure (once per module), hand the first test the calibration, skip every test.
        `keep` (the calibration file's writer, `authoring.calibration_run`) sees the measurement once, first."""
        import pytest

        from ..verdicts.calibration import accept_broken_from

        run = self.run
        first = run._calibration is None
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
        if self.run._result is not None:
            self.publish(self.run._result.conclusion(bounds={}, checks=[], verdict="measured"), measure=False)
        elif self.run._speed is not None:
            from ..speed.assertions import speed_conclusion

            self.publish(speed_conclusion(self.run._speed, {}, [], verdict="measured"), measure=False)

    def __repr__(self) -> str:
        return f"<paired {self.run.lever.describe()}>"


if TYPE_CHECKING:

    def _takes_every_assertion(paired: Paired) -> tuple[KLSubject, SpeedSubject, CapabilitySubject]:
        """mypy checks here that `Paired` offers what each assertion asks of the `paired` fixture."""
        return paired, paired, paired
