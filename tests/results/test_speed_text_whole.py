"""A speed record's words, whole: each context's line with every part present, and with each part
missing (said as `?`, or left out where it would say nothing), the number formats at their edges, the
weights line and the load warning exactly as a reader sees them."""

from __future__ import annotations

from typing import Any

import pytest
from speed_words import context_text, load_warning, ratio_text, speed_lines

from pytest_mlxgate.results.speed_text import mib

MIB = 1 << 20
GIB = 1 << 30


def full() -> dict[str, Any]:
    return {
        "reference": {
            "prefill_tps": 812.4,
            "decode_tps": 41.25,
            "kv_bytes": 84 * MIB,
            "kv_held_bytes": 60 * MIB,
            "peak_bytes": 3 * MIB,
        },
        "candidate": {
            "prefill_tps": 99.94,
            "decode_tps": 55.3,
            "kv_bytes": 45 * MIB,
            "kv_held_bytes": 31.5 * MIB,
            "peak_bytes": 0,
        },
        "prefill": {"ratio": 0.87, "ratio_ci": [0.8, 0.95], "n": 9},
        "decode": {"ratio": 1.344, "ratio_ci": [1.291, 1.404], "n": 9.0},
        "stopped": "budget",
    }


def test_a_context_with_every_figure_reads_whole() -> None:
    assert context_text(full()) == (
        "prefill ×0.87 [0.80, 0.95] (tok/s 812 → 99.9) · decode ×1.34 [1.29, 1.40] (tok/s 41.2 → 55.3)"
        " · KV 84.0 MiB → 45.0 MiB (holds 60.0 MiB → 31.5 MiB) · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)"
    )


HEAD = "prefill ×0.87 [0.80, 0.95] (tok/s 812 → 99.9) · decode ×1.34 [1.29, 1.40] (tok/s 41.2 → 55.3)"


@pytest.mark.parametrize(
    ("arm", "key", "value", "tail"),
    [
        ("reference", "kv_held_bytes", None, " · KV 84.0 MiB → 45.0 MiB · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)"),
        ("candidate", "kv_held_bytes", None, " · KV 84.0 MiB → 45.0 MiB · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)"),
        ("candidate", "kv_held_bytes", True, " · KV 84.0 MiB → 45.0 MiB · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)"),
        ("reference", "peak_bytes", None, " · KV 84.0 MiB → 45.0 MiB (holds 60.0 MiB → 31.5 MiB) · 9 pairs (budget)"),
        ("candidate", "peak_bytes", None, " · KV 84.0 MiB → 45.0 MiB (holds 60.0 MiB → 31.5 MiB) · 9 pairs (budget)"),
        (
            "reference",
            "kv_bytes",
            None,
            " · KV ? → 45.0 MiB (holds 60.0 MiB → 31.5 MiB) · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)",
        ),
        (
            "candidate",
            "kv_bytes",
            "45",
            " · KV 84.0 MiB → ? (holds 60.0 MiB → 31.5 MiB) · peak +3.0 MiB → +0.0 MiB · 9 pairs (budget)",
        ),
    ],
)
def test_a_part_one_arm_lacks_is_left_out_or_unknown(arm: str, key: str, value: Any, tail: str) -> None:
    ctx = full()
    ctx[arm][key] = value
    assert context_text(ctx) == HEAD + tail


def test_the_pairs_are_said_only_with_a_reason_to_stop_and_a_count() -> None:
    ctx = full()
    ctx["stopped"] = None
    assert context_text(ctx).endswith("peak +3.0 MiB → +0.0 MiB")
    ctx["stopped"] = "decided"
    ctx["decode"] = {"ratio": 1.344, "ratio_ci": [1.291, 1.404]}  # no count
    assert context_text(ctx).endswith("peak +3.0 MiB → +0.0 MiB")
    ctx["decode"]["n"] = 4
    assert context_text(ctx).endswith("peak +3.0 MiB → +0.0 MiB · 4 pairs (decided)")


@pytest.mark.parametrize("ctx", [{}, {"reference": None, "candidate": None, "prefill": None, "decode": None}])
def test_an_empty_context_says_what_it_does_not_know(ctx: dict[str, Any]) -> None:
    assert context_text(ctx) == "prefill ×? (tok/s ? → ?) · decode ×? (tok/s ? → ?) · KV ? → ?"


@pytest.mark.parametrize(
    ("tps", "text"),
    [(100, "100"), (100.4, "100"), (99.94, "99.9"), (99.96, "100.0"), (5, "5.0"), (0, "0.0"), (True, "?"), ("9", "?")],
)
def test_tokens_per_second_whole_from_a_hundred_else_to_a_tenth(tps: Any, text: str) -> None:
    ctx = {"reference": {"prefill_tps": tps, "decode_tps": tps}, "candidate": {}}
    assert context_text(ctx) == f"prefill ×? (tok/s {text} → ?) · decode ×? (tok/s {text} → ?) · KV ? → ?"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "?"),
        (0, "0.0 MiB"),
        (1.5 * MIB, "1.5 MiB"),
        (GIB - MIB, "1023.0 MiB"),
        (GIB - 1, "1024.0 MiB"),
        (GIB, "1.00 GiB"),
        (2.5 * GIB, "2.50 GiB"),
    ],
)
def test_bytes_in_mib_below_a_gib_then_in_gib(n: float | None, text: str) -> None:
    assert mib(n) == text


