"""BFCL (Berkeley Function Calling Leaderboard) v4, single-turn AST categories, scored offline.

Five categories: simple (python), multiple (pick the right one of several functions), parallel
(several calls of one function), parallel_multiple, and irrelevance (no function fits: the model must
not call one). Data comes from the `bfcl-eval` package. Functions reach the model through its chat
template's `tools` when the template supports them, else through BFCL's own prompting-mode system
prompt (functions as JSON, calls as `[func(a=1), ...]`). Whatever format the model answers in is
parsed by `toolcalls` and checked by a matcher that follows BFCL's AST checker (see `check_calls`).
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..base import Item, ItemResult, RunOptions, TaskDataMissing, Tier, chat_render, prompt_hash
from ..data import package_file
from ..toolcalls import ToolCall, parse_tool_calls

__all__ = [
    "CATEGORIES",
    "CATEGORY_FILES",
    "BfclTask",
    "Check",
    "TASK",
    "check_call",
    "check_calls",
    "convert_schema",
    "fallback_system_prompt",
    "supports_tools",
]

CATEGORY_FILES: dict[str, str] = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
    "irrelevance": "BFCL_v4_irrelevance.json",
}
CATEGORIES: tuple[str, ...] = tuple(CATEGORY_FILES)
_FIX = (
    "pip install --no-deps bfcl-eval  (the package ships BFCL's data files: "
    "bfcl_eval/data/BFCL_v4_*.json and bfcl_eval/data/possible_answer/)"
)

# BFCL's type names -> JSON schema (OpenAI tools). "any" gets no type: any JSON value.
_SCHEMA_TYPES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "integer": "integer",
    "number": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "object": "object",
}
# BFCL's checker, Python flavour: the exact Python type each declared type must have.
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}

# BFCL's default prompting-mode system prompt (ret_fmt=python, func_doc_fmt=json, plaintext, classic).
_SYSTEM_PROMPT = (
    "You are an expert in composing functions.You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "If none of the functions can be used, point it out. If the given question lacks the parameters "
    "required by the function, also point it out.\n\n"
    "You should only return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)].  "
    "You SHOULD NOT include any other text in the response.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within the "
    "current turn. Continue to output functions to call until you have fulfilled the user's request to "
    "the best of your ability. Once you have no more functions to call, the system will consider the "
    "current turn complete and proceed to the next turn or task.\n\n"
    "Here is a list of functions in json format that you can invoke.\n{functions}\n"
)


# ---- data ------------------------------------------------------------------------------------------


def _read_jsonl(relative: str) -> list[dict[str, Any]]:
    path = package_file("bfcl_eval", relative)
    if path is None:
        raise TaskDataMissing(f"BFCL data file {relative} not found. Install it offline-ready with: {_FIX}")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if isinstance(r, dict)]


@cache
def _category_items(category: str) -> tuple[Item, ...]:
    """Every item of one category, in file order (cached: the files do not change under a run)."""
    questions = _read_jsonl(f"data/{CATEGORY_FILES[category]}")
    answers: dict[str, Any] = {}
    if category != "irrelevance":
        for row in _read_jsonl(f"data/possible_answer/{CATEGORY_FILES[category]}"):
            answers[row["id"]] = row["ground_truth"]
    items = []
    for q in questions:
        if category != "irrelevance" and q["id"] not in answers:
            raise TaskDataMissing(f"BFCL item {q['id']} has no possible answer; reinstall: {_FIX}")
        functions = q["function"]
        items.append(
            Item(
                id=str(q["id"]),
                messages=tuple(dict(m) for m in q["question"][0]),
                tools=tuple(convert_schema(f) for f in functions),
                target={"category": category, "possible_answer": answers.get(q["id"]), "functions": functions},
                meta={"category": category},
            )
        )
    return tuple(items)


def convert_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI-style tool (`dict`->object, `float`->number, `tuple`->array)."""
    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": _convert_type(copy.deepcopy(dict(function.get("parameters", {})))),
        },
    }


