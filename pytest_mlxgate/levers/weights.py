"""Weight quantization as a lever: each arm gets the model's weights as loaded, or quantized in
process exactly as `mlx_lm.convert -q` would write them (`mlx_lm.utils.quantize_model`: the same
layers, bits and group size), so a gate compares float weights with 4-bit ones without a second
repo. Two arms, two models in memory: the quantized copy is loaded afresh from the same verified
snapshot, so the reference's weights are never touched.

    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 4, "group_size": 64})

Values: None / "float" (as loaded), a bit count (group 64), "bits=4,group_size=64", or a dict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import LeverError, LeverNotApplicableError
from ..models.loaded import LoadedModel, load_mlx

__all__ = ["WeightsSpec", "parse_weights_value", "quantized_copy"]

_BITS = (2, 3, 4, 5, 6, 8)
_GROUPS = (32, 64, 128)
_AS_LOADED = frozenset({"none", "float", "as-loaded", "as_loaded", "original", "plain"})
_FORMS = (
    "None or 'float' (as loaded), a bit count (8: group 64), 'bits=4,group_size=64', or {'bits': 4, 'group_size': 64}"
)


@dataclass(frozen=True)
class WeightsSpec:
    """Affine quantization of every layer mlx_lm's converter quantizes."""

    bits: int
    group_size: int = 64

    def describe(self) -> str:
        return f"{self.bits}-bit g{self.group_size} weights"


def parse_weights_value(value: object) -> WeightsSpec | None:
    """One arm's value; LeverError names what was given and the forms that work."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _AS_LOADED):
        return None
    raw: Mapping[str, object]
    if isinstance(value, bool):
        raise LeverError(f"weights value {value!r} is not a quantization; give {_FORMS}")
    if isinstance(value, int):
        raw = {"bits": value}
    elif isinstance(value, str):
        text = value.strip().lower()
        short = re.fullmatch(r"q?(\d+)(?:-?bits?)?", text)
        if short:
            raw = {"bits": int(short.group(1))}
        else:
            try:
                raw = dict(part.split("=", 1) for part in text.split(",") if part.strip())
            except ValueError:
                raise LeverError(f"weights value {value!r} is not a quantization; give {_FORMS}") from None
    elif isinstance(value, Mapping):
        raw = dict(value)
    else:
        raise LeverError(f"weights value {value!r} ({type(value).__name__}) is not a quantization; give {_FORMS}")
    unknown = sorted(str(k) for k in raw if k not in ("bits", "group_size"))
    if unknown or "bits" not in raw:
        raise LeverError(
            f"weights value {value!r}: {'unknown keys ' + str(unknown) if unknown else 'no bits'}; give {_FORMS}"
        )
    bits, group = _whole(raw["bits"], "bits", value), _whole(raw.get("group_size", 64), "group_size", value)
    if bits not in _BITS or group not in _GROUPS:
        raise LeverError(f"weights value {value!r}: MLX quantizes to bits {list(_BITS)} in groups of {list(_GROUPS)}")
    return WeightsSpec(bits, group)


def _whole(x: object, key: str, value: object) -> int:
    try:
        return int(str(x).strip())
    except ValueError:
        raise LeverError(f"weights value {value!r}: {key}={x!r} is not a whole number") from None


def quantized_copy(loaded: LoadedModel, spec: WeightsSpec) -> LoadedModel:
    """The same snapshot loaded again and quantized as `mlx_lm.convert -q --q-bits B --q-group-size G`."""
    import mlx.core as mx
    from mlx_lm.utils import quantize_model

    model = load_mlx(loaded.snapshot)[0]  # unreadable weights: ModelUnavailableError naming the file
    config_path = loaded.snapshot.dir / "config.json"
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if "quantization" in config:
        raise LeverNotApplicableError(
            f"{loaded.snapshot.pinned} is already quantized ({config['quantization']}): this weights gate compares "
            "float weights with a quantization of them; run it on the float repo (e.g. --mlx-candidate "
            "google/gemma-4-e4b-it), or compare two repos with the model lever (--mlx-reference)"
        )
    model, _ = quantize_model(model, config, spec.group_size, spec.bits)
    mx.eval(model.parameters())
    return replace(loaded, model=model)
