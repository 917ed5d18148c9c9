"""The KL at the edges of floating point, against float64 references: logits offset by ±1e4 (where a
log-softmax without its max subtraction overflows), masked (-inf) tokens, exact ties, float16 inputs.

Each property holds for the exact yardstick (`exact_kl`) and for the compacted pipeline both arms run
(`compact_reference` + `compare`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats.divergence import compact_reference, compare, exact_kl

EXTREMES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def kl64(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of one row, in float64 from scratch: shifted by the row max, masked entries skipped."""
    a, b = (np.asarray(r, dtype=np.float64) for r in (p_logits, q_logits))
    la = a - a.max() - math.log(math.fsum(np.exp(a - a.max())))
    lb = b - b.max() - math.log(math.fsum(np.exp(b - b.max())))
    live = np.isfinite(la)
    return math.fsum(np.exp(la[live]) * (la[live] - lb[live]))


@st.composite
def extreme_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Two (T, V) logit arrays: Gaussian rows at a per-row offset far from 0, some ties and some masks
    (never in the candidate where the reference has mass: that KL is infinite by definition)."""
    t, v = draw(st.integers(1, 4)), draw(st.integers(2, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.5, 3.0, 12.0]))
    x = rng.standard_normal((t, v)) * scale
    y = x + rng.standard_normal((t, v)) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
    for rows in (x, y):
        rows += np.asarray(draw(st.lists(st.sampled_from([0.0, 1e4, -1e4, 3e3]), min_size=t, max_size=t)))[:, None]
    if draw(st.booleans()):  # exact ties: the top value repeated, in both arms
        for rows in (x, y):
            rows[:, v // 2] = rows.max(axis=1)
    masked = draw(st.sampled_from([0.0, 0.3, 0.9]))
    if masked:  # masked in both arms (a token the vocabulary rules out), never a row's argmax
        hide = rng.random((t, v)) < masked
        hide[np.arange(t), np.argmax(x, axis=1)] = False
        hide[np.arange(t), np.argmax(y, axis=1)] = False
        x[hide] = -np.inf
        y[hide] = -np.inf
    return x, y


@EXTREMES
@given(extreme_pairs())
def test_the_exact_kl_is_the_float64_kl_wherever_the_logits_sit(pair: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = pair
    got = exact_kl(x, y)
    assert got.dtype == np.float64 and np.isfinite(got).all()
    for r in range(x.shape[0]):
        assert got[r] == pytest.approx(max(kl64(x[r], y[r]), 0.0), rel=1e-9, abs=1e-12)


@EXTREMES
@given(extreme_pairs())
def test_the_pipeline_both_arms_run_is_finite_and_bounded_by_the_exact_kl(pair: tuple[np.ndarray, np.ndarray]) -> None:
    x32, y32 = (a.astype(np.float32) for a in pair)
    t = x32.shape[0]
    nxt = np.argmax(x32, axis=1)
    scores = compare(compact_reference(x32, nxt), y32, nxt, np.arange(t))
    exact = np.array([kl64(x32[r], y32[r]) for r in range(t)])  # of the float32 values the arms hold
    assert np.isfinite(scores.kl).all() and (scores.kl >= 0).all()
    assert np.all(scores.kl <= exact + 1e-6 + 1e-4 * exact), "coarsening can only lose divergence"
    # the top-1 is the first of equal maxima in each arm, as argmax gives it
    np.testing.assert_array_equal(scores.ref_top1, np.argmax(x32, axis=1))
    np.testing.assert_array_equal(scores.cand_top1, np.argmax(y32, axis=1))
    # the candidate's log-probability of the next token, in float64 from scratch
    for r in range(t):
        b = y32[r].astype(np.float64)
        lq = b[nxt[r]] - b.max() - math.log(math.fsum(np.exp(b - b.max())))
        assert scores.cand_next_logprob[r] == pytest.approx(lq, rel=1e-5, abs=1e-4)


@EXTREMES
@given(extreme_pairs(), st.sampled_from([1e4, -1e4, 2e3]))
def test_a_shift_of_every_logit_in_a_row_changes_no_kl(pair: tuple[np.ndarray, np.ndarray], shift: float) -> None:
    """Softmax forgets a row's offset: in float64 (the yardstick) exactly so, up to rounding."""
    x, y = pair
    np.testing.assert_allclose(exact_kl(x + shift, y - shift), exact_kl(x, y), rtol=1e-6, atol=1e-9)


@EXTREMES
@given(extreme_pairs())
def test_float16_logits_are_scored_as_the_values_they_hold(pair: tuple[np.ndarray, np.ndarray]) -> None:
    """A model's float16 logits (what MLX hands over for a half-precision model) score as their exact
    float32/float64 values: no overflow of exp in half precision, nothing rounded further."""
    x16, y16 = (np.clip(a, -6e4, 6e4).astype(np.float16) for a in pair)  # float16 holds up to 65504
    t = x16.shape[0]
    nxt = np.argmax(x16, axis=1)
    half = compare(compact_reference(x16, nxt, logits_dtype="float16"), y16, nxt, np.arange(t))
    x32, y32 = x16.astype(np.float32), y16.astype(np.float32)
    single = compare(compact_reference(x32, nxt, logits_dtype="float16"), y32, nxt, np.arange(t))
    np.testing.assert_array_equal(half.kl, single.kl)
    np.testing.assert_allclose(exact_kl(x16, y16), [kl64(x32[r], y32[r]) for r in range(t)], rtol=1e-9, atol=1e-12)


def test_a_row_of_one_live_token_against_the_same_row_is_zero() -> None:
    x = np.full((1, 8), -np.inf)
    x[0, 3] = 1e4
    assert exact_kl(x, x)[0] == 0.0
    scores = compare(
        compact_reference(x.astype(np.float32), np.array([3])), x.astype(np.float32), np.array([3]), np.array([0])
    )
    assert scores.kl[0] == 0.0 and scores.cand_next_logprob[0] == 0.0
