"""Choice scoring with a shared prefix prefilled once: the same log-probabilities as whole prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.capability.generate import (
    MIN_SHARED_PREFIX,
    _shared_prefix_groups,
    choice_logprobs,
    choice_logprobs_many,
)

# --- grouping (pure) ------------------------------------------------------------------------------


def test_items_sharing_a_long_prefix_form_one_group_and_the_rest_run_whole() -> None:
    shots = list(range(100, 100 + 40))
    prompts = [shots + [1, 2], [7] * 50, shots + [3], shots + [1, 5, 6], [8, 9]]
    groups = _shared_prefix_groups(prompts, MIN_SHARED_PREFIX)
    shared = [g for g in groups if g[1]]
    assert len(shared) == 1
    members, length = shared[0]
    assert sorted(members) == [0, 2, 3] and length == 40
    assert sorted(i for members, n in groups if n == 0 for i in members) == [1, 4]


def test_the_shared_length_leaves_every_member_a_token_of_its_own() -> None:
    base = list(range(64))
    groups = _shared_prefix_groups([base, base + [1], base + [2]], MIN_SHARED_PREFIX)
    assert groups == [([0, 1, 2], 63)]  # the shortest member keeps its last token


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=60), max_size=12), st.integers(1, 40))
def test_groups_cover_every_item_once_and_members_really_share_their_prefix(
    prompts: list[list[int]], min_shared: int
) -> None:
    groups = _shared_prefix_groups(prompts, min_shared)
    seen = sorted(i for members, _ in groups for i in members)
    assert seen == list(range(len(prompts)))
    for members, shared in groups:
        assert shared == 0 or shared >= min_shared
        if shared:
            first = prompts[members[0]][:shared]
            assert all(prompts[i][:shared] == first and len(prompts[i]) > shared for i in members)


# --- the numbers ---------------------------------------------------------------------------------


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _mmlu_like(n_subjects: int, per_subject: int) -> tuple[list[str], list[tuple[str, ...]]]:
    texts = []
    for s in range(n_subjects):
        shots = "".join(
            f"Question: fact {s}.{k} is which letter?\nA. one\nB. two\nC. three\nD. four\nAnswer: {'ABCD'[k % 4]}\n\n"
            for k in range(5)
        )
        header = f"The following are multiple choice questions (with answers) about topic {s}.\n\n"
        texts += [
            header + shots + f"Question: item {i} of topic {s}?\nA. x\nB. y\nC. z\nD. w\nAnswer:"
            for i in range(per_subject)
        ]
    return texts, [(" A", " B", " C", " D")] * len(texts)


def test_prefix_reuse_matches_whole_prompts_on_a_real_model(tiny_model_dir: Path) -> None:
    import mlx_lm

    model, tok = mlx_lm.load(str(tiny_model_dir))
    texts, choices = _mmlu_like(2, 3)
    texts.append("A prompt that shares nothing with the others, scored whole:")  # a group of its own
    choices.append((" A", " B", " C", " D"))
    many = choice_logprobs_many(model, tok, texts, choices)
    assert _max_diff(many, [choice_logprobs(model, tok, t, c) for t, c in zip(texts, choices, strict=True)]) < 1e-4
    # multi-token continuations (one row per choice, tokens summed) take the same path
    # longer choices first too: rows run sorted by length, and each must land in its own slot
    multi = [(" Paris", " the city of London"), (" no thanks at all", " yes")] * 3 + [(" a b c d", " b", " c d")]
    many = choice_logprobs_many(model, tok, texts, multi)
    assert _max_diff(many, [choice_logprobs(model, tok, t, c) for t, c in zip(texts, multi, strict=True)]) < 1e-4


def test_a_wrong_prefix_would_be_caught(tiny_model_dir: Path) -> None:
    """The comparison above can fail: scoring each item after another item's question differs."""
    import mlx_lm

    model, tok = mlx_lm.load(str(tiny_model_dir))
    texts, choices = _mmlu_like(1, 2)
    swapped = [choice_logprobs(model, tok, texts[1 - i], c) for i, c in enumerate(choices)]
    assert _max_diff(choice_logprobs_many(model, tok, texts, choices), swapped) > 1e-3


