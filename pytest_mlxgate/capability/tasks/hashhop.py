"""HashHop: multi-hop lookup over a long context of random hash assignments (after Magic's design).

Why: a KV-cache or attention lever can keep short-context quality and still lose the ability to
*retrieve and chain* facts far apart in a long prompt. Random hashes carry no semantics, so the only
way to answer is to find each line in the context; hop counts of 1-4 show where retrieval breaks.

A case is a set of chains `h1 = h2`, `h2 = h3`, ... written one assignment per line and shuffled
with many distractor chains of mixed length. The question starts from a chain's first hash and asks
for the hash reached after exactly k assignments, which is the chain's last hash (chains never share
a hash, so the end of the chain is unambiguous).

Two forms of the question, one per tier:
- full (~12k tokens, hops 1-4): a chat turn with instructions and a worked example, answered with
  the hash alone;
- smoke (~384 tokens, hops 1-2): a raw-text chain to complete, "2 steps from X: X =", after three
  chains worked from the context's own distractors; the model writes " Y = Z" and the k-th hash it
  writes is its answer. Why: the embedded 135M chat model scored 0-4% on the chat form at every
  small size tried (24 items each at 256, 384 and 512 tokens with hops 1-2, and at 1024 with hops
  1-4), so no lever could show a drop there. On the chain form it solved about half the 1-hop and a fifth
  of the 2-hop questions in trials (16-24 items per cell, 256-512 tokens); the 12 smoke items: 4 of
  6 and 0 of 6. Writing each hash it passes is what lets a small model chain at all: after " = Y"
  it finds "Y =" in the context and copies what follows (an induction copy, exactly what a broken
  KV cache or attention kernel loses).

Length is measured in tokens. `generate` counts with the tokenizer it is given; without one (the
task's `load` has none) it uses `CHARS_PER_TOKEN`, measured on the embedded SmolLM2 tokenizer for
exactly this text (random mixed-case letters tokenize badly: ~1.40 chars per token, ~25.7 tokens
per line). Other tokenizers differ, so `meta["context_tokens"]` records the target and whether it
was measured or estimated.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

from ..base import Item, ItemResult, RunOptions, Tier, chat_render, prompt_hash, stable_id

__all__ = [
    "CHARS_PER_TOKEN",
    "CONTEXT_TOKENS_FULL",
    "CONTEXT_TOKENS_SMOKE",
    "HASH_LEN",
    "HOPS_FULL",
    "HOPS_SMOKE",
    "HashHopCase",
    "HashHopTask",
    "MAX_HOPS",
    "Query",
    "TASK",
    "build_chain_prompt",
    "build_messages",
    "chain_answer",
    "chains_of",
    "extract_hash",
    "generate",
    "parse_assignments",
    "per_hop_accuracy",
    "question",
]

HASH_LEN = 16
MAX_HOPS = 4
# Characters per token of "Hash = Hash\n" lines on the embedded SmolLM2 tokenizer (measured: 1.400-1.404
# over 3 x 1000 random lines; tests/test_task_hashhop.py re-measures it and fails if it drifts past 10%).
CHARS_PER_TOKEN = 1.40
# The smoke tier is sized (and phrased) for a small model to solve some of it, so a lever that hurts
# retrieval can show a drop there (see the module docstring); the full tier is the real test.
CONTEXT_TOKENS_SMOKE = 384
CONTEXT_TOKENS_FULL = 12000
HOPS_SMOKE = (1, 2)
HOPS_FULL = (1, 2, 3, 4)
DEMOS = 3  # worked chains in a smoke prompt, from the context's distractor chains
SMOKE_N = 12
FULL_N = 48

_ALPHABET = string.ascii_letters
_HASH_RE = re.compile(rf"(?<![A-Za-z])[A-Za-z]{{{HASH_LEN}}}(?![A-Za-z])")
_LINE_RE = re.compile(rf"^([A-Za-z]{{{HASH_LEN}}}) = ([A-Za-z]{{{HASH_LEN}}})$", re.MULTILINE)
_CONTEXT_OPEN = "<assignments>\n"
_CONTEXT_CLOSE = "\n</assignments>"

# The worked example: fixed hashes, excluded from generation so they can never be a right answer.
_EX = ("qWxZrTbNmKpLsVdF", "HgJyUtReWqAzXcVb", "pLmKoJiNhUbYgVtF")
_INSTRUCTIONS = (
    f'Each line between the <assignments> tags reads "A = B": {HASH_LEN}-letter hash A leads to hash B. '
    "To follow an assignment, find the line with the current hash on the left; move to the hash on its right.\n"
    f"Example:\n{_EX[0]} = {_EX[1]}\n{_EX[1]} = {_EX[2]}\n"
    f"Starting from {_EX[0]}, follow 2 assignments: what hash do you reach? Answer with the hash only.\n"
    f"{_EX[2]}\n\n"
)


class Query(NamedTuple):
    """One question: from `start`, `hops` assignments lead to `answer`."""

    start: str
    hops: int
    answer: str


@dataclass(frozen=True)
class HashHopCase:
    """A generated context and its questions; `context_tokens` is measured or estimated (`measured`)."""

    context: str
    queries: tuple[Query, ...]
    context_tokens: int
    measured: bool
    n_lines: int
    distractor_lengths: tuple[int, ...] = ()


def _count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens of `text` alone: subtract whatever an empty encode adds (BOS and the like)."""
    return len(_ids(tokenizer.encode(text))) - len(_ids(tokenizer.encode("")))


