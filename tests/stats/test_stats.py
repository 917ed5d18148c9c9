"""Statistics per gate (`pytest_mlxgate.stats`): t quantiles, interval coverage, the JSON summary."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.stats.divergence import TokenScores
from pytest_mlxgate.stats.intervals import (
    _betainc,
    _resampled_quantiles,
    cluster_bootstrap_quantile,
    cluster_bootstrap_quantiles,
    mean_interval,
    normal_quantile,
    proportion_interval,
    t_quantile,
    wilson_bounds,
    wilson_interval,
    wilson_lower,
    z_two_sided,
)
from pytest_mlxgate.stats.kl_stats import QUANTILES, KLStats, summarize

# --- distributions and intervals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "df, expected",
    [
        (1, 12.706204736),
        (2, 4.302652730),
        (5, 2.570581836),
        (10, 2.228138852),
        (30, 2.042272456),
        (math.inf, 1.959963985),
    ],
)
def test_t_quantile_matches_the_table_at_0_975(df: float, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-expected, rel=1e-8)


@pytest.mark.parametrize(
    "p, df, expected",
    [(0.95, 3, 2.353363435), (0.995, 1, 63.656741163), (0.9995, 4, 8.610301581), (0.9, 20, 1.325340707)],
)
def test_t_quantile_elsewhere_in_the_table(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-8)


def test_t_quantile_refuses_nonsense() -> None:
    assert t_quantile(0.5, 7) == 0.0
    for p, df in ((0.0, 3), (1.0, 3), (0.9, 0), (0.9, -1)):
        with pytest.raises(ValueError):
            t_quantile(p, df)


def test_normal_quantiles_refuse_what_is_no_probability() -> None:
    assert normal_quantile(0.0) == -math.inf and normal_quantile(1.0) == math.inf
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"^p must be in \[0, 1\], got "):
            normal_quantile(p)
    assert z_two_sided(0.95) == pytest.approx(1.959963985)
    for confidence in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"^confidence must be in \(0, 1\), got "):
            z_two_sided(confidence)


# t_quantile is cached: its __wrapped__ computes afresh, through the incomplete beta, every time.
@pytest.mark.parametrize("p", [0.001, 0.2, 0.6, 0.75, 0.9, 0.975, 0.999])
def test_t_quantile_has_the_closed_forms_at_one_and_two_degrees_of_freedom(p: float) -> None:
    assert t_quantile.__wrapped__(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile.__wrapped__(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)


@pytest.mark.parametrize("x", [1e-6, 0.05, 0.3, 0.5, 0.71, 0.97, 1 - 1e-6])
def test_incomplete_beta_equals_its_closed_forms(x: float) -> None:
    # Integer shapes: I_x(a, b) = P(Binomial(a + b - 1, x) >= a); on both sides of the switch point.
    for a, b in [(1, 1), (2, 3), (5, 2), (7, 7), (1, 9), (12, 4), (3, 20)]:
        n = a + b - 1
        exact = sum(math.comb(n, j) * x**j * (1 - x) ** (n - j) for j in range(a, n + 1))
        assert _betainc(a, b, x) == pytest.approx(exact, rel=1e-10, abs=1e-300), (a, b)
    # Non-integer shapes: I_x(a, 1) = x^a, I_x(1, b) = 1 - (1 - x)^b, I_x(1/2, 1/2) = 2/pi asin(sqrt x).
    assert _betainc(2.5, 1.0, x) == pytest.approx(x**2.5, rel=1e-10)
    assert _betainc(1.0, 0.5, x) == pytest.approx(-math.expm1(0.5 * math.log1p(-x)), rel=1e-10)
    assert _betainc(0.5, 0.5, x) == pytest.approx(2 / math.pi * math.asin(math.sqrt(x)), rel=1e-10)
    assert _betainc(3.0, 2.0, 0.0) == 0.0 and _betainc(3.0, 2.0, -0.5) == 0.0
    assert _betainc(3.0, 2.0, 1.0) == 1.0 and _betainc(3.0, 2.0, 1.5) == 1.0


def test_mean_interval_known_values() -> None:
    lo, hi = mean_interval(np.array([1.0, 2.0, 3.0, 4.0]))
    half = 3.182446305 * math.sqrt(5 / 3) / 2  # t(0.975, 3) * s / sqrt(n)
    assert (lo, hi) == (pytest.approx(2.5 - half, rel=1e-8), pytest.approx(2.5 + half, rel=1e-8))
    assert mean_interval(np.array([1.0, 2.0, 3.0, 4.0]), weights=np.full(4, 7.0)) == pytest.approx((lo, hi))
    assert mean_interval(np.array([3.0])) == (-math.inf, math.inf)
    assert mean_interval(np.array([2.0, 2.0, 2.0])) == (2.0, 2.0)
    with pytest.raises(ValueError):
        mean_interval(np.array([]))


def test_mean_interval_refuses_bad_input_by_name() -> None:
    for values in (np.array([]), np.ones((2, 2))):
        with pytest.raises(ValueError, match=r"^need a non-empty 1-D array of values, got shape "):
            mean_interval(values)
    weights_message = r"^weights must be non-negative, one per value, and not all zero$"
    for weights in (np.array([1.0, -1.0, 3.0]), np.array([1.0, 1.0]), np.zeros(3)):
        with pytest.raises(ValueError, match=weights_message):
            mean_interval(np.array([1.0, 2.0, 3.0]), weights=weights)


def test_zero_weights_drop_their_values_and_fractional_weights_count() -> None:
    values = np.array([1.0, 2.0, 3.0, 100.0])
    assert mean_interval(values, weights=np.array([1.0, 1.0, 1.0, 0.0])) == mean_interval(values[:3])
    assert mean_interval(values[:3], weights=np.full(3, 0.25)) == pytest.approx(mean_interval(values[:3]))
    assert mean_interval(np.array([4.0, 9.0]), weights=np.array([0.0, 2.0])) == (-math.inf, math.inf)  # one left


def test_a_non_finite_mean_gives_its_own_interval() -> None:
    assert mean_interval(np.array([1.0, math.inf])) == (-math.inf, math.inf)
    lo, hi = mean_interval(np.array([1.0, math.nan]))
    assert math.isnan(lo) and math.isnan(hi)


def test_weighted_mean_interval_centres_on_the_pooled_token_mean() -> None:
    tokens = [np.array([1.0, 1.0, 1.0, 5.0]), np.array([6.0]), np.array([0.0, 2.0])]
    lo, hi = mean_interval(np.array([t.mean() for t in tokens]), weights=np.array([t.size for t in tokens]))
    assert (lo + hi) / 2 == pytest.approx(np.concatenate(tokens).mean())
    assert lo < hi


@pytest.mark.parametrize(
    "k, n, expected",  # Newcombe (1998), Statistics in Medicine 17:857, Table II, method 3 (score)
    [(81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)), (0, 20, (0.0, 0.1611)), (1, 29, (0.0061, 0.1718))],
)
def test_wilson_interval_known_values(k: int, n: int, expected: tuple[float, float]) -> None:
    lo, hi = wilson_interval(k, n)
    assert (round(lo, 4), round(hi, 4)) == expected


def test_wilson_interval_edges_and_symmetry() -> None:
    z2 = 1.959963985**2
    assert wilson_interval(0, 10) == (0.0, pytest.approx(z2 / (10 + z2)))
    lo, hi = wilson_interval(3, 17)
    assert wilson_interval(14, 17) == (pytest.approx(1 - hi), pytest.approx(1 - lo))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_wilson_interval_refuses_impossible_counts_and_reaches_one_at_all_successes() -> None:
    for k, n in ((5, 4), (-1, 5), (0, -1)):
        with pytest.raises(ValueError, match=r"^need 0 <= successes <= n, got "):
            wilson_interval(k, n)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(10, 10)[0] < 1.0
    for k, n in ((5, 4), (-1, 5)):
        with pytest.raises(ValueError, match=r"^need 0 <= successes <= n, got "):
            wilson_lower(k, n)
    for confidence in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"^confidence must be in \(0, 1\), got "):
            wilson_lower(3, 10, confidence)


def test_proportion_interval_is_the_hull_of_wilson_and_the_weighted_t_interval() -> None:
    hits, sizes = np.array([1.0, 0.0, 9.0, 2.0]), np.array([1.0, 3.0, 10.0, 4.0])  # one single-token sequence
    for confidence in (0.8, 0.95):
        w_lo, w_hi = wilson_interval(12, 18, confidence)
        t_lo, t_hi = mean_interval(hits / sizes, confidence, weights=sizes)
        assert proportion_interval(hits, sizes, confidence) == (min(w_lo, max(0.0, t_lo)), max(w_hi, min(1.0, t_hi)))
    # Equal rates in every sequence: the t interval is a point, so the hull is Wilson's, at that confidence.
    even = proportion_interval(np.array([3.0, 6.0, 9.0]), np.array([10.0, 20.0, 30.0]), 0.8)
    assert even == wilson_interval(18, 60, 0.8)


# --- cluster bootstrap ---------------------------------------------------------------------------------------


def test_resampled_quantiles_equal_numpy_on_the_concatenated_resample() -> None:
    rng = np.random.default_rng(3)
    seqs = [rng.lognormal(size=int(n)) for n in rng.integers(1, 40, 9)]
    seqs[4][:] = seqs[2][0]  # ties across sequences
    qs = [0.0, 0.1, 0.5, 0.9, 0.999, 1.0]
    draws = rng.integers(0, len(seqs), size=(40, len(seqs)))
    ours = _resampled_quantiles(seqs, qs, draws)
    expected = np.array([np.quantile(np.concatenate([seqs[i] for i in d]), qs) for d in draws])
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=0)


def test_cluster_bootstrap_is_deterministic_and_honest_about_one_sequence() -> None:
    rng = np.random.default_rng(4)
    seqs = [rng.lognormal(size=50) for _ in range(12)]
    a = cluster_bootstrap_quantile(seqs, 0.9, resamples=200, seed=1)
    assert a == cluster_bootstrap_quantile(seqs, 0.9, resamples=200, seed=1)
    assert a != cluster_bootstrap_quantile(seqs, 0.9, resamples=200, seed=2)
    assert a[0] <= np.quantile(np.concatenate(seqs), 0.9) <= a[1]
    assert cluster_bootstrap_quantiles(seqs, [0.9], resamples=200, seed=1) == [a]
    assert cluster_bootstrap_quantile([seqs[0], np.array([])], 0.5) == (-math.inf, math.inf)


def test_cluster_bootstrap_is_the_percentile_interval_of_whole_sequence_resamples() -> None:
    rng = np.random.default_rng(6)
    seqs = [rng.lognormal(size=int(n)) for n in rng.integers(1, 30, 5)]
    qs, resamples, seed, confidence = [0.5, 0.9], 300, 3, 0.8
    draws = np.random.default_rng(seed).integers(0, len(seqs), size=(resamples, len(seqs)))
    stats = np.array([np.quantile(np.concatenate([seqs[i] for i in d]), qs) for d in draws])
    bounds = np.quantile(stats, [0.1, 0.9], axis=0)
    expected = [(bounds[0, i], bounds[1, i]) for i in range(len(qs))]
    ours = cluster_bootstrap_quantiles(seqs, qs, resamples=resamples, seed=seed, confidence=confidence)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)
    one = cluster_bootstrap_quantile(seqs, 0.9, resamples=resamples, seed=seed, confidence=confidence)
    assert one == pytest.approx(expected[1], rel=1e-12)
    # The defaults: 1000 resamples from seed 0, at 95%; two sequences are enough to resample.
    assert cluster_bootstrap_quantiles(seqs, qs) == cluster_bootstrap_quantiles(
        seqs, qs, resamples=1000, seed=0, confidence=0.95
    )
    assert cluster_bootstrap_quantile(seqs, 0.5) == cluster_bootstrap_quantiles(seqs, [0.5], resamples=1000, seed=0)[0]
    lo, hi = cluster_bootstrap_quantile(seqs[:2], 0.5, resamples=50)
    assert math.isfinite(lo) and math.isfinite(hi)


def test_cluster_bootstrap_sorts_once_whatever_the_number_of_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps 1000 resamples of 64 x 256 tokens cheap, counted instead of timed: the pooled
    tokens are sorted (and concatenated) once, and the resamples' quantiles come from one search,
    so the number of sorts, concatenations and quantile calls does not grow with the resamples
    (a per-resample concatenate + np.quantile would make 1000 of each)."""
    rng = np.random.default_rng(5)
    seqs = [rng.lognormal(size=256) for _ in range(64)]
    expensive = ("concatenate", "sort", "argsort", "partition", "argpartition", "quantile", "percentile")

    def counted(resamples: int) -> dict[str, int]:
        calls = dict.fromkeys(expensive, 0)
        with monkeypatch.context() as m:
            for name in expensive:
                real = getattr(np, name)

                def counting(*args: object, _name: str = name, _real: Any = real, **kw: object) -> Any:
                    calls[_name] += 1
                    return _real(*args, **kw)

                m.setattr(np, name, counting)
            cis = cluster_bootstrap_quantiles(seqs, list(QUANTILES.values()), resamples=resamples)
        assert all(lo < hi for lo, hi in cis)
        return calls

    few, many = counted(10), counted(1000)
    assert many == few, (few, many)
    assert sum(many.values()) <= 6, many


