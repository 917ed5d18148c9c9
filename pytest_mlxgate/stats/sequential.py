"""Sequential capability gate: add items in batches, look after every batch, stop once it is shown.

The gate's drop is delta = E[ref_i - cand_i] over paired items (positive = the candidate is worse),
with per-item scores in [0, 1] (0/1 pass/fail, or graded). Items are expensive, so the gate adds
them in batches and looks after each one, stopping as soon as it has shown either

* *pass*: the one-sided upper (1 - alpha) bound of delta is <= max_drop, or
* *fail* (regression shown): the one-sided lower (1 - alpha) bound of delta is > max_drop,

and otherwise (budget spent) reports *inconclusive* with what is missing. Looking after every batch
with a fixed-n bound (Wilson, t, Tango) would inflate the error rate several-fold (the tests measure
it); the bounds here are a *confidence sequence*: P(the drop ever leaves them, at ANY time) <= alpha
per side, so they stay valid under optional stopping at every batch, at a data-dependent time, and
for a caller that keeps looking as long as it likes.

Construction: the betting confidence sequence
---------------------------------------------
Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables by betting", JRSS-B
85(1):1-27 (arXiv:2010.09686). X_i = ref_i - cand_i lies in [-1, 1]; Y_i = (X_i + 1)/2 in [0, 1]
has mean m = (delta + 1)/2. For a candidate value m, a gambler who bets that the mean is BELOW m
holds the capital

    K_t^up(m) = prod_{i <= t} (1 + lambda_i(m) * (m - Y_i)),

a nonnegative martingale when the mean really is m (E[Y_i | past] = m). Ville's inequality gives
P(exists t: K_t^up(m) >= 1/alpha) <= alpha, so {m : max_{s<=t} K_s^up(m) < 1/alpha} is a one-sided
(1 - alpha) confidence sequence: its sup is the UPPER bound. The mirror gambler (1 + lambda (Y - m))
gives the LOWER bound. Each side is at level alpha on its own, so the pair is a two-sided
(1 - 2*alpha) confidence sequence; the gate only ever needs one side per verdict (a false pass needs
the upper bound to be wrong, a false fail the lower one), so each error is <= alpha.

Bets (predictable plug-in, WSR's "PrPl-EB" lambda, eq. 26-27 there, one-sided: log(1/alpha)):

    lambda_t = sqrt(2 log(1/alpha) / (sigma2_{t-1} * h_t)),   h_t = t log(1 + t),
    mu_t = (1/2 + sum_{i<=t} Y_i) / (t + 1),   sigma2_t = (1/4 + sum_{i<=t} (Y_i - mu_i)^2) / (t + 1),

truncated per side as WSR do: lambda_t(m) <= c/(1 - m) for the upper gambler (whose worst item, Y = 1,
then keeps a factor >= 1 - c) and <= c/m for the lower one, c = `TRUNCATION` = 3/4 (WSR suggest 1/2
or 3/4; 3/4 stops a near-exact lever ~30% earlier at the same error rates in the simulations). The
cap loosens away from the middle, so a few agreeing items already rule out large drops (8 of them:
drop <= 0.377). `horizon` = H replaces h_t by H: bets tuned to be sharpest at H items (WSR's
fixed-time choice) while staying anytime-valid, since validity needs only that lambda_t is fixed by
the items before t; H must be fixed before any item is seen (the item budget, say), never chosen
from the data. Every factor is >= 1 - c > 0 and K^up(m) increases in m (K^low decreases), so each
bound is found by bisection over m (to 1e-12, conservatively); the running max over time (WSR's
running intersection) is kept: a bound only tightens as items arrive, and a verdict once shown
stays shown. The verdict itself is the capital test at the margin (no bisection error).

Why this one:
* anytime-valid: optional stopping after every batch (or every item) cannot inflate the error rate;
* variance-adaptive, unlike Hoeffding-type sequences: sigma2 estimates the spread of the differences,
  so a near-exact lever (almost every X_i = 0) bets hard and stops early; with no discordant pair at
  all, alpha = 0.05 and max_drop = 0.10 the upper bound clears the margin at n = 38 (at 0.05: 78),
  where a Hoeffding sequence needs many hundreds;
* valid for any scores in [0, 1] (graded as well as 0/1), with no normal approximation: it only
  needs E[X_i | earlier items] = delta, i.e. the items arrive in an order that is independent of
  their outcomes (present them in a seeded shuffled order fixed in advance). A finite pool sampled
  without replacement is covered approximately (well for pools much larger than n).

What it costs (tests/stats/test_sequential.py simulates these, alpha = 0.05, a look after every batch
of 8 items, seeded runs): at a true drop exactly at the margin (0.05, 10% discordant) it passes
falsely in 3.3% of runs and fails falsely in 2.2% (both <= alpha; other nulls <= 3.8%), where a
fixed-n normal bound re-checked after every batch passes falsely in 22%; a near-exact lever (no drop,
margin 0.05) passes in >= 99% of runs within 400 items, on average after 80 (0% discordant), 93 (1%)
and 114 (2%) items; a 3-point excess (margin 0.02, true drop 0.05, 10% discordant) is shown as a
regression in 27% of runs within 400 items, 53% within 1000, 79% within 2000; at margin 0 a true drop
of 0.03 with 5% discordant is shown in 55% within 400 items and 83% within 800 (the fixed-n exact
McNemar test needs 371 items for 80%, but may look only once). Bets tuned to the budget (horizon =
max_items = 400) raise the 27% to 42%, and the near-exact passes come ~15 items later.

Caveats. Variance adaptivity has a price: the bets depend on the spread seen so far, so turning an
EARLY agreement into a loss can lower the later lower bound slightly (by <~0.003 in random
searches; the upper bound never decreased, and changing the latest item moves both bounds the right
way exactly). Each side is a separate one-sided sequence, so on items whose drop drifts (sorted by
subject, say) the running bounds can cross (lower > upper); `decide` then reports *inconclusive* and
says so. In a random order it did not happen in thousands of random sequences.

`n_needed` (for an inconclusive verdict) is a projection, not a guarantee: the same sequence is run on
the observed items followed by a synthetic continuation that repeats the observed per-item
differences in their observed proportions, laid out evenly (the empirical quantiles at the
golden-ratio points, so the +1/0/-1 mix is right in every prefix); it is the first total n at which
the bound would clear the margin, or None beyond `N_CAP` items or when the observed drop sits at the
margin. Because each continuation is a prefix of the next, one pass finds it (no search over n).

No scipy: pure numpy, deterministic.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..results.verdicts import Verdict
from .paired_tests import Scores, score_array

__all__ = [
    "N_CAP",
    "TRUNCATION",
    "PairBatch",
    "SequentialVerdict",
    "bounds_from_diffs",
    "decide",
    "drop_bounds",
    "log_capital",
    "run_sequential",
]

Side = Literal["upper", "lower"]
#: What `run_sequential`'s `next_batch(k)` returns: up to k (ref, cand) pairs (a list, a (k, 2) array),
#: fewer or none (empty, None) once the items are exhausted.
PairBatch = Sequence[tuple[float, float]] | np.ndarray | None

#: c in lambda_t(m) <= c / max(m, 1 - m): every capital factor stays >= 1 - c. WSR suggest 1/2 or 3/4.
TRUNCATION = 0.75
#: The longest projection `n_needed` looks at; beyond it the message says "more than N_CAP".
N_CAP = 100_000
_BISECT_WIDTH = 1e-12  # on the drop scale [-1, 1]
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


# --- validation -------------------------------------------------------------------------------------------


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5) (one-sided error per bound), got {alpha}")


def _check_max_drop(max_drop: float) -> None:
    if not 0.0 <= max_drop <= 1.0:
        raise ValueError(f"max_drop must be in [0, 1] (a drop in score, ref - cand), got {max_drop}")


def _check_horizon(horizon: int | None) -> None:
    if horizon is not None and not (isinstance(horizon, int | np.integer) and horizon >= 1):
        raise ValueError(f"horizon must be a positive number of items or None, got {horizon!r}")


def _scores(values: Scores, name: str) -> np.ndarray:
    arr = score_array(values, name)
    if arr.size and not (arr.min() >= 0.0 and arr.max() <= 1.0):
        raise ValueError(f"{name} scores must lie in [0, 1], got values in [{arr.min():g}, {arr.max():g}]")
    return arr


def _diffs(ref: Scores, cand: Scores) -> np.ndarray:
    r, c = _scores(ref, "ref"), _scores(cand, "cand")
    if r.shape != c.shape:
        raise ValueError(f"the arms must score the same items: {r.size} ref vs {c.size} cand scores")
    return np.asarray(r - c, dtype=np.float64)


# --- the capital process ------------------------------------------------------------------------------------


def _plugin_bets(x: np.ndarray, alpha: float, horizon: int | None) -> np.ndarray:
    """The untruncated PrPl-EB bet on the X scale (beta = lambda / 2), predictable: beta_t uses x_1..x_{t-1}.

    On X = 2Y - 1: mu_X = 2 mu_Y - 1 = sum x / (t + 1), sigma2_X = 4 sigma2_Y = (1 + sum (x - mu_X)^2)/(t + 1),
    and lambda (m - Y) = (lambda / 2)(delta - X), so beta = sqrt(2 log(1/alpha) / (sigma2_X h_t)).
    Written in X so that swapping the arms (x -> -x) mirrors every number exactly.
    """
    t = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    mu = np.cumsum(x, axis=-1) / (t + 1.0)
    sigma2 = (1.0 + np.cumsum((x - mu) ** 2, axis=-1)) / (t + 1.0)
    prev = np.concatenate([np.ones(x.shape[:-1] + (1,)), sigma2[..., :-1]], axis=-1)  # sigma2_0 = 1
    h = t * np.log1p(t) if horizon is None else np.full_like(t, float(horizon))
    return np.asarray(np.sqrt(2.0 * math.log(1.0 / alpha) / (prev * h)), dtype=np.float64)


def _log_capital(x: np.ndarray, bets: np.ndarray, drop: float, side: Side) -> np.ndarray:
    # lambda <= c/(1 - m) (upper) or c/m (lower); on the X scale beta <= c/(1 - drop) or c/(1 + drop).
    room = 1.0 - drop if side == "upper" else 1.0 + drop
    beta = bets if room <= 0.0 else np.minimum(bets, TRUNCATION / room)
    edge = drop - x if side == "upper" else x - drop
    return np.asarray(np.cumsum(np.log1p(beta * edge), axis=-1), dtype=np.float64)


def log_capital(
    diffs: np.ndarray, drop: float, *, side: Side, alpha: float = 0.05, horizon: int | None = None
) -> np.ndarray:
    """log K_t (t = 1..n) of the gambler against `drop`, for paired differences x = ref - cand in [-1, 1].

    side "upper" bets that the true drop is below `drop` (its wealth >= 1/alpha at some t rejects every
    value >= drop: the upper bound is below it); "lower" bets that it is above. Vectorized over leading
    axes (simulated runs x items): the last axis is the item order. The running max of the result
    against log(1/alpha) is exactly the test `decide` applies at the margin.
    """
    _check_alpha(alpha)
    _check_horizon(horizon)
    x = np.asarray(diffs, dtype=np.float64)
    if x.ndim < 1:
        raise ValueError("diffs needs an item axis")
    if x.size and not (np.all(np.isfinite(x)) and x.min() >= -1.0 and x.max() <= 1.0):
        raise ValueError("paired differences must lie in [-1, 1]")
    if not -1.0 <= drop <= 1.0:
        raise ValueError(f"drop must be in [-1, 1], got {drop}")
    if side not in ("upper", "lower"):
        raise ValueError(f"side must be 'upper' or 'lower', got {side!r}")
    return _log_capital(x, _plugin_bets(x, alpha, horizon), drop, side)


def _rejects(x: np.ndarray, bets: np.ndarray, drop: float, side: Side, threshold: float) -> bool:
    """Has the gambler against `drop` reached 1/alpha at any time so far (running intersection)?"""
    return bool(x.size) and float(np.max(_log_capital(x, bets, drop, side))) >= threshold


def _bisect(x: np.ndarray, bets: np.ndarray, side: Side, threshold: float) -> float:
    """The bound: the rejected value closest to the confidence sequence (conservative to 1e-12).

    The rejected set is [U, 1] (upper) or [-1, L] (lower); the ends -1 and 1 hold trivially. The interval
    is symmetric and the updates mirror each other, so lower(x) == -upper(-x) exactly.
    """
    lo, hi = -1.0, 1.0
    while hi - lo > _BISECT_WIDTH:
        mid = 0.5 * (lo + hi)
        if side == "upper":
            if _rejects(x, bets, mid, side, threshold):
                hi = mid
            else:
                lo = mid
        else:
            if _rejects(x, bets, mid, side, threshold):
                lo = mid
            else:
                hi = mid
    return hi if side == "upper" else lo


def bounds_from_diffs(diffs: np.ndarray, *, alpha: float = 0.05, horizon: int | None = None) -> tuple[float, float]:
    """(lower, upper) for paired differences in item order; see `drop_bounds`. No items: (-1, 1)."""
    _check_alpha(alpha)
    _check_horizon(horizon)
    x = np.asarray(diffs, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"diffs must be 1-D, got shape {x.shape}")
    if x.size and not (np.all(np.isfinite(x)) and x.min() >= -1.0 and x.max() <= 1.0):
        raise ValueError("paired differences must lie in [-1, 1]")
    bets = _plugin_bets(x, alpha, horizon)
    threshold = math.log(1.0 / alpha)
    return _bisect(x, bets, "lower", threshold), _bisect(x, bets, "upper", threshold)


def drop_bounds(ref: Scores, cand: Scores, *, alpha: float = 0.05, horizon: int | None = None) -> tuple[float, float]:
    """Anytime-valid one-sided bounds (lower, upper) of the drop E[ref - cand], items taken in the given order.

    EACH side is a one-sided (1 - alpha) confidence sequence: P(drop < lower at any n) <= alpha and
    P(drop > upper at any n) <= alpha, so together a two-sided (1 - 2 alpha) sequence. They are the
    running intersection over every prefix (a bound never loosens as items are added). Scores in [0, 1],
    one per item in the shared order; `horizon`: see the module docs (fix it before seeing data).
    """
    return bounds_from_diffs(_diffs(ref, cand), alpha=alpha, horizon=horizon)


# --- the verdict --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequentialVerdict:
    """What the sequential gate has shown, with its n, bounds and margin, JSON-ready for the report."""

    verdict: Verdict
    n: int
    drop: float  # observed mean of ref - cand (positive = the candidate is worse); nan with no items
    lower: float  # one-sided (1 - fail_alpha) anytime-valid lower bound of the drop
    upper: float  # one-sided (1 - alpha) anytime-valid upper bound of the drop
    max_drop: float
    alpha: float
    n_needed: int | None  # inconclusive: projected total items to clear the margin (None: beyond N_CAP / at it)
    message: str
    losses: int = 0  # items where the candidate scored lower than the reference
    wins: int = 0  # items where it scored higher
    horizon: int | None = None
    batches: int | None = None  # run_sequential: how many batches it drew; decide alone: None
    stopped_by: str | None = None  # run_sequential: "verdict" | "max_items" | "max_seconds" | "exhausted"
    fail_alpha: float | None = None  # the lower bound's level (None: alpha)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (no NaN/inf: undefined numbers become None)."""
        out = dataclasses.asdict(self)
        for key in ("drop", "lower", "upper", "max_drop", "alpha", "fail_alpha"):
            out[key] = float(out[key]) if out[key] is not None and math.isfinite(out[key]) else None
        out["method"] = "betting confidence sequence (Waudby-Smith & Ramdas 2023, PrPl-EB bets)"
        return out


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def _confidence(alpha: float) -> str:
    return f"{100.0 * (1.0 - alpha):.4g}%"


