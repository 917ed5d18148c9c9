"""A tiny random llama with the embedded model's real tokenizer: a real mlx_lm model that loads in
milliseconds, for tests of the gate machinery that do not need a model that talks sense."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tiny_model(out: Path, *, seed: int = 0, scale: float = 2.0, **overrides: object) -> Path:
    """Write config (TINY_CONFIG with `overrides`), random weights (seeded) and the embedded
    tokenizer into `out`.

    `scale` sharpens the embedding so the random model's next-token distributions are peaked,
    like a real model's, rather than nearly uniform.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    mx.random.seed(seed)
    config = {**TINY_CONFIG, **overrides}
    model = llama.Model(llama.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * scale
    weights = dict(tree_flatten(model.parameters()))
    return write_snapshot(out, config, weights)


def write_snapshot(out: Path, config: dict[str, object], weights: dict[str, object]) -> Path:
    """A model directory mlx_lm loads: config.json, model.safetensors and the embedded tokenizer."""
    import mlx.core as mx

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)  # type: ignore[arg-type]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    source = ensure_embedded_snapshot()
    for name in _TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)
    return out
