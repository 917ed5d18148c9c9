"""Known-bad kernels the gates name as `KNOWN_BAD`: each has one real bug that a gate's limits must fail.

`--mlx-calibrate` measures them beside the lever (the result is in `calibration/<gate>.json`), and the
calibration files' test checks that the gate's limits, as written, fail them.
"""

from __future__ import annotations

from typing import Any

from pytest_mlxgate.reference_ops import scaled_dot_product_attention as _plain_attention


def attention_scale_off(
    q: Any,
    k: Any,
    v: Any,
    *,
    scale: float,
    mask: Any = None,
    sinks: Any = None,
    force_fused: bool = False,
    stream: Any = None,
) -> Any:
    """Attention with its softmax scale 10% too large: what a kernel that rounds or caches 1/sqrt(d)
    wrongly computes. Every row still sums to 1, so nothing but the distribution shows it."""
    return _plain_attention(q, k, v, scale=scale * 1.1, mask=mask, sinks=sinks, force_fused=force_fused, stream=stream)