def _continuation(x: np.ndarray, length: int) -> np.ndarray:
    """`length` synthetic differences in the observed proportions, evenly laid out (golden-ratio quantiles)."""
    ordered = np.sort(x)
    u = np.mod((np.arange(length, dtype=np.float64) + 0.5) * _GOLDEN, 1.0)
    return ordered[np.minimum((u * x.size).astype(np.int64), x.size - 1)]


def _project(
    x: np.ndarray, max_drop: float, side: Side, alpha: float, horizon: int | None, fail_alpha: float
) -> int | None:
    """First total n (observed items, then the synthetic continuation) at which `side` clears the margin."""
    if x.size >= N_CAP:
        return None
    path = np.concatenate([x, _continuation(x, N_CAP - x.size)])
    level = alpha if side == "upper" else fail_alpha
    crossed = np.flatnonzero(
        np.maximum.accumulate(_log_capital(path, _plugin_bets(path, alpha, horizon), max_drop, side))
        >= math.log(1.0 / level)
    )
    return int(crossed[0]) + 1 if crossed.size else None


def _rates(x: np.ndarray, losses: int, wins: int) -> str:
    if np.all((x == 0.0) | (np.abs(x) == 1.0)):
        return f"discordance ({losses} losses and {wins} wins in {x.size} items)"
    return f"spread of the per-item differences ({losses} lower, {wins} higher in {x.size} items)"


