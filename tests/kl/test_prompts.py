"""Prompt sets and token sequences: the default set's coverage, exact sequence lengths, no
repeated sequences when tiling, determinism, and prompts-file errors that name file and line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_mlxgate.errors import ChatTemplateMissingError, LeverNotApplicableError, MlxgateUsageError, PromptsError
from pytest_mlxgate.kl.prompts import (
    SEPARATOR,
    Prompt,
    TokenSequence,
    build_sequences,
    default_prompts,
    load_prompts_file,
    prompts_for,
    render,
    sequences_digest,
)

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = {"code", "prose", "math", "qa", "instructions", "tool", "multilingual", "chat"}
# Every kind of text the brief asks for, as an id prefix in the default set.
KINDS = [
    "code-python",
    "code-rust",
    "code-sql",
    "code-javascript",
    "code-shell",
    "code-diff",
    "prose-narrative",
    "prose-essay",
    "prose-news",
    "math-arithmetic",
    "math-algebra",
    "math-proof",
    "math-latex",
    "qa-factual",
    "qa-reading",
    "instructions-howto",
    "instructions-recipe",
    "instructions-list",
    "instructions-system",
    "tool-schema",
    "tool-call",
    "tool-result",
    "lang-fr",
    "lang-de",
    "lang-es",
    "lang-zh",
    "lang-ja",
    "lang-ru",
    "lang-ar",
    "lang-hi",
    "chat",
]
# Each non-Latin language prompt must really be written in its script.
SCRIPTS = {
    "lang-zh": r"[\u4e00-\u9fff]",
    "lang-ja": r"[\u3040-\u30ff]",
    "lang-ru": r"[\u0400-\u04ff]",
    "lang-ar": r"[\u0600-\u06ff]",
    "lang-hi": r"[\u0900-\u097f]",
}


@pytest.fixture(scope="session")
def prompts() -> tuple[Prompt, ...]:
    return default_prompts()


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text))


# ---------------------------------------------------------------- the default set


def test_default_set_is_large_with_unique_ids(prompts: tuple[Prompt, ...]) -> None:
    assert len(prompts) >= 40
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    assert default_prompts() is prompts  # parsed once


def test_default_set_covers_every_domain_and_kind(prompts: tuple[Prompt, ...]) -> None:
    assert DOMAINS <= {p.domain for p in prompts}
    missing = [k for k in KINDS if not any(p.id.startswith(k + "-") for p in prompts)]
    assert missing == []
    for prefix, script in SCRIPTS.items():
        (prompt,) = [p for p in prompts if p.id.startswith(prefix + "-")]
        assert prompt.text is not None and len(re.findall(script, prompt.text)) > 100, prompt.id


def test_default_chat_prompts_have_turns_and_a_tool_call(prompts: tuple[Prompt, ...]) -> None:
    chats = [p for p in prompts if p.messages is not None]
    assert len(chats) >= 3
    assert all(p.domain == "chat" and p.text is None for p in chats)
    assert any({"system", "user", "assistant"} <= {m["role"] for m in p.messages or ()} for p in chats)
    calls = [
        json.loads(m["content"].split("<tool_call>")[1].split("</tool_call>")[0])
        for p in chats
        for m in p.messages or ()
        if m["role"] == "assistant" and "<tool_call>" in m["content"]
    ]
    assert calls and all({"name", "arguments"} <= set(call) for call in calls)


def test_default_prompts_render_to_400_1200_chars_and_64_tokens(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    bad = {}
    for p in prompts:
        text = render(p, tokenizer)
        n_tokens = len(encode(tokenizer, text))
        if not (400 <= len(text) <= 1200 and n_tokens >= 64):
            bad[p.id] = (len(text), n_tokens)
    assert bad == {}


def test_messages_render_through_the_chatml_template(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    chat = next(p for p in prompts if p.messages is not None)
    text = render(chat, tokenizer)
    assert text.startswith("<|im_start|>") and text.count("<|im_start|>") >= len(chat.messages or ())
    for message in chat.messages or ():
        assert f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>" in text
    # The markers become the single special tokens, not their characters spelled out.
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert encode(tokenizer, text).count(im_start) == text.count("<|im_start|>")


def test_text_prompts_render_as_is(tokenizer: Any) -> None:
    prompt = Prompt(id="t", domain="x", text="  exactly\nthis  ")
    assert render(prompt, tokenizer) == "  exactly\nthis  "


def test_pyproject_ships_the_default_set_as_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "kl/prompts_default.jsonl" in data["tool"]["setuptools"]["package-data"]["pytest_mlxgate"]


# ---------------------------------------------------------------- sequences


def check_sequences(seqs: list[TokenSequence], prompts: tuple[Prompt, ...], n: int, tokens: int) -> None:
    assert len(seqs) == n
    assert [s.index for s in seqs] == list(range(n))
    assert all(len(s.ids) == tokens + 1 and all(isinstance(i, int) for i in s.ids) for s in seqs)
    assert len({s.ids for s in seqs}) == n, "a sequence repeats"
    known = {p.id for p in prompts}
    for s in seqs:
        assert s.sources[0] == prompts[s.index % len(prompts)].id
        assert set(s.sources) <= known and len(set(s.sources)) == len(s.sources)
        assert s.preview and "\n" not in s.preview and len(s.preview) <= 60


@pytest.mark.slow  # hypothesis: 25 tokenizations of up to 132 x 600 tokens
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 132), tokens=st.integers(1, 600))
def test_sequences_have_exactly_tokens_plus_one_ids(
    prompts: tuple[Prompt, ...], tokenizer: Any, n: int, tokens: int
) -> None:
    check_sequences(build_sequences(prompts, tokenizer, n=n, tokens=tokens), prompts, n, tokens)


@pytest.mark.parametrize("tokens", [1, 24, 256])
def test_tiling_to_three_times_the_set_never_repeats_a_sequence(
    prompts: tuple[Prompt, ...], tokenizer: Any, tokens: int
) -> None:
    n = 3 * len(prompts)
    check_sequences(build_sequences(prompts, tokenizer, n=n, tokens=tokens), prompts, n, tokens)


def test_sources_are_exactly_the_prompts_joined(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    tokens = 256
    seqs = build_sequences(prompts, tokenizer, n=len(prompts), tokens=tokens)
    by_id = {p.id: p for p in prompts}
    joined = [s for s in seqs if len(s.sources) > 1]
    assert joined, "expected some prompts shorter than 257 tokens"
    for s in seqs:  # round 0 starts every prompt at its beginning
        parts = [render(by_id[i], tokenizer) for i in s.sources]
        assert tuple(encode(tokenizer, SEPARATOR.join(parts))[: tokens + 1]) == s.ids
        # ...and no source more than needed: without the last one it would be too short.
        if len(parts) > 1:
            assert len(encode(tokenizer, SEPARATOR.join(parts[:-1]))) < tokens + 1
    # Round 0 follows each prompt with the next one in the set.
    assert all(s.sources[1] == prompts[(s.index + 1) % len(prompts)].id for s in joined)


class _CharTokenizer:
    """One id per character: separators cost tokens that per-prompt counts do not see."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_sources_are_minimal_even_when_separators_add_tokens() -> None:
    five = [Prompt(id=c, domain="x", text=c * 10) for c in "abcde"]
    # Three prompts and two separators are exactly 34 ids; the counts alone would suggest four.
    seqs = build_sequences(five, _CharTokenizer(), n=5, tokens=33)
    assert [s.sources for s in seqs][:2] == [("a", "b", "c"), ("b", "c", "d")]
    assert seqs[0].ids == tuple(map(ord, "a" * 10 + "\n\n" + "b" * 10 + "\n\n" + "c" * 10))
    assert seqs[0].preview == "aaaaaaaaaa bbbbbbbbbb cccccccccc"


