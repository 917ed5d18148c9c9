"""Verifiers for the 25 IFEval instruction types (Zhou et al. 2023), written from their definitions.

The semantics follow the reference checkers of google-research `instruction_following_eval`
(Apache-2.0): same counting rules, same thresholds, same strict/loose procedure, so that scores
are comparable with published IFEval numbers. The code is our own; tests cross-check it against an
independent copy of the reference (`tests/test_task_ifeval.py`).

Two dependencies of the reference are replaced:
- NLTK's Punkt English model (sentence counting) by `count_sentences`, a rule-based splitter that
  reproduces Punkt's decisions on ordinary prose (break after `.?!` unless the period ends a known
  abbreviation, an initial or a number followed by lower-case text). It can differ from Punkt where
  Punkt leans on word statistics it learnt from its training corpus: an abbreviation or a lone
  initial followed by an unusual capitalised word, or runs of single-letter initials ("A. B. C.").
- NLTK's `word_tokenize` (capital-word counting) by `treebank_words`, which groups characters into
  tokens as the Treebank rules do; only the grouping matters for counting all-capital words.
Language identification has no such substitute: it uses `langdetect` when installed (seeded, so
two runs agree) and otherwise reports the instruction as unverifiable (None) rather than guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

try:
    import langdetect  # type: ignore[import-not-found, import-untyped, unused-ignore]
except ImportError:  # the language instruction is then unverifiable: its items are dropped
    langdetect = None

__all__ = [
    "INSTRUCTION_TYPES",
    "IfevalVerdict",
    "check_instruction",
    "count_sentences",
    "count_words",
    "detect_language",
    "evaluate_response",
    "language_detection_available",
    "loose_variants",
    "treebank_words",
]

Check = Callable[[str, Mapping[str, Any]], "bool | None"]

# ---------------------------------------------------------------- text measures


def count_words(text: str) -> int:
    """Words as the reference counts them: maximal runs of `\\w` characters."""
    return len(re.findall(r"\w+", text))


# Abbreviations after which a period does not end a sentence (lower case, final period dropped).
# Deliberately narrow, like Punkt's English model: "etc", "e.g", "i.e", "no", "fig" are NOT here,
# because Punkt breaks after them too.
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof jr sr st messrs gen col lt maj adm sen rep reps gov
    inc ltd co corp bros cos vs ave ft mg yr ok
    jan feb aug sept sep oct nov dec tues wed fri
    a.m p.m u.s u.k u.n u.s.a u.s.s.r ph.d d.c n.y l.a
    calif conn fla ga ill kan ky mich minn nev okla ore pa tenn va vt wash wis ariz colo ala
""".split()
)
# Single letters that Punkt's English model lists as abbreviations ("C.", "K."): never a break.
_LETTER_ABBREVIATIONS = frozenset("cdefghklmnprstvw")
# Capitalised words that end a sentence after an abbreviation or an ellipsis ("etc. The"): the
# English model's sentence starters and words it saw only lower case mid-sentence. Others ("She",
# "We", "Then", names) leave the abbreviation inside the sentence, as Punkt does.
_SENTENCE_STARTERS = frozenset(
    """
    the he it i they this these there but so yet if in when while although though however many
    most some both since thus indeed instead meanwhile moreover nevertheless nonetheless nor even
    despite among according under similarly separately her which finally overall here unless your
    please note such still yes
""".split()
)
# Other common words: after a lone initial ("Plan B. She") they too start a new sentence, where a
# name ("J. Smith") does not.
_COMMON_WORDS = _SENTENCE_STARTERS | frozenset(
    """
    she we you that those then and on at a an my our his their its what why how where who after
    before also all as for with from by to of one two first next now today each every no not or
    because once until during over let other another only just well
""".split()
)
_WORD_START_EXCLUDED = set('("`{[:;&#*@)}]-,')
_NONWORD_AFTER = r"[)\";}\]*:@'({\[!?]"
_END_CHAR = re.compile(r"[.?!](?=(?P<after>" + _NONWORD_AFTER + r")|\s+(?P<next>\S+))")
_NUMBER = re.compile(r"^-?[.,]?\d[\d,.\-]*\.?$")
_INITIAL = re.compile(r"^[^\W\d]\.$")
_CLOSERS = re.compile(r"[\"')\]}]+?(?:\s+|(?=--)|$)")


