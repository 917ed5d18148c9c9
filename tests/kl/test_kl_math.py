"""Per-token vocabulary math (`pytest_mlxgate.stats.divergence`) against independent float64 numpy computations."""

from __future__ import annotations

import io
import math
import os
import signal
import time
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats import divergence as kl
from pytest_mlxgate.stats import row_blocks
from pytest_mlxgate.stats.divergence import (
    INITIAL_TAU,
    LOG_FLOOR,
    MAX_KEEP,
    MIN_KEEP,
    TAIL_MASS_TARGET,
    RefDistributions,
    TokenScores,
    compact_reference,
    compare,
    dtype_resolution,
    exact_kl,
    first_nonfinite_row,
)

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- independent float64 oracles -------------------------------------------------------------------


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    with np.errstate(divide="ignore"):
        return x - m - math.log(float(np.exp(x - m).sum()))


def logsumexp64(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0 or not np.isfinite(a).any():
        return -math.inf
    m = a[np.isfinite(a)].max()
    return float(m + math.log(float(np.exp(a - m).sum())))


def coarse_kl64(ref_row: np.ndarray, cand_row: np.ndarray, ids: np.ndarray) -> float:
    """KL between the two rows coarsened to `ids` plus one bin for everything else, in float64."""
    lp, lq = log_softmax64(ref_row), log_softmax64(cand_row)
    rest = np.setdiff1d(np.arange(lp.shape[0]), ids)
    p_bins = np.append(lp[ids], logsumexp64(lp[rest]))
    q_bins = np.append(lq[ids], logsumexp64(lq[rest]))
    live = p_bins > -np.inf
    return float(np.sum(np.exp(p_bins[live]) * (p_bins[live] - q_bins[live])))


def random_logits(seed: int, t: int, v: int, scale: float, *, spikes: int = 0, masked: float = 0.0) -> np.ndarray:
    """Gaussian logits, optionally with a few boosted tokens per row and some -inf (masked) ones."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, v)) * scale
    for row in x:
        if spikes:
            row[rng.choice(v, min(spikes, v), replace=False)] += rng.uniform(5, 20, min(spikes, v))
        if masked:
            hide = rng.random(v) < masked
            hide[int(np.argmax(row))] = False
            row[hide] = -np.inf
    return x.astype(np.float32)


def rows(ref: RefDistributions) -> list[np.ndarray]:
    return [ref.ids[a:b] for a, b in pairwise(ref.offsets)]


logit_cases = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "t": st.integers(1, 5),
        "v": st.integers(1, 400),
        "scale": st.sampled_from([0.01, 0.5, 2.0, 3.0, 6.0, 30.0]),
        "spikes": st.integers(0, 4),
        "masked": st.sampled_from([0.0, 0.0, 0.3, 0.97]),
    }
)


# --- the reference's sets follow the rules ------------------------------------------------------------


def check_row_rules(x: np.ndarray, ids: np.ndarray, logprobs: np.ndarray, tail_log: float) -> None:
    """One row of a compaction against the rules, recomputed in float64 from the logits."""
    v = x.shape[0]
    x64 = x.astype(np.float64)
    lp64 = log_softmax64(x64)
    k = ids.shape[0]
    assert 1 <= k <= min(v, MAX_KEEP)
    assert np.unique(ids).shape[0] == k
    assert ids[0] == int(np.argmax(x)), "the head of a row is the argmax (first of equal maxima)"

    # Ordered by logit descending (equal logits by id), up to float32 rounding of max - x.
    xs = np.where(np.isfinite(x64[ids]), x64[ids], -1e30)
    slack = 1e-6 * (1.0 + np.abs(xs[:-1]))
    assert np.all(np.diff(xs) <= slack)
    rest = np.setdiff1d(np.arange(v), ids)
    if rest.size and np.isfinite(x64[ids]).all():
        assert x64[rest].max() <= xs.min() + 1e-6 * (1.0 + abs(xs.min())), "the set is a top-k"

    # Log-probs over the FULL vocabulary, and the tail without cancellation.
    finite = np.isfinite(lp64[ids])
    assert np.array_equal(np.isfinite(logprobs), finite)
    np.testing.assert_allclose(logprobs[finite], lp64[ids][finite], rtol=1e-6, atol=2e-5)
    tail64 = logsumexp64(lp64[rest])
    if tail64 < -70:  # beyond float32's exp: exp(x - max) underflows, so only "negligible" is checkable
        assert tail_log == -math.inf or tail_log < -65
    else:
        assert math.isfinite(tail_log)
        assert abs(math.exp(tail_log) - math.exp(tail64)) <= 1e-4 * math.exp(tail64) + 1e-12

    # The selection rule: INITIAL_TAU set, at least MIN_KEEP, tail target, at most MAX_KEEP; minimal.
    top = lp64.max()
    surely_in = int(np.count_nonzero(lp64 >= top - INITIAL_TAU + 1e-4))
    maybe_in = int(np.count_nonzero(lp64 >= top - INITIAL_TAU - 1e-4))
    need = min(MIN_KEEP, v)
    if k < MAX_KEEP:
        assert k >= surely_in and k >= need
        assert math.exp(tail64) <= TAIL_MASS_TARGET * (1 + 1e-4) + 1e-9
        if k > max(maybe_in, need):  # the last token was needed for the tail target
            assert math.exp(logsumexp64([tail64, lp64[ids[-1]]])) > TAIL_MASS_TARGET * (1 - 1e-4)
    else:  # capped: the INITIAL_TAU set was too big, or MAX_KEEP - 1 tokens left too much tail
        short_tail = math.exp(logsumexp64([tail64, lp64[ids[-1]]]))
        assert maybe_in >= MAX_KEEP or short_tail > TAIL_MASS_TARGET * (1 - 1e-4)


@PROPERTY
@given(logit_cases)
def test_sets_follow_the_selection_rules(case: dict[str, float]) -> None:
    x = random_logits(
        int(case["seed"]),
        int(case["t"]),
        int(case["v"]),
        float(case["scale"]),
        spikes=int(case["spikes"]),
        masked=float(case["masked"]),
    )
    nxt = np.random.default_rng(int(case["seed"])).integers(0, x.shape[1], x.shape[0])
    ref = compact_reference(x, nxt)
    for r, ids in enumerate(rows(ref)):
        a, b = ref.offsets[r], ref.offsets[r + 1]
        check_row_rules(x[r], ids, ref.logprobs[a:b], float(ref.tail_logmass[r]))
    lp_next = np.array([log_softmax64(x[r])[nxt[r]] for r in range(x.shape[0])])
    finite = np.isfinite(lp_next)
    np.testing.assert_allclose(ref.next_logprob[finite], lp_next[finite], rtol=1e-6, atol=2e-5)
    assert np.all(np.isneginf(ref.next_logprob[~finite]))
    np.testing.assert_array_equal(ref.top1, np.argmax(x, axis=1))


@pytest.mark.parametrize("scale, spikes", [(3.0, 0), (2.5, 12), (6.0, 0)])
def test_sets_follow_the_rules_at_a_real_vocabulary_size(scale: float, spikes: int) -> None:
    """Full-size rows take the block/threaded paths: capped rows, widened rows, subsampled thresholds."""
    x = random_logits(7, 12, 49152, scale, spikes=spikes)
    ref = compact_reference(x, np.zeros(12, dtype=np.int64))
    for r, ids in enumerate(rows(ref)):
        a, b = ref.offsets[r], ref.offsets[r + 1]
        check_row_rules(x[r], ids, ref.logprobs[a:b], float(ref.tail_logmass[r]))


def test_flat_rows_cap_at_max_keep_with_the_exact_top() -> None:
    x = random_logits(3, 3, 6000, 1.0)
    ref = compact_reference(x, np.zeros(3, dtype=np.int64))
    for r, ids in enumerate(rows(ref)):
        assert ids.shape[0] == MAX_KEEP
        expected = np.lexsort((np.arange(6000), -x[r].astype(np.float64)))[:MAX_KEEP]
        np.testing.assert_array_equal(ids, expected)
        assert math.exp(float(ref.tail_logmass[r])) > TAIL_MASS_TARGET


def test_a_misleading_subsample_falls_back_to_the_full_set() -> None:
    """Every 16th token high, the rest a little lower: the strided guess keeps too few, and the row
    must still get its exact top MAX_KEEP."""
    v = 8192
    rng = np.random.default_rng(11)
    x = rng.standard_normal(v) * 0.1
    x[:: kl._SUBSAMPLE] += 5.0
    x = x.astype(np.float32)[None, :]
    ref = compact_reference(x, np.zeros(1, dtype=np.int64))
    expected = np.lexsort((np.arange(v), -x[0].astype(np.float64)))[:MAX_KEEP]
    np.testing.assert_array_equal(ref.ids, expected)


def test_rows_with_few_finite_logits_keep_min_keep_tokens() -> None:
    x = np.full((2, 50), -np.inf, dtype=np.float32)
    x[0, [3, 17, 40]] = [1.0, 0.5, -2.0]
    x[1, :] = -200.0  # finite, but exp underflows in float32
    x[1, 9] = 0.0
    ref = compact_reference(x, np.array([3, 9]))
    first, second = rows(ref)
    assert first.shape[0] == MIN_KEEP and list(first[:3]) == [3, 17, 40]
    assert np.all(np.isneginf(ref.logprobs[3:MIN_KEEP]))
    assert ref.tail_logmass[0] == -np.inf
    assert second.shape[0] == MIN_KEEP and second[0] == 9
    np.testing.assert_allclose(ref.logprobs[MIN_KEEP + 1 : 2 * MIN_KEEP], -200.0, atol=1e-4)
    scores = compare(ref, x, np.array([3, 9]), np.arange(2))
    assert np.all(scores.kl == 0.0)


# --- compare: KL against float64 ----------------------------------------------------------------------


@PROPERTY
@given(logit_cases)
def test_identical_logits_give_exactly_zero(case: dict[str, float]) -> None:
    x = random_logits(
        int(case["seed"]),
        int(case["t"]),
        int(case["v"]),
        float(case["scale"]),
        spikes=int(case["spikes"]),
        masked=float(case["masked"]),
    )
    nxt = np.random.default_rng(1).integers(0, x.shape[1], x.shape[0])
    ref = compact_reference(x, nxt)
    scores = compare(ref, x.copy(), nxt, np.arange(x.shape[0]))
    assert np.all(scores.kl == 0.0)
    np.testing.assert_array_equal(scores.cand_top1, scores.ref_top1)
    np.testing.assert_array_equal(scores.cand_next_logprob, scores.ref_next_logprob)


@PROPERTY
@given(logit_cases, st.sampled_from([1e-3, 0.05, 0.5, 3.0]))
def test_coarse_kl_matches_float64_and_bounds_the_exact_kl(case: dict[str, float], noise: float) -> None:
    x = random_logits(
        int(case["seed"]), int(case["t"]), int(case["v"]), float(case["scale"]), spikes=int(case["spikes"])
    )
    rng = np.random.default_rng(int(case["seed"]) + 1)
    y = (x + rng.standard_normal(x.shape) * noise).astype(np.float32)
    nxt = rng.integers(0, x.shape[1], x.shape[0])
    ref = compact_reference(x, nxt)
    scores = compare(ref, y, nxt, np.arange(x.shape[0]))
    exact = exact_kl(x, y)
    for r, ids in enumerate(rows(ref)):
        expected = coarse_kl64(x[r], y[r], ids)
        assert scores.kl[r] == pytest.approx(expected, rel=1e-4, abs=2e-6)
        assert scores.kl[r] <= exact[r] + 1e-6, "coarsening can only lose divergence"
        if ids.shape[0] == x.shape[1]:
            assert scores.kl[r] == pytest.approx(exact[r], rel=1e-4, abs=2e-6)
    lq = np.array([log_softmax64(y[r])[nxt[r]] for r in range(y.shape[0])])
    np.testing.assert_allclose(scores.cand_next_logprob, lq, rtol=1e-6, atol=2e-5)
    np.testing.assert_array_equal(scores.cand_top1, np.argmax(y, axis=1))
    np.testing.assert_array_equal(scores.ref_top1, np.argmax(x, axis=1))
    assert scores.kl.dtype == np.float64 and np.all(scores.kl >= 0)


def test_exact_kl_against_a_direct_float64_sum() -> None:
    x, y = random_logits(5, 4, 300, 3.0), random_logits(6, 4, 300, 3.0)
    for r in range(4):
        p, q = np.exp(log_softmax64(x[r])), np.exp(log_softmax64(y[r]))
        assert exact_kl(x, y)[r] == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-10)


@pytest.mark.parametrize("p1, q1", [(0.9, 0.5), (0.5, 0.9), (0.999, 0.001), (0.3, 0.31)])
def test_two_token_distributions_give_their_closed_form(p1: float, q1: float) -> None:
    x = np.log(np.array([[p1, 1 - p1]], dtype=np.float64)).astype(np.float32)
    y = np.log(np.array([[q1, 1 - q1]], dtype=np.float64)).astype(np.float32)
    # from the float32 logits actually used, so that only the KL math is under test
    p1, q1 = (float(np.exp(log_softmax64(a[0]))[0]) for a in (x, y))
    expected = p1 * math.log(p1 / q1) + (1 - p1) * math.log((1 - p1) / (1 - q1))
    scores = compare(compact_reference(x, np.array([0])), y, np.array([0]), np.array([0]))
    assert scores.kl[0] == pytest.approx(expected, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("v, peak", [(16, 3.0), (16, 9.0), (300, 12.0)])
def test_uniform_reference_against_a_peaked_candidate(v: int, peak: float) -> None:
    """KL(U || q) with q one token e^peak above the rest: -ln V + ln(e^peak + V - 1) - peak / V."""
    x = np.zeros((1, v), dtype=np.float32)
    y = np.zeros((1, v), dtype=np.float32)
    y[0, 5] = peak
    expected = -math.log(v) + math.log(math.exp(peak) + v - 1) - peak / v
    scores = compare(compact_reference(x, np.array([0])), y, np.array([0]), np.array([0]))
    assert scores.kl[0] == pytest.approx(expected, rel=1e-5)
    assert exact_kl(x, y)[0] == pytest.approx(expected, rel=1e-10)


def test_a_candidate_that_zeroes_a_likely_token_gets_a_large_finite_kl() -> None:
    x = np.zeros((1, 2), dtype=np.float32)
    y = np.array([[0.0, -np.inf]], dtype=np.float32)
    scores = compare(compact_reference(x, np.array([0])), y, np.array([0]), np.array([0]))
    # 0.5 ln(0.5 / 1) + 0.5 (ln 0.5 - LOG_FLOOR): the zeroed token counts as float32's smallest normal
    assert scores.kl[0] == pytest.approx(math.log(0.5) - 0.5 * LOG_FLOOR, rel=1e-6)
    assert math.isfinite(scores.kl[0]) and scores.kl[0] > 40


def test_compaction_error_is_small_on_a_large_vocabulary() -> None:
    """Tail coarsening loses at most a sliver of the exact KL on Gaussian + spike logits."""
    x = random_logits(21, 6, 20000, 2.5, spikes=5)
    y = (x + np.random.default_rng(22).standard_normal(x.shape) * 0.1).astype(np.float32)
    scores = compare(compact_reference(x, np.zeros(6, dtype=np.int64)), y, np.zeros(6, dtype=np.int64), np.arange(6))
    exact = exact_kl(x, y)
    assert np.all(scores.kl <= exact + 1e-6)
    assert np.all(scores.kl >= 0.9 * exact)


# --- results do not depend on blocks or threads ------------------------------------------------------


def test_blocks_and_threads_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    x = random_logits(4, 23, 3000, 3.0, spikes=3)
    y = (x + np.random.default_rng(5).standard_normal(x.shape) * 0.2).astype(np.float32)
    nxt = np.random.default_rng(6).integers(0, 3000, 23)
    ref = compact_reference(x, nxt)
    scores = compare(ref, y, nxt, np.arange(23))
    monkeypatch.setattr(row_blocks, "BLOCK_ELEMENTS", 3 * 3000)
    monkeypatch.setattr(row_blocks, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(row_blocks, "WORKERS", 3)
    ref2 = compact_reference(x, nxt)
    for name, value in ref.to_arrays().items():
        np.testing.assert_array_equal(ref2.to_arrays()[name], value, err_msg=name)
    np.testing.assert_array_equal(compare(ref, y, nxt, np.arange(23)).kl, scores.kl)
    assert np.all(compare(ref, x, nxt, np.arange(23)).kl == 0.0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_thread_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork copies the pool object but not its threads: the child must not wait on them forever."""
    monkeypatch.setattr(row_blocks, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(row_blocks, "WORKERS", 2)
    x = random_logits(12, 8, 300, 3.0)
    expected = compact_reference(x, np.zeros(8, dtype=np.int64)).ids  # the parent's pool now exists
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if it computes the same thing
        try:
            same = np.array_equal(compact_reference(x, np.zeros(8, dtype=np.int64)).ids, expected)
        finally:
            os._exit(0 if same else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on the parent's thread pool")


# --- near ties, non-finite rows, input checks ------------------------------------------------------------


def test_a_sequence_without_positions_is_empty_not_an_error() -> None:
    x = np.zeros((0, 10), dtype=np.float32)
    none = np.zeros(0, dtype=np.int64)
    ref = compact_reference(x, none)
    assert len(ref) == 0 and list(ref.offsets) == [0]
    assert len(compare(ref, x, none, none)) == 0
    assert len(RefDistributions.from_arrays(ref.to_arrays())) == 0
    assert first_nonfinite_row(x) is None


def test_dtype_resolution() -> None:
    assert dtype_resolution("float32") == 2.0**-23
    assert dtype_resolution("float16") == 2.0**-10
    assert dtype_resolution("bfloat16") == 2.0**-7
    assert dtype_resolution("mlx.core.bfloat16") == 2.0**-7
    assert dtype_resolution("no-such-dtype") == 2.0**-23


def test_near_ties_depend_on_the_native_dtype() -> None:
    x = np.full((3, 20), -5.0, dtype=np.float32)
    x[0, [2, 7]] = [10.0, 9.95]  # gap 0.05: inside 2 bf16 ulps at 10 (0.156), outside float16's (0.0195)
    x[1, [4, 6]] = [3.0, 3.0]  # an exact tie
    x[2, [1, 3]] = [10.0, 8.0]
    nxt = np.zeros(3, dtype=np.int64)
    assert list(compact_reference(x, nxt, logits_dtype="bfloat16").near_tie) == [True, True, False]
    assert list(compact_reference(x, nxt, logits_dtype="float16").near_tie) == [False, True, False]
    assert list(compact_reference(x, nxt).near_tie) == [False, True, False]
    assert list(compact_reference(x, nxt).top1) == [2, 4, 1]


def test_top1_agreement_fields_follow_argmax_with_ties_to_the_lowest_id() -> None:
    x = np.zeros((2, 10), dtype=np.float32)
    x[0, [3, 8]] = 2.0
    x[1, 1] = 1.0
    y = x.copy()
    y[1, 6] = 5.0  # the candidate's top token moves
    scores = compare(compact_reference(x, np.zeros(2, dtype=np.int64)), y, np.zeros(2, dtype=np.int64), np.arange(2))
    assert list(scores.ref_top1) == [3, 1] and list(scores.cand_top1) == [3, 6]
    assert scores.kl[0] == 0.0 and scores.kl[1] > 0
    signed_zeros = np.array([[-1.0, -0.0, 0.0, -0.0]], dtype=np.float32)  # -0.0 == +0.0: the first wins
    ref = compact_reference(signed_zeros, np.array([0]))
    assert list(ref.ids[:3]) == [1, 2, 3] and ref.top1[0] == np.argmax(signed_zeros[0]) == 1


def test_first_nonfinite_row() -> None:
    x = np.zeros((5, 8), dtype=np.float32)
    x[0, 2] = -np.inf  # masked tokens are fine
    assert first_nonfinite_row(x) is None
    x[3, 1] = np.nan
    assert first_nonfinite_row(x) == 3
    x[1, 7] = np.inf
    assert first_nonfinite_row(x) == 1
    z = np.zeros((3, 4), dtype=np.float32)
    z[2, :] = -np.inf
    assert first_nonfinite_row(z) == 2


def test_nonfinite_rows_and_mismatched_shapes_are_refused() -> None:
    x = np.zeros((3, 8), dtype=np.float32)
    ref = compact_reference(x, np.zeros(3, dtype=np.int64))
    bad = x.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="row 1"):
        compact_reference(bad, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="do not match"):
        compare(ref, np.zeros((4, 8), np.float32), np.zeros(4, dtype=np.int64), np.arange(4))
    with pytest.raises(ValueError, match="do not match"):
        compare(ref, np.zeros((3, 9), np.float32), np.zeros(3, dtype=np.int64), np.arange(3))
    with pytest.raises(ValueError, match="positions"):
        compare(ref, x, np.zeros(3, dtype=np.int64), np.arange(2))
    with pytest.raises(ValueError, match="next_tokens"):
        compare(ref, x, np.array([0, 1, 8]), np.arange(3))
    with pytest.raises(ValueError, match="row 1"):
        compare(ref, bad, np.zeros(3, dtype=np.int64), np.arange(3))


# --- serialisation ------------------------------------------------------------------------------------------


def _through_npz(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def test_ref_distributions_round_trip_through_npz() -> None:
    x = random_logits(8, 6, 500, 3.0, spikes=2, masked=0.1)
    ref = compact_reference(x, np.arange(6), logits_dtype="bfloat16")
    back = RefDistributions.from_arrays(_through_npz(ref.to_arrays()))
    assert back.vocab_size == ref.vocab_size == 500
    for name, value in ref.to_arrays().items():
        np.testing.assert_array_equal(back.to_arrays()[name], value, err_msg=name)
        assert back.to_arrays()[name].dtype == value.dtype
    assert np.all(compare(back, x, np.arange(6), np.arange(6)).kl == 0.0)


def _corrupt(arrays: dict[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    a = dict(arrays)
    if how == "missing":
        del a["tail_logmass"]
    elif how == "offsets_start":
        a["offsets"] = a["offsets"] + 1
    elif how == "empty_row":
        a["offsets"] = a["offsets"].copy()
        a["offsets"][2] = a["offsets"][1]
    elif how == "offsets_end":
        a["ids"] = a["ids"][:-1]
    elif how == "id_range":
        a["ids"] = a["ids"].copy()
        a["ids"][0] = 500
    elif how == "lengths":
        a["near_tie"] = a["near_tie"][:-1]
    elif how == "float_ids":
        a["ids"] = a["ids"].astype(np.float32)
    elif how == "vocab_shape":
        a["vocab_size"] = np.array([500, 500])
    elif how == "nan":
        a["logprobs"] = a["logprobs"].copy()
        a["logprobs"][3] = np.nan
    elif how == "positive":
        a["tail_logmass"] = a["tail_logmass"].copy()
        a["tail_logmass"][0] = 0.5
    return a


@pytest.mark.parametrize(
    "how",
    [
        "missing",
        "offsets_start",
        "empty_row",
        "offsets_end",
        "id_range",
        "lengths",
        "float_ids",
        "vocab_shape",
        "nan",
        "positive",
    ],
)
def test_from_arrays_rejects_inconsistent_arrays(how: str) -> None:
    ref = compact_reference(random_logits(9, 4, 500, 3.0), np.zeros(4, dtype=np.int64))
    RefDistributions.from_arrays(ref.to_arrays())  # the uncorrupted arrays load
    with pytest.raises(ValueError):
        RefDistributions.from_arrays(_corrupt(ref.to_arrays(), how))


def test_token_scores_round_trip_and_validation() -> None:
    x = random_logits(10, 5, 200, 3.0)
    y = (x + 0.1).astype(np.float32)
    scores = compare(compact_reference(x, np.arange(5)), y, np.arange(5), np.arange(10, 15))
    back = TokenScores.from_arrays(_through_npz(scores.to_arrays()))
    for name, value in scores.to_arrays().items():
        np.testing.assert_array_equal(getattr(back, name), value, err_msg=name)
        assert getattr(back, name).dtype == value.dtype
    broken = scores.to_arrays()
    broken["positions"] = broken["positions"][:-1]
    with pytest.raises(ValueError):
        TokenScores.from_arrays(broken)
    del broken["positions"]
    with pytest.raises(ValueError):
        TokenScores.from_arrays(broken)
