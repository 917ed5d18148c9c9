"""Compatibility path: KV cache plans live in `pytest_mlxgate.levers.kvcache` (its docstring has the
kv_config.json format)."""

from .levers.kvcache import *  # noqa: F403
from .levers.kvcache import __all__  # noqa: F401