def test_each_round_walks_the_followers_with_its_own_stride() -> None:
    five = [Prompt(id=c, domain="x", text=c * 10) for c in "abcde"]
    seqs = build_sequences(five, _CharTokenizer(), n=20, tokens=15)
    # Strides coprime to 5 are 1, 2, 3, 4: round r follows prompt i with prompt i + stride_r.
    assert [s.sources for s in seqs[0:20:5]] == [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e")]
    assert seqs[6].sources == ("b", "d")
    assert len({s.ids for s in seqs}) == 20


def test_later_rounds_vary_what_follows_or_where_it_starts(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    count = len(prompts)
    seqs = build_sequences(prompts, tokenizer, n=2 * count, tokens=256)
    for first, second in zip(seqs[:count], seqs[count:], strict=True):
        assert first.sources[0] == second.sources[0]
        if len(first.sources) > 1 and len(second.sources) > 1:
            assert first.sources[1] != second.sources[1]
        else:  # the first prompt fills it alone: round 1 starts later in it
            assert first.ids[:8] != second.ids[:8]


def test_sequences_are_deterministic_and_prefix_stable(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    a = build_sequences(prompts, tokenizer, n=60, tokens=200)
    b = build_sequences(list(prompts), tokenizer, n=60, tokens=200)
    assert a == b and sequences_digest(a) == sequences_digest(b)
    assert build_sequences(prompts, tokenizer, n=7, tokens=200) == a[:7]
    assert sequences_digest(build_sequences(prompts, tokenizer, n=60, tokens=199)) != sequences_digest(a)


@pytest.mark.slow  # a fresh interpreter loading the tokenizer
def test_sequences_do_not_depend_on_the_process(prompts: tuple[Prompt, ...], tokenizer: Any) -> None:
    """Another interpreter with another hash seed builds the same ids (they key caches)."""
    code = (
        "from mlx_lm.utils import load_tokenizer\n"
        "from pytest_mlxgate.models.embedded import ensure_embedded_snapshot\n"
        "from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest\n"
        "tok = load_tokenizer(ensure_embedded_snapshot())\n"
        "print(sequences_digest(build_sequences(default_prompts(), tok, n=100, tokens=64)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    here = sequences_digest(build_sequences(prompts, tokenizer, n=100, tokens=64))
    assert out.stdout.strip().splitlines()[-1] == here


def test_a_raw_tokenizers_tokenizer_gives_the_same_ids(tokenizer: Any) -> None:
    """`tokenizers.Tokenizer.encode` returns an Encoding, not a list; both must work alike."""
    from tokenizers import Tokenizer

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    raw = Tokenizer.from_file(str(ensure_embedded_snapshot() / "tokenizer.json"))
    text_prompts = [p for p in default_prompts() if p.text is not None]
    assert build_sequences(text_prompts, raw, n=20, tokens=100) == build_sequences(
        text_prompts, tokenizer, n=20, tokens=100
    )


def test_too_short_prompt_set_says_how_many_tokens_it_gives(tokenizer: Any) -> None:
    few = [Prompt(id="a", domain="x", text="Hello there."), Prompt(id="b", domain="x", text="Bye now.")]
    total = len(encode(tokenizer, SEPARATOR.join(p.text or "" for p in few)))
    with pytest.raises(PromptsError) as info:
        build_sequences(few, tokenizer, n=1, tokens=100)
    message = str(info.value)
    assert f"only {total} tokens" in message and "needs 101" in message
    assert f"--mlx-kl-tokens to {total - 1}" in message and "add prompts" in message
    # Exactly enough works.
    assert len(build_sequences(few, tokenizer, n=1, tokens=total - 1)[0].ids) == total


def test_asking_for_more_distinct_sequences_than_exist_is_an_error(tokenizer: Any) -> None:
    one = [Prompt(id="a", domain="x", text="one two three four five six seven eight nine ten")]
    size = len(encode(tokenizer, one[0].text or ""))
    # Full length: only the start of the text reaches it, so only one distinct sequence exists.
    assert len(build_sequences(one, tokenizer, n=1, tokens=size - 1)) == 1
    with pytest.raises(PromptsError, match=r"only 1 distinct .* asks for 2.*--mlx-kl-prompts to 1"):
        build_sequences(one, tokenizer, n=2, tokens=size - 1)
    # Shorter sequences can start at later words: several distinct ones exist.
    check_sequences(build_sequences(one, tokenizer, n=4, tokens=3), tuple(one), 4, 3)


@pytest.mark.parametrize(
    ("n", "tokens", "flag"),
    [
        (0, 8, "--mlx-kl-prompts"),
        (4, 0, "--mlx-kl-tokens"),
        (-1, 8, "--mlx-kl-prompts"),
        (True, 8, "--mlx-kl-prompts"),
        (4, 2.5, "--mlx-kl-tokens"),
    ],
)
def test_counts_below_one_are_usage_errors(tokenizer: Any, n: Any, tokens: Any, flag: str) -> None:
    with pytest.raises(PromptsError, match=f"{flag} must be a whole number of at least 1"):
        build_sequences(default_prompts(), tokenizer, n=n, tokens=tokens)


def test_no_prompts_is_a_usage_error(tokenizer: Any) -> None:
    with pytest.raises(MlxgateUsageError, match="no prompts"):
        build_sequences([], tokenizer, n=1, tokens=8)


class _NoTemplate:
    """A tokenizer without a chat template (a base model's)."""

    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages: Any, tokenize: bool = True) -> str:
        raise AssertionError("must not be called")


class _BrokenTemplate(_NoTemplate):
    has_chat_template = True

    def apply_chat_template(self, messages: Any, tokenize: bool = True) -> str:
        raise ValueError("Conversation roles must alternate user/assistant")


def test_messages_without_a_chat_template_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "plain"}\n{"id": "conv", "messages": [{"role": "user", "content": "hi"}]}\n')
    chat = load_prompts_file(path)[1]
    with pytest.raises(PromptsError) as info:
        render(chat, _NoTemplate())
    assert f"{path}:2: prompt 'conv'" in str(info.value) and "no chat" in str(info.value)
    assert '{"text": "..."}' in str(info.value)
    with pytest.raises(PromptsError, match="rejected the conversation.*roles must alternate"):
        render(chat, _BrokenTemplate())
    # Only a conversation needs the template.
    assert render(load_prompts_file(path)[0], _NoTemplate()) == "plain"


def test_sequences_digest_covers_every_id_and_the_boundaries() -> None:
    def seqs(*ids: tuple[int, ...]) -> list[TokenSequence]:
        return [TokenSequence(index=i, ids=x, sources=("a",), preview="") for i, x in enumerate(ids)]

    base = sequences_digest(seqs((1, 2), (3, 4)))
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert base == sequences_digest(seqs((1, 2), (3, 4)))
    assert base != sequences_digest(seqs((1, 2), (3, 5)))
    assert base != sequences_digest(seqs((3, 4), (1, 2)))
    assert base != sequences_digest(seqs((1,), (2, 3, 4)))
    assert base != sequences_digest(seqs((1, 2, 3, 4)))


# ---------------------------------------------------------------- Prompt and prompts files


def test_prompt_needs_exactly_one_of_text_or_messages() -> None:
    with pytest.raises(PromptsError, match="exactly one of text or messages"):
        Prompt(id="a", domain="x")
    with pytest.raises(PromptsError, match="exactly one of text or messages"):
        Prompt(id="a", domain="x", text="t", messages=({"role": "user", "content": "c"},))


def test_prompt_messages_are_read_only_copies() -> None:
    turn = {"role": "user", "content": "c"}
    prompt = Prompt(id="a", domain="x", messages=(turn,))
    turn["content"] = "changed"
    assert prompt.messages is not None and prompt.messages[0]["content"] == "c"
    with pytest.raises(TypeError):
        prompt.messages[0]["content"] = "x"  # type: ignore[index]
    assert prompt == Prompt(id="a", domain="x", messages=({"role": "user", "content": "c"},))
    assert len({prompt, prompt}) == 1


def test_load_prompts_file_reads_text_messages_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        json.dumps({"text": "First prompt."}),
        "",
        "   ",
        json.dumps(
            {
                "id": "conv",
                "domain": "chat",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            }
        ),
        json.dumps({"text": "Zürich 東京\u2028raw separator", "domain": "multilingual"}, ensure_ascii=False),
    ]
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode())  # BOM and CRLF are fine
    got = load_prompts_file(path)
    assert [(p.id, p.domain) for p in got] == [
        ("mine.jsonl:1", "custom"),
        ("conv", "chat"),
        ("mine.jsonl:5", "multilingual"),
    ]
    assert got[0].text == "First prompt." and got[2].text == "Zürich 東京\u2028raw separator"
    assert got[1].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert got[1].origin == f"{path}:4"