def decide(
    ref: Scores,
    cand: Scores,
    *,
    max_drop: float,
    alpha: float = 0.05,
    horizon: int | None = None,
    fail_alpha: float | None = None,
) -> SequentialVerdict:
    """The sequential gate's verdict on the items so far (in order): pass, fail or inconclusive.

    pass: upper bound <= max_drop; fail: lower bound > max_drop (the drop is shown larger); otherwise
    inconclusive, with `n_needed`. Valid however often it is called on a growing list of items, as long
    as the item order and `horizon` were fixed in advance. The verdict is the capital test at the
    margin itself (the reported bound is snapped to the margin when bisection lands within 1e-12 of it).
    `fail_alpha` (default `alpha`) is the lower side's level: a gate over k tasks passes each at alpha
    (all must pass) but shows a regression in any one at alpha / k (Bonferroni), so that a false fail
    in one of them stays <= alpha too. The bets stay tuned to `alpha` (validity needs only that they
    are predictable).
    """
    _check_alpha(alpha)
    _check_max_drop(max_drop)
    _check_horizon(horizon)
    fail_alpha = _fail_alpha(alpha, fail_alpha)
    return _decide(_diffs(ref, cand), max_drop, alpha, horizon, project=True, fail_alpha=fail_alpha)


def _fail_alpha(alpha: float, fail_alpha: float | None) -> float:
    if fail_alpha is None:
        return alpha
    if not 0.0 < fail_alpha <= alpha:
        raise ValueError(f"fail_alpha must be in (0, alpha={alpha}], got {fail_alpha}")
    return fail_alpha


