"""A speed record in words: `speed @512: decode ×1.34 [1.29, 1.40] (tok/s 41.2 → 55.3) · KV 84 → 45 MiB`.

Reads the typed read model (`record_speed`): the assertions' messages and the controller's summary give the
same words from one parse (standard library only: the xdist controller's summary uses it).
"""

from __future__ import annotations

from .record_speed import LoadSeen, Ratio, Speed, SpeedContext

__all__ = ["context_text", "load_warning", "mib", "ratio_text", "speed_lines"]


def mib(n: float | None) -> str:
    return "?" if n is None else f"{n / (1 << 20):.1f} MiB" if n < (1 << 30) else f"{n / (1 << 30):.2f} GiB"


def ratio_text(estimate: Ratio | None) -> str:
    """`×1.34 [1.29, 1.40]`."""
    if estimate is None or estimate.ratio is None:
        return "×?"
    lo, hi = estimate.ci
    interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else " [no interval]"
    return f"×{estimate.ratio:.2f}{interval}"


def _tps(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def context_text(ctx: SpeedContext) -> str:
    """One context: prefill and decode ratios with tokens/s, then KV bytes and peak growth per arm."""
    ref, cand = ctx.reference, ctx.candidate
    parts = [
        f"prefill {ratio_text(ctx.prefill)} (tok/s {_tps(ref.prefill_tps)} → {_tps(cand.prefill_tps)})",
        f"decode {ratio_text(ctx.decode)} (tok/s {_tps(ref.decode_tps)} → {_tps(cand.decode_tps)})",
        f"KV {mib(ref.kv_bytes)} → {mib(cand.kv_bytes)}",
    ]
    if ref.kv_held_bytes is not None and cand.kv_held_bytes is not None:
        parts[-1] += f" (holds {mib(ref.kv_held_bytes)} → {mib(cand.kv_held_bytes)})"
    if ref.peak_bytes is not None and cand.peak_bytes is not None:
        parts.append(f"peak +{mib(ref.peak_bytes)} → +{mib(cand.peak_bytes)}")
    pairs = ctx.decode.n if ctx.decode is not None else None
    if ctx.stopped and pairs is not None:  # sequential trials: how many pairs, and why no more
        parts.append(f"{pairs} pairs ({ctx.stopped})")
    return " · ".join(parts)


def speed_lines(speed: Speed) -> list[str]:
    """One line per context, the servers and their concurrent context where both arms were served, then the
    weights when the arms' differ (two-model mode), then a warning when other processes loaded the machine
    while the trials were timed."""
    lines = [f"speed @{c.length}: {context_text(c)}" for c in speed.contexts]
    served = speed.served
    if served is not None:  # both arms served over HTTP (`speed.served`)
        lines.append(f"served: {served.reference} (reference) against {served.candidate}, streamed")
        if served.concurrent is not None:
            lines.append(
                f"speed @{served.concurrent.length}, {served.requests} requests at once: "
                f"{context_text(served.concurrent)}"
            )
    ref_w, cand_w = speed.weights_reference, speed.weights_candidate
    if ref_w is not None and cand_w is not None and ref_w != cand_w:
        lines.append(f"weights {mib(ref_w)} → {mib(cand_w)}")
    warning = load_warning(speed.load_seen)
    if warning:
        lines.append(warning)
    return lines


def load_warning(seen: LoadSeen | None) -> str | None:
    """`⚠ speed timed under load: …` when the record's `load_seen` says other load was high, else None."""
    if seen is None or seen.high is not True:
        return None
    busy = "the cores busy"
    if seen.other_cores is not None and seen.share is not None:
        busy = f"{seen.other_cores:.1f} of {seen.cores} cores busy ({100 * seen.share:.0f}%)"
    return (
        f"⚠ speed timed under load: other processes kept {busy} during the trials, so these ratios "
        "measure that contention too; re-time with the machine otherwise idle"
    )
