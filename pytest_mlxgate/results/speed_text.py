"""A speed record in words: `speed @512: decode ×1.34 [1.29, 1.40] (tok/s 41.2 → 55.3) · KV 84 → 45 MiB`.

Reads the JSON a record carries (standard library only: the xdist controller's summary uses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["context_text", "load_warning", "mib", "ratio_text", "speed_lines"]


def mib(n: float | None) -> str:
    return "?" if n is None else f"{n / (1 << 20):.1f} MiB" if n < (1 << 30) else f"{n / (1 << 30):.2f} GiB"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def ratio_text(estimate: Mapping[str, Any] | None) -> str:
    """`×1.34 [1.29, 1.40]`."""
    if not estimate or _num(estimate.get("ratio")) is None:
        return "×?"
    lo, hi = (list(estimate.get("ratio_ci") or []) + [None, None])[:2]
    lo_n, hi_n = _num(lo), _num(hi)
    interval = f" [{lo_n:.2f}, {hi_n:.2f}]" if lo_n is not None and hi_n is not None else " [no interval]"
    return f"×{float(estimate['ratio']):.2f}{interval}"


def _tps(x: Any) -> str:
    v = _num(x)
    return "?" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def context_text(ctx: Mapping[str, Any]) -> str:
    """One context: prefill and decode ratios with tokens/s, then KV bytes and peak growth per arm."""
    ref, cand = ctx.get("reference") or {}, ctx.get("candidate") or {}
    parts = [
        f"prefill {ratio_text(ctx.get('prefill'))} (tok/s {_tps(ref.get('prefill_tps'))} → "
        f"{_tps(cand.get('prefill_tps'))})",
        f"decode {ratio_text(ctx.get('decode'))} (tok/s {_tps(ref.get('decode_tps'))} → "
        f"{_tps(cand.get('decode_tps'))})",
        f"KV {mib(_num(ref.get('kv_bytes')))} → {mib(_num(cand.get('kv_bytes')))}",
    ]
    held_ref, held_cand = _num(ref.get("kv_held_bytes")), _num(cand.get("kv_held_bytes"))
    if held_ref is not None and held_cand is not None:
        parts[-1] += f" (holds {mib(held_ref)} → {mib(held_cand)})"
    if ref.get("peak_bytes") is not None and cand.get("peak_bytes") is not None:
        parts.append(f"peak +{mib(_num(ref['peak_bytes']))} → +{mib(_num(cand['peak_bytes']))}")
    pairs = _num((ctx.get("decode") or {}).get("n"))
    if ctx.get("stopped") and pairs is not None:  # sequential trials: how many pairs, and why no more
        parts.append(f"{pairs:.0f} pairs ({ctx['stopped']})")
    return " · ".join(parts)


def speed_lines(speed: Mapping[str, Any]) -> list[str]:
    """One line per context, the servers and their concurrent context where both arms were served, then the
    weights when the arms' differ (two-model mode), then a warning when other processes loaded the machine
    while the trials were timed."""
    lines = [f"speed @{c}: {context_text(ctx)}" for c, ctx in (speed.get("contexts") or {}).items()]
    served = speed.get("served")
    if isinstance(served, Mapping):  # both arms served over HTTP (`speed.served`)
        lines.append(f"served: {served.get('reference')} (reference) against {served.get('candidate')}, streamed")
        concurrent = served.get("concurrent")
        if isinstance(concurrent, Mapping):
            lines.append(
                f"speed @{concurrent.get('context')}, {concurrent.get('requests')} requests at once: "
                f"{context_text(concurrent)}"
            )
    weights = speed.get("weights_bytes") or {}
    ref_w, cand_w = _num(weights.get("reference")), _num(weights.get("candidate"))
    if ref_w is not None and cand_w is not None and ref_w != cand_w:
        lines.append(f"weights {mib(ref_w)} → {mib(cand_w)}")
    warning = load_warning(speed.get("load_seen"))
    if warning:
        lines.append(warning)
    return lines


def load_warning(seen: Any) -> str | None:
    """`⚠ speed timed under load: …` when the record's `load_seen` says other load was high, else None."""
    if not isinstance(seen, Mapping) or seen.get("high") is not True:
        return None
    others, share = _num(seen.get("other_cores")), _num(seen.get("share"))
    busy = "the cores busy"
    if others is not None and share is not None:
        busy = f"{others:.1f} of {seen.get('cores')} cores busy ({100 * share:.0f}%)"
    return (
        f"⚠ speed timed under load: other processes kept {busy} during the trials, so these ratios "
        "measure that contention too; re-time with the machine otherwise idle"
    )