def _convert_type(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    t = schema.get("type")
    if t == "any":
        del schema["type"]
    elif isinstance(t, str):
        schema["type"] = _SCHEMA_TYPES.get(t, t)
    if isinstance(schema.get("properties"), dict):
        schema["properties"] = {k: _convert_type(v) for k, v in schema["properties"].items()}
    if "items" in schema:
        schema["items"] = _convert_type(schema["items"])
    schema.pop("optional", None)  # not JSON schema; `required` already says it
    return schema


# ---- presentation ----------------------------------------------------------------------------------


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tools` (else the text fallback is used)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        inner = getattr(tokenizer, "_tokenizer", None)
        template = getattr(inner, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    if isinstance(template, list):  # HF's [{"name": ..., "template": ...}] form
        template = " ".join(str(t.get("template", "")) if isinstance(t, dict) else str(t) for t in template)
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def fallback_system_prompt(functions: Sequence[Mapping[str, Any]]) -> str:
    """BFCL's prompting-mode system prompt: the functions as JSON and the `[f(a=1)]` call format."""
    return _SYSTEM_PROMPT.replace("{functions}", json.dumps(list(functions), indent=4))


# ---- matching (BFCL's AST checker, Python flavour) -------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A matcher outcome: ok, or the BFCL-style error type and a message."""

    ok: bool
    error_type: str = ""
    message: str = ""


_OK = Check(True)


def _standardize(s: str) -> str:
    """BFCL's string normalisation: drop spaces and `,./-_*^`, lowercase, single -> double quotes."""
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std_list(values: Sequence[Any]) -> list[Any]:
    return [_standardize(v) if isinstance(v, str) else v for v in values]


def _answer_type(allowed: Sequence[Any]) -> type | None:
    for a in allowed:
        if a != "":
            return type(a)
    return None


def _type_check(
    param: str, value: Any, allowed: Sequence[Any], expected: type, nested: type | None
) -> tuple[Check, bool]:
    """(result, is_variable) as BFCL's `type_checker`: a value of the answers' own type is a variable."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    values: Any = value
    if type(value) is expected:
        if nested is None:
            return _OK, is_variable
        for allowed_item in allowed:
            fine = True
            if isinstance(allowed_item, list):  # BFCL: each value item must type-check one level deep
                for v in values:
                    if not _type_check(param, v, allowed_item, nested, None)[0].ok:
                        fine = False
                        break
            if fine:
                return _OK, is_variable
    if answer_type is not None and type(value) is answer_type:
        return _OK, True
    return Check(
        False, "type_error", f"{param!r}: expected {expected.__name__}, got {type(value).__name__} {value!r}"
    ), False


def _dict_check(param: str, value: Mapping[Any, Any], allowed: Sequence[Any]) -> Check:
    result = Check(False, "value_error:dict", f"{param!r}: no allowed dict matches {value!r}")
    for answer in allowed:
        if answer == "" or not isinstance(answer, dict):
            continue
        bad = ""
        for k, v in value.items():
            if k not in answer:
                bad = f"{param!r}: unexpected key {k!r}"
                break
            sv = _standardize(v) if isinstance(v, str) else v
            if sv not in _std_list(answer[k]):
                bad = f"{param!r}[{k!r}]: {v!r} not in {answer[k]!r}"
                break
        if not bad:
            for k, v in answer.items():
                if k not in value and "" not in v:
                    bad = f"{param!r}: missing key {k!r}"
                    break
        if not bad:
            return _OK
        result = Check(False, "value_error:dict", bad)
    return result


def _list_dict_check(param: str, value: Sequence[Any], allowed: Sequence[Any]) -> Check:
    result = Check(False, "value_error:list_dict", f"{param!r}: no allowed list of dicts matches")
    for answer in allowed:
        if not isinstance(answer, list) or len(answer) != len(value):
            result = Check(False, "value_error:list_dict_count", f"{param!r}: wrong number of dicts")
            continue
        checks = [
            _dict_check(param, v, [a])
            if isinstance(v, dict)
            else Check(False, "value_error:list_dict", f"{param!r}: {v!r} is not a dict")
            for v, a in zip(value, answer, strict=True)
        ]
        bad = next((c for c in checks if not c.ok), None)
        if bad is None:
            return _OK
        result = bad
    return result


def check_call(function: Mapping[str, Any], call: ToolCall, answer: Mapping[str, Any]) -> Check:
    """One call against one possible answer `{name: {param: [allowed...]}}` (BFCL's simple checker)."""
    name, allowed_by_param = next(iter(answer.items()))
    if call.name != name:
        return Check(False, "wrong_func_name", f"called {call.name!r}, expected {name!r}")
    params = function.get("parameters", {})
    details: Mapping[str, Any] = params.get("properties", {})
    for req in params.get("required", []):
        if req not in call.arguments:
            return Check(False, "missing_required", f"missing required parameter {req!r}")
    for param, value in call.arguments.items():
        if param not in details or param not in allowed_by_param:
            return Check(False, "unexpected_param", f"unexpected parameter {param!r}")
        allowed: list[Any] = list(allowed_by_param[param])
        declared = str(details[param].get("type", "any"))
        expected = _PY_TYPES.get(declared, str)
        nested: type | None = None
        if declared in ("array", "tuple"):
            items = details[param].get("items")
            if isinstance(items, dict):
                nested = _PY_TYPES.get(str(items.get("type", "any")), str)
        if declared == "float" and type(value) is int:  # Python's int -> float, as BFCL allows
            value = float(value)
        type_result, is_variable = _type_check(param, value, allowed, expected, nested)
        if not type_result.ok:
            return type_result
        if not is_variable:
            if expected is dict:
                result = _dict_check(param, value, allowed)
            elif expected is list and nested is dict:
                result = _list_dict_check(param, value, allowed)
            elif expected is str:
                ok = _standardize(value) in [_standardize(a) for a in allowed if isinstance(a, str)]
                result = (
                    _OK
                    if ok
                    else Check(False, "value_error:string", f"{param!r}: {value!r} not in {allowed!r} (normalised)")
                )
            elif expected is list:
                std = _std_list(value)
                ok = any(isinstance(a, list) and std == _std_list(a) for a in allowed)
                result = _OK if ok else Check(False, "value_error:list", f"{param!r}: {value!r} not in {allowed!r}")
            else:
                result = (
                    _OK if value in allowed else Check(False, "value_error", f"{param!r}: {value!r} not in {allowed!r}")
                )
            if not result.ok:
                return result
            continue
        if value not in allowed:
            return Check(False, "value_error", f"{param!r}: {value!r} not in {allowed!r}")
    for param, allowed_values in allowed_by_param.items():
        if param not in call.arguments and "" not in allowed_values:
            return Check(False, "missing_optional", f"parameter {param!r} is required by the answer")
    return _OK


def _canonical_name(name: str, functions: Sequence[Mapping[str, Any]]) -> str:
    """The offered function `name` means; `a_b` for `a.b` too (OpenAI-style names can't hold dots)."""
    names = [str(f["name"]) for f in functions]
    if name in names:
        return name
    dotless = [n for n in names if n.replace(".", "_") == name]
    return dotless[0] if len(dotless) == 1 else name


def check_calls(
    functions: Sequence[Mapping[str, Any]], calls: Sequence[ToolCall], possible_answer: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """(verdict, reason) for calls vs all possible answers, matched in any order.

    Follows BFCL's AST checker: the count must match; each answer needs its own call that passes
    the simple checker. BFCL pairs greedily; this finds a full matching if any exists (the same
    verdict except where BFCL's greedy pairing would miss one).
    """
    if not calls:
        return "no_call", "no function call"
    calls = [ToolCall(_canonical_name(c.name, functions), c.arguments) for c in calls]
    expected = [next(iter(a)) for a in possible_answer]
    if {c.name for c in calls} != set(expected):
        return "wrong_function", f"called {sorted(c.name for c in calls)}, expected {sorted(expected)}"
    if len(calls) != len(possible_answer):
        return "wrong_args", f"{len(calls)} calls, expected {len(possible_answer)}"
    by_name = {str(f["name"]): f for f in functions}
    ok = [
        [check_call(by_name.get(name, {}), c, a) for c in calls]
        for name, a in zip(expected, possible_answer, strict=True)
    ]
    owner: dict[int, int] = {}  # call index -> answer index

    def assign(i: int, seen: set[int]) -> bool:
        for j in range(len(calls)):
            if ok[i][j].ok and j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(possible_answer)):
        if not assign(i, set()):
            same = [r for r, c in zip(ok[i], calls, strict=True) if c.name == expected[i]]
            first = same[0] if same else Check(False, "unmatched", "")
            return "wrong_args", f"answer {i} ({expected[i]}) unmatched: {first.error_type}: {first.message}"
    return "correct", ""


# ---- the task --------------------------------------------------------------------------------------


class BfclTask:
    """The `Task` for BFCL: pass/fail per item (a call set either matches or it does not)."""

    name = "bfcl"
    graded = False
    max_new_tokens = 256
    smoke_n = 30

    def configured(self, options: RunOptions) -> BfclTask:
        """No run option applies to this task (it keeps no per-run state): the shared object serves every run."""
        return self

    def load(self, tier: Tier, *, n: int | None = None, seed: int = 0) -> list[Item]:
        """smoke: `n` (30) items spread evenly over the five categories; full: all 1240 (or `n`, spread)."""
        by_cat = {c: _category_items(c) for c in CATEGORIES}
        if tier == "full" and n is None:
            return [it for c in CATEGORIES for it in by_cat[c]]
        n = self.smoke_n if n is None else n
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[Item] = []
        for k, c in enumerate(CATEGORIES):
            want = min(n // len(CATEGORIES) + (1 if k < n % len(CATEGORIES) else 0), len(by_cat[c]))
            rng = random.Random(f"bfcl:{c}:{seed}")
            out.extend(by_cat[c][i] for i in sorted(rng.sample(range(len(by_cat[c])), want)))
        return out

    def render(self, item: Item, tokenizer: Any) -> str:
        """Tools through the chat template if it takes them, else BFCL's system prompt in text."""
        messages = [dict(m) for m in item.messages or ()]
        if supports_tools(tokenizer):
            return chat_render(tokenizer, messages, tools=item.tools)
        system = fallback_system_prompt(item.target["functions"])
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = system + "\n\n" + str(messages[0].get("content", ""))
        else:
            messages.insert(0, {"role": "system", "content": system})
        return chat_render(tokenizer, messages)

    def score(self, item: Item, output: str, *, choice_logprobs: Sequence[float] | None = None) -> ItemResult:
        """Parse the output's calls and match them; irrelevance passes exactly when nothing is called."""
        target = item.target
        parsed = parse_tool_calls(output)
        detail: dict[str, Any] = {
            "category": target["category"],
            "format": parsed.format,
            "calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.calls],
            "notes": list(parsed.notes),
        }
        if target["category"] == "irrelevance":
            if parsed.calls:
                verdict, reason = "unexpected_call", f"called {[c.name for c in parsed.calls]}"
            else:
                verdict, reason = "correct", parsed.reason
        elif not parsed.calls and parsed.malformed:
            verdict, reason = "parse_error", parsed.reason
        elif not parsed.calls:
            verdict, reason = "no_call", parsed.reason
        else:
            verdict, reason = check_calls(target["functions"], parsed.calls, target["possible_answer"])
        detail["reason"] = reason
        return ItemResult(
            item_id=item.id,
            prompt_hash=prompt_hash(_hash_source(item)),
            output=output,
            score=1.0 if verdict == "correct" else 0.0,
            verdict=verdict,
            detail=detail,
        )


def _hash_source(item: Item) -> str:
    """Scoring has no tokenizer: hash the item's content (the runner records the rendered prompt's)."""
    return json.dumps(
        {"id": item.id, "messages": list(item.messages or ()), "tools": list(item.tools or ())},
        sort_keys=True,
        default=str,
    )


TASK = BfclTask()
