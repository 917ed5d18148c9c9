"""`plan kv`'s decisions and words, whole: every field of the search's record, every line of its summary
and every refusal's message, from inputs whose answers are worked out by hand (fast lane)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.errors import MlxgateUsageError
from pytest_mlxgate.explain.plan_gate import read_gate
from pytest_mlxgate.explain.plan_kv import (
    MAX_ROUNDS,
    PLAIN_OPTION,
    SELECTION_SEQUENCES,
    TARGET_SHARE,
    Option,
    PlanSearch,
    _bytes,
    _verdicts,
    check_search_options,
    choose_plan,
    greedy_plan,
    plan_summary,
)

FOUR, SIX, EIGHT = Option(4, 64), Option(6, 64), Option(8, 64)


@dataclass
class Stats:
    """What the search reads of a plan's statistics: the mean, its interval, and (for the verdict) the
    JSON form `kl_checks` reads, with a top-1 rate."""

    mean: float
    mean_ci: tuple[float, float]
    top1: float = 1.0
    top1_ci: tuple[float, float] = (1.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_prompts": 8,
            "mean": self.mean,
            "mean_ci": list(self.mean_ci),
            "top1": self.top1,
            "top1_ci": list(self.top1_ci),
        }


def _s(mean: float, half: float) -> Stats:
    return Stats(mean, (mean - half, mean + half))


# --- Option, _bytes, _verdicts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "label", "per_value", "spec"),
    [
        (Option(4, 64), "4-bit g64", {2: 0.5 + 2 * 2 / 64, 4: 0.5 + 2 * 4 / 64}, {"bits": 4, "group_size": 64}),
        (Option(8, 32), "8-bit g32", {2: 1 + 2 * 2 / 32, 4: 1 + 2 * 4 / 32}, {"bits": 8, "group_size": 32}),
        (
            Option(3, 128),
            "3-bit g128",
            {2: 3 / 8 + 2 * 2 / 128, 4: 3 / 8 + 2 * 4 / 128},
            {"bits": 3, "group_size": 128},
        ),
        (Option(2), "2-bit gNone", {2: 2.0, 4: 4.0}, {"bits": 2, "group_size": 64}),  # no group: plain's size
        (PLAIN_OPTION, "plain", {2: 2.0, 4: 4.0}, None),
    ],
)
def test_an_option_s_label_bytes_per_value_and_spec(
    option: Option, label: str, per_value: dict[int, float], spec: dict[str, int] | None
) -> None:
    assert option.label == label
    for itemsize, expected in per_value.items():
        got = option.bytes_per_value(itemsize)
        assert got == expected and isinstance(got, float)
    assert option.spec() == spec


def test_a_plan_s_bytes_sum_each_layer_s_size_at_its_option() -> None:
    plan = {0: FOUR, 1: EIGHT, 2: PLAIN_OPTION}
    sizes = {0: 64.0, 1: 128.0, 2: 32.0, 3: 1000.0}  # a size no layer of the plan has counts for nothing
    assert _bytes(plan, sizes, 2) == 0.5625 * 64 + 1.0625 * 128 + 2 * 32
    assert _bytes({}, sizes, 2) == 0


@pytest.mark.parametrize(
    ("stats", "limits", "verdict"),
    [
        (_s(0.01, 0.005), {"mean": 0.02}, "pass"),
        (_s(0.015, 0.005), {"mean": 0.02}, "pass"),  # the upper end at the limit passes
        (_s(0.02, 0.005), {"mean": 0.02}, "inconclusive"),
        (_s(0.03, 0.005), {"mean": 0.02}, "fail"),
        (Stats(0.01, (0.0, 0.02), 0.5, (0.4, 0.6)), {"mean": 0.02, "top1": 0.5}, "inconclusive"),
        (Stats(0.01, (0.0, 0.02), 0.3, (0.2, 0.4)), {"mean": 0.02, "top1": 0.5}, "fail"),
        (Stats(0.02, (0.01, 0.03), 0.3, (0.2, 0.4)), {"mean": 0.02, "top1": 0.5}, "fail"),  # fail beats inconcl.
        (Stats(0.03, (0.025, 0.035), 0.9, (0.85, 0.95)), {"mean": 0.02, "top1": 0.5}, "fail"),
        (Stats(0.02, (0.01, 0.03), 0.9, (0.85, 0.95)), {"top1": 0.5, "mean": 0.02}, "inconclusive"),
        (Stats(0.01, (0.0, 0.02), 0.9, (0.85, 0.95)), {"mean": 0.02, "top1": 0.5}, "pass"),
    ],
)
def test_a_plan_s_verdict_is_its_worst_check(stats: Stats, limits: dict[str, float], verdict: str) -> None:
    assert _verdicts(stats, limits) == verdict  # type: ignore[arg-type]


# --- check_search_options -----------------------------------------------------------------------------

NOT = "is not a choice mlx quantizes a KV cache with; give some of"


@pytest.mark.parametrize(
    ("bits", "groups", "message"),
    [
        (
            (4, 7, 9),
            (64,),
            f"--bits 4,7,9: 7, 9 {NOT} 2,3,4,5,6,8",
        ),
        ((), (64,), f"--bits : nothing {NOT} 2,3,4,5,6,8"),
        (
            (4,),
            (48, 64),
            f"--group-sizes 48,64: 48 {NOT} 32,64,128",
        ),
        ((4,), (), f"--group-sizes : nothing {NOT} 32,64,128"),
        ((1,), (16,), f"--bits 1: 1 {NOT} 2,3,4,5,6,8"),
    ],
)
def test_a_bad_bit_width_or_group_size_is_refused_naming_the_option_the_wrong_values_and_the_choices(
    bits: tuple[int, ...], groups: tuple[int, ...], message: str
) -> None:
    with pytest.raises(MlxgateUsageError) as caught:
        check_search_options(bits, groups, 4)
    assert str(caught.value) == message


@pytest.mark.parametrize("selection", [1, 0, -3, True, 2.5, "4"])
def test_a_selection_under_two_or_not_an_int_is_refused(selection: Any) -> None:
    with pytest.raises(MlxgateUsageError) as caught:
        check_search_options((2, 3, 4, 5, 6, 8), (32, 64, 128), selection)
    assert str(caught.value) == (
        f"--selection {selection}: the search judges each plan by an interval over the selection sequences, "
        f"and fewer than 2 give none; give 2 or more (default {SELECTION_SEQUENCES})"
    )
    assert SELECTION_SEQUENCES == 6


@pytest.mark.parametrize("selection", [2, 3, 100])
def test_every_allowed_choice_and_a_selection_of_two_or_more_pass(selection: int) -> None:
    assert check_search_options((2, 3, 4, 5, 6, 8), (32, 64, 128), selection) is None


# --- greedy_plan -------------------------------------------------------------------------------------


def _drift(sens: Mapping[int, float], scale: Mapping[Option, float]) -> Any:
    def drift(i: int, o: Option) -> float:
        return 0.0 if o.bits is None else sens[i] * scale[o]

    return drift


def test_the_greedy_buys_the_most_drift_per_byte_one_upgrade_at_a_time() -> None:
    # bytes per value (itemsize 2): 4-bit 0.5625, 8-bit 1.0625, plain 2
    sizes = {0: 64.0, 1: 128.0}
    drift = _drift({0: 0.03, 1: 0.002}, {FOUR: 1.0, EIGHT: 0.25})
    # all 4-bit predicts 0.032; layer 0 to 8-bit saves 0.0225 for 32 bytes, the most per byte: 0.0095
    assert greedy_plan(sizes, [EIGHT, FOUR], drift, target=0.01, itemsize=2) == {0: EIGHT, 1: FOUR}
    # below that: layer 0 plain (saves 0.0075 for 60 bytes) before layer 1 at 8 bits (0.0015 for 64)
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.005, itemsize=2) == {0: PLAIN_OPTION, 1: FOUR}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.0015, itemsize=2) == {0: PLAIN_OPTION, 1: EIGHT}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.0, itemsize=2) == {0: PLAIN_OPTION, 1: PLAIN_OPTION}
    # a target met exactly needs nothing; just under it, one upgrade
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.032, itemsize=2) == {0: FOUR, 1: FOUR}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.0319, itemsize=2) == {0: EIGHT, 1: FOUR}
    # from a start, only its layers are planned, and a met start is kept as it is
    start = {0: PLAIN_OPTION, 1: FOUR}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.002, start=start, itemsize=2) == start
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.0019, start=start, itemsize=2) == {
        0: PLAIN_OPTION,
        1: EIGHT,
    }
    assert start == {0: PLAIN_OPTION, 1: FOUR}  # the start itself is not changed
    # a start off the greedy's own path is where it goes on from, not the cheapest plan
    off_path = {0: FOUR, 1: PLAIN_OPTION}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.05, start=off_path, itemsize=2) == off_path


def test_the_greedy_prices_by_the_item_size_and_the_layer_s_size() -> None:
    # itemsize 4: 4-bit 0.625, 8-bit 1.125, plain 4 per value. Layer 0 is small and sensitive, layer 1
    # big and a little less so: per byte, layer 0 first though layer 1 saves nearly as much.
    sizes = {0: 10.0, 1: 1000.0}
    drift = _drift({0: 1.0, 1: 0.9}, {FOUR: 1.0, EIGHT: 0.0})
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=1.0, itemsize=4) == {0: EIGHT, 1: FOUR}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.95, itemsize=4) == {0: EIGHT, 1: FOUR}
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.5, itemsize=4) == {0: EIGHT, 1: EIGHT}


def test_the_greedy_stops_when_nothing_dearer_saves_drift() -> None:
    sizes = {0: 64.0}
    flat = _drift({0: 0.5}, {FOUR: 1.0, EIGHT: 1.0})  # 8 bits save nothing; plain saves it all
    assert greedy_plan(sizes, [FOUR, EIGHT], flat, target=0.1, itemsize=2) == {0: PLAIN_OPTION}

    def never(i: int, o: Option) -> float:  # even plain drifts: nothing to buy, the plan stays
        return 0.5

    assert greedy_plan(sizes, [FOUR, EIGHT], never, target=0.1, itemsize=2) == {0: FOUR}
    assert greedy_plan({}, [FOUR], never, target=0.1, itemsize=2) == {}


def test_the_greedy_buys_upgrades_of_under_a_byte_and_never_one_that_costs_nothing_more() -> None:
    # a layer of one value: 4 to 8 bits costs half a byte
    drift = _drift({0: 0.5}, {FOUR: 1.0, EIGHT: 0.1})
    assert greedy_plan({0: 1.0}, [FOUR, EIGHT], drift, target=0.1, itemsize=2) == {0: EIGHT}
    # 2 bits without a group size take plain's bytes: plain costs nothing more, so it is no upgrade
    two = Option(2)
    assert two.bytes_per_value(2) == PLAIN_OPTION.bytes_per_value(2)
    assert greedy_plan({0: 64.0}, [two], _drift({0: 0.5}, {two: 1.0}), target=0.1, itemsize=2) == {0: two}


def test_the_greedy_takes_the_first_of_equal_ratios_and_only_a_strictly_better_one() -> None:
    sizes = {0: 64.0, 1: 64.0}
    drift = _drift({0: 0.01, 1: 0.01}, {FOUR: 1.0, EIGHT: 0.0})
    # both layers' upgrades are worth the same per byte: the first layer is upgraded first
    assert greedy_plan(sizes, [FOUR, EIGHT], drift, target=0.015, itemsize=2) == {0: EIGHT, 1: FOUR}
    assert greedy_plan({1: 64.0, 0: 64.0}, [FOUR, EIGHT], drift, target=0.015, itemsize=2) == {1: EIGHT, 0: FOUR}


# --- choose_plan ---------------------------------------------------------------------------------------


class Measure:
    """A measurement by table: a uniform plan's statistics by option, a layer alone by layer, any other
    plan by its (layer, option) pairs; it records every plan and what it was said to be."""

    def __init__(
        self,
        uniform: Mapping[Option, Stats],
        alone: Mapping[int, Stats],
        plans: Mapping[frozenset[tuple[int, Option]], Stats],
        n_layers: int,
    ) -> None:
        self.uniform, self.alone, self.plans, self.n = uniform, alone, plans, n_layers
        self.calls: list[tuple[dict[int, Option], str]] = []

    def __call__(self, plan: Mapping[int, Option], what: str) -> Stats:
        self.calls.append((dict(plan), what))
        key = frozenset(plan.items())
        if key in self.plans:
            return self.plans[key]
        if len(plan) == 1 and self.n > 1:
            return self.alone[next(iter(plan))]
        options = set(plan.values())
        assert len(options) == 1 and len(plan) == self.n, plan
        return self.uniform[options.pop()]


SIZES = {0: 64.0, 1: 128.0}  # bytes per token, itemsize 2: 4-bit 36 + 72, 8-bit 68 + 136, plain 128 + 256


def _uniform(option: Option, stats: Stats, passes: bool) -> dict[str, Any]:
    return {
        "option": option.label,
        "mean": stats.mean,
        "mean_ci": list(stats.mean_ci),
        "passes": passes,
        "bytes_per_token": option.bytes_per_value(2) * 192,
    }


def test_a_failed_plan_backs_off_and_a_cheaper_mixed_plan_that_passes_beats_the_uniform_one() -> None:
    u4, u8 = _s(0.04, 0.005), _s(0.01, 0.001)
    first, second = _s(0.03, 0.005), _s(0.005, 0.001)
    measure = Measure(
        {FOUR: u4, EIGHT: u8},
        {0: _s(0.03, 0.0), 1: _s(0.002, 0.0)},
        {frozenset({0: EIGHT, 1: FOUR}.items()): first, frozenset({0: PLAIN_OPTION, 1: FOUR}.items()): second},
        2,
    )
    result = choose_plan(SIZES, [EIGHT, FOUR], 2, {"mean": 0.02}, measure)  # the cheapest is not first
    # drift at 8 bits = the layer's drift alone at 4 bits x 0.01 / 0.04
    assert measure.calls == [
        ({0: EIGHT, 1: EIGHT}, "uniform 8-bit g64"),
        ({0: FOUR, 1: FOUR}, "uniform 4-bit g64"),
        ({0: FOUR}, "layer 0 alone at 4-bit g64"),
        ({1: FOUR}, "layer 1 alone at 4-bit g64"),
        ({0: EIGHT, 1: FOUR}, "the plan found for a predicted mean KL <= 0.01"),
        ({0: PLAIN_OPTION, 1: FOUR}, "the plan found for a predicted mean KL <= 0.00475"),
    ]
    assert TARGET_SHARE == 0.5
    assert result.to_json() == {
        "kv_config": {"default": None, "layers": {"0": None, "1": {"bits": 4, "group_size": 64}}},
        "bytes_per_token": 200.0,
        "plain_bytes_per_token": 384.0,
        "chosen": "mixed",
        "uniform": [_uniform(EIGHT, u8, True), _uniform(FOUR, u4, False)],
        "rounds": [
            {
                "target": 0.01,
                "predicted": pytest.approx(0.0095, abs=1e-15),
                "mean": 0.03,
                "mean_ci": list(first.mean_ci),
                "verdict": "fail",
                "checks": {"mean": "fail"},
                "bytes_per_token": 68.0 + 72.0,
            },
            {
                "target": pytest.approx(0.00475, abs=1e-15),
                "predicted": 0.002,
                "mean": 0.005,
                "mean_ci": list(second.mean_ci),
                "verdict": "pass",
                "checks": {"mean": "pass"},
                "bytes_per_token": 200.0,
            },
        ],
        "sensitivity": {"0": 0.03, "1": 0.002},
        "passed_selection": True,
        "selection_sequences": 0,
        "seconds": 0.0,
        "verification": None,
        "notes": [],
    }
    assert result.layers == {0: PLAIN_OPTION, 1: FOUR} and result.succeeded


def test_an_inconclusive_plan_is_not_a_pass_and_the_target_halves_from_itself_when_the_prediction_is_above() -> None:
    # the greedy cannot meet the target (every layer plain still predicts... nothing: plain is 0), so make
    # the first plan predict exactly its target: the next target is the target halved
    u4, u8 = _s(0.04, 0.005), _s(0.04, 0.005)  # 8 bits no better than 4: the ratio is 1
    inconclusive = _s(0.02, 0.005)
    measure = Measure(
        {FOUR: u4, EIGHT: u8},
        {0: _s(0.006, 0.0), 1: _s(0.004, 0.0)},
        {
            frozenset({0: FOUR, 1: FOUR}.items()): inconclusive,
            frozenset({0: PLAIN_OPTION, 1: FOUR}.items()): _s(0.001, 0.0005),
        },
        2,
    )
    result = choose_plan(SIZES, [FOUR, EIGHT], 2, {"mean": 0.02}, measure)
    assert [(r["target"], r["predicted"], r["verdict"]) for r in result.rounds] == [
        (0.01, 0.01, "inconclusive"),
        (0.005, 0.004, "pass"),
    ]
    # every uniform plan fails: the mixed plan stands
    assert result.chosen == "mixed" and result.passed_selection and result.notes == []
    assert result.layers == {0: PLAIN_OPTION, 1: FOUR} and result.bytes_per_token == 128 + 72


def test_a_uniform_mean_of_zero_counts_as_a_tiny_drift_not_a_division_by_zero() -> None:
    # 8 bits measured at 0: a layer's drift there is its drift alone x 1e-12 / 0.04, so the greedy moves
    # layer 0 to 8 bits (cheaper than plain, and enough)
    u4, u8 = _s(0.04, 0.005), Stats(0.0, (0.0, 0.0))
    measure = Measure(
        {FOUR: u4, EIGHT: u8},
        {0: _s(0.03, 0.0), 1: _s(0.002, 0.0)},
        {frozenset({0: EIGHT, 1: FOUR}.items()): _s(0.002, 0.001)},
        2,
    )
    result = choose_plan(SIZES, [FOUR, EIGHT], 2, {"mean": 0.02}, measure)
    assert result.rounds[0]["predicted"] == pytest.approx(0.002 + 0.03 * 1e-12 / 0.04, rel=1e-9, abs=0)
    assert result.uniform[1]["mean"] == 0.0 and result.uniform[1]["passes"]
    # uniform 8-bit passes and costs 204 bytes; the mixed plan (68 + 72 = 140) is cheaper
    assert result.chosen == "mixed" and result.layers == {0: EIGHT, 1: FOUR} and result.bytes_per_token == 140


def test_a_mixed_plan_that_costs_as_much_as_a_passing_uniform_one_loses_to_it() -> None:
    u4, u8 = _s(0.04, 0.005), _s(0.005, 0.001)
    measure = Measure(
        {FOUR: u4, EIGHT: u8},
        {0: _s(0.02, 0.0), 1: _s(0.02, 0.0)},  # 8 bits: 0.005 each, 0.01 in all: both layers need 8 bits
        {},
        2,
    )
    result = choose_plan(SIZES, [FOUR, EIGHT], 2, {"mean": 0.02}, measure)
    assert result.rounds[0]["bytes_per_token"] == 204.0 and result.rounds[0]["verdict"] == "pass"
    assert result.chosen == "uniform 8-bit g64" and result.layers == {0: EIGHT, 1: EIGHT}
    assert result.bytes_per_token == 204.0 and result.passed_selection
    assert result.notes == ["no mixed plan found costs fewer bytes than uniform 8-bit g64, which passes"]


def test_the_cheapest_passing_uniform_plan_wins_over_a_mixed_plan_that_never_passed() -> None:
    u4, u6, u8 = _s(0.04, 0.005), _s(0.01, 0.001), _s(0.004, 0.001)
    measure = Measure(
        {FOUR: u4, SIX: u6, EIGHT: u8},
        {0: _s(0.03, 0.0), 1: _s(0.03, 0.0)},
        {},
        2,
    )

    def failing(plan: Mapping[int, Option], what: str) -> Stats:
        return measure(plan, what) if what.startswith(("uniform", "layer")) else _s(0.5, 0.01)

    result = choose_plan(SIZES, [EIGHT, SIX, FOUR], 2, {"mean": 0.02}, failing)
    # halving until the greedy reaches every layer plain (3 plans), which no lower target changes: no round
    # measures a plan twice, and none passed
    assert len(result.rounds) == 3 < MAX_ROUNDS and {r["verdict"] for r in result.rounds} == {"fail"}
    assert set(result.rounds[-1]["checks"].values()) == {"fail"} and result.rounds[-1]["predicted"] == 0.0
    targets = [r["target"] for r in result.rounds]
    for a, b in zip(result.rounds, result.rounds[1:], strict=False):
        assert b["target"] == min(a["target"], a["predicted"]) / 2
    assert targets[0] == 0.01
    # 6-bit g64: 0.75 + 0.0625 bytes per value, cheaper than 8 bits; both pass
    assert [u["passes"] for u in result.uniform] == [True, True, False]
    assert result.chosen == "uniform 6-bit g64" and result.layers == {0: SIX, 1: SIX}
    assert result.bytes_per_token == 0.8125 * 192 and result.passed_selection and result.succeeded
    assert result.notes == ["no mixed plan found costs fewer bytes than uniform 6-bit g64, which passes"]


def test_when_no_plan_passes_the_answer_is_none_and_the_note_names_the_options_and_the_rounds() -> None:
    u4, u8 = _s(0.04, 0.005), _s(0.03, 0.005)
    measure = Measure({FOUR: u4, EIGHT: u8}, {0: _s(0.03, 0.0), 1: _s(0.03, 0.0)}, {}, 2)

    def failing(plan: Mapping[int, Option], what: str) -> Stats:
        return measure(plan, what) if what.startswith(("uniform", "layer")) else _s(0.5, 0.01)

    result = choose_plan(SIZES, [FOUR, EIGHT], 2, {"mean": 0.02}, failing)
    assert result.chosen == "none" and result.passed_selection is False and not result.succeeded
    assert result.notes == [
        "no plan among 4-bit g64, 8-bit g64 per layer passed the gate's limits on the selection sequences in 1 "
        "measured round; keep the plain cache, or widen the options (--bits, --group-sizes)"
    ]
    # 8 bits save too little: the first plan is all plain, predicting 0; a lower target finds that plan
    # again, so it is not measured again (before: the same plan measured 4 times)
    assert [(r["target"], r["predicted"]) for r in result.rounds] == [(0.01, 0.0)]
    assert result.layers == {0: PLAIN_OPTION, 1: PLAIN_OPTION}  # the last round's plan is kept
    assert result.bytes_per_token == 384.0 == result.plain_bytes_per_token


# --- PlanSearch's record and plan_summary --------------------------------------------------------------


def _search(**changes: Any) -> PlanSearch:
    fields: dict[str, Any] = {
        "layers": {2: EIGHT, 0: FOUR, 1: FOUR, 3: PLAIN_OPTION},
        "bytes_per_token": 12345.6,
        "plain_bytes_per_token": 24691.2,
        "uniform": [
            {
                "option": "4-bit g64",
                "mean": 0.0123456,
                "mean_ci": [0.01, 0.014],
                "passes": False,
                "bytes_per_token": 6000.0,
            },
            {
                "option": "8-bit g64",
                "mean": 0.00051,
                "mean_ci": [0.0004, 0.0006],
                "passes": True,
                "bytes_per_token": 20000.0,
            },
        ],
        "rounds": [
            {
                "target": 0.01,
                "predicted": 0.00987654,
                "mean": 0.0234567,
                "mean_ci": [0.02, 0.027],
                "verdict": "fail",
                "bytes_per_token": 1.0,
            },
            {
                "target": 0.00493827,
                "predicted": 0.004,
                "mean": 0.0031,
                "mean_ci": [0.0025, 0.00375],
                "verdict": "pass",
                "bytes_per_token": 2.0,
            },
        ],
        "sensitivity": {1: 0.25, 0: 0.5},
        "passed_selection": True,
        "chosen": "mixed",
        "seconds": 12.56,
        "selection": 6,
        "verification": None,
        "notes": ["first note", "second note"],
    }
    fields.update(changes)
    return PlanSearch(**fields)


def test_the_record_holds_every_field_with_the_plan_in_layer_order() -> None:
    result = _search(verification={"verified": True, "verdicts": {"g.py::t": "pass"}})
    record = result.to_json()
    assert record == {
        "kv_config": {
            "default": None,
            "layers": {
                "0": {"bits": 4, "group_size": 64},
                "1": {"bits": 4, "group_size": 64},
                "2": {"bits": 8, "group_size": 64},
                "3": None,
            },
        },
        "bytes_per_token": 12345.6,
        "plain_bytes_per_token": 24691.2,
        "chosen": "mixed",
        "uniform": result.uniform,
        "rounds": result.rounds,
        "sensitivity": {"0": 0.5, "1": 0.25},
        "passed_selection": True,
        "selection_sequences": 6,
        "seconds": 12.6,
        "verification": {"verified": True, "verdicts": {"g.py::t": "pass"}},
        "notes": ["first note", "second note"],
    }
    assert list(record) == [
        "kv_config", "bytes_per_token", "plain_bytes_per_token", "chosen", "uniform", "rounds", "sensitivity",
        "passed_selection", "selection_sequences", "seconds", "verification", "notes",
    ]  # fmt: skip
    assert list(record["kv_config"]["layers"]) == ["0", "1", "2", "3"] and list(record["sensitivity"]) == ["0", "1"]
    assert (
        _search(seconds=0.04).to_json()["seconds"] == 0.0
        and _search(passed_selection=False).to_json()["passed_selection"] is False
    )


def test_a_plan_with_no_group_size_is_written_with_the_default_group_of_64() -> None:
    assert _search(layers={0: Option(4)}).kv_config() == {
        "default": None,
        "layers": {"0": {"bits": 4, "group_size": 64}},
    }


ROUNDS_AND_UNIFORM = [
    "  uniform 4-bit g64: mean KL 0.0123 on the selection, does not pass · 0.486x the plan's bytes",
    "  uniform 8-bit g64: mean KL 0.00051 on the selection, passes · 1.620x the plan's bytes",
    "  round 1: predicted 0.00988 <= target 0.01; measured mean KL 0.0235 [0.02, 0.027] -> fail on 6 selection "
    "sequences",
    "  round 2: predicted 0.004 <= target 0.00494; measured mean KL 0.0031 [0.0025, 0.00375] -> pass on 6 selection "
    "sequences",
    "  note: first note",
    "  note: second note",
]


def test_the_summary_of_an_unverified_plan_says_every_figure_and_that_it_is_unverified() -> None:
    assert plan_summary(_search()) == [
        "plan (mixed): 2 layers 4-bit g64, 1 layers 8-bit g64, 1 layers plain · 12,346 KV bytes per token "
        "(50.0% of plain)",
        *ROUNDS_AND_UNIFORM,
        "  not verified (--no-verify): passed on the selection only; run the gate on it before use",
        "  took 13 s",
    ]


MEAN_CHECK = {"key": "mean", "value": 1e-3, "lower": 5e-4, "upper": 1.5e-3, "limit": 2e-3, "direction": "max"}


@pytest.mark.parametrize(
    ("verified", "words"),
    [
        (True, ["VERIFIED: passes the gate on its own (held-out) prompts at 128 tokens: {v} (not checked at a "
                "long context: --long-tokens 0)"]),
        (False, ["NOT verified: does not pass the gate on its own (held-out) prompts at 128 tokens: {v}",
                 "  mean 0.001 [bound 0.0015 vs 0.002] fail"]),
    ],
)  # fmt: skip
def test_the_summary_of_a_verified_plan_ends_with_the_gate_s_verdicts(verified: bool, words: list[str]) -> None:
    verdicts = {"g.py::test_drift": "pass" if verified else "fail"}
    check = {**MEAN_CHECK, "verdict": "pass" if verified else "fail"}
    verification = {"verified": verified, "verdicts": verdicts, "tokens": 128, "checks": [check]}
    lines = plan_summary(_search(verification=verification, chosen="none"))
    assert lines[1:] == [*ROUNDS_AND_UNIFORM, *(f"  {w.format(v=verdicts)}" for w in words), "  took 13 s"]
    assert lines[0].startswith("plan (none): 2 layers 4-bit g64")


def test_a_plan_that_passes_short_and_fails_long_is_not_verified_and_both_figures_are_said() -> None:
    from pytest_mlxgate.explain.plan_verify import verification_lines

    short = {"g.py::test_drift": "pass"}
    long = {"verified": False, "verdicts": {"g.py::test_drift": "fail"}, "tokens": 512}
    long["checks"] = [{**MEAN_CHECK, "value": 3e-3, "upper": 4e-3, "verdict": "fail"}]
    v = {
        "verified": False,
        "verdicts": short,
        "tokens": 128,
        "checks": [{**MEAN_CHECK, "verdict": "pass"}],
        "long": long,
    }
    assert verification_lines(v) == [
        "  NOT verified: passes the gate at 128 tokens but not at 512 tokens: a plan for short contexts only, "
        "not returned",
        "    at 128 tokens: mean 0.001 [bound 0.0015 vs 0.002] pass",
        "    at 512 tokens: mean 0.003 [bound 0.004 vs 0.002] fail",
    ]
    long_passes = {**long, "verified": True, "verdicts": {"g.py::test_drift": "pass"}}
    assert verification_lines({**v, "verified": True, "long": long_passes}) == [
        f"  VERIFIED: passes the gate on its own (held-out) prompts at 128 tokens: {short}; and at 512 tokens: "
        f"{long_passes['verdicts']}"
    ]


@pytest.mark.parametrize(
    ("tokens", "decode", "window", "long"), [(128, 32, None, 512), (128, 32, 1024, 1056), (8, 4, 16, 32)]
)
def test_the_long_context_is_four_times_the_gate_s_and_past_the_window(
    tokens: int, decode: int, window: int | None, long: int, tmp_path: Path
) -> None:
    from pytest_mlxgate.explain.plan_verify import long_context

    marks = f"pytestmark = [{KV}, pytest.mark.mlx_kl(prompts=4, tokens={tokens}, decode={decode})]\n\n"
    path = _gate(tmp_path, marks + "def test_drift(paired):\n    assert_kl_below(paired, mean=0.1)\n")
    assert long_context(read_gate(path), window) == long


def test_the_summary_when_nothing_was_chosen_claims_no_plan_and_zero_bytes_read_as_nan() -> None:
    result = _search(
        chosen="none", layers={}, bytes_per_token=0.0, plain_bytes_per_token=0.0, rounds=[], notes=[], seconds=0.4
    )
    assert plan_summary(result) == [
        "plan (none):  · 0 KV bytes per token (nan% of plain)",
        "  uniform 4-bit g64: mean KL 0.0123 on the selection, does not pass · nanx the plan's bytes",
        "  uniform 8-bit g64: mean KL 0.00051 on the selection, passes · nanx the plan's bytes",
        "  took 0 s",
    ]
    assert math.isnan(float("nan"))


# --- read_gate -------------------------------------------------------------------------------------------

HEAD = """
import pathlib
import pytest
from pytest_mlxgate import assert_kl_below

