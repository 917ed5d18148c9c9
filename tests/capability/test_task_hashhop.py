"""HashHop: the generator's guarantees (checked by an independent parser), length targets measured on
the real embedded tokenizer, both forms of the question (smoke's chain to complete, full's chat turn),
and scoring of right, wrong, malformed and hostile outputs."""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from itertools import pairwise
from typing import Any

import pytest

from pytest_mlxgate.capability.base import Item, ItemResult, Task
from pytest_mlxgate.capability.tasks import hashhop
from pytest_mlxgate.capability.tasks.hashhop import (
    CHARS_PER_TOKEN,
    TASK,
    HashHopCase,
    HashHopTask,
    chain_answer,
    generate,
    per_hop_accuracy,
)

__all__: list[str] = []


def ntok(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text)) - len(tokenizer.encode(""))


# ---------------------------------------------------------------- an independent resolver


def lines_of(context: str) -> list[tuple[str, str]]:
    """The context's assignments in order, parsed without the module's regexes."""
    out = []
    for raw in context.splitlines():
        if raw.startswith("<"):
            continue
        left, eq, right = raw.partition(" = ")
        assert eq, f"malformed line {raw!r}"
        assert len(left) == len(right) == 16 and (left + right).isalpha() and (left + right).isascii(), raw
        out.append((left, right))
    return out


def prompt_of(item: Item) -> str:
    """The smoke form's text, or the full form's single user turn."""
    if item.text is not None:
        return item.text
    assert item.messages is not None
    return str(item.messages[0]["content"])


def block(item: Item) -> str:
    """The item's assignments block (the instructions mention the tag too, so split on the line form)."""
    return prompt_of(item).split("<assignments>\n")[1].split("\n</assignments>")[0]


#: The full (chat) form on a small context: cheap to build, the same code path as the 12k-token one.
CHAT = HashHopTask(context_tokens_full=1024)


def resolve(context: str, start: str, hops: int) -> str:
    """Follow exactly `hops` assignments from `start`; fail if the chain is broken."""
    edges = dict(lines_of(context))
    here = start
    for _ in range(hops):
        assert here in edges, f"chain breaks at {here}"
        here = edges[here]
    return here


def chains(context: str) -> list[list[str]]:
    """Every chain, head to tail."""
    pairs = lines_of(context)
    edges = dict(pairs)
    targets = {b for _, b in pairs}
    result = []
    for head in (a for a, _ in pairs if a not in targets):
        chain = [head]
        while chain[-1] in edges:
            chain.append(edges[chain[-1]])
        result.append(chain)
    return result


def case(seed: int = 0, *, tokens: int = 1024, hops: int = 3, tok: Any = None, n_queries: int = 1) -> HashHopCase:
    return generate(seed, context_tokens=tokens, hops=hops, tokenizer=tok, n_queries=n_queries)


# ---------------------------------------------------------------- the generator


def test_same_seed_same_case_and_different_seed_different() -> None:
    assert case(7) == case(7)
    assert case(7, n_queries=3) == case(7, n_queries=3)
    assert case(7).context != case(8).context
    assert case(7).queries != case(8).queries
    # Only the seed matters: the global random state does not leak in.
    random.seed(1)
    a = case(5)
    random.seed(2)
    assert case(5) == a


def test_load_is_deterministic_and_seeded() -> None:
    assert TASK.load("smoke") == TASK.load("smoke")
    assert [i.text for i in TASK.load("smoke", seed=1)] != [i.text for i in TASK.load("smoke")]
    assert len({i.text for i in TASK.load("smoke")}) == 12  # every item its own context
    assert CHAT.load("full", n=4) == CHAT.load("full", n=4)


