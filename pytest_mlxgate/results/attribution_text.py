"""Drift attribution in words: the lines a failing gate's message and the terminal summary print."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .record_kl import Attribution, LayerError, parse_attribution

__all__ = ["attribution_lines", "entry_step", "top_line"]


def _kl(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == 0:
        return "0"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def _ci(ci: Any) -> str:
    return f"[{_kl(ci.lower)}, {_kl(ci.upper)}]"


def entry_step(residual: tuple[LayerError, ...]) -> tuple[int, float] | None:
    """The layer whose output error jumps most over the layer before's (its index, the factor): one bad
    layer is a step; error that compounds grows smoothly and no layer stands out. None for one layer."""
    known = [(e.layer, e.rel_error) for e in residual if e.layer is not None and e.rel_error is not None]
    steps = [
        (layer, err / before if before > 0 else (math.inf if err > 0 else 1.0))
        for (_, before), (layer, err) in zip(known, known[1:], strict=False)
    ]
    return max(steps, key=lambda s: s[1]) if steps else None


def top_line(a: Attribution, k: int = 3) -> str:
    """One line: the scopes that carry the most drift, with their share of the lever's whole."""
    parts = []
    for s in a.top(k):
        share = f", {s.mean / a.whole_mean:.0%} of the whole" if a.whole_mean and s.mean is not None else ""
        parts.append(f"{s.name} {_kl(s.mean)} {_ci(s.mean_ci)}{share}")
    return "drift from: " + ("; ".join(parts) if parts else "no scope measured")


def attribution_lines(attribution: Attribution | Mapping[str, Any]) -> list[str]:
    """Where the drift comes from, as a failing gate's message ends: the top scopes, the attention
    types, where the output error enters, what could not be scoped, and what it cost."""
    a = attribution if isinstance(attribution, Attribution) else parse_attribution(attribution)
    if not a.scopes:
        return ["where the drift comes from: not measured", *(f"  note: {n}" for n in a.notes)]
    cost = f"{a.sequence_arms} sequence-arms"
    if a.gate_sequence_arms:
        cost += (
            f", {a.sequence_arms / a.gate_sequence_arms:.1f}x the gate's {a.gate_sequence_arms}"
            if a.sequence_arms
            else ""
        )
    if a.seconds is not None:
        cost += f", {a.seconds:.0f} s" + (
            f" ({a.seconds / a.gate_seconds:.1f}x the gate's time)" if a.gate_seconds else ""
        )
    if a.source == "cache":
        cost += ", from the reference cache"
    lines = [
        f"where the drift comes from (the lever on one scope of layers at a time, {a.sequences} sequences; "
        f"whole mean KL {_kl(a.whole_mean)} {_ci(a.whole_ci)}; cost {cost}):",
        "  " + top_line(a),
    ]
    types = [s for s in a.scopes if s.kind == "type"]
    if types:
        lines.append("  by attention type: " + "; ".join(f"{s.name} {_kl(s.mean)} {_ci(s.mean_ci)}" for s in types))
    step = entry_step(a.residual)
    if step is not None and a.residual:
        last = a.residual[-1]
        factor = "from none before it" if math.isinf(step[1]) else f"x{step[1]:.1f} the layer before's"
        lines.append(
            f"  output error enters at layer {step[0]} ({factor}); after the last layer "
            f"{_kl(last.rel_error)} of the reference's norm ({a.residual_sequences} sequences)"
        )
    lines.extend(f"  note: {n}" for n in a.notes)
    return lines