def _ids(encoded: Any) -> Sequence[Any]:
    """`encode` returns a list (HF, mlx_lm) or an Encoding with `.ids` (tokenizers)."""
    ids = getattr(encoded, "ids", encoded)
    return list(ids)


def _line_cost(tokenizer: Any | None, line: str) -> float:
    """A line's share of the context length, newline included."""
    if tokenizer is None:
        return (len(line) + 1) / CHARS_PER_TOKEN
    return float(_count_tokens(tokenizer, line + "\n"))


def generate(seed: int, *, context_tokens: int, hops: int, tokenizer: Any | None, n_queries: int = 1) -> HashHopCase:
    """A deterministic case for `seed`: `n_queries` chains of `hops` hops hidden among distractors.

    Every query line sits between distractor lines (never next to another query line), the chain's
    lines appear in random order, and distractor chains take every length 1..max(MAX_HOPS, hops)+1
    in turn (shuffled rounds), so the length of a chain says nothing. A target too small for the
    queries plus one distractor per query line is exceeded rather than broken.
    """
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    if n_queries < 1:
        raise ValueError(f"n_queries must be >= 1, got {n_queries}")
    rng = random.Random(seed)
    used: set[str] = set(_EX)

    def new_hash() -> str:
        while True:
            h = "".join(rng.choices(_ALPHABET, k=HASH_LEN))
            if h not in used:
                used.add(h)
                return h

    def chain_lines(n_hops: int) -> list[str]:
        chain = [new_hash() for _ in range(n_hops + 1)]
        return [f"{a} = {b}" for a, b in pairwise(chain)]

    queries: list[Query] = []
    query_lines: list[str] = []
    for _ in range(n_queries):
        lines = chain_lines(hops)
        queries.append(Query(lines[0][:HASH_LEN], hops, lines[-1][-HASH_LEN:]))
        query_lines.extend(lines)

    budget = float(context_tokens) - sum(_line_cost(tokenizer, ln) for ln in query_lines)
    budget -= _wrapper_tokens(tokenizer)
    distractors: list[str] = []
    lengths: list[int] = []
    longest = max(MAX_HOPS, hops) + 1
    bag: list[int] = []
    while True:
        if not bag:  # every length 1..longest in each round: no hop count stands out
            bag = list(range(1, longest + 1))
            rng.shuffle(bag)
        want = bag.pop()
        lines = chain_lines(want)
        costs = [_line_cost(tokenizer, ln) for ln in lines]
        keep = 0
        for cost in costs:  # the last chain is cut short to land on the target, not overshoot it
            if budget - cost < -cost / 2 and len(distractors) + keep >= len(query_lines):
                break
            budget -= cost
            keep += 1
        if keep:
            distractors.extend(lines[:keep])
            lengths.append(keep)
        if keep < len(lines):
            break
    rng.shuffle(distractors)
    order = list(query_lines)
    rng.shuffle(order)
    # Distinct gaps between distractor lines: no two query lines are ever adjacent.
    gaps = sorted(rng.sample(range(len(distractors) + 1), len(order)))
    out: list[str] = []
    g = 0
    for i in range(len(distractors) + 1):
        while g < len(gaps) and gaps[g] == i:
            out.append(order[g])
            g += 1
        if i < len(distractors):
            out.append(distractors[i])
    context = _CONTEXT_OPEN + "\n".join(out) + _CONTEXT_CLOSE
    if tokenizer is None:
        tokens = round(len(context) / CHARS_PER_TOKEN)
    else:
        tokens = _count_tokens(tokenizer, context)
    return HashHopCase(
        context=context,
        queries=tuple(queries),
        context_tokens=tokens,
        measured=tokenizer is not None,
        n_lines=len(out),
        distractor_lengths=tuple(lengths),
    )