@pytest.mark.parametrize(
    ("estimate", "text"),
    [
        ({"ratio": 1.344, "ratio_ci": [1.291, 1.404]}, "×1.34 [1.29, 1.40]"),
        ({"ratio": 2, "ratio_ci": [1, 3]}, "×2.00 [1.00, 3.00]"),
        ({"ratio": 1.5}, "×1.50 [no interval]"),
        ({"ratio": 1.5, "ratio_ci": None}, "×1.50 [no interval]"),
        ({"ratio": 1.5, "ratio_ci": [1.2]}, "×1.50 [no interval]"),
        ({"ratio": 1.5, "ratio_ci": [None, 1.7]}, "×1.50 [no interval]"),
        ({"ratio": 1.5, "ratio_ci": [1.2, None]}, "×1.50 [no interval]"),
        ({"ratio": 1.5, "ratio_ci": [1.2, "1.7"]}, "×1.50 [no interval]"),
        ({"ratio": None, "ratio_ci": [1.2, 1.7]}, "×?"),
        ({"ratio": True, "ratio_ci": [1.2, 1.7]}, "×?"),
        ({}, "×?"),
        (None, "×?"),
    ],
)
def test_a_ratio_with_its_interval_to_two_places(estimate: Any, text: str) -> None:
    assert ratio_text(estimate) == text


WARNING = (
    "⚠ speed timed under load: other processes kept {busy} during the trials, so these ratios measure that "
    "contention too; re-time with the machine otherwise idle"
)


@pytest.mark.parametrize(
    ("seen", "busy"),
    [
        ({"high": True, "other_cores": 1.26, "cores": 4, "share": 0.315}, "1.3 of 4 cores busy (32%)"),
        ({"high": True, "other_cores": 2, "cores": 2, "share": 1}, "2.0 of 2 cores busy (100%)"),
        ({"high": True, "other_cores": None, "cores": 2, "share": 0.5}, "the cores busy"),
        ({"high": True, "other_cores": 1.0, "cores": 2, "share": None}, "the cores busy"),
        ({"high": True, "other_cores": 1.0, "cores": 2}, "the cores busy"),
        ({"high": True}, "the cores busy"),
    ],
)
def test_the_load_warning_says_how_busy_the_cores_were(seen: dict[str, Any], busy: str) -> None:
    assert load_warning(seen) == WARNING.format(busy=busy)


@pytest.mark.parametrize("seen", [{"high": 1}, {"high": "yes"}, {"high": False}, {}, None, [("high", True)]])
def test_no_load_warning_unless_the_record_says_high_exactly(seen: Any) -> None:
    assert load_warning(seen) is None


def test_a_record_reads_context_by_context_then_weights_then_the_warning() -> None:
    other = {"prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1], "n": 3}}
    speed = {
        "contexts": {"8192": full(), "600": other},
        "weights_bytes": {"reference": 2 * GIB, "candidate": 600 * MIB},
        "load_seen": {"high": True, "other_cores": 1.0, "cores": 2, "share": 0.5},
    }
    assert speed_lines(speed) == [  # shortest context first, however the record ordered them
        "speed @600: prefill ×1.00 [0.90, 1.10] (tok/s ? → ?) · decode ×? (tok/s ? → ?) · KV ? → ?",
        f"speed @8192: {context_text(full())}",
        "weights 2.00 GiB → 600.0 MiB",
        WARNING.format(busy="1.0 of 2 cores busy (50%)"),
    ]


@pytest.mark.parametrize(
    "weights",
    [
        {"reference": 5 * MIB, "candidate": 5 * MIB},
        {"reference": 5 * MIB},
        {"candidate": 5 * MIB},
        {"reference": True, "candidate": 5 * MIB},
        None,
    ],
)
def test_weights_are_said_only_when_both_are_known_and_differ(weights: Any) -> None:
    assert speed_lines({"contexts": None, "weights_bytes": weights, "load_seen": {"high": False}}) == []
    assert speed_lines({"weights_bytes": weights}) == []


def test_a_served_speed_names_both_servers_and_its_concurrent_context() -> None:
    """Both arms served (`speed.served`): after the contexts, the servers, then the shortest context timed
    with several requests at once, worded as any context is (the summary reads the same typed parse)."""
    served = {
        "reference": "http://127.0.0.1:8080",
        "candidate": "http://127.0.0.1:8081",
        "method": "streamed /v1/completions",
        "concurrent": {"requests": 4, "context": 48, **full()},
    }
    speed = {"contexts": {"48": full()}, "served": served}
    assert speed_lines(speed) == [
        f"speed @48: {context_text(full())}",
        "served: http://127.0.0.1:8080 (reference) against http://127.0.0.1:8081, streamed",
        f"speed @48, 4 requests at once: {context_text(full())}",
    ]
