"""KL from a server's top-k (`stats.topk`): a lower bound of the full KL at every k, exact with the whole
vocabulary, never below 0, rising as more tokens are shared (a finer grouping), and lists checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats.topk import TopK, TopKError, topk_kl


def _logsoftmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def _full_kl(lp: np.ndarray, lq: np.ndarray) -> float:
    return float(np.sum(np.exp(lp) * (lp - lq)))


def _topk(row: np.ndarray, k: int) -> TopK:
    ids = np.argsort(-row)[:k]
    rng = np.random.default_rng(k)
    shuffled = rng.permutation(ids)  # as mlx_lm.server sends them: an unsorted argpartition
    return TopK.read(((int(t), float(row[t])) for t in shuffled), where="test")


rows = st.tuples(
    st.integers(min_value=2, max_value=60),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.floats(min_value=0.01, max_value=6.0),
    st.floats(min_value=0.0, max_value=3.0),
)


def _pair(spec: tuple[int, int, float, float]) -> tuple[np.ndarray, np.ndarray]:
    vocab, seed, sharpness, drift = spec
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=vocab) * sharpness
    return _logsoftmax(logits), _logsoftmax(logits + rng.normal(size=vocab) * drift)


@settings(max_examples=300, deadline=None)
@given(spec=rows, k=st.integers(min_value=1, max_value=11), both=st.booleans())
def test_the_top_k_kl_is_a_lower_bound_of_the_full_kl_at_every_k(
    spec: tuple[int, int, float, float], k: int, both: bool
) -> None:
    lp, lq = _pair(spec)
    exact = _full_kl(lp, lq)
    reference = _topk(lp, k) if both else lp  # a server on both sides, or the reference in process
    got = topk_kl(reference, _topk(lq, k))
    assert 0.0 <= got.kl <= exact + 1e-9
    assert got.same_top == (int(np.argmax(lp)) == int(np.argmax(lq)))  # top-1 agreement is exact


@settings(max_examples=200, deadline=None)
@given(spec=rows)
def test_with_the_whole_vocabulary_the_bound_is_the_full_kl(spec: tuple[int, int, float, float]) -> None:
    lp, lq = _pair(spec)
    vocab = len(lp)
    got = topk_kl(lp, _topk(lq, vocab), slack=0.0)
    assert got.kl == pytest.approx(_full_kl(lp, lq), rel=1e-6, abs=1e-9)
    assert topk_kl(lp, lq).kl == pytest.approx(_full_kl(lp, lq), rel=1e-6, abs=1e-9)  # both in process


@settings(max_examples=200, deadline=None)
@given(spec=rows, k=st.integers(min_value=1, max_value=10))
def test_sharing_more_tokens_never_lowers_the_bound(spec: tuple[int, int, float, float], k: int) -> None:
    """A finer grouping (one more token its own bin) can only raise a coarse KL: the bound tightens with k."""
    lp, lq = _pair(spec)
    fewer, more = topk_kl(lp, _topk(lq, k), slack=0.0), topk_kl(lp, _topk(lq, k + 1), slack=0.0)
    assert more.kl >= fewer.kl - 1e-12
    assert more.shared == min(k + 1, len(lp)) and fewer.shared == min(k, len(lp))


@given(spec=rows, k=st.integers(min_value=1, max_value=11))
def test_identical_distributions_are_zero_apart(spec: tuple[int, int, float, float], k: int) -> None:
    lp, _ = _pair(spec)
    got = topk_kl(_topk(lp, k), _topk(lp, k))
    assert got.kl == pytest.approx(0.0, abs=1e-12) and got.same_top


def test_a_candidate_tail_rounded_to_nothing_is_room_not_a_division_by_zero() -> None:
    """A candidate whose listed mass rounds to 1 (no tail) where the reference keeps some: no infinity (the
    rounding slack is room for it), and still at most the full KL."""
    lp = np.log(np.array([0.5, 0.3, 0.2 - 1e-9, 1e-9]))
    lq = np.log(np.array([0.6, 0.3, 0.1 - 1e-12, 1e-12]))
    cand = TopK.read([(0, float(lq[0])), (1, float(lq[1])), (2, float(lq[2]))], where="p")
    got = topk_kl(lp, cand)
    assert np.isfinite(got.kl) and got.kl <= _full_kl(lp, lq)
    assert got.shared == 3 and got.cand_tail == pytest.approx(0.0, abs=1e-9)


def test_the_reference_s_likely_tokens_left_out_of_the_candidate_s_top_k_are_not_free() -> None:
    """Two top-k lists that share no token: a token the candidate's top k leaves out has at most its k-th
    probability, so the reference's likely tokens cost KL however the rest is spread (issue 56's review: a
    disjoint server read 0.0 and 'no difference')."""
    ref = TopK.read([(1, np.log(0.6)), (2, np.log(0.3))], where="ref")
    cand = TopK.read([(7, np.log(0.5)), (8, np.log(0.4))], where="cand")
    got = topk_kl(ref, cand)
    # the best the candidate can do: tokens 1 and 2 share its unlisted 0.1, in proportion: 0.9 ln 9 - 0.1 ln 9
    assert got.kl == pytest.approx(0.8 * np.log(9), rel=1e-3) and not got.same_top
    full_p = np.array([0.6, 0.3, 0.05, 0.05, 0.0])  # one world consistent with both lists
    full_q = np.array([0.05, 0.04, 0.01, 0.5, 0.4])
    live = full_p > 0
    assert got.kl <= float(np.sum(full_p[live] * np.log(full_p[live] / full_q[live])))


@settings(max_examples=300, deadline=None)
@given(spec=rows, k=st.integers(min_value=1, max_value=11), both=st.booleans(), slack=st.sampled_from([0.0, 1e-4]))
def test_the_bound_never_passes_the_full_kl_with_or_without_slack(
    spec: tuple[int, int, float, float], k: int, both: bool, slack: float
) -> None:
    lp, lq = _pair(spec)
    reference = _topk(lp, k + 3) if both else lp
    assert topk_kl(reference, _topk(lq, k), slack=slack).kl <= _full_kl(lp, lq) + 1e-9


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        ([], "an empty top-k list"),
        ([(1, -0.1), (1, -2.0)], "a token id appears twice"),
        ([("7", -0.1)], "token id '7' is not a whole number"),
        ([(True, -0.1)], "token id True is not a whole number"),
        ([(-1, -0.1)], "token id -1 is not a whole number"),
        ([(3, float("nan"))], "log-probability nan is not a finite number"),
        ([(3, None)], "log-probability None is not a finite number"),
        ([(3, 0.5)], "is above 0 (a probability > 1)"),
        ([(3, -0.1), (4, -0.2), (5, -0.3)], "add up to 2."),
    ],
)
def test_a_list_that_is_no_part_of_a_distribution_is_refused_naming_where(entries: list, said: str) -> None:
    with pytest.raises(TopKError, match="position 4: ") as e:
        TopK.read(entries, where="position 4")
    assert said in str(e.value)


def test_a_list_is_sorted_here_most_likely_first() -> None:
    read = TopK.read([(9, -3.0), (2, -0.7), (5, -1.5)], where="p")
    assert read.ids == (2, 5, 9) and read.logprobs == (-0.7, -1.5, -3.0) and read.top == 2


def _drifted(seed: int, drift: float, t: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A sequence of `t` rows over `v` tokens: reference logits, the candidate's (`drift` of noise on them),
    and the next tokens."""
    rng = np.random.default_rng(seed)
    ref_logits = (rng.normal(size=(t, v)) * 3).astype(np.float32)
    cand_logits = (ref_logits + rng.normal(size=(t, v)) * drift).astype(np.float32)
    return ref_logits, cand_logits, rng.integers(0, v, size=t)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    k=st.integers(min_value=1, max_value=11),
    drift=st.floats(min_value=0.0, max_value=2.0),
)
def test_a_sequence_scored_on_top_k_lists_is_bounded_by_the_full_comparison_row_by_row(
    seed: int, k: int, drift: float
) -> None:
    """`compare_topk` against `compare` (the candidate's whole logits) on one sequence: every row's KL at most
    the full one, top-1 exact, the next token's log-probability where the list holds it, NaN where not; rows
    not asked are left out and counted."""
    from pytest_mlxgate.stats.divergence import compact_reference, compare
    from pytest_mlxgate.stats.topk import compare_topk

    t, v = 8, 300
    ref_logits, cand_logits, nxt = _drifted(seed, drift, t, v)
    positions = np.arange(t)
    ref = compact_reference(ref_logits, nxt)
    full = compare(ref, cand_logits, nxt, positions)
    rows = [_logsoftmax(r.astype(np.float64)) for r in cand_logits]
    lists: list[TopK | None] = [_topk(r, k) for r in rows]
    lists[3] = None  # a position whose prompt could not be asked
    got = compare_topk(ref, lists, nxt, positions)
    kept = [i for i in range(t) if i != 3]
    assert got.unaskable == 1 and list(got.scores.positions) == kept and got.k == k
    assert np.all(got.scores.kl <= full.kl[kept] + 1e-6)
    assert np.array_equal(got.scores.cand_top1, full.cand_top1[kept])
    assert np.array_equal(got.scores.ref_top1, full.ref_top1[kept])
    listed = np.array([int(nxt[i]) in lists[i].ids for i in kept])  # type: ignore[union-attr]
    assert got.next_unlisted == int((~listed).sum())
    np.testing.assert_allclose(got.scores.cand_next_logprob[listed], full.cand_next_logprob[kept][listed], atol=1e-5)
    assert np.isnan(got.scores.cand_next_logprob[~listed]).all()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    k=st.integers(min_value=1, max_value=11),
    drift=st.floats(min_value=0.0, max_value=2.0),
    served_candidate=st.booleans(),
)
def test_a_served_reference_bounds_the_full_kl_against_a_candidate_in_process_or_served(
    seed: int, k: int, drift: float, served_candidate: bool
) -> None:
    """`served_reference` rows (a server's top-k, the rest one tail bin) scored by `compare` against the
    candidate's whole logits, or by `compare_topk` against its top-k: every row at most the full KL, top-1
    exact, a row not asked marked and dropped by `kept_scores`, the reference's next token NaN where unlisted."""
    from pytest_mlxgate.stats.divergence import compare, exact_kl
    from pytest_mlxgate.stats.topk import compare_topk, kept_scores, served_reference

    t, v = 8, 300
    ref_logits, cand_logits, nxt = _drifted(seed, drift, t, v)
    positions = np.arange(t)
    ref_rows = [_logsoftmax(r.astype(np.float64)) for r in ref_logits]
    ref_lists: list[TopK | None] = [_topk(r, k) for r in ref_rows]
    ref_lists[5] = None
    ref, asked = served_reference(ref_lists, nxt, v)
    assert list(asked) == [i != 5 for i in range(t)]
    if served_candidate:
        scores = compare_topk(ref, [_topk(_logsoftmax(r.astype(np.float64)), k) for r in cand_logits], nxt, positions)
        got = kept_scores(scores.scores, asked)
    else:
        got = kept_scores(compare(ref, cand_logits, nxt, positions), asked)
    kept = [i for i in range(t) if i != 5]
    assert list(got.positions) == kept
    full = exact_kl(ref_logits, cand_logits)[kept]
    assert np.all(got.kl >= 0) and np.all(got.kl <= full + 1e-5)
    assert np.array_equal(got.ref_top1, np.argmax(ref_logits, axis=1)[kept])
    assert np.array_equal(got.cand_top1, np.argmax(cand_logits, axis=1)[kept])
    listed = np.array([int(nxt[i]) in ref_lists[i].ids for i in kept])  # type: ignore[union-attr]
    assert np.isnan(got.ref_next_logprob[~listed]).all()
    np.testing.assert_allclose(got.ref_next_logprob[listed], np.array(ref_rows)[kept, nxt[kept]][listed], atol=1e-5)


