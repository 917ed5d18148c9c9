"""A speed measurement in words, as the assertions' messages and the closing summary both print it: per
context both ratios with their intervals and tokens/s, the KV bytes (and what the cache holds), peak
growth and the pairs timed; the weights when the arms differ; a warning when the machine was loaded."""

from __future__ import annotations

from speed_words import speed_lines

MIB = 2**20


def test_a_speed_record_reads_line_for_line() -> None:
    arm_ref = {
        "prefill_tps": 1234.5,
        "decode_tps": 45.25,
        "kv_bytes": 3 * MIB,
        "kv_held_bytes": 4 * MIB,
        "peak_bytes": 8 * MIB,
    }
    arm_cand = {
        "prefill_tps": 1500.0,
        "decode_tps": 50.0,
        "kv_bytes": 1.5 * MIB,
        "kv_held_bytes": 2 * MIB,
        "peak_bytes": 6 * MIB,
    }
    speed = {
        "contexts": {
            "600": {
                "reference": arm_ref,
                "candidate": arm_cand,
                "prefill": {"ratio": 1.215, "ratio_ci": [1.1, 1.33], "n": 6},
                "decode": {"ratio": 1.105, "ratio_ci": [1.02, 1.2], "n": 6},
                "stopped": "decided",
            },
            "8192": {  # one pair, a decode that never finished, no KV figure: said, never invented
                "reference": {"prefill_tps": 90.0, "decode_tps": 9.5, "kv_bytes": None},
                "candidate": {"prefill_tps": 95.0, "decode_tps": None},
                "prefill": {"ratio": 1.05, "ratio_ci": [None, None], "n": 1},
                "decode": None,
            },
        },
        "weights_bytes": {"reference": 200 * MIB, "candidate": 100 * MIB},
        "load_seen": {"high": True, "other_cores": 1.5, "cores": 2, "share": 0.75},
    }
    assert speed_lines(speed) == [
        "speed @600: prefill ×1.22 [1.10, 1.33] (tok/s 1234 → 1500) · decode ×1.10 [1.02, 1.20] (tok/s 45.2 → 50.0)"
        " · KV 3.0 MiB → 1.5 MiB (holds 4.0 MiB → 2.0 MiB) · peak +8.0 MiB → +6.0 MiB · 6 pairs (decided)",
        "speed @8192: prefill ×1.05 [no interval] (tok/s 90.0 → 95.0) · decode ×? (tok/s 9.5 → ?) · KV ? → ?",
        "weights 200.0 MiB → 100.0 MiB",
        "⚠ speed timed under load: other processes kept 1.5 of 2 cores busy (75%) during the trials, so these "
        "ratios measure that contention too; re-time with the machine otherwise idle",
    ]
    # the same weights on both arms, an idle machine: nothing more to say
    assert (
        speed_lines({"contexts": {}, "weights_bytes": {"reference": 5, "candidate": 5}, "load_seen": {"high": False}})
        == []
    )


def test_a_served_speed_names_its_servers_and_its_concurrent_context() -> None:
    """Both arms served: the servers and the context timed with 4 requests at once, after the contexts; the
    KV bytes no server shows over HTTP read unknown, never 0."""
    arm = {"prefill_tps": 300.0, "decode_tps": 20.0, "kv_bytes": None}
    ctx = {
        "reference": arm,
        "candidate": {**arm, "decode_tps": 25.0},
        "prefill": {"ratio": 1.0, "ratio_ci": [0.9, 1.1], "n": 3},
        "decode": {"ratio": 1.25, "ratio_ci": [1.1, 1.4], "n": 3},
        "stopped": "budget",
    }
    speed = {
        "contexts": {"48": ctx},
        "served": {
            "reference": "http://127.0.0.1:8080",
            "candidate": "http://127.0.0.1:8081",
            "concurrent": {"requests": 4, "context": 48, **ctx},
        },
    }
    body = "prefill ×1.00 [0.90, 1.10] (tok/s 300 → 300) · decode ×1.25 [1.10, 1.40] (tok/s 20.0 → 25.0) · KV ? → ?"
    assert speed_lines(speed) == [
        f"speed @48: {body} · 3 pairs (budget)",
        "served: http://127.0.0.1:8080 (reference) against http://127.0.0.1:8081, streamed",
        f"speed @48, 4 requests at once: {body} · 3 pairs (budget)",
    ]