def _last_token(chunk: str) -> str:
    """The word-token ending `chunk` (which ends in `.?!`): brackets, quotes and asterisks split off."""
    if re.search(r"\.{2,}$", chunk):
        return "..."
    token = re.split(r"[)\";}\]*:@({\[!?]|(?=')", chunk[:-1])[-1] + chunk[-1]  # "'" may start a word
    return token.lstrip("".join(_WORD_START_EXCLUDED))


def _first_token(chunk: str) -> str:
    """The word-token starting `chunk`: a lone punctuation mark, or the word up to punctuation."""
    if chunk[0] in _WORD_START_EXCLUDED:
        return chunk[0]
    return re.split(_NONWORD_AFTER + r"|\.{2,}|,(?=\s|$)", chunk)[0] or chunk[0]


def _starts_sentence(word: str) -> bool:
    """A capitalised common word: the evidence Punkt needs to end a sentence at an abbreviation."""
    return word[:1].isupper() and word.rstrip(".").lower() in _SENTENCE_STARTERS


def _is_break(chunk: str, following: str) -> bool:
    """Whether the `.?!` that ends `chunk` ends a sentence, given the token that follows it."""
    if chunk[-1] in "?!":
        return True
    token = _last_token(chunk)
    no_sentence_evidence = following in (";", ":", ",", ".", "!", "?") or following[:1].islower()
    if token == "...":
        return _starts_sentence(following)
    if _NUMBER.match(token):
        return not no_sentence_evidence
    body = token[:-1].lower()
    if _INITIAL.match(token):
        if body in _LETTER_ABBREVIATIONS:
            return False
        if no_sentence_evidence:
            return False
        return not following[:1].isupper() or following.rstrip(".").lower() in _COMMON_WORDS
    if body in _ABBREVIATIONS or body.split("-")[-1] in _ABBREVIATIONS:
        return _starts_sentence(following)
    return True


def _candidates(text: str) -> list[tuple[re.Match[str], str]]:
    """Possible sentence ends with the word they close: one per word, its last `.?!` that is
    followed by punctuation or by whitespace and more text (how Punkt enumerates them)."""
    found: list[tuple[re.Match[str], str]] = []
    word_start, word_end = 0, 0
    for m in _END_CHAR.finditer(text):
        before = text[word_end : m.start()]
        space = max((i for i, c in enumerate(before) if c.isspace()), default=0)
        start = word_end + space + 1 if space else word_start
        if found and word_end > start:  # same word as the previous candidate: keep only the last
            found.pop()
        found.append((m, text[start : m.end()]))
        word_start, word_end = start, m.start()
    return found


def count_sentences(text: str) -> int:
    """Sentences as NLTK's Punkt English model would split `text` (see the module docstring)."""
    if not text.strip():
        return 0
    count = 1
    for m, chunk in _candidates(text):
        nxt = m.group("next")
        following = m.group("after") if nxt is None else _first_token(nxt)
        if not _is_break(chunk, following):
            continue
        rest = text[m.start("next") if nxt is not None else m.end() :]
        closers = _CLOSERS.match(rest)  # closing quotes/brackets belong to the sentence before
        if closers is None or rest[closers.end() :].strip():
            count += 1
    return count


_CONTRACTION_END = re.compile(r"(?<=[^' ])('[sSmMdD]|'ll|'LL|'re|'RE|'ve|'VE|n't|N'T)$")
_SPLIT_WORDS = re.compile(
    r"(?i)^(can)(not)$|^(d)('ye)$|^(gim)(me)$|^(gon)(na)$|^(got)(ta)$|^(lem)(me)$|^(more)('n)$|^(wan)(na)$"
)
_SEPARATORS = re.compile(r"\s+|\.{2,}|--|[:,](?=\D|$)|[;@#$%&?!*\[\](){}<>\"«»“”‘’„`\u2012-\u2015]")


def treebank_words(text: str) -> list[str]:
    """Word tokens grouped as NLTK's Treebank-style `word_tokenize` groups letters (punctuation dropped)."""
    words: list[str] = []
    for piece in _SEPARATORS.split(text):
        if not piece:
            continue
        if piece.startswith("'") and not re.match(r"(?i)'(?:re|ve|ll|m|t|s|d|n)\b", piece):
            piece = piece[1:]
        m = _CONTRACTION_END.search(piece)
        head, tail = (piece[: m.start()], m.group(1)) if m else (piece, "")
        split = _SPLIT_WORDS.match(head)
        if split:
            words.extend(g for g in split.groups() if g)
        elif head:
            words.append(head)
        if tail:
            words.append(tail)
    return words