def test_a_served_reference_with_the_whole_vocabulary_is_the_in_process_statistic() -> None:
    """With every token listed the tail is empty: the served rows score the full KL, at least what the
    reference's own compact rows (a tail bin of their own) give."""
    from pytest_mlxgate.stats.divergence import compact_reference, compare, exact_kl
    from pytest_mlxgate.stats.topk import served_reference

    rng = np.random.default_rng(3)
    t, v = 6, 40
    ref_logits = (rng.normal(size=(t, v)) * 2).astype(np.float32)
    cand_logits = (ref_logits + rng.normal(size=(t, v)) * 0.5).astype(np.float32)
    nxt, positions = rng.integers(0, v, size=t), np.arange(t)
    whole = [TopK.read(enumerate(_logsoftmax(r.astype(np.float64)).tolist()), where="test") for r in ref_logits]
    ref, asked = served_reference(whole, nxt, v)
    assert asked.all() and np.all(np.isneginf(ref.tail_logmass))
    got = compare(ref, cand_logits, nxt, positions)
    np.testing.assert_allclose(got.kl, exact_kl(ref_logits, cand_logits), rtol=1e-4, atol=1e-6)
    compacted = compare(compact_reference(ref_logits, nxt), cand_logits, nxt, positions).kl  # a tail bin: below
    assert np.all(compacted <= got.kl + 1e-6)