# --- coverage: sequences are the units, tokens are not -------------------------------------------------------


def ar1_lognormal(rng: np.random.Generator, reps: int, seqs: int, tokens: int, phi: float = 0.9) -> np.ndarray:
    """Per-token 'KL' exp(g), g an AR(1) with N(0, 1) marginals: correlated within a sequence, heavy-tailed."""
    g = np.empty((reps, seqs, tokens))
    g[..., 0] = rng.standard_normal((reps, seqs))
    shocks = rng.standard_normal((reps, seqs, tokens)) * math.sqrt(1 - phi**2)
    for t in range(1, tokens):
        g[..., t] = phi * g[..., t - 1] + shocks[..., t]
    return np.exp(g) * 1e-3


def test_sequence_level_mean_interval_covers_and_token_level_does_not() -> None:
    kl = ar1_lognormal(np.random.default_rng(2024), 300, 32, 64)
    true_mean = math.exp(0.5) * 1e-3  # E[exp(N(0, 1))]
    by_sequence = np.mean([lo <= true_mean <= hi for lo, hi in (mean_interval(r.mean(axis=1)) for r in kl)])
    by_token = np.mean([lo <= true_mean <= hi for lo, hi in (mean_interval(r.ravel()) for r in kl)])
    assert by_sequence >= 0.90
    assert by_token <= 0.70, "tokens are not independent: a token-level interval is far too narrow"