# ---------------------------------------------------------------- language


@lru_cache(maxsize=1)
def language_detection_available() -> bool:
    """Whether `langdetect` (the reference's detector) is installed; seeds it for determinism."""
    if langdetect is None:
        return False
    langdetect.DetectorFactory.seed = 0
    return True


def detect_language(text: str) -> str | None:
    """ISO code of `text`'s language; "" when undetectable (no features), None without langdetect."""
    if not language_detection_available():
        return None
    try:
        return str(langdetect.detect(text))
    except langdetect.LangDetectException:
        return ""


# ---------------------------------------------------------------- the checks


def _compare(count: int, relation: str, threshold: int) -> bool:
    """The reference's two relations: "less than" (<) and "at least" (>=)."""
    if relation == "less than":
        return count < threshold
    if relation == "at least":
        return count >= threshold
    raise ValueError(f"relation must be 'less than' or 'at least', not {relation!r}")


def _language(value: str, kw: Mapping[str, Any]) -> bool | None:
    lang = detect_language(value)
    if lang is None:
        return None
    return lang == "" or lang == kw["language"]  # the reference passes undetectable text


def _english_case(upper: bool) -> Check:
    def check(value: str, kw: Mapping[str, Any]) -> bool | None:
        if not (value.isupper() if upper else value.islower()):
            return False
        lang = detect_language(value)
        return None if lang is None else lang in ("", "en")

    return check


def _paragraphs_stars(value: str, kw: Mapping[str, Any]) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", value)
    count = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if 0 < i < len(parts) - 1:
                return False
            count -= 1
    return count == int(kw["num_paragraphs"])


def _nth_paragraph_first_word(value: str, kw: Mapping[str, Any]) -> bool:
    parts = value.split("\n\n")
    count = sum(1 for p in parts if p.strip())
    nth = int(kw["nth_paragraph"])
    if nth > count:
        return False
    para = parts[nth - 1].strip()
    if not para:
        return False
    word = para.split()[0].strip().lstrip("'").lstrip('"')
    first = re.split(r"[.,?!'\"]", word)[0].lower()
    return count == int(kw["num_paragraphs"]) and first == str(kw["first_word"]).lower()


def _postscript(value: str, kw: Mapping[str, Any]) -> bool:
    marker = str(kw["postscript_marker"]).strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + marker.lower() + r".*$"
    return re.search(pattern, value.lower(), flags=re.MULTILINE) is not None


def _highlights(value: str, kw: Mapping[str, Any]) -> bool:
    single = [h for h in re.findall(r"\*[^\n*]*\*", value) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n*]*\*\*", value) if h[2:-2].strip()]
    return len(single) + len(double) >= int(kw["num_highlights"])


def _sections(value: str, kw: Mapping[str, Any]) -> bool:
    splitter = str(kw["section_spliter"]).strip()
    pieces = re.split(r"\s?" + splitter + r"\s?\d+\s?", value)
    return len(pieces) - 1 >= int(kw["num_sections"])


def _json(value: str, kw: Mapping[str, Any]) -> bool:
    body = value.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        if body.startswith(fence):
            body = body[len(fence) :]
            break
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _two_responses(value: str, kw: Mapping[str, Any]) -> bool:
    parts = value.split("******")
    kept: list[str] = []
    for i, part in enumerate(parts):
        if part.strip():
            kept.append(part.strip())
        elif 0 < i < len(parts) - 1:
            return False
    return len(kept) == 2 and kept[0] != kept[1]


def _title(value: str, kw: Mapping[str, Any]) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", value))