pathlib.Path(__file__).with_suffix(".name").write_text(__name__)
"""

KV = 'pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving")'


KV_QUANTIZED_REF = KV.replace('ref="plain"', 'ref={"bits": 4}')


def _gate(tmp_path: Path, body: str, name: str = "test_my_gate.py") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + body)
    return path


def test_a_gate_with_one_mark_and_no_sizes_takes_the_default_sizes_and_is_imported_under_its_own_name(
    tmp_path: Path,
) -> None:
    path = _gate(
        tmp_path,
        f"pytestmark = {KV}\n\n"
        "def test_b(paired):\n    assert_kl_below(paired, mean=0.5, p99=2)\n\n"
        "def test_a(paired):\n    assert_kl_below(paired, mean=0.1, top1=0.9)\n\n"
        "def test_c(paired):\n    assert_kl_below(paired, mean=0.3)\n",
    )
    gate = read_gate(path)
    assert (gate.path, gate.prompts, gate.tokens, gate.decode) == (path, 64, 256, 32)
    assert gate.limits == {"mean": 0.5, "p99": 2.0, "top1": 0.9}  # the first test's own limit wins
    assert gate.kl_tests == ("test_a", "test_b", "test_c")
    assert gate.lever.name == "kv_cache" and gate.lever.kind == "kv"
    assert path.with_suffix(".name").read_text() == "_mlxgate_plan_test_my_gate"


def test_a_model_s_limits_replace_the_gate_s_and_another_model_s_do_not(tmp_path: Path) -> None:
    path = _gate(
        tmp_path,
        f"pytestmark = [pytest.mark.mlx_speed(), {KV}, pytest.mark.mlx_kl(prompts=5, tokens=20, decode=6)]\n\n"
        "def test_drift(paired):\n"
        "    assert_kl_below(\n"
        "        paired, mean=0.02, models={'other': {'mean': 0.9, 'p99': 0.8}, 'tiny': {'mean': 0.05}}\n"
        "    )\n\n"
        "def test_more(paired):\n"
        "    assert_kl_below(paired, mean=0.04, top1=0.5, models={'tiny': {'p99': 0.4}})\n",
    )
    assert read_gate(path).limits == {"mean": 0.02, "top1": 0.5}
    assert read_gate(path, model="tiny").limits == {"mean": 0.05, "top1": 0.5, "p99": 0.4}
    assert read_gate(path, model="other").limits == {"mean": 0.9, "top1": 0.5, "p99": 0.8}
    assert read_gate(path, model="nobody").limits == {"mean": 0.02, "top1": 0.5}
    gate = read_gate(path)
    assert (gate.prompts, gate.tokens, gate.decode) == (5, 20, 6) and gate.kl_tests == ("test_drift", "test_more")


def test_a_mean_only_for_a_model_is_a_mean_for_that_model_alone(tmp_path: Path) -> None:
    path = _gate(
        tmp_path,
        f"pytestmark = [{KV}]\n\ndef test_drift(paired):\n"
        "    assert_kl_below(paired, top1=0.5, models={'tiny': {'mean': 0.05}})\n",
    )
    assert read_gate(path, model="tiny").limits == {"top1": 0.5, "mean": 0.05}
    with pytest.raises(MlxgateUsageError) as caught:
        read_gate(path)
    assert str(caught.value) == (
        f"{path} asserts no mean KL limit (assert_kl_below(paired, mean=...)): nothing to meet"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("x = 1\n", "{path} declares no mlx_lever: give a KV gate module, e.g. gates/test_kv_cache.py"),
        (
            "pytestmark = [pytest.mark.mlx_kl(prompts=4)]\n",
            "{path} declares no mlx_lever: give a KV gate module, e.g. gates/test_kv_cache.py",
        ),
        (
            'pytestmark = pytest.mark.mlx_lever("mx_compile", context="pytest_mlxgate.reference_ops:compiled", '
            'ref="off", cand="on", path="serving")\n',
            "{path}'s lever 'mx_compile' is a context lever: `plan kv` searches KV plans; give a KV gate module, "
            "e.g. gates/test_kv_cache.py",
        ),
        (
            f"pytestmark = [{KV_QUANTIZED_REF}]\n",
            "{path}'s reference arm is not the plain cache: the search prices plans against it",
        ),
        (
            f"pytestmark = [{KV}]\n\ndef test_drift(paired):\n    assert_kl_below(paired, top1=0.5)\n",
            "{path} asserts no mean KL limit (assert_kl_below(paired, mean=...)): nothing to meet",
        ),
    ],
)
def test_a_gate_the_search_cannot_use_is_refused_with_the_reason(tmp_path: Path, body: str, message: str) -> None:
    path = _gate(tmp_path, body)
    with pytest.raises(MlxgateUsageError) as caught:
        read_gate(path)
    assert str(caught.value) == message.format(path=path)


def test_a_relative_plan_file_in_the_lever_is_found_beside_the_gate(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text('{"default": {"bits": 8, "group_size": 64}}')
    lever = KV.replace('cand={"bits": 8, "group_size": 64}', 'cand="plan.json"')
    body = f"pytestmark = [{lever}]\n\ndef test_drift(paired):\n    assert_kl_below(paired, mean=0.1)\n"
    gate = read_gate(_gate(tmp_path, body))
    assert not gate.lever.kv_plan("candidate").is_plain


def test_a_missing_gate_file_is_refused_with_an_example(tmp_path: Path) -> None:
    for path in (tmp_path / "nothing.py", tmp_path):
        with pytest.raises(MlxgateUsageError) as caught:
            read_gate(path)
        assert str(caught.value) == (f"--gate {path}: no such file; give a gate module, e.g. gates/test_kv_cache.py")