@pytest.mark.slow  # a coverage simulation
def test_cluster_bootstrap_median_covers_and_token_bootstrap_does_not() -> None:
    kl = ar1_lognormal(np.random.default_rng(7), 60, 32, 64)
    true_median = 1e-3  # exp(median of N(0, 1))
    clustered = np.mean(
        [
            lo <= true_median <= hi
            for lo, hi in (cluster_bootstrap_quantile(list(r), 0.5, resamples=300, seed=i) for i, r in enumerate(kl))
        ]
    )
    tokens = np.mean(
        [
            lo <= true_median <= hi
            for lo, hi in (
                cluster_bootstrap_quantile(list(r.reshape(-1, 1)), 0.5, resamples=300, seed=i) for i, r in enumerate(kl)
            )
        ]
    )
    assert clustered >= 0.85
    assert tokens <= 0.75


# --- the summary -----------------------------------------------------------------------------------------------

EXPECTED_KEYS = [
    "n_prompts",
    "n_sequences",
    "n_tokens",
    "confidence",
    "mean",
    "mean_ci",
    "median",
    "p90",
    "p95",
    "p99",
    "p999",
    "quantile_ci",
    "max",
    "max_at",
    "same_top",
    "same_top_ci",
    "top1",
    "top1_ci",
    "flips",
    "near_tie_flips",
    "near_ties",
    "ln_ppl_ratio",
    "ln_ppl_ratio_ci",
    "delta_p",
    "worst",
    "worst_prompts",
]


