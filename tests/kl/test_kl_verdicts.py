"""The KL gate's three verdicts on synthetic statistics: pass (bound inside), fail (crossing shown),
inconclusive (the interval straddles the limit, or there is none), and the prompts that would tell."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pytest_mlxgate.kl.assertions import kl_checks
from pytest_mlxgate.results.verdicts import overall_verdict


def stats(
    mean_ci: tuple[float, float],
    *,
    mean: float | None = None,
    top1_ci: tuple[float, float] = (0.99, 1.0),
    top1: float = 0.995,
    max_kl: float = 1e-3,
    n: int = 16,
) -> dict[str, Any]:
    return {
        "n_prompts": n,
        "mean": mean if mean is not None else sum(mean_ci) / 2,
        "mean_ci": list(mean_ci),
        "quantile_ci": {"p99": [1e-4, 2e-4]},
        "p99": 1.5e-4,
        "max": max_kl,
        "top1": top1,
        "top1_ci": list(top1_ci),
        "ln_ppl_ratio": 0.0,
        "ln_ppl_ratio_ci": [-1e-3, 1e-3],
    }


def verdict(s: dict[str, Any], **bounds: float) -> tuple[str, list[dict[str, Any]]]:
    checks = kl_checks(s, bounds)
    return overall_verdict(checks), checks


def test_a_bound_inside_every_limit_passes() -> None:
    v, checks = verdict(stats((1e-5, 3e-5)), mean=1e-4, p99=1e-3, top1=0.98, max=1e-2)
    assert v == "pass" and all(c["verdict"] == "pass" and "passed" not in c for c in checks)
    mean, p99, top1, max_kl = checks  # each interval's two ends, in the metric's units, whatever the direction
    assert (mean["lower"], mean["upper"], mean["direction"]) == (1e-5, 3e-5, "max")
    assert (p99["lower"], p99["upper"]) == (1e-4, 2e-4) and (top1["lower"], top1["upper"], top1["direction"]) == (
        0.99,
        1.0,
        "min",
    )
    assert max_kl["lower"] == max_kl["upper"] == max_kl["value"] == 1e-3  # observed, not estimated


def test_an_interval_wholly_beyond_a_limit_is_a_fail() -> None:
    v, checks = verdict(stats((2e-4, 4e-4)), mean=1e-4)
    assert v == "fail" and checks[0]["lower"] == 2e-4 and checks[0]["n_needed"] is None
    v, _ = verdict(stats((1e-5, 2e-5), top1_ci=(0.90, 0.95), top1=0.93), top1=0.97)
    assert v == "fail"
    v, _ = verdict(stats((1e-5, 2e-5), max_kl=0.5), max=0.1)  # an observed max over the limit is shown
    assert v == "fail"


def test_an_interval_straddling_a_limit_is_inconclusive_with_the_prompts_it_would_take() -> None:
    v, checks = verdict(stats((2e-5, 1.4e-4), mean=6e-5, n=16), mean=1e-4)
    assert v == "inconclusive" and checks[0]["verdict"] == "inconclusive" and "passed" not in checks[0]
    # half-width 8e-5 against room 4e-5: four times the prompts (1/sqrt(n))
    assert checks[0]["n_needed"] == 64
    v, checks = verdict(stats((2e-5, 1.4e-4), mean=1.2e-4), mean=1e-4)  # point value over the limit
    assert v == "inconclusive" and checks[0]["n_needed"] is None
    v, checks = verdict(stats((1e-5, 2e-5), top1_ci=(0.96, 0.99), top1=0.975), top1=0.97)
    assert v == "inconclusive" and checks[0]["n_needed"] == math.ceil(16 * (0.015 / 0.005) ** 2)


def test_one_prompt_has_no_interval_and_shows_nothing() -> None:
    s = stats((float("nan"), float("nan")), mean=1e-5, n=1)
    v, checks = verdict(s, mean=1e-4)
    assert v == "inconclusive" and checks[0]["n_needed"] is None
    assert checks[0]["lower"] is None and checks[0]["upper"] is None  # no interval: no ends (JSON null, not NaN)


def test_fail_outranks_inconclusive_across_limits() -> None:
    v, _ = verdict(stats((2e-5, 1.4e-4), mean=6e-5, max_kl=0.5), mean=1e-4, max=0.1)
    assert v == "fail"


@pytest.mark.parametrize(("policy", "outcome"), [("fail", "failed"), ("warn", "passed"), ("xfail", "xfailed")])
def test_the_inconclusive_policy_fails_warns_or_xfails(pytester: pytest.Pytester, policy: str, outcome: str) -> None:
    pytester.makepyfile(
        test_x="""
from pytest_mlxgate.results.verdicts import settle_inconclusive

def test_gate():
    settle_inconclusive("inconclusive: n=8 bounds the drop at 0.25", "POLICY")
""".replace("POLICY", policy)
    )
    result = pytester.runpytest("-p", "no:randomly", "-W", "default")
    result.assert_outcomes(**{outcome: 1}, **({"warnings": 1} if policy == "warn" else {}))
    if policy == "warn":
        result.stdout.fnmatch_lines(["*InconclusiveGateWarning: inconclusive: n=8 bounds the drop at 0.25*"])


def test_the_policy_option_is_read_and_checked(pytester: pytest.Pytester) -> None:
    from pytest_mlxgate.config.settings import read_gate_settings

    assert read_gate_settings(pytester.parseconfig()).inconclusive == "fail"
    assert read_gate_settings(pytester.parseconfig("--mlx-inconclusive=warn")).inconclusive == "warn"
    pytester.makeini("[pytest]\nmlx_inconclusive = pass\n")
    with pytest.raises(Exception, match="mlx_inconclusive = 'pass'.*an inconclusive gate never passes"):
        read_gate_settings(pytester.parseconfig())