OK_LINE = json.dumps({"text": "fine"})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"text": "unterminated}', "not valid JSON"),
        ('["text", "a list"]', "expected a JSON object, got a list"),
        ('{"id": "x"}', 'neither "text" nor "messages"'),
        ('{"text": "a", "messages": [{"role": "user", "content": "b"}]}', 'both "text" and "messages"'),
        (
            '{"messages": [{"role": 5, "content": "hi"}]}',
            '"messages"[0]["role"] must be a non-empty string, got a number',
        ),
        (
            '{"messages": [{"role": "user", "content": ["hi"]}]}',
            '"messages"[0]["content"] must be a string, got a list',
        ),
        ('{"messages": [{"role": "user"}]}', '"messages"[0] has no "content"'),
        ('{"messages": ["hello"]}', '"messages"[0] must be an object'),
        ('{"messages": []}', '"messages" must be a non-empty list of turns, got an empty list'),
        ('{"messages": "hello"}', '"messages" must be a non-empty list of turns, got a string'),
        ('{"text": ""}', '"text" must be a non-empty string, got an empty string'),
        ('{"text": 42}', '"text" must be a non-empty string, got a number'),
        ('{"text": "a", "id": 7}', '"id" must be a non-empty string'),
        ('{"prompt": "a", "text": "b"}', "unknown key(s) 'prompt'"),
        (
            json.dumps({"id": "mine.jsonl:1", "text": "dup"}),
            "duplicate prompt id 'mine.jsonl:1' (first used on line 1)",
        ),
    ],
)
def test_load_prompts_file_errors_name_file_and_line(tmp_path: Path, bad_line: str, expected: str) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(f"{OK_LINE}\n\n{bad_line}\n{OK_LINE}\n", encoding="utf-8")
    with pytest.raises(PromptsError) as info:
        load_prompts_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: ")
    assert expected in message
    assert isinstance(info.value, MlxgateUsageError)


