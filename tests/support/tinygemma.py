"""A tiny random gemma-4 from mlx_lm's own `gemma4_text` classes, with the real architecture's
structure: sliding and full attention layers (RotatingKVCache and KVCache), KV-shared layers that
reuse earlier layers' K/V (so fewer caches than layers), per-layer inputs, final logit
softcapping, two head dims (sliding vs full), a tied embedding. Seeded, so every build of one
configuration has the same weights.

Two config forms, as real gemma-4 repos ship them:
- "text": `model_type: gemma4_text`, weights named `model.layers...`;
- "multimodal": `model_type: gemma4` with a `text_config` (and a vision config mlx_lm ignores),
  weights named `model.language_model.layers...`, which mlx_lm's `gemma4.Model.sanitize` maps.

The tokenizer is the embedded model's (49,152 entries); `vocab=262_144` gives the real gemma-4
vocabulary size (rows past the tokenizer are never produced by encoding, but the logits, the KL
and the softmax span all of them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tinymodel import write_snapshot

#: 8 layers, three sliding then one full (gemma-4 ends on a full layer): caches on the first 5
#: (sliding x3, full, sliding); the last 3 reuse the K/V of the last cached layer of their type.
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]
KV_SHARED_LAYERS = 3
SLIDING_WINDOW = 16

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_text",
    "hidden_size": 64,
    "num_hidden_layers": len(LAYER_TYPES),
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "global_head_dim": 128,
    "rms_norm_eps": 1e-6,
    "vocab_size": 49152,
    "vocab_size_per_layer_input": 49152,
    "hidden_size_per_layer_input": 8,
    "num_kv_shared_layers": KV_SHARED_LAYERS,
    "sliding_window": SLIDING_WINDOW,
    "layer_types": LAYER_TYPES,
    "final_logit_softcapping": 30.0,
    "use_double_wide_mlp": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}


def tiny_gemma4_config(
    *, vocab: int = 49152, layers: int | None = None, shared: int | None = None, **overrides: Any
) -> dict[str, Any]:
    """The text config of the tiny gemma-4 at `vocab` entries; `layers` (a multiple of 4: three
    sliding, one full) and `shared` (KV-shared layers at the end) make a deeper one; `overrides`
    set any other key."""
    config = {**TEXT_CONFIG, "vocab_size": vocab, "vocab_size_per_layer_input": vocab, **overrides}
    if layers is not None:
        if layers % 4:
            raise ValueError(f"layers must be a multiple of 4 (three sliding, one full), got {layers}")
        types = (["sliding_attention"] * 3 + ["full_attention"]) * (layers // 4)
        config.update(num_hidden_layers=layers, layer_types=types)
    if shared is not None:
        config["num_kv_shared_layers"] = shared
    return config


def build_tiny_gemma4(
    out: Path,
    *,
    form: Literal["text", "multimodal"] = "text",
    vocab: int = 49152,
    seed: int = 0,
    scale: float = 4.0,
    layers: int | None = None,
    shared: int | None = None,
    **overrides: Any,
) -> Path:
    """Write config, seeded random weights and the embedded tokenizer into `out`; returns `out`.
    `layers`/`shared`: see `tiny_gemma4_config` (default: 8 layers, 3 KV-shared).

    `scale` sharpens the embedding so next-token distributions are peaked, as a trained model's are.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import gemma4_text

    text = tiny_gemma4_config(vocab=vocab, layers=layers, shared=shared, **overrides)
    mx.random.seed(seed)
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(text))  # type: ignore[no-untyped-call]
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * scale
    weights = dict(tree_flatten(model.parameters()))
    if form == "multimodal":
        weights = {"model.language_model." + k.removeprefix("model."): v for k, v in weights.items()}
        config: dict[str, Any] = {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "vocab_size": vocab,
            "text_config": text,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16},
        }
    else:
        config = {"architectures": ["Gemma4ForCausalLM"], **text}
    return write_snapshot(out, config, weights)


def tiny_gemma3_model(window: int = 8) -> Any:
    """A random gemma3_text in memory (sliding, full, sliding, full; head dim 32) with a `window`-token
    window; weights scaled up so greedy choices are far from ties. Seeded."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import gemma3_text

    mx.random.seed(0)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=300,
        sliding_window=window,
        sliding_window_pattern=2,
    )
    model = gemma3_text.Model(args)
    model.update(tree_map(lambda p: p * 8 if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model
