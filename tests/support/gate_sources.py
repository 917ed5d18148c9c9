"""Source text of the small modules pytester gate sessions import (kept in one place)."""

#: `perturb.py`: an RMSNorm with weights 2% too large, a small real drift; gates patch
#: `mlx.core.fast.rms_norm` with `perturb:rms_norm`.
PERTURB = '''
import mlx.core as mx

_fused = mx.fast.rms_norm


def rms_norm(x, weight, eps):
    """RMSNorm with weights 2% too large: a small, real drift."""
    return _fused(x, weight * 1.02, eps)
'''