@pytest.mark.parametrize("content", [b"", b"\n  \n\r\n"])
def test_empty_prompts_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(PromptsError, match=re.escape(f"{path}: no prompts")):
        load_prompts_file(path)


def test_unreadable_prompts_files_are_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(PromptsError, match=re.escape(f"{missing}: prompts file not found")):
        load_prompts_file(missing)
    with pytest.raises(PromptsError, match=re.escape(f"{tmp_path}: cannot read")):
        load_prompts_file(tmp_path)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(OK_LINE.encode() + b'\n{"text": "caf\xe9"}\n')
    with pytest.raises(PromptsError, match=re.escape(f"{latin1}:2: not valid UTF-8")):
        load_prompts_file(latin1)


# ---------------------------------------------------------------- base models (no chat template)


@pytest.fixture(scope="session")
def base_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same tokenizer with its chat template taken out: what a base model's looks like to mlx_lm."""
    import shutil

    from mlx_lm.utils import load_tokenizer

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    source, out = ensure_embedded_snapshot(), tmp_path_factory.mktemp("base-tokenizer")
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copyfile(source / name, out / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer(out)
    assert loaded.has_chat_template is False
    return loaded


def test_the_default_set_is_unchanged_where_the_tokenizer_has_a_template(tokenizer: Any) -> None:
    given, why = prompts_for(tokenizer)
    assert given == default_prompts() and why == ""  # the same sequences, so cached references still match


def test_a_base_model_gets_the_plain_prompts_and_fills_more_than_the_set_holds(base_tokenizer: Any) -> None:
    """Before, sequence 38 started with the first chat prompt and failed to render: a gate asking for
    39 or more default prompts failed at setup on any model without a chat template."""
    given, why = prompts_for(base_tokenizer)
    plain = [p for p in default_prompts() if p.messages is None]
    assert list(given) == plain and len(plain) == 38
    assert "6 chat prompts are left out" in why and "no chat template" in why
    sequences = build_sequences(given, base_tokenizer, n=64, tokens=32, why_fewer=why)
    check_sequences(sequences, given, 64, 32)
    with pytest.raises(PromptsError, match="no chat template"):  # what the unfiltered set did
        build_sequences(default_prompts(), base_tokenizer, n=39, tokens=32)


def test_too_few_plain_prompts_say_why_the_set_is_smaller(base_tokenizer: Any) -> None:
    given, why = prompts_for(base_tokenizer)
    with pytest.raises(PromptsError) as info:
        build_sequences(given[:1], base_tokenizer, n=1, tokens=10**5, why_fewer=why)
    assert "(the default set's 6 chat prompts are left out" in str(info.value)


def test_a_users_chat_prompts_on_a_base_model_skip_the_gate_naming_them(
    tmp_path: Path, base_tokenizer: Any, tokenizer: Any
) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "plain"}\n{"id": "conv", "messages": [{"role": "user", "content": "hi"}]}\n')
    mine = load_prompts_file(path)
    with pytest.raises(ChatTemplateMissingError) as info:
        prompts_for(base_tokenizer, mine)
    assert isinstance(info.value, LeverNotApplicableError)  # the `paired` fixture skips these, with the text
    message = str(info.value)
    assert f"1 of the 2 prompts are chat conversations (first: 'conv' ({path}:2))" in message
    assert "skips" in message and '{"text": "..."}' in message
    assert prompts_for(tokenizer, mine) == (mine, "")  # a chat model takes them as written
    plain_only = load_prompts_file(path)[:1]
    assert prompts_for(base_tokenizer, plain_only) == (plain_only, "")
