"""Weight quantization as a lever: each arm gets the model's weights as loaded, or quantized in
process exactly as `mlx_lm.convert -q` would write them (`mlx_lm.utils.quantize_model`: the same
layers, bits and group size), so a gate compares float weights with 4-bit ones without a second
repo. Two arms, two models in memory: the quantized copy is loaded afresh from the same verified
snapshot, so the reference's weights are never touched.

    pytest.mark.mlx_lever("weights", weights=True, ref=None, cand={"bits": 4, "group_size": 64})

Values: None / "float" (as loaded), a bit count (group 64), "bits=4,group_size=64", a dict, or a
per-layer plan: a JSON file holding mlx_lm's own `quantization` block (a config.json, or the block alone,
as `mlxgate plan weights` writes it): a default bits and group size, and an entry per module path, its
own `{"bits": 6, "group_size": 64}` or `false` (kept as loaded); `"verified": false` and `"verification"`
beside them: the mark of a plan no gate verified (`--no-verify`, `common.plan_mark`), said in its description.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..common.plan_mark import MARK_KEYS, unverified_reason
from ..errors import LeverError, LeverNotApplicableError
from ..models.loaded import LoadedModel, load_mlx

__all__ = ["WeightsSpec", "parse_weights_value", "quantization_block", "quantized_copy", "save_quantized"]

_BITS = (2, 3, 4, 5, 6, 8)
_GROUPS = (32, 64, 128)
_AS_LOADED = frozenset({"none", "float", "as-loaded", "as_loaded", "original", "plain"})
_FORMS = (
    "None or 'float' (as loaded), a bit count (8: group 64), 'bits=4,group_size=64', {'bits': 4, 'group_size': 64}, "
    "or a weights_config.json (a per-layer plan: mlx_lm's quantization block)"
)

#: A module's own quantization in a plan: (bits, group size), or None where it keeps its weights as loaded.
Entry = tuple[int, int] | None


@dataclass(frozen=True)
class WeightsSpec:
    """Affine quantization of every layer mlx_lm's converter quantizes, at `bits`/`group_size`, except the
    module paths `layers` names with a width of their own (or None: kept as loaded); `source` is the plan's
    file, for the reader."""

    bits: int
    group_size: int = 64
    layers: tuple[tuple[str, Entry], ...] = ()
    source: str | None = None
    unverified: str | None = None  # why the plan file says no gate verified it (`common.plan_mark`)

    def describe(self) -> str:
        mark = f" [NOT verified: {self.unverified}]" if self.unverified is not None else ""
        return self._quantization() + mark

    def _quantization(self) -> str:
        if not self.layers:
            return f"{self.bits}-bit g{self.group_size} weights"
        counts: dict[str, int] = {}
        for _, entry in self.layers:
            label = "as loaded" if entry is None else f"{entry[0]}-bit g{entry[1]}"
            counts[label] = counts.get(label, 0) + 1
        shown = ", ".join(f"{n} × {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        where = f" ({Path(self.source).name})" if self.source else ""
        return f"weights plan{where}: {shown}; others {self.bits}-bit g{self.group_size}"

    @property
    def stable(self) -> str:
        """What a cache key holds: the quantization, a plan by the sha256 of its entries (not its file name)."""
        if not self.layers:
            return self._quantization()
        return "sha256:" + hashlib.sha256(json.dumps(quantization_block(self), sort_keys=True).encode()).hexdigest()

    def predicate(self, path: str) -> bool | dict[str, Any]:
        """mlx_lm's `quant_predicate` answer for the module at `path`: its own entry, else the default."""
        entry = dict(self.layers).get(path, (self.bits, self.group_size))
        return False if entry is None else {"bits": entry[0], "group_size": entry[1], "mode": "affine"}


def quantization_block(spec: WeightsSpec) -> dict[str, Any]:
    """The spec as the `quantization` block of an mlx_lm config.json (what `mlx_lm.load` reads)."""
    block: dict[str, Any] = {"group_size": spec.group_size, "bits": spec.bits, "mode": "affine"}
    for path, entry in spec.layers:
        block[path] = False if entry is None else {"group_size": entry[1], "bits": entry[0], "mode": "affine"}
    return block


