"""A gate module's KL measurement: both arms over its prompts once, remembered for all its KL tests;
the A/A floor beside it for calibration; and where a gate's drift comes from (attribution)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..kl.result import KLResult
    from .arms import ModuleArms

__all__ = ["KLArms"]


class KLArms:
    """Runs `measure_kl` on first use and remembers its result, or the error it raised."""

    def __init__(self, arms: ModuleArms, *, aa: bool = False) -> None:
        self.arms = arms
        self.aa = aa
        self.result: KLResult | None = None
        self._error: BaseException | None = None
        self._attribution: dict[str, Any] | None = None

    def kl(self) -> KLResult:
        if self._error is not None:
            raise self._error
        if self.result is None:
            try:
                self.result = self._timed_run()
            except BaseException as e:
                self._error = e
                raise
        return self.result

    def _timed_run(self) -> KLResult:
        """`measure`, its time charged to the reference and candidate phases (all to the candidate if it raised)."""
        import time

        phases = self.arms.phases
        started = time.perf_counter()
        try:
            found = self.measure(aa=self.aa)
        except BaseException:
            phases.add("candidate", time.perf_counter() - started)
            raise
        reference_s = float(found.durations.get("reference_s", 0.0))
        phases.add("reference", reference_s)
        phases.add("candidate", time.perf_counter() - started - reference_s)
        return found

    def measure(self, *, aa: bool) -> KLResult:
        """One measurement, not remembered: the lever's arms, or (`aa`) the reference against itself; with the
        float32 oracle (a module that asks for it), the kernel at the lever's site too (`kl.site`)."""
        from ..kl.measure import measure_kl

        arms = self.arms
        found = measure_kl(
            lever=arms.lever,
            shape=arms.shape,
            sequences=arms.sequences,
            sequences_digest=arms.sequences_digest,
            reference=arms.reference_model(),
            candidate=arms.candidate,
            two_models=arms.lever.two_models and arms.reference is not None,
            machine=arms.machine,
            cache=arms.cache,
            refresh_reference=arms.refresh_reference,
            aa=aa,
            counters=arms.counters,
            say=arms.say,
            watch=arms.watch,
            oracle=None if aa else arms.oracle,
            server=None if aa else arms.server,
            ref_server=None if aa else arms.ref_server,
        )
        if arms.oracle is not None and not aa and arms.server is None and arms.ref_server is None:
            self._judge_sites(found)
        return found

    def _judge_sites(self, found: KLResult) -> None:
        """The lever's functions on a bounded capture of the reference arm, each call against its float32 oracle."""
        from ..config.dtypes import ORACLE_DTYPE
        from ..kl.site import lever_sites, measure_sites

        arms = self.arms
        if arms.reference_model().dtype == ORACLE_DTYPE:
            found.site_note = (
                "float32: at the site the plain path is the oracle itself, so a kernel has no low-precision path to "
                "be compared with; the model-level check reads its KL against relative_atol"
            )
            return
        sites = lever_sites(arms.lever)
        if not sites:
            found.site_note = (
                "the lever swaps no function the plugin can call on its own (an environment flag, mx.compile, a KV "
                "plan or weights): only the model-level check against the float32 oracle applies"
            )
            return
        arms.say(f"site check: {', '.join(s.target for s in sites)} against float32 on the reference arm")
        found.site = measure_sites(arms.reference_model().model, arms.sequences, arms.shape, arms.lever, sites)
        # a capture of the reference arm: its time is the reference phase's (`_timed_run` reads reference_s)
        found.durations["site_s"] = round(found.site.seconds, 3)
        found.durations["reference_s"] = round(found.durations.get("reference_s", 0.0) + found.site.seconds, 3)
        found.durations["total_s"] = round(found.durations.get("total_s", 0.0) + found.site.seconds, 3)

    def explanation(self, kl: KLResult, budget: float) -> dict[str, Any]:
        """Where `kl`'s drift comes from (`explain.attribute`), once per module, within `budget` seconds.
        Attribution is a by-product: an error in it becomes a note, never the gate's verdict."""
        if self._attribution is not None:  # the module's arms, explained once for all its KL tests
            return self._attribution
        if self.arms.server is not None or self.arms.ref_server is not None:  # in process: not the server's arms
            self._attribution = {
                "version": 0,
                "scopes": [],
                "residual": {"layers": []},
                "notes": ["attribution runs the candidate in process, layer by layer: not for a server arm"],
            }
            return self._attribution
        from ..explain.attribute import attribute
        from ..kl.measure import reference_key

        arms = self.arms
        reference = arms.reference_model()
        key = reference_key(
            model=reference,
            lever=arms.lever,
            shape=arms.shape,
            sequences_digest=arms.sequences_digest,
            machine=arms.machine,
        )
        refs = arms.cache.load(key, len(arms.sequences)) if arms.cache is not None else None
        try:
            with arms.phases.timing("explain"):
                found = attribute(
                    lever=arms.lever,
                    shape=arms.shape,
                    sequences=arms.sequences,
                    whole=kl.scores,
                    reference=reference,
                    candidate=arms.candidate,
                    budget=budget,
                    refs=refs,
                    cache=arms.cache,
                    cache_key=key,
                    say=arms.say,
                    # the gate's own cost, both arms computed (a cached reference arm costs what the candidate's does)
                    gate_seconds=2 * float(kl.durations.get("candidate_s", 0.0)) or None,
                ).to_json()
        except Exception as e:
            found = {
                "version": 0,
                "scopes": [],
                "residual": {"layers": []},
                "notes": [f"attribution could not run ({type(e).__name__}: {e}); the gate's verdict stands"],
            }
        self._attribution = found
        return found
