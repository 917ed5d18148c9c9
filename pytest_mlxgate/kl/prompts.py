"""The token sequences a KL gate scores: the prompt sets, and how prompts become exactly `tokens + 1`
ids each.

Both arms are teacher-forced over the same ids, so the ids must be a pure function of the prompts,
the tokenizer and (n, tokens): no randomness, no environment. `sequences_digest` names them for
caches. A prompt is plain text or a chat conversation rendered through the tokenizer's template.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import ChatTemplateMissingError, PromptsError

__all__ = [
    "DEFAULT_PROMPTS_RESOURCE",
    "SEPARATOR",
    "Prompt",
    "TokenSequence",
    "build_sequences",
    "default_prompts",
    "load_prompts_file",
    "prompts_for",
    "render",
    "sequences_digest",
    "tail_sequences",
    "texts_of",
]

#: The package data file that holds the default prompt set.
DEFAULT_PROMPTS_RESOURCE = "prompts_default.jsonl"
#: What joins consecutive prompts when one alone is too short for a sequence.
SEPARATOR = "\n\n"

_PACKAGE = __name__.rpartition(".")[0]
_LINE_KEYS = ("id", "domain", "text", "messages")
_EXAMPLE = '{"text": "..."} or {"messages": [{"role": "user", "content": "..."}]}'
_PREVIEW_CHARS = 60
# Start offsets tried within a prompt, once varying its followers cannot make a sequence unique.
_MAX_START_LEVELS = 256


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain `text`, or chat `messages` rendered through the tokenizer's template."""

    id: str
    domain: str
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, hash=False)
    # Where it came from ("file:line"), so a later error (no chat template) can say so.
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"{self.origin}: " if self.origin else ""
        if (self.text is None) == (self.messages is None):
            raise PromptsError(
                f"{where}prompt {self.id!r} must have exactly one of text or messages: a prompt is "
                "either plain text or a chat conversation. Give one of them, not both or neither."
            )
        if self.messages is not None:
            if not self.messages:
                raise PromptsError(f"{where}prompt {self.id!r} has no messages; give at least one turn.")
            frozen = []
            for message in self.messages:
                if not all(isinstance(message.get(k), str) for k in ("role", "content")) or not all(
                    isinstance(v, str) for v in message.values()
                ):
                    raise PromptsError(
                        f"{where}prompt {self.id!r} has a malformed message {dict(message)!r}: every "
                        'message needs string "role" and "content" (and only string values).'
                    )
                frozen.append(MappingProxyType(dict(message)))
            # Read-only copies: default_prompts() is cached and shared.
            object.__setattr__(self, "messages", tuple(frozen))


@dataclass(frozen=True)
class TokenSequence:
    """`tokens + 1` ids: `tokens` scored positions, each predicting the next id."""

    index: int
    ids: tuple[int, ...]
    sources: tuple[str, ...]  # ids of the prompts it was built from, in order
    preview: str  # the start of its text on one line, for failure reports

    @property
    def text(self) -> str:
        """The prompt whose window it is (its first source): sequences of one text are not independent."""
        return self.sources[0] if self.sources else f"#{self.index}"


def texts_of(sequences: Sequence[TokenSequence]) -> list[str]:
    """Each sequence's text, for `summarize(texts=)`: n counts texts, not windows of them."""
    return [s.text for s in sequences]


@functools.cache
def default_prompts() -> tuple[Prompt, ...]:
    """The built-in domain-diverse prompt set (package data), parsed once per process."""
    data = resources.files(_PACKAGE).joinpath(DEFAULT_PROMPTS_RESOURCE)
    return _parse_jsonl(data.read_text(encoding="utf-8"), f"{_PACKAGE}/{DEFAULT_PROMPTS_RESOURCE}", require_meta=True)