def parse_weights_value(value: object) -> WeightsSpec | None:
    """One arm's value; LeverError names what was given and the forms that work."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _AS_LOADED):
        return None
    raw: Mapping[str, object]
    if isinstance(value, Path) or (isinstance(value, str) and value.strip().lower().endswith(".json")):
        return _read_plan(Path(value))
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


def _read_plan(path: Path) -> WeightsSpec:
    """A weights_config.json: mlx_lm's quantization block, alone or inside a config.json."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise LeverError(f"weights plan {path}: cannot read it ({e.strerror}); give a weights_config.json") from None
    except ValueError as e:
        raise LeverError(f"weights plan {path}: not JSON ({e}); give mlx_lm's quantization block") from None
    block = data.get("quantization", data) if isinstance(data, dict) else None
    if not isinstance(block, dict) or "bits" not in block:
        raise LeverError(
            f"weights plan {path}: no quantization block (a 'bits' and 'group_size', then an entry per module "
            'path such as "model.layers.0.mlp.down_proj": {"bits": 6, "group_size": 64}); `mlxgate plan weights` '
            "writes one"
        )
    where = f"weights plan {path}"
    unverified = unverified_reason(block, where)
    block = {k: v for k, v in block.items() if k not in MARK_KEYS}
    default = _entry({k: v for k, v in block.items() if k in ("bits", "group_size", "mode")}, where)
    layers: list[tuple[str, Entry]] = []
    for key, entry in block.items():
        if key in ("bits", "group_size", "mode"):
            continue
        if entry is False:
            layers.append((key, None))
        elif isinstance(entry, dict):
            layers.append((key, _entry(entry, f"{where}, {key!r}")))
        else:
            raise LeverError(f"{where}: {key!r} is {entry!r}; give {{'bits': B, 'group_size': G}} or false")
    return WeightsSpec(default[0], default[1], tuple(sorted(layers)), str(path), unverified)


def _entry(raw: Mapping[str, object], where: str) -> tuple[int, int]:
    unknown = sorted(str(k) for k in raw if k not in ("bits", "group_size", "mode"))
    if unknown:
        raise LeverError(f"{where}: unknown keys {unknown}; an entry holds bits, group_size and mode 'affine'")
    if raw.get("mode", "affine") != "affine":
        raise LeverError(f"{where}: mode {raw.get('mode')!r}; this lever quantizes affine (mlx_lm's default)")
    bits, group = _whole(raw.get("bits"), "bits", where), _whole(raw.get("group_size", 64), "group_size", where)
    if bits not in _BITS or group not in _GROUPS:
        raise LeverError(f"{where}: MLX quantizes to bits {list(_BITS)} in groups of {list(_GROUPS)}")
    return bits, group


def _whole(x: object, key: str, value: object) -> int:
    try:
        return int(str(x).strip())
    except ValueError:
        raise LeverError(f"weights value {value!r}: {key}={x!r} is not a whole number") from None


def quantized_copy(loaded: LoadedModel, spec: WeightsSpec) -> LoadedModel:
    """The same snapshot loaded again and quantized as `mlx_lm.convert -q --q-bits B --q-group-size G`."""
    return _quantized(loaded, spec)[0]


def save_quantized(loaded: LoadedModel, spec: WeightsSpec, dest: Path) -> None:
    """Write the snapshot quantized by `spec` to `dest` as `mlx_lm.convert` writes a model (its weights, a
    config.json with the quantization block, the snapshot's tokenizer and other files), so `mlx_lm.load`
    opens it unchanged. Written to a folder beside `dest` and moved there whole: never half a model, and
    a `dest` that exists is refused, not overwritten."""
    from mlx_lm.utils import save_config, save_model

    if dest.exists():
        raise LeverError(f"--save {dest}: it exists; give a new folder (a saved model is never overwritten)")
    copy, config = _quantized(loaded, spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_model(staging, copy.model)
        save_config(config, config_path=staging / "config.json")
        for f in sorted(loaded.snapshot.dir.iterdir()):
            if f.is_file() and f.name != "config.json" and not f.name.startswith(".") and not _weights_file(f.name):
                shutil.copyfile(f, staging / f.name)
        staging.replace(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _weights_file(name: str) -> bool:
    return name.endswith(".safetensors") or name.endswith(".safetensors.index.json") or name.endswith(".gguf")


def _quantized(loaded: LoadedModel, spec: WeightsSpec) -> tuple[LoadedModel, dict[str, Any]]:
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
    # mlx_lm skips a module whose rows the *default* group size does not divide, before asking the
    # predicate: the smallest group in the plan lets every entry be asked (each names its own group)
    groups = [spec.group_size] + [e[1] for _, e in spec.layers if e is not None]
    own = getattr(model, "quant_predicate", None)  # what the model itself keeps float, a plan keeps float too

    def planned(path: str, module: Any) -> bool | dict[str, Any]:
        return False if own is not None and own(path, module) is False else spec.predicate(path)

    model, quantized_config = quantize_model(
        model, config, min(groups), spec.bits, quant_predicate=planned if spec.layers else None
    )
    mx.eval(model.parameters())
    return replace(loaded, model=model), quantized_config