def make_scores(
    kl: list[float],
    *,
    ref_top1: list[int] | None = None,
    cand_top1: list[int] | None = None,
    near_tie: list[bool] | None = None,
    ref_lp: list[float] | None = None,
    cand_lp: list[float] | None = None,
    first_position: int = 0,
    token0: int = 100,
) -> TokenScores:
    n = len(kl)
    ref_top = np.array(ref_top1 if ref_top1 is not None else [1] * n, dtype=np.int32)
    return TokenScores(
        kl=np.array(kl, dtype=np.float64),
        ref_top1=ref_top,
        cand_top1=np.array(cand_top1, dtype=np.int32) if cand_top1 is not None else ref_top.copy(),
        near_tie=np.array(near_tie if near_tie is not None else [False] * n, dtype=bool),
        ref_next_logprob=np.array(ref_lp if ref_lp is not None else [-1.0] * n, dtype=np.float32),
        cand_next_logprob=np.array(cand_lp if cand_lp is not None else [-1.0] * n, dtype=np.float32),
        next_tokens=np.arange(token0, token0 + n, dtype=np.int32),
        positions=np.arange(first_position, first_position + n, dtype=np.int32),
    )


@pytest.fixture
def three_prompts() -> list[TokenScores]:
    return [
        make_scores(
            [0.1, 0.2, 0.0, 0.05],
            first_position=10,
            token0=100,
            ref_lp=[-1.0, -2.0, -0.5, -1.5],
            cand_lp=[-1.2, -2.2, -0.7, -1.7],
        ),
        make_scores(
            [0.5, 2.0, 0.3],
            first_position=20,
            token0=200,
            ref_top1=[5, 5, 7],
            cand_top1=[5, 6, 8],
            near_tie=[False, False, True],
            ref_lp=[-0.1, -0.2, -3.0],
            cand_lp=[-0.3, -0.4, -3.2],
        ),
        make_scores(
            [0.01, 0.02, 0.01, 0.03, 0.01],
            first_position=30,
            token0=300,
            near_tie=[False, True, False, False, False],
            ref_lp=[-1.0] * 5,
            cand_lp=[-1.2] * 5,
        ),
    ]