def load_prompts_file(path: Path) -> tuple[Prompt, ...]:
    """A user's prompt set (--mlx-prompts-file): JSONL, one prompt per line, blank lines ignored."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PromptsError(
            f"{path}: prompts file not found. --mlx-prompts-file must name an existing JSONL file "
            f"with one prompt per line, e.g. {_EXAMPLE}."
        ) from None
    except OSError as e:
        raise PromptsError(
            f"{path}: cannot read the prompts file ({e.strerror or e}). Point --mlx-prompts-file "
            "at a readable JSONL file."
        ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise PromptsError(
            f"{path}:{line}: not valid UTF-8 ({e.reason}). Prompts files are read as UTF-8; "
            "re-save the file with UTF-8 encoding."
        ) from None
    return _parse_jsonl(text, str(path), require_meta=False, default_id_prefix=path.name)


def _parse_jsonl(text: str, source: str, *, require_meta: bool, default_id_prefix: str = "") -> tuple[Prompt, ...]:
    """Parse prompt lines; every error names `source:line`, what was expected and the fix."""
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    # Split on "\n" only: JSON strings may hold raw U+2028 etc., which splitlines() would cut.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        prompt = _parse_line(line, where, require_meta, f"{default_id_prefix}:{lineno}")
        if prompt.id in first_line:
            raise PromptsError(
                f"{where}: duplicate prompt id {prompt.id!r} (first used on line "
                f"{first_line[prompt.id]}). Ids name prompts in failure reports, so they must be "
                "unique; rename one of them."
            )
        first_line[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise PromptsError(
            f"{source}: no prompts (the file is empty or has only blank lines). Add one JSON "
            f"object per line, e.g. {_EXAMPLE}."
        )
    return tuple(prompts)


def _parse_line(line: str, where: str, require_meta: bool, default_id: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptsError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno}). Each non-blank line must be "
            f"one complete JSON object, e.g. {_EXAMPLE}; write newlines inside a prompt as \\n."
        ) from None
    if not isinstance(obj, dict):
        raise PromptsError(f"{where}: expected a JSON object, got {_json_type(obj)}. Write each prompt as {_EXAMPLE}.")
    unknown = sorted(set(obj) - set(_LINE_KEYS))
    if unknown:
        raise PromptsError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}. A prompt line may only have "
            f"{', '.join(map(repr, _LINE_KEYS))}; remove or rename the others (a typo would "
            "otherwise be silently ignored)."
        )
    has_text, has_messages = "text" in obj, "messages" in obj
    if has_text == has_messages:
        what = "both" if has_text else "neither"
        raise PromptsError(
            f'{where}: the object has {what} "text" {"and" if has_text else "nor"} "messages". '
            "A prompt is either plain text or a chat conversation: give exactly one, "
            f"e.g. {_EXAMPLE}."
        )
    meta = {key: _meta(obj, key, where, require_meta) for key in ("id", "domain")}
    prompt_id = meta["id"] or default_id
    domain = meta["domain"] or "custom"
    if has_text:
        body = obj["text"]
        if not isinstance(body, str) or not body.strip():
            got = "an empty string" if isinstance(body, str) else _json_type(body)
            raise PromptsError(
                f'{where}: "text" must be a non-empty string, got {got}. Put the prompt text '
                'there, e.g. {"text": "Once upon a time"}.'
            )
        return Prompt(id=prompt_id, domain=domain, text=body, origin=where)
    return Prompt(id=prompt_id, domain=domain, messages=_parse_messages(obj["messages"], where), origin=where)


def _parse_messages(value: object, where: str) -> tuple[Mapping[str, str], ...]:
    example = '[{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]'
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else _json_type(value)
        raise PromptsError(f'{where}: "messages" must be a non-empty list of turns, got {got}. Write it as {example}.')
    messages: list[Mapping[str, str]] = []
    for k, message in enumerate(value):
        if not isinstance(message, dict):
            raise PromptsError(
                f'{where}: "messages"[{k}] must be an object with "role" and "content", got '
                f'{_json_type(message)}. Write each turn as {{"role": "user", "content": "..."}}.'
            )
        for key in ("role", "content"):
            if key not in message:
                raise PromptsError(
                    f'{where}: "messages"[{k}] has no "{key}". Every turn needs a string "role" '
                    '(system, user, assistant, tool) and a string "content".'
                )
        for key, item in message.items():
            if not isinstance(item, str) or (key == "role" and not item):
                got = "an empty string" if isinstance(item, str) else _json_type(item)
                raise PromptsError(
                    f'{where}: "messages"[{k}]["{key}"] must be a {"non-empty " if key == "role" else ""}'
                    f"string, got {got}. Chat templates take text turns: write "
                    '"role" as e.g. "user" and "content" as the turn\'s text (a tool call as its JSON text).'
                )
        messages.append(message)
    return tuple(messages)


def _meta(obj: dict[str, Any], key: str, where: str, required: bool) -> str | None:
    if key not in obj:
        if required:
            raise PromptsError(f'{where}: the default prompt set needs an "{key}" on every line.')
        return None
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else _json_type(value)
        raise PromptsError(
            f'{where}: "{key}" must be a non-empty string, got {got}. Give a short label such as '
            f'"{"code-python-1" if key == "id" else "code"}", or leave "{key}" out.'
        )
    return value


def _json_type(value: object) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def render(prompt: Prompt, tokenizer: Any) -> str:
    """The prompt's text: `text` as is, `messages` through the tokenizer's chat template."""
    if prompt.text is not None:
        return prompt.text
    assert prompt.messages is not None
    where = f"{prompt.origin}: " if prompt.origin else ""
    if not _has_chat_template(tokenizer):
        raise PromptsError(
            f"{where}prompt {prompt.id!r} is a chat conversation, but the tokenizer has no chat "
            "template to turn it into text. Use a model whose tokenizer has a chat template, or "
            'give this prompt as {"text": "..."} instead of "messages".'
        )
    try:
        out = tokenizer.apply_chat_template([dict(m) for m in prompt.messages], tokenize=False)
    except Exception as e:  # the template's own checks (role order etc.) raise all sorts
        raise PromptsError(
            f"{where}prompt {prompt.id!r}: the tokenizer's chat template rejected the conversation "
            f"({type(e).__name__}: {e}). Fix the turns to suit this model's template, or give the "
            "prompt as plain text."
        ) from e
    if not isinstance(out, str):
        raise PromptsError(
            f"{where}prompt {prompt.id!r}: apply_chat_template(tokenize=False) returned "
            f"{type(out).__name__}, not text. Pass a tokenizer whose chat template renders strings."
        )
    return out


def prompts_for(tokenizer: Any, prompts: Sequence[Prompt] | None = None) -> tuple[tuple[Prompt, ...], str]:
    """(the prompts a gate builds its sequences from, why there are fewer than given: "" if not).

    The default set (`prompts` None) puts its plain prompts first and keeps its chat prompts only
    where the tokenizer has a chat template, so a base model fills a gate from the plain ones. A
    user's set is used as written: chat prompts on a tokenizer without a template skip the gate
    (`ChatTemplateMissingError`), naming them, rather than silently scoring fewer prompts."""
    if prompts is None:
        given = default_prompts()
        plain = tuple(p for p in given if p.messages is None)
        chat = tuple(p for p in given if p.messages is not None)
        if not chat or _has_chat_template(tokenizer):
            return plain + chat, ""
        return plain, (
            f"the default set's {len(chat)} chat prompts are left out: this tokenizer has no chat "
            f"template, so {len(plain)} plain prompts remain"
        )
    conversations = [p for p in prompts if p.messages is not None]
    if conversations and not _has_chat_template(tokenizer):
        first = conversations[0]
        where = f" ({first.origin})" if first.origin else ""
        raise ChatTemplateMissingError(
            f"{len(conversations)} of the {len(prompts)} prompts are chat conversations "
            f"(first: {first.id!r}{where}), but "
            "this model's tokenizer has no chat template to render them, so this gate cannot score them here "
            'and skips. Give those prompts as {"text": "..."}, or run the gate on a model with a chat template.'
        )
    return tuple(prompts), ""


def _has_chat_template(tokenizer: Any) -> bool:
    # mlx_lm's TokenizerWrapper knows about its own renderers too; plain HF tokenizers do not.
    has = getattr(tokenizer, "has_chat_template", None)
    if isinstance(has, bool):
        return has
    return hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None) is not None


def _encode(tokenizer: Any, text: str) -> list[int]:
    """`tokenizer.encode(text)`: special tokens (BOS) only as the tokenizer itself adds them."""
    out = tokenizer.encode(text)
    return [int(i) for i in getattr(out, "ids", out)]  # a `tokenizers.Tokenizer` gives an Encoding


def _check_count(value: object, flag: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PromptsError(
            f"{flag} must be a whole number of at least 1, got {value!r}: it is {meaning}. "
            f"Pass a positive count, e.g. {flag} 64."
        )
    return value


def build_sequences(
    prompts: Sequence[Prompt], tokenizer: Any, *, n: int, tokens: int, why_fewer: str = ""
) -> list[TokenSequence]:
    """`n` distinct sequences of exactly `tokens + 1` ids; sequence i starts with prompt i mod len.

    A prompt shorter than a sequence is followed by others, joined by SEPARATOR, then the join is
    encoded once and truncated. Round r = i // len(prompts) walks the followers with its own
    stride, so tiled sequences differ; where the first prompt alone fills a sequence, later
    rounds start it at a later word instead. Each sequence depends only on earlier ones, so the
    first k sequences are the same for every n >= k. `why_fewer` (from `prompts_for`) joins the
    errors that count the prompts.
    """
    n = _check_count(n, "--mlx-kl-prompts", "how many token sequences the KL gate scores")
    tokens = _check_count(tokens, "--mlx-kl-tokens", "how many positions each sequence scores")
    if not prompts:
        raise PromptsError(
            "no prompts to build token sequences from. Give a non-empty prompt set "
            "(--mlx-prompts-file) or leave it out to use the default set."
        )
    note = f" ({why_fewer})" if why_fewer else ""
    builder = _Builder(list(prompts), tokenizer, tokens + 1)
    try:
        builder.check_enough(tokens)
    except PromptsError as e:
        raise PromptsError(f"{e}{note}") from None
    seen: set[tuple[int, ...]] = set()
    sequences: list[TokenSequence] = []
    for i in range(n):
        sequence = builder.sequence(i, seen)
        if sequence is None:
            raise PromptsError(
                f"only {i} distinct token sequences of {tokens + 1} ids can be built from these "
                f"{len(prompts)} prompts{note}, but --mlx-kl-prompts asks for {n}. Lower --mlx-kl-prompts "
                f"to {i} or less, lower --mlx-kl-tokens, or add prompts (--mlx-prompts-file)."
            )
        seen.add(sequence.ids)
        sequences.append(sequence)
    return sequences


class _Builder:
    """Renders and token-counts each prompt once, then tries candidate joins for each sequence."""

    def __init__(self, prompts: list[Prompt], tokenizer: Any, need: int) -> None:
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.need = need
        count = len(prompts)
        self.strides = [s for s in range(1, count) if math.gcd(s, count) == 1] or [1]
        self._rendered: dict[int, str] = {}
        self._counts: dict[tuple[int, int], int] = {}
        self._starts: dict[int, list[int]] = {}

    def rendered(self, j: int) -> str:
        if j not in self._rendered:
            self._rendered[j] = render(self.prompts[j], self.tokenizer)
        return self._rendered[j]

    def count(self, j: int, start: int) -> int:
        """Token count of prompt j from character `start`: only to guess how many to join."""
        key = (j, start)
        if key not in self._counts:
            self._counts[key] = len(_encode(self.tokenizer, self.rendered(j)[start:]))
        return self._counts[key]

    def check_enough(self, tokens: int) -> None:
        """Fail early, with the counts, when even all prompts joined are shorter than a sequence."""
        if self.join(0, 0, self.strides[0]) is not None:
            return  # encodes only as much as one sequence needs, not the whole set
        joined = SEPARATOR.join(self.rendered(j) for j in range(len(self.prompts)))
        total = len(_encode(self.tokenizer, joined))
        fix = f"lower --mlx-kl-tokens to {total - 1} or less, or " if total > 1 else ""
        raise PromptsError(
            f"the {len(self.prompts)} prompts together give only {total} tokens, but each "
            f"sequence needs {self.need} ({tokens} scored positions + 1). To fix it, {fix}add "
            "prompts (--mlx-prompts-file)."
        )

    def sequence(self, i: int, seen: set[tuple[int, ...]]) -> TokenSequence | None:
        """The first candidate for sequence i whose ids are new; None when none is."""
        count = len(self.prompts)
        first, round_ = i % count, i // count
        for start in self.starts(first):
            for t in range(len(self.strides)):
                stride = self.strides[(round_ + t) % len(self.strides)]
                built = self.join(first, start, stride)
                if built is None:
                    break  # too short from this start whatever follows it
                ids, used, text = built
                if ids not in seen:
                    sources = tuple(self.prompts[j].id for j in used)
                    return TokenSequence(index=i, ids=ids, sources=sources, preview=_preview(text))
                if len(used) == 1:
                    break  # the first prompt fills it alone: other followers change nothing
        return None

    def starts(self, j: int) -> Iterator[int]:
        """Character offsets to start prompt j at: 0, then word starts spread over the text."""
        if j not in self._starts:
            text = self.rendered(j)
            starts = [0]
            for k in range(1, _MAX_START_LEVELS):
                pos = _next_word_start(text, int(_van_der_corput(k) * len(text)))
                if pos < len(text) and pos not in starts:
                    starts.append(pos)
            self._starts[j] = starts
        return iter(self._starts[j])

    def join(self, first: int, start: int, stride: int) -> tuple[tuple[int, ...], list[int], str] | None:
        """Prompt `first` from `start`, then followers by `stride`, as few as reach `need` ids."""
        count = len(self.prompts)
        order = [first] + [(first + k * stride) % count for k in range(1, count)]
        head = self.rendered(first)[start:]

        def encode(m: int) -> tuple[list[int], str]:
            text = SEPARATOR.join([head] + [self.rendered(j) for j in order[1:m]])
            return _encode(self.tokenizer, text), text

        # Guess from per-prompt counts, then correct: the join's ids are what count.
        m, estimate = 1, self.count(first, start)
        while estimate < self.need and m < count:
            estimate += self.count(order[m], 0)
            m += 1
        ids, text = encode(m)
        while len(ids) < self.need and m < count:
            m += 1
            ids, text = encode(m)
        if len(ids) < self.need:
            return None
        while m > 1:  # drop followers the truncation would cut anyway, so sources are exact
            shorter, shorter_text = encode(m - 1)
            if len(shorter) < self.need:
                break
            m, ids, text = m - 1, shorter, shorter_text
        return tuple(ids[: self.need]), order[:m], text


def _van_der_corput(k: int) -> float:
    """1/2, 1/4, 3/4, 1/8, ...: offsets that spread out evenly however many are taken."""
    value, denom = 0.0, 1.0
    while k:
        denom *= 2
        k, bit = divmod(k, 2)
        value += bit / denom
    return value


def _next_word_start(text: str, pos: int) -> int:
    """The first position at or after `pos` where a word begins: after whitespace or punctuation
    (CJK text has no spaces, but it has 、。，)."""
    while pos < len(text) and not _is_word_start(text, pos):
        pos += 1
    return pos


def _is_word_start(text: str, pos: int) -> bool:
    if text[pos].isspace():
        return False
    return pos == 0 or text[pos - 1].isspace() or unicodedata.category(text[pos - 1]).startswith("P")


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW_CHARS else flat[: _PREVIEW_CHARS - 1] + "…"


def tail_sequences(prompts: Sequence[Prompt], tokenizer: Any, *, skip: int, tokens: int) -> list[TokenSequence]:
    """A sequence of `tokens + 1` ids from each prompt long enough, past its first `skip` ids: what a run that
    reads at most `skip` ids of each prompt never sees (a plan search's selection beside a gate's own)."""
    out: list[TokenSequence] = []
    for p in prompts:
        ids = _encode(tokenizer, render(p, tokenizer))[skip : skip + tokens + 1]
        if len(ids) == tokens + 1:
            text = tokenizer.decode(ids)
            out.append(TokenSequence(index=len(out), ids=tuple(ids), sources=(p.id,), preview=_preview(text)))
    return out


def sequences_digest(sequences: Sequence[TokenSequence]) -> str:
    """sha256 over every sequence's ids (length-prefixed, little-endian): a cache key for them."""
    digest = hashlib.sha256(b"mlxgate-token-sequences-v1\0")
    for sequence in sequences:
        digest.update(struct.pack("<Q", len(sequence.ids)))
        digest.update(struct.pack(f"<{len(sequence.ids)}q", *sequence.ids))
    return digest.hexdigest()
