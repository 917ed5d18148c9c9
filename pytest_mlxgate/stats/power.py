"""How likely a capability drop test is to show a drop, and the n it needs: the power of the binary
margin test (by simulation, or exactly by enumerating the discordant counts) at a true drop, and the least n
that reaches a power: how the sizes in `paired_tests`' docs were found, and what its tests pin the test's
size with."""

from __future__ import annotations

import numpy as np

from .paired_tests import binary_drop_p, binom_pmf, check_alpha, check_margin, upper_tail_half

__all__ = ["n_for_power", "power_binary", "power_binary_exact"]


def _cells(p_discordant: float, true_drop: float) -> tuple[float, float]:
    if not 0.0 <= p_discordant <= 1.0 or abs(true_drop) > p_discordant:
        raise ValueError(f"need |true_drop| <= p_discordant <= 1, got {true_drop}, {p_discordant}")
    return (p_discordant + true_drop) / 2.0, (p_discordant - true_drop) / 2.0


def power_binary(
    n: int,
    p_discordant: float,
    true_drop: float,
    *,
    max_drop: float,
    alpha: float = 0.05,
    sims: int = 2000,
    seed: int = 0,
) -> float:
    """Simulated rejection rate of `drop_exceeds` on binary data: power, or size when true_drop <= max_drop.

    Each simulated evaluation draws n paired items with P(loss) = (p_discordant + true_drop)/2 and
    P(win) = (p_discordant - true_drop)/2; the rest are concordant.
    """
    check_alpha(alpha)
    check_margin(max_drop)
    p_loss, p_win = _cells(p_discordant, true_drop)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [p_loss, p_win, max(0.0, 1.0 - p_loss - p_win)], size=sims)
    rejected = sum(binary_drop_p(int(b), int(c), n, max_drop, "exceeds")[1] < alpha for b, c, _ in counts)
    return rejected / sims


def power_binary_exact(n: int, p_discordant: float, true_drop: float, *, max_drop: float, alpha: float = 0.05) -> float:
    """The same rejection rate as `power_binary`, summed exactly over every possible paired table.

    P(reject) = sum_m P(M = m) sum_b P(B = b | m) [test rejects at (b, m - b)], with M ~ Bin(n, pd)
    discordant pairs and B | m ~ Bin(m, P(loss)/pd). No Monte Carlo error: this is how the sample
    size in the module docs was found, and how the tests pin the score test's size.
    """
    check_alpha(alpha)
    check_margin(max_drop)
    p_loss, _ = _cells(p_discordant, true_drop)
    if p_discordant == 0.0:
        return float(binary_drop_p(0, 0, n, max_drop, "exceeds")[1] < alpha)
    pm = binom_pmf(n, p_discordant)
    theta = p_loss / p_discordant
    total = 0.0
    for m in range(n + 1):
        if pm[m] < 1e-16:
            continue
        if max_drop == 0.0:
            reject = upper_tail_half(m) < alpha
            reject[0] = False  # b = 0: p = 1
        else:
            reject = np.array([binary_drop_p(b, m - b, n, max_drop, "exceeds")[1] < alpha for b in range(m + 1)])
        total += pm[m] * float(np.sum(binom_pmf(m, theta)[reject]))
    return min(1.0, total)


def n_for_power(
    p_discordant: float,
    true_drop: float,
    *,
    max_drop: float,
    alpha: float = 0.05,
    power: float = 0.8,
    n_max: int = 20000,
) -> int:
    """Smallest n from which the exact power stays >= `power` for the next 20 n (discreteness saw-tooth)."""
    n = 1
    while n <= n_max:
        if power_binary_exact(n, p_discordant, true_drop, max_drop=max_drop, alpha=alpha) >= power:
            ahead = [
                power_binary_exact(k, p_discordant, true_drop, max_drop=max_drop, alpha=alpha)
                for k in range(n + 1, n + 21)
            ]
            if min(ahead) >= power:
                return n
        n += 1
    raise ValueError(f"power {power} not reached by n = {n_max}")