def test_summary_json_has_exactly_the_documented_keys(three_prompts: list[TokenScores]) -> None:
    j = summarize(three_prompts).to_json()
    assert list(j) == EXPECTED_KEYS
    assert list(j["quantile_ci"]) == ["median", "p90", "p95", "p99", "p999"]
    assert list(j["max_at"]) == ["prompt", "position", "token_id"]
    assert list(j["delta_p"]) == ["mean", "rms", "p1", "p5", "median", "p95", "p99"]
    assert all(
        list(w) == ["prompt", "position", "kl", "token_id", "ref_top1", "cand_top1", "p_ref", "p_cand"]
        for w in j["worst"]
    )
    assert json.loads(json.dumps(j, allow_nan=False)) == j


def test_summary_values(three_prompts: list[TokenScores]) -> None:
    s = summarize(three_prompts)
    pooled = np.concatenate([t.kl for t in three_prompts])
    assert (s.n_prompts, s.n_tokens, s.confidence) == (3, 12, 0.95)
    assert s.mean == pytest.approx(pooled.mean())
    for name, q in QUANTILES.items():
        assert getattr(s, name) == pytest.approx(float(np.quantile(pooled, q)))
        lo, hi = s.quantile_ci[name]
        assert lo <= hi
    assert s.mean_ci[0] < s.mean < s.mean_ci[1]
    per_prompt = np.array([t.kl.mean() for t in three_prompts])
    lo, hi = mean_interval(per_prompt, weights=np.array([len(t) for t in three_prompts]))
    assert s.mean_ci == (pytest.approx(max(0.0, lo)), pytest.approx(hi))
    assert lo < 0 and s.mean_ci[0] == 0.0, "KL is never negative: the interval stops at 0"

    # The largest KL: prompt 1, its second token, at position 21, next token 201.
    assert s.max == 2.0
    j = s.to_json()
    assert j["max_at"] == {"prompt": 1, "position": 21, "token_id": 201}
    assert [(w["prompt"], w["position"]) for w in j["worst"]] == [(1, 21), (1, 20), (1, 22), (0, 11), (0, 10)]
    assert [w["kl"] for w in j["worst"]] == sorted((w["kl"] for w in j["worst"]), reverse=True)
    top = j["worst"][0]
    assert (top["token_id"], top["ref_top1"], top["cand_top1"]) == (201, 5, 6)
    assert top["p_ref"] == pytest.approx(math.exp(-0.2), rel=1e-6)
    assert top["p_cand"] == pytest.approx(math.exp(-0.4), rel=1e-6)
    assert j["worst_prompts"] == [
        {"prompt": 1, "mean_kl": pytest.approx(2.8 / 3)},
        {"prompt": 0, "mean_kl": pytest.approx(0.0875)},
        {"prompt": 2, "mean_kl": pytest.approx(0.016)},
    ]

    # One real flip and one near-tie flip, counted apart; two near ties in all.
    assert (s.flips, s.near_tie_flips, s.near_ties) == (1, 1, 2)
    assert s.same_top == pytest.approx(10 / 12)
    assert s.top1 == pytest.approx(11 / 12)
    for value, (lo, hi) in ((s.same_top, s.same_top_ci), (s.top1, s.top1_ci)):
        assert 0.0 <= lo <= value <= hi <= 1.0

    # The candidate gives the text's tokens less probability: ln(PPL_cand / PPL_ref) > 0.
    assert s.ln_ppl_ratio == pytest.approx(0.2, abs=1e-6)
    assert s.ln_ppl_ratio_ci[0] == pytest.approx(0.2, abs=1e-6)
    assert s.delta_p["mean"] < 0 and s.delta_p["p99"] < 0


