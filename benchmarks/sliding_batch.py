"""sliding_batch: greedy generation on gemma3-270m (15 sliding-window + 3 full layers), batched vs
one prompt at a time, for the two plans a gemma KV gate's arms hold.

* `full-8bit` (8-bit KV on the full layers, the windows plain): now the batched loop
  (`serving.batch.greedy_batch`, `BatchRotatingKVCache` for the windows, `BatchQuantizedKVCache` for
  the full layers) vs the loop it took before, one prompt at a time with the plan's own caches
  (`capability.generate._per_layer`).
* `uniform-8bit` (8-bit KV on every layer, windows too): the batched loop with quantized windows
  (`BatchQuantizedRotatingKVCache`) vs one prompt at a time with `QuantizedRotatingKVCache`, the only
  way such a plan ran before.
* `plain`: the batched loop vs mlx_lm's `batch_generate` (the route plain gemma arms took before):
  no regression wanted, a ratio reported.

16 prompts, half of them longer than the 512-token window (so rows wrap inside the batch), 32 new
tokens. One warm-up, then `--repeats` (default 3) rounds, the order alternating per round; medians
quoted, outputs compared token for token. Goal: one-at-a-time / batched >= 2x for the quantized plans.
`--only NAME` (a prefix: full, uniform, plain) runs one plan's pair.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ._common import header, median, verdict

GOAL = 2.0
WINDOW_WRAPPING_TOKENS = 700


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    from pytest_mlxgate.kl.prompts import default_prompts

    texts = [p.text for p in default_prompts() if p.text]
    out = []
    for i in range(n):
        text = texts[i % len(texts)]
        ids = list(tokenizer.encode(text))
        if i % 2:  # every other prompt past the window: the rows wrap at different steps
            while len(ids) < WINDOW_WRAPPING_TOKENS:
                ids += list(tokenizer.encode(" " + texts[(i + len(ids)) % len(texts)], add_special_tokens=False))
            ids = ids[:WINDOW_WRAPPING_TOKENS]
        out.append(ids)
    return out


def run(n: int, tokens: int, repeats: int, only: str = "") -> None:
    import mlx_lm
    from mlx_lm import batch_generate

    from pytest_mlxgate.capability.generate import _per_layer
    from pytest_mlxgate.models.embedded import ensure_gemma3_snapshot
    from pytest_mlxgate.serving.batch import batchable, greedy_batch
    from pytest_mlxgate.serving.kv_plan import KVPlan, KVSpec, parse_kv_value

    model, tokenizer = mlx_lm.load(str(ensure_gemma3_snapshot()))
    ids = _prompts(tokenizer, n)
    lengths = [len(x) for x in ids]
    header(
        f"gemma3-270m generation: {n} prompts ({min(lengths)}..{max(lengths)} tokens) x {tokens} new, batched vs not"
    )
    full8 = KVPlan(default=None, layers={}, types={"full_attention": KVSpec(8, 64, 0)}, source="full-8bit")
    uniform8 = parse_kv_value("8")
    plain = parse_kv_value("plain")
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    assert all(batchable(model, kv, lengths) for kv in (full8, uniform8, plain))

    def batched(kv: KVPlan) -> list[list[int]]:
        return greedy_batch(model, ids, max_new_tokens=tokens, kv=kv, eos=eos)

    def one_at_a_time(kv: KVPlan) -> list[list[int]]:
        texts = [_per_layer(model, tokenizer, x, tokens, kv) for x in ids]
        return [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def mlx_lm_batched() -> list[list[int]]:
        texts = batch_generate(model, tokenizer, ids, max_tokens=tokens).texts
        return [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    runs = {
        "full-8bit batched": lambda: batched(full8),
        "full-8bit one at a time": lambda: one_at_a_time(full8),
        "uniform-8bit batched": lambda: batched(uniform8),
        "uniform-8bit one at a time": lambda: one_at_a_time(uniform8),
        "plain batched": lambda: batched(plain),
        "plain mlx_lm batch_generate": mlx_lm_batched,
    }
    runs = {name: fn for name, fn in runs.items() if name.startswith(only)}
    greedy_batch(model, ids[:2], max_new_tokens=2, kv=full8, eos=eos)  # warm-up: weights paged in
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[list[int]]] = {}
    order = list(runs)
    for r in range(repeats):
        for name in order if r % 2 == 0 else reversed(order):
            t0 = time.perf_counter()
            outputs[name] = runs[name]()
            times[name].append(time.perf_counter() - t0)
    for name in runs:
        print(f"{name:30} median {median(times[name]):7.1f} s  ({', '.join(f'{t:.1f}' for t in times[name])})")

    def same(a: str, b: str) -> int:
        decode = tokenizer.decode
        return sum(decode(x).strip() == decode(y).strip() for x, y in zip(outputs[a], outputs[b], strict=True))

    for plan, other in (
        ("full-8bit", "one at a time"),
        ("uniform-8bit", "one at a time"),
        ("plain", "mlx_lm batch_generate"),
    ):
        fast, slow = f"{plan} batched", f"{plan} {other}"
        if fast not in runs:
            continue
        ratio = median(times[slow]) / median(times[fast])
        goal = "(reported)" if plan == "plain" else f"goal >= {GOAL}: {verdict(ratio >= GOAL)}"
        print(f"{plan}: identical outputs batched vs {other} {same(fast, slow)}/{n}")
        print(f"{plan}: {other} / batched = {ratio:.2f}x  {goal}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="sliding_batch")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run the pair of one plan: full, uniform or plain")
    args = parser.parse_args(argv)
    run(args.prompts, args.tokens, args.repeats, args.only)
