"""Compatibility path: the plain-ops reference kernels live in `pytest_mlxgate.levers.reference_ops`.

Gates name `pytest_mlxgate.reference_ops:scaled_dot_product_attention` (a patch value) and
`pytest_mlxgate.reference_ops:fast_ops` (a context factory) in their levers, and the reference
cache keys on that text, so this path keeps working; the objects (rope, layer_norm, rms_norm, ...:
everything in that module's `__all__`) are the same.
"""

from .levers.reference_ops import *  # noqa: F403
from .levers.reference_ops import __all__  # noqa: F401