@pytest.mark.slow  # the embedded model on real MMLU prompts (~3k-token five-shot prefixes)
def test_prefix_reuse_matches_whole_prompts_on_real_mmlu_items() -> None:
    import mlx_lm

    from pytest_mlxgate.capability.tasks.mmlu import MMLU, load_subjects
    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    model, tok = mlx_lm.load(str(ensure_embedded_snapshot()))
    data = load_subjects()
    items: list[Any] = [MMLU._item(s, i, data[s]) for s in sorted(data)[:2] for i in range(3)]
    texts, choices = [it.text for it in items], [it.choices for it in items]
    whole = [choice_logprobs(model, tok, t, c) for t, c in zip(texts, choices, strict=True)]
    assert _max_diff(choice_logprobs_many(model, tok, texts, choices), whole) < 1e-4


@pytest.mark.parametrize("scoring", ["choice", "exact"])
def test_an_arm_reports_items_done_as_they_finish(tiny_model_dir: Path, tmp_path: Path, scoring: Any) -> None:
    import json

    import mlx_lm

    from pytest_mlxgate.capability.runner import run_arm
    from pytest_mlxgate.capability.user_tasks import JsonlTask
    from pytest_mlxgate.levers.lever import Lever

    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"Item {i}:", "choices": [" a", " b"], "target": " a"}) + "\n" for i in range(5))
    )
    task = JsonlTask("t", path, scoring=scoring, max_new_tokens=2)
    model, tok = mlx_lm.load(str(tiny_model_dir))
    lever = Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
    calls: list[tuple[int, int]] = []
    results, _ = run_arm(
        task,
        task.load("full"),
        model,
        tok,
        lever,
        "reference",
        batch_size=2,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert len(results) == 5 and calls and calls[-1] == (5, 5)
    assert all(total == 5 for _, total in calls) and [d for d, _ in calls] == sorted(d for d, _ in calls)


# --- the vocabulary projection only where a choice is read -------------------------------------------


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_gemma4_dir", "tiny_gemma4_multimodal_dir"])
def test_the_split_head_gives_the_full_forwards_logits(fixture: str, request: pytest.FixtureRequest) -> None:
    """Body + projection at chosen positions == the model's own forward there (llama tied head,
    gemma-4 with softcapping, and gemma-4 wrapped as the multimodal model)."""
    import mlx.core as mx
    import mlx_lm

    from pytest_mlxgate.capability.generate import _logits_at, _split_head

    model, tok = mlx_lm.load(str(request.getfixturevalue(fixture)))
    head = _split_head(model)
    assert head is not None, "a known architecture must take the fast path"
    rows = [
        tok.encode("The capital of France is Paris, and the capital of Spain is"),
        tok.encode("One two three four five six seven eight nine ten eleven twelve"),
    ]
    width = max(map(len, rows))
    tokens = mx.array([r + [0] * (width - len(r)) for r in rows])
    index = mx.array([[0, 5, len(rows[0]) - 1], [2, 3, len(rows[1]) - 1]])
    full = model(tokens)
    want = mx.take_along_axis(full, index[..., None], axis=1)
    got = _logits_at(head, tokens, None, index)
    assert got.shape == want.shape
    assert float(mx.abs(got - want).max()) < 1e-4
    # the check can fail: the positions must matter
    assert float(mx.abs(got - mx.take_along_axis(full, (index + 1)[..., None], axis=1)).max()) > 1e-2


def test_an_unknown_architecture_projects_every_position(tiny_model_dir: Path) -> None:
    import mlx_lm

    from pytest_mlxgate.capability.generate import _split_head

    model, _ = mlx_lm.load(str(tiny_model_dir))
    model.args.model_type = "some_new_arch"  # a forward we have not read: never guess its head
    assert _split_head(model) is None


def test_choice_scoring_on_gemma4_matches_whole_prompts(tiny_gemma4_dir: Path) -> None:
    """Sliding-window caches cannot take a copied prefix: items run whole, batched, still exact."""
    import mlx_lm

    model, tok = mlx_lm.load(str(tiny_gemma4_dir))
    texts, choices = _mmlu_like(2, 3)
    multi = [(" Paris", " the city of London"), (" yes", " no thanks")] * 3
    for opts in (choices, multi):
        many = choice_logprobs_many(model, tok, texts, opts)
        assert _max_diff(many, [choice_logprobs(model, tok, t, c) for t, c in zip(texts, opts, strict=True)]) < 1e-4
