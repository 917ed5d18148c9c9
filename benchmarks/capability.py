"""capability: generation throughput batched vs sequential, and the smoke tier's wall time.

1. On the embedded model, `--prompts` (32) chat prompts x `--tokens` (64) new tokens, greedy, with
   the KV plan `--kv` (plain; `8` for an 8-bit cache): our batched path (`generate_greedy`, batch
   32) vs `mlx_lm.stream_generate` one prompt at a time (with kv_bits for a quantized plan), and
   how many texts are identical. Goal: generated tokens/s batched / sequential >= 4.
2. MMLU choice scoring, `--subjects` (4) x `--per-subject` (8) real five-shot items: each prompt
   whole (one forward per item) vs the shared prefix prefilled once per subject and the suffixes
   batched (`choice_logprobs_many`, what the runner uses); items/s of both, the ratio, and the
   largest log-probability difference (goal: the same numbers to float32 rounding, < 1e-4).
3. The smoke tier of each of the six tasks on ONE arm (the gate runs two), items and seconds per
   task, and the total; a task that cannot run here is reported with its reason. The extra tasks
   (`arc_easy`, `piqa`, `sciq`) run when `--tasks` names them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from ._common import header, verdict

GOAL = 4.0


def _load() -> tuple[Any, Any]:
    import mlx_lm

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    model, tokenizer = mlx_lm.load(str(ensure_embedded_snapshot()))
    return model, tokenizer


def throughput(n: int, tokens: int, kv_value: str = "plain") -> None:
    from pytest_mlxgate.capability.base import chat_render
    from pytest_mlxgate.capability.generate import generate_greedy, generate_sequential
    from pytest_mlxgate.kl.prompts import default_prompts
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    header(f"capability generation: {n} prompts x {tokens} new tokens, KV {kv_value}, batched vs sequential (greedy)")
    model, tokenizer = _load()
    texts = [p.text or p.messages[-1]["content"] for p in default_prompts()]  # type: ignore[index]
    prompts = [
        chat_render(tokenizer, [{"role": "user", "content": "Continue this:\n" + t[:300]}])
        for t in (texts * (n // len(texts) + 1))[:n]
    ]
    kv = parse_kv_value(kv_value)
    generate_greedy(model, tokenizer, prompts[:2], max_new_tokens=4, kv=kv)  # warm-up
    t0 = time.perf_counter()
    batched = generate_greedy(model, tokenizer, prompts, max_new_tokens=tokens, kv=kv, batch_size=n)
    tb = time.perf_counter() - t0
    t0 = time.perf_counter()
    sequential = generate_sequential(model, tokenizer, prompts, max_new_tokens=tokens, kv=kv)
    ts = time.perf_counter() - t0
    produced = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in batched)
    same = sum(
        a.strip() == b.strip() for a, b in zip(batched, sequential, strict=True)
    )  # streaming drops a leading space
    print(f"batched:    {tb:.1f} s  ({produced / tb:.1f} generated tok/s)")
    print(f"sequential: {ts:.1f} s  ({produced / ts:.1f} generated tok/s)")
    print(f"identical outputs: {same}/{n}")
    print(f"ratio sequential/batched time: {ts / tb:.2f}x  goal >= {GOAL}: {verdict(ts / tb >= GOAL)}")


def mmlu_prefix(subjects: int, per_subject: int) -> None:
    from pytest_mlxgate.capability.generate import choice_logprobs, choice_logprobs_many
    from pytest_mlxgate.capability.tasks.mmlu import MMLU, load_subjects

    header(f"MMLU choice scoring: {subjects} subjects x {per_subject} items, whole prompts vs shared prefix")
    model, tokenizer = _load()
    data = load_subjects()
    items = [MMLU._item(s, i, data[s]) for s in sorted(data)[:subjects] for i in range(per_subject)]
    texts, choices = [str(it.text) for it in items], [it.choices for it in items]
    choice_logprobs(model, tokenizer, texts[0], choices[0])  # warm-up
    t0 = time.perf_counter()
    whole = [choice_logprobs(model, tokenizer, t, c) for t, c in zip(texts, choices, strict=True)]
    tw = time.perf_counter() - t0
    t0 = time.perf_counter()
    reused = choice_logprobs_many(model, tokenizer, texts, choices)
    tr = time.perf_counter() - t0
    diff = max(abs(a - b) for ra, rb in zip(whole, reused, strict=True) for a, b in zip(ra, rb, strict=True))
    n = len(items)
    print(f"whole prompts: {tw:.1f} s  ({n / tw:.2f} items/s)")
    print(f"shared prefix: {tr:.1f} s  ({n / tr:.2f} items/s)")
    print(f"max |log-prob difference|: {diff:.2e}  (goal < 1e-4: {verdict(diff < 1e-4)})")
    print(f"ratio whole/shared time: {tw / tr:.2f}x")


def smoke_tier(only: Sequence[str] | None = None) -> None:
    from pytest_mlxgate.capability.base import EXTRA_TASK_NAMES, TASK_NAMES
    from pytest_mlxgate.capability.runner import load_task, run_arm
    from pytest_mlxgate.levers.lever import Lever

    header("capability smoke tier, one arm, embedded model")
    model, tokenizer = _load()
    lever = Lever(name="none", kind="env", target="MLXGATE_BENCH_UNUSED", ref="0", cand="0")
    total = 0.0
    for name in (*TASK_NAMES, *EXTRA_TASK_NAMES):
        if (only and name not in only) or (not only and name in EXTRA_TASK_NAMES):
            continue
        task = load_task(name)
        try:
            items = task.load("smoke")
            t0 = time.perf_counter()
            results, _ = run_arm(task, items, model, tokenizer, lever, "reference")
            dt = time.perf_counter() - t0
        except Exception as e:  # report and go on: one task's absence is not the benchmark's failure
            print(f"{name:10} skipped: {e}")
            continue
        total += dt
        score = sum(r.score for r in results) / len(results)
        print(f"{name:10} {len(items):4} items  {dt:7.1f} s  score {100 * score:.1f}%")
    print(f"smoke tier, one arm: {total:.0f} s (a paired gate runs both arms: ~{2 * total:.0f} s)")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="capability")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--subjects", type=int, default=4)
    parser.add_argument("--per-subject", type=int, default=8)
    parser.add_argument("--kv", default="plain", help="the KV plan of the throughput run (e.g. 8: quantized)")
    parser.add_argument("--only", choices=["throughput", "prefix", "smoke"], default=None)
    parser.add_argument("--tasks", default="", help="comma-separated smoke-tier tasks (default: the six)")
    args = parser.parse_args(argv)
    if args.only in (None, "throughput"):
        throughput(args.prompts, args.tokens, args.kv)
    if args.only in (None, "prefix"):
        mmlu_prefix(args.subjects, args.per_subject)
    if args.only in (None, "smoke"):
        smoke_tier([t for t in args.tasks.split(",") if t] or None)


if __name__ == "__main__":
    main(sys.argv[1:])
