"""A capability arm served over HTTP (`--mlx-cand-server`, `--mlx-ref-server`): the task's generation items
asked of the server, greedy, each output scored by the task exactly as an in-process arm's.

Each prompt goes as the text the in-process arm would generate from (the task's rendering, the local chat
template applied) to `/v1/completions`: both arms then read the same tokens, and the server's count of the
prompt's tokens is checked against the local one at every item (another tokenizer, or a server that wraps
prompts in a template of its own, is an error naming the item: its answers would be to another prompt).
Choice items are scored by the log-probabilities of given answers, which no OpenAI-compatible server gives:
a task with any is an error, never scored on the items that are left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ServerArmError
from ..remote.client import ServerClient
from .generate import prompt_length

if TYPE_CHECKING:
    from ..remote.arm import ServedArm
    from .base import Item, Task

__all__ = ["served_outputs"]


def served_outputs(
    task: Task,
    items: Sequence[Item],
    rendered: Mapping[str, str],
    server: ServedArm,
    tokenizer: Any,
    *,
    budget: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, str]:
    """Each generation item's greedy output from `server` (one request at a time: a verdict that does not
    hang on how a server batched its requests). ServerArmError on a choice item or a prompt the server
    counts otherwise than the local tokenizer."""
    choice = [it.id for it in items if it.kind == "choice"]
    if choice:
        raise ServerArmError(
            f"capability task {task.name} through server {server.endpoint.url}: {len(choice)} of its items are "
            "scored by the log-probabilities of given answers (multiple choice), which an OpenAI-compatible "
            "server does not give. Gate a generation task (gsm8k, ifeval, humaneval, bfcl, hashhop) through "
            "the server, or run this one in process"
        )
    client = ServerClient(server.endpoint)
    outputs: dict[str, str] = {}
    try:
        for done, it in enumerate(items, 1):
            prompt = rendered[it.id]
            text, counted = client.generate(prompt, max_tokens=budget)
            local = prompt_length(tokenizer, prompt)
            if counted is not None and counted != local:
                raise ServerArmError(
                    f"server {server.endpoint.url}: item {it.id} of {task.name} is {local} prompt tokens here and "
                    f"{counted} there: another tokenizer, or a template of its own around the prompt; its answer "
                    "would be to another prompt. Serve the same snapshot as the gate's other arm"
                )
            outputs[it.id] = text
            if progress is not None:
                progress(done, len(items))
    finally:
        client.close()
    return outputs