def _wrapper_tokens(tokenizer: Any | None) -> float:
    """The tags around the lines count toward the context length too."""
    wrapper = _CONTEXT_OPEN + _CONTEXT_CLOSE
    if tokenizer is None:
        return len(wrapper) / CHARS_PER_TOKEN
    return float(_count_tokens(tokenizer, wrapper))


def parse_assignments(text: str) -> dict[str, str]:
    """Every `A = B` line in `text` as {A: B}: what following an assignment means."""
    return {m.group(1): m.group(2) for m in _LINE_RE.finditer(text)}


def question(start: str, hops: int) -> str:
    """The question line; a small model needs the same wording as the worked example."""
    word = "assignment" if hops == 1 else "assignments"
    return f"Starting from {start}, follow {hops} {word}: what hash do you reach? Answer with the hash only."


_CHAIN_HEAD = (
    'Each line between the <assignments> tags reads "A = B": hash A leads to hash B. To follow the '
    "assignments from a hash, find the line that starts with the current hash and move to the hash on its right.\n\n"
)


def _steps(hops: int) -> str:
    return f"{hops} step{'s' if hops > 1 else ''}"


def chains_of(case: HashHopCase) -> list[list[str]]:
    """Every chain of the case's context, each from its first hash to its last, in context order."""
    graph = parse_assignments(case.context)
    ends = set(graph.values())
    out = []
    for start in graph:  # dicts keep the order of the lines
        if start in ends:
            continue
        chain = [start]
        while chain[-1] in graph:
            chain.append(graph[chain[-1]])
        out.append(chain)
    return out


def build_chain_prompt(case: HashHopCase, query: Query, demos: int = DEMOS) -> str:
    """The smoke form: instructions, the context, up to `demos` chains worked from distractors long
    enough for `query.hops` steps, then the query's chain opened for the model to complete."""
    worked = [c for c in chains_of(case) if c[0] != query.start and len(c) > query.hops][:demos]
    shown = "".join(f"{_steps(query.hops)} from {c[0]}: {' = '.join(c[: query.hops + 1])}\n" for c in worked)
    return f"{_CHAIN_HEAD}{case.context}\n\n{shown}{_steps(query.hops)} from {query.start}: {query.start} ="


def chain_answer(output: str, hops: int) -> tuple[str | None, int]:
    """The hash a completed chain reaches: the `hops`-th hash on the output's first line, or the last
    one written when the chain stops short; with how many hashes the line holds."""
    found = _HASH_RE.findall(output.lstrip(" ").partition("\n")[0])
    if not found:
        return None, 0
    return str(found[min(hops, len(found)) - 1]), len(found)


def build_messages(case: HashHopCase, query: Query) -> tuple[dict[str, str], ...]:
    """One user turn: instructions with the worked example, the context, then the question."""
    content = f"{_INSTRUCTIONS}{case.context}\n\n{question(query.start, query.hops)}"
    return ({"role": "user", "content": content},)


def extract_hash(output: str, known: Sequence[str] | set[str] = ()) -> str | None:
    """The answer in `output`: the first 16-letter token that is a hash of the context, else the first one.

    Preferring known hashes keeps a 16-letter English word in a chatty preamble ("responsibilities")
    from hiding a right answer; quotes, markdown and punctuation around the hash do not matter.
    """
    found = _HASH_RE.findall(output)
    if not found:
        return None
    known_set = set(known)
    for candidate in found:
        if candidate in known_set:
            return str(candidate)
    return str(found[0])


def per_hop_accuracy(results: Sequence[ItemResult]) -> dict[int, tuple[int, int]]:
    """hops -> (correct, n), from each result's `detail["hops"]`: where chaining breaks down."""
    acc: dict[int, tuple[int, int]] = {}
    for r in results:
        k = int(r.detail["hops"])
        ok, n = acc.get(k, (0, 0))
        acc[k] = (ok + (1 if r.passed else 0), n + 1)
    return dict(sorted(acc.items()))