@pytest.mark.parametrize("seed", range(20))
def test_no_collisions_and_only_letters(seed: int) -> None:
    c = case(seed, tokens=1500, hops=1 + seed % 4, n_queries=1 + seed % 3)
    pairs = lines_of(c.context)
    lefts = Counter(a for a, _ in pairs)
    rights = Counter(b for _, b in pairs)
    assert max(lefts.values()) == 1 and max(rights.values()) == 1  # deterministic walk, no merges
    every = set(lefts) | set(rights)
    assert len(every) == len(pairs) + len(chains(c.context))  # distinct hashes: lines + one head per chain
    assert all(set(h) <= set(string.ascii_letters) for h in every)
    assert not every & set(hashhop._EX)  # the worked example's hashes never appear as real ones
    assert sum(len(ch) - 1 for ch in chains(c.context)) == len(pairs)  # no cycles: every line is on a chain


@pytest.mark.parametrize("hops", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_answer_reached_in_exactly_k_hops_and_chain_ends_there(seed: int, hops: int) -> None:
    c = case(seed, hops=hops, n_queries=2)
    edges = dict(lines_of(c.context))
    targets = set(edges.values())
    assert len(c.queries) == 2
    for q in c.queries:
        assert q.hops == hops
        assert resolve(c.context, q.start, hops) == q.answer
        assert q.answer not in edges  # the end of the chain: k hops is the whole chain
        assert q.start not in targets  # the start is a chain's first hash
        assert q.answer != q.start


@pytest.mark.parametrize("seed", range(10))
def test_distractors_of_mixed_lengths_hide_the_chain(seed: int) -> None:
    c = case(seed, tokens=1024, hops=2)
    (q,) = c.queries
    all_chains = chains(c.context)
    others = [ch for ch in all_chains if ch[0] != q.start]
    assert len(others) >= 5
    lengths = Counter(len(ch) - 1 for ch in others)
    assert set(range(1, 6)) <= set(lengths), lengths  # shorter, equal and longer chains than the query's
    assert len(lines_of(c.context)) >= 10 * 2  # distractor lines outnumber the chain's ten to one


@pytest.mark.parametrize("seed", range(15))
def test_query_lines_are_scattered(seed: int) -> None:
    c = case(seed, tokens=800, hops=4, n_queries=2)
    pairs = lines_of(c.context)
    chain_lines = set()
    for q in c.queries:
        here = q.start
        for _ in range(q.hops):
            nxt = dict(pairs)[here]
            chain_lines.add((here, nxt))
            here = nxt
    positions = sorted(i for i, p in enumerate(pairs) if p in chain_lines)
    assert len(positions) == 8
    assert all(b - a >= 2 for a, b in pairwise(positions)), positions


def test_chain_lines_are_not_always_in_order() -> None:
    """Lines shuffled: in some cases a later hop's line comes before an earlier one."""
    out_of_order = 0
    for seed in range(20):
        c = case(seed, hops=4)
        pairs = lines_of(c.context)
        (q,) = c.queries
        order = []
        here = q.start
        for _ in range(4):
            idx = next(i for i, (a, _) in enumerate(pairs) if a == here)
            order.append(idx)
            here = pairs[idx][1]
        out_of_order += order != sorted(order)
    assert out_of_order >= 10


def test_tiny_target_still_scatters() -> None:
    c = case(0, tokens=10, hops=4)
    assert resolve(c.context, c.queries[0].start, 4) == c.queries[0].answer
    assert len(lines_of(c.context)) >= 8  # at least one distractor per query line


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        case(hops=0)
    with pytest.raises(ValueError):
        case(n_queries=0)
    with pytest.raises(ValueError):
        TASK.load("medium")  # type: ignore[arg-type]


# ---------------------------------------------------------------- length in real tokens


def test_chars_per_token_constant_matches_embedded_tokenizer(tokenizer: Any) -> None:
    rng = random.Random(123)

    def h() -> str:
        return "".join(rng.choices(string.ascii_letters, k=16))

    text = "\n".join(f"{h()} = {h()}" for _ in range(600))
    measured = len(text) / ntok(tokenizer, text)
    assert abs(measured - CHARS_PER_TOKEN) / measured < 0.05, measured


@pytest.mark.parametrize("target", [1024, 4000, 12000])
@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_context_length_within_ten_percent(tokenizer: Any, target: int, with_tokenizer: bool) -> None:
    for seed, hops in ((0, 1), (1, 4)):
        c = case(seed, tokens=target, hops=hops, tok=tokenizer if with_tokenizer else None)
        real = ntok(tokenizer, c.context)
        assert abs(real - target) <= 0.10 * target, (real, target)
        assert c.measured is with_tokenizer
        if with_tokenizer:
            assert c.context_tokens == real


def test_smoke_items_are_short_chains_to_complete(tokenizer: Any) -> None:
    """The smoke form: raw text (no chat template), a 256-512-token context, worked chains from the
    distractors (right, and never the query's), and the query's chain opened at its start."""
    for item in TASK.load("smoke"):
        rendered = TASK.render(item, tokenizer)
        assert rendered == item.text and item.messages is None and "<|im_start|>" not in rendered
        assert 256 <= ntok(tokenizer, block(item)) <= 512
        assert len(tokenizer.encode(rendered)) < 800
        start, hops = item.target["start"], item.target["hops"]
        steps = "1 step" if hops == 1 else f"{hops} steps"
        head, _, worked = rendered.partition("</assignments>\n\n")
        *shown, last = worked.split("\n")
        assert last == f"{steps} from {start}: {start} ="
        assert 1 <= len(shown) <= hashhop.DEMOS
        for line in shown:
            prefix, _, chain_text = line.partition(": ")
            chain = chain_text.split(" = ")
            assert prefix == f"{steps} from {chain[0]}" and len(chain) == hops + 1 and chain[0] != start
            assert all(resolve(block(item), chain[0], k) == chain[k] for k in range(1, hops + 1))
        assert start not in worked.rpartition("\n")[0]  # no worked chain gives the query away


def test_chat_items_render_under_1300_tokens(tokenizer: Any) -> None:
    for item in CHAT.load("full", n=4):
        rendered = CHAT.render(item, tokenizer)
        assert len(tokenizer.encode(rendered)) < 1300
        assert rendered.rstrip().endswith("assistant")  # generation prompt appended
        q = item.target
        word = "assignment" if q["hops"] == 1 else "assignments"
        assert (
            f"Starting from {q['start']}, follow {q['hops']} {word}: what hash do you reach? Answer with the hash only."
        ) in rendered


def test_full_items_are_about_12k_tokens(tokenizer: Any) -> None:
    items = TASK.load("full", n=4)
    for item in items:
        assert item.messages is not None
        context = block(item)
        assert abs(ntok(tokenizer, context) - 12000) <= 1200


# ---------------------------------------------------------------- the task


def test_task_shape_and_tiers() -> None:
    task: Task = TASK  # the protocol, checked by mypy
    assert (task.name, task.graded, task.max_new_tokens) == ("hashhop", False, 32)
    assert (hashhop.HOPS_SMOKE, hashhop.CONTEXT_TOKENS_SMOKE) == ((1, 2), 384)
    assert (hashhop.HOPS_FULL, hashhop.CONTEXT_TOKENS_FULL) == ((1, 2, 3, 4), 12000)
    smoke = TASK.load("smoke")
    assert len(smoke) == 12
    assert Counter(i.meta["hops"] for i in smoke) == {1: 6, 2: 6}
    assert [i.id for i in smoke[:5]] == [
        "hashhop-0-0-h1",
        "hashhop-0-1-h2",
        "hashhop-0-2-h1",
        "hashhop-0-3-h2",
        "hashhop-0-4-h1",
    ]
    assert len(TASK.load("smoke", n=5)) == 5
    for item in smoke:
        assert set(item.target) == {"answer", "hops", "start"}
        assert item.meta["context_tokens"] == 384 and item.meta["form"] == "chain" and item.kind == "generate"
        assert item.text is not None and item.messages is None
        assert resolve(block(item), item.target["start"], item.target["hops"]) == item.target["answer"]
    full = CHAT.load("full", seed=3)
    assert len(full) == 48 and Counter(i.meta["hops"] for i in full) == {k: 12 for k in (1, 2, 3, 4)}
    assert full[0].id == "hashhop-3-0-h1" and full[0].meta["context_tokens"] == 1024
    for item in full[:8]:
        assert item.meta["form"] == "chat" and item.text is None
        assert item.messages is not None and len(item.messages) == 1 and item.messages[0]["role"] == "user"
        assert resolve(block(item), item.target["start"], item.target["hops"]) == item.target["answer"]


def test_hop_counts_are_configurable() -> None:
    task = HashHopTask(context_tokens_smoke=300, hops_smoke=(3,), hops_full=(1, 2))
    assert {i.meta["hops"] for i in task.load("smoke", n=3)} == {3}
    assert [i.meta["hops"] for i in task.load("full", n=4)] == [1, 2, 1, 2]
    for bad in ((), (0, 1)):
        with pytest.raises(ValueError):
            HashHopTask(hops_smoke=bad)


def test_context_size_is_configurable() -> None:
    small = HashHopTask(context_tokens_smoke=300, context_tokens_full=2000)
    s = small.load("smoke", n=2)
    f = small.load("full", n=2)
    assert s[0].meta["context_tokens"] == 300 and f[0].meta["context_tokens"] == 2000

    def size(items: list[Item]) -> int:
        return len(block(items[0]))

    assert size(s) < size(TASK.load("smoke", n=1)) < size(f) < size(TASK.load("full", n=1))


# ---------------------------------------------------------------- scoring


@pytest.fixture(scope="module")
def item() -> Item:
    return CHAT.load("full", n=3)[2]  # the chat form, hops 3


def score(item: Item, output: str) -> ItemResult:
    return CHAT.score(item, output)


def test_score_right_answer_in_many_wrappers(item: Item) -> None:
    answer = item.target["answer"]
    for output in (
        answer,
        f"  {answer}\n",
        f'"{answer}"',
        f"'{answer}'.",
        f"**{answer}**",
        f"`{answer}`",
        f"The answer is {answer}.",
        f"Following the chain, you reach: {answer}!",
        f"responsibilities aside, it is {answer}",
        f"{answer}<|im_end|>",
    ):
        r = score(item, output)
        assert (r.verdict, r.score, r.passed) == ("correct", 1.0, True), output
        assert r.detail["hops"] == 3 and r.detail["chain_position"] == 3 and r.output == output


def test_score_wrong_answers(item: Item) -> None:
    answer, start = item.target["answer"], item.target["start"]
    context = block(item)
    one_short = resolve(context, start, 2)

    r = score(item, start)  # echoing the start hash
    assert (r.verdict, r.score, r.detail["chain_position"], r.detail["in_context"]) == ("wrong", 0.0, 0, True)
    r = score(item, one_short)  # stopped a hop early
    assert (r.verdict, r.detail["chain_position"]) == ("wrong", 2)
    r = score(item, f"{one_short} then {answer}")  # the first hash is what counts
    assert r.verdict == "wrong"
    r = score(item, answer.swapcase())  # case matters: hashes are mixed case
    assert r.verdict == "wrong" and r.detail["in_context"] is False
    other = next(a for a, _ in lines_of(context) if a not in (start, answer))
    r = score(item, other)
    assert r.verdict == "wrong" and r.detail["chain_position"] is None
    r = score(item, hashhop._EX[2])  # parroting the worked example
    assert r.verdict == "wrong" and r.detail["in_context"] is False


def test_score_malformed_and_hostile(item: Item) -> None:
    answer = item.target["answer"]
    for output in (
        "",
        "   ",
        "I don't know.",
        answer[:15],
        answer + "x",
        "x" + answer,
        "A" * 10_000,
        "= " * 5_000,
        "\x00" * 100,
    ):
        r = score(item, output)
        assert (r.verdict, r.score) == ("no_answer", 0.0), output[:40]
        assert r.detail["extracted"] is None and r.detail["hops"] == 3
    long = "blah " * 2_000 + answer  # 10k chars of prose, the right hash at the very end
    assert len(long) > 10_000 and score(item, long).verdict == "correct"
    r = score(item, "ZZZZZZZZZZZZZZZZ")  # a well-formed hash that is nowhere in the context
    assert r.verdict == "wrong" and r.detail["in_context"] is False
    # The same prompt always hashes the same, and the result survives JSON.
    assert score(item, "").prompt_hash == score(item, answer).prompt_hash
    r = score(item, answer)
    assert ItemResult.from_json(r.to_json()) == r


def test_per_hop_accuracy() -> None:
    items = HashHopTask(context_tokens_full=600).load("full", n=12)
    outputs = []
    for i, it in enumerate(items):
        hops = it.target["hops"]
        # right on every 1-hop item, right on one 2-hop item, wrong elsewhere
        right = hops == 1 or (hops == 2 and i == 1)
        outputs.append(it.target["answer"] if right else it.target["start"])
    results = [CHAT.score(it, out) for it, out in zip(items, outputs, strict=True)]
    assert per_hop_accuracy(results) == {1: (3, 3), 2: (1, 3), 3: (0, 3), 4: (0, 3)}
    assert per_hop_accuracy([]) == {}
    assert list(per_hop_accuracy(list(reversed(results)))) == [1, 2, 3, 4]


def test_extract_hash_prefers_context_hashes() -> None:
    h = "AbCdEfGhIjKlMnOp"
    assert hashhop.extract_hash(f"characteristical {h}", {h}) == h
    assert hashhop.extract_hash(f"characteristical {h}") == "characteristical"
    assert hashhop.extract_hash("none here") is None
    assert re.fullmatch(r"[A-Za-z]{16}", h)


# ---------------------------------------------------------------- scoring the smoke form (chains)


@pytest.fixture(scope="module")
def two_hop() -> Item:
    return TASK.load("smoke", n=2)[1]  # the chain form, hops 2


def test_chain_form_scores_the_hash_the_chain_reaches(two_hop: Item) -> None:
    start, answer = two_hop.target["start"], two_hop.target["answer"]
    middle = resolve(block(two_hop), start, 1)
    cases = {
        f" {middle} = {answer}\n2 steps from x": ("correct", 2, 2),  # the chain written out
        f" {middle} = {answer} = AbCdEfGhIjKlMnOp": ("correct", 2, 3),  # on past the end: step 2 counts
        f" {answer}": ("correct", 2, 1),  # straight to the end
        f" {middle}\n{answer}": ("wrong", 1, 1),  # stopped after one step: only the first line counts
        f" {middle} = {middle}": ("wrong", 1, 2),  # copied the wrong line
        f" {start} = {middle}": ("wrong", 1, 2),  # restarted the chain: the 2nd hash is one step short
    }
    for output, (verdict, position, written) in cases.items():
        r = TASK.score(two_hop, output)
        assert (r.verdict, r.detail["chain_position"], r.detail["hashes_written"]) == (verdict, position, written), (
            output
        )
        assert r.score == (1.0 if verdict == "correct" else 0.0)
    for output in ("", " \n" + answer, " I don't know", " " + answer[:15]):
        r = TASK.score(two_hop, output)
        assert (r.verdict, r.detail["extracted"]) == ("no_answer", None), output
    assert TASK.score(two_hop, "").prompt_hash == hashhop.prompt_hash(str(two_hop.text))


def test_chain_answer() -> None:
    a, b, c = "AbCdEfGhIjKlMnOp", "QrStUvWxYzAbCdEf", "GhIjKlMnOpQrStUv"
    assert chain_answer(f" {a} = {b} = {c}", 2) == (b, 3)
    assert chain_answer(f" {a}", 3) == (a, 1)
    assert chain_answer(f"{a}\n{b}", 2) == (a, 1)
    assert chain_answer("  no hash", 1) == (None, 0)