def test_a_better_candidate_has_a_negative_ln_ppl_ratio() -> None:
    scores = [make_scores([0.1] * 4, ref_lp=[-2.0] * 4, cand_lp=[-1.5] * 4) for _ in range(3)]
    s = summarize(scores)
    assert s.ln_ppl_ratio == pytest.approx(-0.5)
    assert s.delta_p["mean"] == pytest.approx(math.exp(-1.5) - math.exp(-2.0), rel=1e-6)


def test_proportion_intervals_are_the_more_conservative_one() -> None:
    rng = np.random.default_rng(9)
    scores = []
    for i in range(8):
        flip = rng.random(40) < (0.05 if i % 2 else 0.4)  # prompts differ a lot: the t interval is wider
        scores.append(make_scores([0.1] * 40, ref_top1=[1] * 40, cand_top1=list(np.where(flip, 2, 1))))
    s = summarize(scores)
    same = sum(int(np.sum(t.ref_top1 == t.cand_top1)) for t in scores)
    w_lo, w_hi = wilson_interval(same, 320)
    rates = np.array([np.mean(t.ref_top1 == t.cand_top1) for t in scores])
    t_lo, t_hi = mean_interval(rates)
    assert s.same_top_ci == (pytest.approx(min(w_lo, t_lo)), pytest.approx(max(w_hi, t_hi)))
    assert s.same_top_ci[0] < w_lo


def test_one_prompt_gives_unbounded_intervals_as_none() -> None:
    s = summarize([make_scores([0.1, 0.4, 0.2])])
    j = s.to_json()
    assert j["mean_ci"] == [0.0, None]  # KL >= 0, and one prompt says nothing about the upper end
    assert all(v == [None, None] for v in j["quantile_ci"].values())
    assert j["ln_ppl_ratio_ci"] == [None, None]
    assert j["same_top_ci"] == [0.0, 1.0]
    json.dumps(j, allow_nan=False)


def test_infinite_values_become_none() -> None:
    scores = [make_scores([0.1, 0.2], cand_lp=[-1.0, -math.inf]), make_scores([0.3, 0.1])]
    j = summarize(scores).to_json()
    assert j["ln_ppl_ratio"] is None
    json.dumps(j, allow_nan=False)


def test_summary_round_trips_through_json(three_prompts: list[TokenScores]) -> None:
    s = summarize(three_prompts)
    back = KLStats.from_json(json.loads(json.dumps(s.to_json(), allow_nan=False)))
    assert back.to_json() == s.to_json()
    one = summarize([make_scores([0.1, 0.4])])
    assert KLStats.from_json(one.to_json()).mean_ci == (0.0, math.inf)
    assert KLStats.from_json(one.to_json()).ln_ppl_ratio_ci == (-math.inf, math.inf)


def test_empty_prompts_are_skipped_and_no_tokens_is_refused() -> None:
    s = summarize([make_scores([0.2, 0.3]), make_scores([]), make_scores([0.5])])
    assert (s.n_prompts, s.n_tokens) == (3, 3)
    assert s.max_at.prompt == 2 and s.worst_prompts[0].prompt == 2
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([make_scores([])])


def test_summary_refuses_nothing_to_summarize_by_name_and_takes_a_single_token() -> None:
    with pytest.raises(ValueError, match=r"^summarize needs at least one prompt's scores$"):
        summarize([])
    with pytest.raises(ValueError, match=r"^summarize needs at least one scored token$"):
        summarize([make_scores([]), make_scores([])])
    one = summarize([make_scores([0.25])])
    assert (one.n_tokens, one.mean, one.max) == (1, 0.25, 0.25)


