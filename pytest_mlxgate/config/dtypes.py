"""The precisions `--mlx-dtype` names: read at option-parse time, so standard library only."""

from __future__ import annotations

__all__ = ["AUTO", "DTYPES", "ORACLE_DTYPE", "parse_dtype"]

#: `--mlx-dtype`'s values: the model as shipped, or the dtype every floating parameter is cast to.
AUTO = "auto"
DTYPES = (AUTO, "bfloat16", "float16", "float32")
#: What a low-precision kernel is judged against: the same ops with every activation in float32.
ORACLE_DTYPE = "float32"
_SHORT = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "fp32": "float32", "f32": "float32"}


def parse_dtype(value: str) -> str:
    """A dtype name as `--mlx-dtype` takes it (`bf16`, `fp16`, `f32` too), or ValueError naming the choices."""
    name = _SHORT.get(value.strip().lower(), value.strip().lower())
    if name not in DTYPES:
        raise ValueError(f"'{value}' is not a dtype mlxgate runs a model in; use one of {', '.join(DTYPES)}")
    return name