def _decide(
    x: np.ndarray, max_drop: float, alpha: float, horizon: int | None, *, project: bool, fail_alpha: float | None = None
) -> SequentialVerdict:
    """`decide` on validated differences; `project=False` skips `n_needed` (run_sequential's interim looks)."""
    n = int(x.size)
    if n == 0:
        raise ValueError("no items to compare")
    drop = float(x.mean())
    losses, wins = int(np.sum(x > 0)), int(np.sum(x < 0))
    bets = _plugin_bets(x, alpha, horizon)
    threshold = math.log(1.0 / alpha)
    fail_threshold = math.log(1.0 / (fail_alpha or alpha))
    lower, upper = _bisect(x, bets, "lower", fail_threshold), _bisect(x, bets, "upper", threshold)
    shown_below = max_drop >= 1.0 or _rejects(x, bets, max_drop, "upper", threshold)
    shown_above = _rejects(x, bets, max_drop, "lower", fail_threshold)
    crossed = lower > upper or (shown_below and shown_above)  # lower >= L*, upper <= U*: a real crossing
    if shown_below:
        upper = min(upper, max_drop)
    if shown_above:
        lower = max(lower, max_drop)
    conf, md = _confidence(alpha), _fmt(max_drop)
    fail_conf = _confidence(fail_alpha or alpha)
    levels = conf if fail_conf == conf else f"upper {conf}, lower {fail_conf}"

    def verdict(kind: Verdict, message: str, needed: int | None = None) -> SequentialVerdict:
        return SequentialVerdict(
            verdict=kind,
            n=n,
            drop=drop,
            lower=lower,
            upper=upper,
            max_drop=float(max_drop),
            alpha=float(alpha),
            n_needed=needed,
            message=message,
            losses=losses,
            wins=wins,
            horizon=horizon,
            fail_alpha=None if fail_alpha in (None, alpha) else float(fail_alpha),
        )

    if crossed:
        return verdict(
            "inconclusive",
            f"inconclusive: the bounds cross (lower {_fmt(lower)} > upper {_fmt(upper)} after {n} "
            f"items): the drop was not the same across the items, so no single drop fits them; "
            f"present the items in a shuffled order",
        )
    if shown_below:
        return verdict(
            "pass",
            f"pass: n={n} bounds the drop at {_fmt(upper)} <= max_drop {md} (one-sided {conf} "
            f"anytime-valid upper bound; observed drop {_fmt(drop)})",
        )
    if shown_above:
        return verdict(
            "fail",
            f"fail: regression shown: n={n} bounds the drop from below at {_fmt(lower)} > "
            f"max_drop {md} (one-sided {fail_conf} anytime-valid lower bound; observed drop "
            f"{_fmt(drop)})",
        )
    head = (
        f"inconclusive: n={n} bounds the drop at {_fmt(upper)}, above max_drop {md}, and from below "
        f"at {_fmt(lower)}, not above it (one-sided {levels} anytime-valid bounds; observed drop {_fmt(drop)})"
    )
    rates = _rates(x, losses, wins)
    needed: int | None = None
    if abs(drop - max_drop) <= 1e-12:
        tail = (
            f"the observed drop sits at the margin, so more items at the observed {rates} "
            f"would not settle it either way"
        )
    else:
        side: Side = "upper" if drop < max_drop else "lower"
        goal = f"bound it at {md}" if side == "upper" else f"show it above {md}"
        needed = _project(x, max_drop, side, alpha, horizon, fail_alpha or alpha) if project else None
        if not project:
            tail = "n_needed not projected"
        elif needed is None:
            tail = f"even {N_CAP} items at the observed {rates} would not {goal}"
        else:
            tail = f"about {needed} items ({needed - n} more) at the observed {rates} would {goal}"
    return verdict("inconclusive", f"{head}; {tail}", needed)