def test_summary_at_another_confidence_with_uneven_prompts() -> None:
    """Prompts of different lengths and ratios, a trailing empty prompt: every interval at 80%, weighted
    by tokens, from the per-prompt sums of the live prompts only."""
    rng = np.random.default_rng(11)
    lengths = [7, 3, 12, 5, 9]
    scores = []
    for i, n in enumerate(lengths):
        ref_lp = -rng.random(n) * 3
        scores.append(
            make_scores(
                list(rng.random(n) * (i + 1)),
                ref_lp=list(ref_lp),
                cand_lp=list(ref_lp - rng.random(n) * (i + 1) * 0.1),
                ref_top1=[1] * n,
                cand_top1=list(np.where(rng.random(n) < 0.3, 2, 1)),
                near_tie=list(rng.random(n) < 0.4),
            )
        )
    scores.append(make_scores([]))
    s = summarize(scores, confidence=0.8)
    live = scores[:-1]
    w = np.array(lengths, dtype=np.float64)
    lo, hi = mean_interval(np.array([t.kl.mean() for t in live]), 0.8, weights=w)
    assert s.mean_ci == (pytest.approx(max(0.0, lo), rel=1e-12), pytest.approx(hi, rel=1e-12))
    qcis = cluster_bootstrap_quantiles([t.kl for t in live], list(QUANTILES.values()), confidence=0.8)
    assert s.quantile_ci == dict(zip(QUANTILES, qcis, strict=True))
    ln = [np.asarray(t.ref_next_logprob, np.float64) - np.asarray(t.cand_next_logprob, np.float64) for t in live]
    assert s.ln_ppl_ratio_ci == pytest.approx(mean_interval(np.array([x.mean() for x in ln]), 0.8, weights=w), rel=1e-9)
    same = [t.ref_top1 == t.cand_top1 for t in live]
    agree = [sm | t.near_tie for sm, t in zip(same, live, strict=True)]
    sums = np.array([a.sum() for a in agree], dtype=np.float64)
    assert s.top1_ci == proportion_interval(sums, w, 0.8)
    assert s.same_top_ci == proportion_interval(np.array([a.sum() for a in same], dtype=np.float64), w, 0.8)
    flips = sum(int(np.sum(~sm & ~t.near_tie)) for sm, t in zip(same, live, strict=True))
    near_tie_flips = sum(int(np.sum(~sm & t.near_tie)) for sm, t in zip(same, live, strict=True))
    assert (s.flips, s.near_tie_flips) == (flips, near_tie_flips) and flips != near_tie_flips
    assert s.near_ties == sum(int(t.near_tie.sum()) for t in live)
    assert len(s.worst_prompts) == 3 and all(p.prompt < 5 for p in s.worst_prompts)
    dp = np.concatenate(
        [np.exp(t.cand_next_logprob.astype(np.float64)) - np.exp(t.ref_next_logprob.astype(np.float64)) for t in live]
    )
    q = np.quantile(dp, [0.01, 0.05, 0.5, 0.95, 0.99])
    assert s.delta_p == pytest.approx(
        {
            "mean": dp.mean(),
            "rms": math.sqrt(np.mean(dp * dp)),
            "p1": q[0],
            "p5": q[1],
            "median": q[2],
            "p95": q[3],
            "p99": q[4],
        },
        rel=1e-12,
    )


def test_ties_keep_prompt_order_among_the_worst() -> None:
    # Many equal KLs (more than a sort does by insertion): among equals, the earlier ones are shown first.
    levels = np.random.default_rng(0).choice([0.5, 0.25, 0.125], size=20)  # exact in binary: ties are exact
    s = summarize([make_scores([float(level)] * 10, first_position=10 * i) for i, level in enumerate(levels)])
    top = [i for i, level in enumerate(levels) if level == levels.max()]
    assert [(w.prompt, w.position) for w in s.worst] == [(top[0], 10 * top[0] + j) for j in range(5)]
    assert [p.prompt for p in s.worst_prompts] == top[:3]


def test_summary_from_json_reads_none_as_nan() -> None:
    j = summarize([make_scores([0.1, 0.2], cand_lp=[-1.0, -math.inf]), make_scores([0.3, 0.1])]).to_json()
    assert math.isnan(KLStats.from_json(j).ln_ppl_ratio)


