"""Compatibility path: the plain-ops reference kernels live in `pytest_mlxgate.levers.reference_ops`.

Gates name `pytest_mlxgate.reference_ops:scaled_dot_product_attention` as a lever value (and the
reference cache keys on that text), so this path keeps working; the objects are the same.
"""

from .levers.reference_ops import *  # noqa: F403
from .levers.reference_ops import __all__  # noqa: F401