# --- the driver --------------------------------------------------------------------------------------------


def _batch_pairs(batch: PairBatch, k: int) -> np.ndarray:
    if batch is None:
        return np.empty((0, 2))
    arr = np.asarray(batch, dtype=np.float64)
    if arr.size == 0:
        return np.empty((0, 2))
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"next_batch must return (ref, cand) pairs, got an array of shape {arr.shape}")
    if arr.shape[0] > k:
        raise ValueError(f"next_batch({k}) returned {arr.shape[0]} pairs")
    return arr


def run_sequential(
    next_batch: Callable[[int], PairBatch],
    *,
    max_drop: float,
    alpha: float = 0.05,
    batch_size: int,
    max_items: int,
    max_seconds: float | None = None,
    horizon: int | None = None,
    fail_alpha: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_batch: Callable[[SequentialVerdict], None] | None = None,
) -> SequentialVerdict:
    """Draw batches until the verdict is shown (pass or fail) or the budget is spent; `decide` after each.

    next_batch(k) returns the next k (ref, cand) pairs, fewer or none once the items run out (it is
    never asked for more than max_items in all). Budgets: `max_items` (the last batch is cut to fit)
    and `max_seconds` (checked after each batch, on `clock`). The verdict records `batches` and
    `stopped_by`. `horizon`: the bets' tuning (module docs); None = anytime (WSR's t log t).
    `fail_alpha`: see `decide`. `on_batch` sees the interim verdict after every batch (progress lines).
    """
    _check_alpha(alpha)
    _check_max_drop(max_drop)
    _check_horizon(horizon)
    fail_alpha = _fail_alpha(alpha, fail_alpha)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not (isinstance(max_items, int) and max_items >= 1):
        raise ValueError(f"max_items must be a positive integer, got {max_items!r}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0 or None, got {max_seconds}")
    start = clock()
    pairs: list[np.ndarray] = []
    n, batches = 0, 0
    verdict: SequentialVerdict | None = None
    stopped_by = "max_items"
    while n < max_items:
        k = min(batch_size, max_items - n)
        got = _batch_pairs(next_batch(k), k)
        if got.shape[0]:
            batches += 1
            pairs.append(_diffs(got[:, 0], got[:, 1]))
            n += got.shape[0]
            verdict = _decide(np.concatenate(pairs), max_drop, alpha, horizon, project=False, fail_alpha=fail_alpha)
            if on_batch is not None:
                on_batch(dataclasses.replace(verdict, batches=batches))
            if verdict.verdict != "inconclusive":
                stopped_by = "verdict"
                break
        if got.shape[0] < k:
            stopped_by = "exhausted"
            break
        if max_seconds is not None and clock() - start >= max_seconds:
            stopped_by = "max_seconds" if n < max_items else "max_items"
            break
    why = {
        "verdict": "shown",
        "max_items": f"the item budget ({max_items}) spent",
        "max_seconds": f"the time budget ({max_seconds:g} s) spent" if max_seconds else "",
        "exhausted": "the items ran out",
    }[stopped_by]
    if verdict is None:
        return SequentialVerdict(
            verdict="inconclusive",
            n=0,
            drop=math.nan,
            lower=-1.0,
            upper=1.0,
            max_drop=float(max_drop),
            alpha=float(alpha),
            n_needed=None,
            horizon=horizon,
            batches=0,
            stopped_by=stopped_by,
            message=f"inconclusive: no items to compare ({why})",
        )
    if verdict.verdict == "inconclusive":  # the projection, once, for the verdict that is returned
        verdict = _decide(np.concatenate(pairs), max_drop, alpha, horizon, project=True, fail_alpha=fail_alpha)
    return dataclasses.replace(
        verdict,
        batches=batches,
        stopped_by=stopped_by,
        message=f"{verdict.message} [after {batches} batches of up to {batch_size}: {why}]",
    )