def test_an_empty_prompt_is_never_among_the_worst() -> None:
    s = summarize([make_scores([0.2, 0.3]), make_scores([]), make_scores([0.5])])
    assert [(p.prompt, p.mean_kl) for p in s.worst_prompts] == [(2, 0.5), (0, pytest.approx(0.25))]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 100_000), frac=st.floats(0.0, 1.0), z=st.floats(0.1, 4.0))
def test_wilson_bounds_hold_the_observed_rate_and_reach_the_ends_at_all_or_none(n: int, frac: float, z: float) -> None:
    """0 <= lo <= k/n <= hi <= 1 for every count, and exactly 1 (0) for the upper (lower) bound when every
    (no) trial succeeded: there the formula's center +- half is the end in exact arithmetic, not in floats."""
    k = round(frac * n)
    lo, hi = wilson_bounds(k, n, z)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert wilson_bounds(n, n, z)[1] == 1.0 and wilson_bounds(0, n, z)[0] == 0.0


# --- n counts independent texts: windows of one text are one unit ---------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6), min_size=1, max_size=8))
def test_distinct_texts_are_the_sequences_themselves(kls: list[list[float]]) -> None:
    scores = [make_scores(k, first_position=10 * i) for i, k in enumerate(kls)]
    alone = summarize(scores).to_json()
    named = summarize(scores, texts=[f"prompt-{i}" for i in range(len(kls))]).to_json()
    assert named == alone and alone["n_prompts"] == alone["n_sequences"] == len(kls)


def test_sixteen_windows_of_one_text_are_n_1_with_no_interval() -> None:
    """Before: one prompt, 16 overlapping windows, reported as 16 prompts, and a bound as if they were
    16 samples passed the gate."""
    from pytest_mlxgate.kl.assertions import kl_checks

    rng = np.random.default_rng(7)
    scores = [make_scores(list(rng.uniform(0.0, 0.02, 8)), first_position=8 * i) for i in range(16)]
    apart = summarize(scores)
    one = summarize(scores, texts=["the one prompt"] * 16)
    assert (apart.n_prompts, apart.n_sequences) == (16, 16) and (one.n_prompts, one.n_sequences) == (1, 16)
    assert one.mean == apart.mean and one.n_tokens == apart.n_tokens  # the figures are the same tokens'
    assert math.isfinite(apart.mean_ci[1]) and one.to_json()["mean_ci"][1] is None
    (checked,) = kl_checks(one.to_json(), {"mean": 1.0})
    assert checked["verdict"] == "inconclusive" and checked["n"] == 1
    (alone,) = kl_checks(apart.to_json(), {"mean": 1.0})
    assert alone["verdict"] == "pass"  # the same numbers, wrongly counted, passed


def test_windows_are_pooled_per_text_before_the_interval() -> None:
    """16 sequences from 2 texts: the mean interval is the token-weighted t interval of the 2 texts'
    means, recomputed here from the per-text sums."""
    rng = np.random.default_rng(11)
    kls = [list(rng.uniform(0.0, 0.1 * (1 + i % 2), 6 + i % 3)) for i in range(16)]
    texts = ["a" if i % 2 == 0 else "b" for i in range(16)]
    s = summarize([make_scores(k) for k in kls], texts=texts)
    pooled = {t: [x for k, tt in zip(kls, texts, strict=True) if tt == t for x in k] for t in ("a", "b")}
    means = np.array([np.mean(pooled["a"]), np.mean(pooled["b"])])
    weights = np.array([len(pooled["a"]), len(pooled["b"])], dtype=np.float64)
    lo, hi = mean_interval(means, 0.95, weights=weights)
    assert s.n_prompts == 2 and s.n_sequences == 16
    assert s.mean_ci == pytest.approx((max(lo, 0.0), hi), rel=1e-12)
    assert s.mean_ci[1] - s.mean_ci[0] > np.ptp(summarize([make_scores(k) for k in kls]).mean_ci)


def test_texts_must_name_every_sequence() -> None:
    with pytest.raises(ValueError, match="texts names 1 sequences, the scores hold 2"):
        summarize([make_scores([0.1]), make_scores([0.2])], texts=["a"])