_CHECKS: dict[str, Check] = {
    "keywords:existence": lambda v, kw: all(re.search(k, v, flags=re.IGNORECASE) for k in kw["keywords"]),
    "keywords:frequency": lambda v, kw: _compare(
        len(re.findall(str(kw["keyword"]).strip(), v, flags=re.IGNORECASE)), kw["relation"], int(kw["frequency"])
    ),
    "keywords:forbidden_words": lambda v, kw: (
        not any(re.search(r"\b" + w + r"\b", v, flags=re.IGNORECASE) for w in kw["forbidden_words"])
    ),
    "keywords:letter_frequency": lambda v, kw: _compare(
        v.lower().count(str(kw["letter"]).strip().lower()), kw["let_relation"], int(kw["let_frequency"])
    ),
    "language:response_language": _language,
    "length_constraints:number_sentences": lambda v, kw: _compare(
        count_sentences(v), kw["relation"], int(kw["num_sentences"])
    ),
    "length_constraints:number_paragraphs": _paragraphs_stars,
    "length_constraints:number_words": lambda v, kw: _compare(count_words(v), kw["relation"], int(kw["num_words"])),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "detectable_content:number_placeholders": lambda v, kw: (
        len(re.findall(r"\[.*?\]", v)) >= int(kw["num_placeholders"])
    ),
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": lambda v, kw: (
        len(re.findall(r"^\s*\*[^*].*$", v, flags=re.M)) + len(re.findall(r"^\s*-.*$", v, flags=re.M))
        == int(kw["num_bullets"])
    ),
    "detectable_format:constrained_response": lambda v, kw: any(
        o in v.strip() for o in ("My answer is yes.", "My answer is no.", "My answer is maybe.")
    ),
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": _json,
    "detectable_format:title": _title,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": lambda v, kw: (
        v.strip().lower().startswith(str(kw["prompt_to_repeat"]).strip().lower())
    ),
    "startend:end_checker": lambda v, kw: v.strip().strip('"').lower().endswith(str(kw["end_phrase"]).strip().lower()),
    "startend:quotation": lambda v, kw: len(v.strip()) > 1 and v.strip()[0] == '"' and v.strip()[-1] == '"',
    "change_case:capital_word_frequency": lambda v, kw: _compare(
        sum(1 for w in treebank_words(v) if w.isupper()), kw["capital_relation"], int(kw["capital_frequency"])
    ),
    "change_case:english_capital": _english_case(upper=True),
    "change_case:english_lowercase": _english_case(upper=False),
    "punctuation:no_comma": lambda v, kw: "," not in v,
}

INSTRUCTION_TYPES: tuple[str, ...] = tuple(_CHECKS)


def check_instruction(instruction_id: str, kwargs: Mapping[str, Any] | None, response: str) -> bool | None:
    """Whether `response` follows one instruction; None when it cannot be verified here.

    kwargs with value None are ignored (the hub's copy of IFEval pads every record with all keys).
    An empty or blank response follows nothing, as in the reference.
    """
    try:
        check = _CHECKS[instruction_id]
    except KeyError:
        raise ValueError(f"unknown IFEval instruction {instruction_id!r}") from None
    if not response.strip():
        return False
    kw = {k: v for k, v in (kwargs or {}).items() if v is not None}
    return check(response, kw)


def loose_variants(response: str) -> list[str]:
    """The reference's loose variants: as is, first/last/both lines dropped, each also without '*'."""
    lines = response.split("\n")
    trimmed = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [response, response.replace("*", ""), *trimmed[1:], *(t.replace("*", "") for t in trimmed[1:])]


@dataclass(frozen=True)
class IfevalVerdict:
    """Strict and loose outcomes per instruction (None: unverifiable) and per prompt."""

    instruction_ids: tuple[str, ...]
    strict: tuple[bool | None, ...]
    loose: tuple[bool | None, ...]

    @property
    def verifiable(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.strict) if s is not None)

    @property
    def prompt_strict(self) -> bool:
        """All verifiable instructions followed (strict); False when none is verifiable."""
        return bool(self.verifiable) and all(self.strict[i] for i in self.verifiable)

    @property
    def prompt_loose(self) -> bool:
        return bool(self.verifiable) and all(self.loose[i] for i in self.verifiable)


def evaluate_response(
    instruction_ids: Sequence[str], kwargs_list: Sequence[Mapping[str, Any] | None], response: str
) -> IfevalVerdict:
    """Strict (response as is) and loose (any variant passes) for every instruction of a prompt."""
    variants = loose_variants(response)
    strict: list[bool | None] = []
    loose: list[bool | None] = []
    for iid, kw in zip(instruction_ids, kwargs_list, strict=True):
        strict.append(check_instruction(iid, kw, response))
        outcomes = [check_instruction(iid, kw, v) for v in variants]
        loose.append(None if any(o is None for o in outcomes) and not any(outcomes) else any(bool(o) for o in outcomes))
    return IfevalVerdict(tuple(instruction_ids), tuple(strict), tuple(loose))
