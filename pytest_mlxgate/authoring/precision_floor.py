"""The precision's own floor: how far the plain low-precision path sits from the float32 oracle.

A limits proof in bfloat16 needs it beside the A/A floor: the A/A arm (the reference with another prefill
chunk) rounds the same way as the reference, so it cannot see the rounding a norm or RoPE kernel adds, and a
limit sized in float32 can sit below what plain bf16 ops already cost (measured: mean KL 1.85e-3 for the
embedded model). Such a limit reads rounding: `proof.inside_precision` turns its fail inconclusive and
never lets it be called proven.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.dtypes import ORACLE_DTYPE
from ..kl.arms import run_candidate
from ..kl.measure import computed_reference, reference_key
from ..kl.oracle import OracleArm
from ..kl.prompts import texts_of
from ..session.builder import oracle_of

if TYPE_CHECKING:
    from ..session.paired_run import PairedRun

__all__ = ["precision_floor"]


def precision_floor(run: PairedRun) -> dict[str, float] | None:
    """The plain reference arm's KL statistics from the float32 oracle, on the gate's own sequences (point
    values); None where the reference arm computes in float32 (it is the oracle)."""
    reference = run.reference_model()
    if reference.dtype == ORACLE_DTYPE:
        return None
    oracle = run.oracle or oracle_of(reference)
    keys = {
        name: reference_key(
            model=model, lever=run.lever, shape=run.shape, sequences_digest=run.sequences_digest, machine=run.machine
        )
        for name, model in (("reference", reference), ("oracle", oracle))
    }
    arm = OracleArm(
        oracle=oracle, reference=reference, oracle_key=keys["oracle"], reference_key=keys["reference"], cache=run.cache
    )
    counters = type(run.counters)()
    arm.prepare(
        run.sequences,
        lambda model, label: computed_reference(
            model, run.sequences, run.shape, run.lever, counters, run.say, run.watch, label
        )[0],
        run.say,
    )
    assert arm.refs is not None  # not the oracle itself (float32 returned above)
    if arm.plain is not None:  # kept beside the oracle by the gate's own measurement (or an earlier proof)
        return dict(arm.plain.figures)
    run.say(f"limits proof: the plain {reference.dtype} path against the float32 oracle (its own rounding)")
    scores = run_candidate(
        reference.model, run.sequences, run.shape, run.lever, arm.refs, counters=counters, arm="reference"
    )
    return dict(arm.keep_plain(scores, texts_of(run.sequences)).figures)