class HashHopTask:
    """The `hashhop` task. Smoke: 12 chains to complete in ~384-token contexts, hops 1-2 evenly;
    full: 48 chat questions on ~12k-token contexts, hops 1-4 evenly (see the module docstring)."""

    name = "hashhop"
    graded = False
    max_new_tokens = 32  # a hash is ~12 tokens: a smoke 2-hop chain " Y = Z" takes ~26

    def __init__(
        self,
        context_tokens_smoke: int = CONTEXT_TOKENS_SMOKE,
        context_tokens_full: int = CONTEXT_TOKENS_FULL,
        *,
        hops_smoke: Sequence[int] = HOPS_SMOKE,
        hops_full: Sequence[int] = HOPS_FULL,
    ) -> None:
        for hops in (hops_smoke, hops_full):
            if not hops or any(k < 1 for k in hops):
                raise ValueError(f"hops must be one or more counts >= 1, got {tuple(hops)}")
        self.context_tokens_smoke = context_tokens_smoke
        self.context_tokens_full = context_tokens_full
        self.hops_smoke = tuple(hops_smoke)
        self.hops_full = tuple(hops_full)

    def configured(self, options: RunOptions) -> HashHopTask:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """`n` items (12 smoke, 48 full), hop counts cycling through the tier's; each item has its own seed."""
        if tier == "smoke":
            count, target, hop_counts = (SMOKE_N if n is None else n), self.context_tokens_smoke, self.hops_smoke
        elif tier == "full":
            count, target, hop_counts = (FULL_N if n is None else n), self.context_tokens_full, self.hops_full
        else:
            raise ValueError(f"unknown tier {tier!r}")
        items: list[Item] = []
        for i in range(count):
            k = hop_counts[i % len(hop_counts)]
            case_seed = int(stable_id("hashhop", seed, i, k, target), 16)
            case = generate(case_seed, context_tokens=target, hops=k, tokenizer=None)
            q = case.queries[0]
            chain = tier == "smoke"
            items.append(
                Item(
                    id=f"hashhop-{seed}-{i}-h{k}",
                    messages=None if chain else build_messages(case, q),
                    text=build_chain_prompt(case, q) if chain else None,
                    target={"answer": q.answer, "hops": k, "start": q.start},
                    meta={
                        "hops": k,
                        "form": "chain" if chain else "chat",
                        "context_tokens": target,
                        "context_tokens_estimated": case.context_tokens,
                        "lines": case.n_lines,
                    },
                )
            )
        return items

    def render(self, item: Item, tokenizer: Any) -> str:
        """The smoke form's raw text as it is; the full form's user turn through the chat template."""
        if item.text is not None:
            return item.text
        if item.messages is None:
            raise ValueError(f"hashhop item {item.id} has neither text nor messages")
        return chat_render(tokenizer, item.messages)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """Exact match on the answer: the first hash of the output (chat form) or the hash the
        completed chain reaches (chain form); detail says how far along the chain it was.

        `prompt_hash` here hashes the text or the messages (score has no tokenizer to render with);
        a runner that rendered the prompt may replace it with the rendered text's hash.
        """
        target: Mapping[str, Any] = item.target
        answer, start, hops = str(target["answer"]), str(target["start"]), int(target["hops"])
        messages = item.messages or ()
        prompt = item.text if item.text is not None else "\n".join(str(m.get("content", "")) for m in messages)
        graph = parse_assignments(_context_of(prompt))
        known = set(graph) | set(graph.values())
        detail: dict[str, Any] = {"hops": hops, "answer": answer}
        if item.text is not None:
            got, written = chain_answer(output, hops)
            detail["hashes_written"] = written
        else:
            got = extract_hash(output, known)
        position = _chain_position(graph, start, got, hops + 1) if got is not None else None
        if got is None:
            verdict, score = "no_answer", 0.0
        elif got == answer:
            verdict, score = "correct", 1.0
        else:
            verdict, score = "wrong", 0.0
        detail.update({"extracted": got, "chain_position": position, "in_context": got in known if got else False})
        hashed = prompt_hash(
            item.text if item.text is not None else json.dumps(list(map(dict, messages)), sort_keys=True)
        )
        return ItemResult(
            item_id=item.id, prompt_hash=hashed, output=output, score=score, verdict=verdict, detail=detail
        )


def _context_of(text: str) -> str:
    """The assignments block only: the worked example's lines are not part of the graph."""
    head, sep, rest = text.partition(_CONTEXT_OPEN)
    return rest.partition(_CONTEXT_CLOSE)[0] if sep else head


def _chain_position(graph: Mapping[str, str], start: str, got: str, limit: int) -> int | None:
    """How many hops from `start` the extracted hash is (0 = echoed the start), or None if off-chain."""
    here: str | None = start
    for step in range(limit + 1):
        if here is None:
            return None
        if here == got:
            return step
        here = graph.get(here)
    return None


TASK = HashHopTask()
