"""BFCL task: data, presentation, the tool-call parser and the AST-style matcher.

Correct answers are built from BFCL's own possible answers (first allowed value of each needed
parameter) and sent in several output formats; perturbations of them must fail with the right
verdict, so a matcher that accepts everything (or nothing) fails here.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.capability.base import Item, TaskDataMissing
from pytest_mlxgate.capability.tasks import bfcl
from pytest_mlxgate.capability.tasks.bfcl import TASK, check_call, check_calls, convert_schema, supports_tools
from pytest_mlxgate.capability.toolcalls import MAX_CHARS, ToolCall, parse_tool_calls

Call = tuple[str, dict[str, Any]]
EXPECTED_COUNTS = {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}


# ---- helpers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def all_items() -> list[Item]:
    return TASK.load("full")


def _by_cat(items: list[Item], cat: str) -> list[Item]:
    return [i for i in items if i.meta["category"] == cat]


def _pick(value: Any) -> Any:
    """A concrete value from an allowed value (dict answers hold lists of allowed values per key)."""
    if isinstance(value, dict):
        return {k: _pick(next(x for x in a if x != "")) for k, a in value.items() if "" not in a}
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return [_pick(x) for x in value]
    return value


def gold_calls(item: Item) -> list[Call]:
    """A correct call set: every required (or non-optional) parameter at its first allowed value."""
    functions = {f["name"]: f for f in item.target["functions"]}
    calls: list[Call] = []
    for answer in item.target["possible_answer"]:
        ((name, params),) = answer.items()
        required = functions[name]["parameters"].get("required", [])
        args = {
            p: _pick(next(v for v in allowed if v != ""))
            for p, allowed in params.items()
            if not ("" in allowed and p not in required)
        }
        calls.append((name, args))
    return calls


def hermes(calls: list[Call]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def bare_json(calls: list[Call]) -> str:
    return json.dumps([{"name": n, "arguments": a} for n, a in calls])


def python_call(calls: list[Call]) -> str:
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls) + "]"


def openai(calls: list[Call]) -> str:
    return json.dumps(
        {"tool_calls": [{"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls]}
    )


def llama3(calls: list[Call]) -> str:
    return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls) + "<|eom_id|>"


def mistral(calls: list[Call]) -> str:
    return "[TOOL_CALLS] " + bare_json(calls)


def fenced(calls: list[Call]) -> str:
    return "Here you go:\n```json\n" + bare_json(calls) + "\n```"


FORMATS = {
    "hermes": hermes,
    "json": bare_json,
    "python": python_call,
    "openai": openai,
    "llama3": llama3,
    "mistral": mistral,
    "fenced": fenced,
}


@pytest.fixture(scope="module")
def sample(all_items: list[Item]) -> list[Item]:
    """20 real items: 5 from each category that has answers, spread through each file."""
    out: list[Item] = []
    for cat in ("simple", "multiple", "parallel", "parallel_multiple"):
        items = _by_cat(all_items, cat)
        out.extend(items[k * len(items) // 5] for k in range(5))
    return out


def _perturb_value(v: Any) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + 1000
    if isinstance(v, str):
        return v + " zzz"
    if isinstance(v, list):
        return [*v, v[0]] if v else ["zzz"]
    if isinstance(v, dict):
        return {**v, "zzz_unknown_key": 1}
    return "zzz"


# ---- data ------------------------------------------------------------------------------------------


def test_category_files_and_counts(all_items: list[Item]) -> None:
    assert bfcl.CATEGORY_FILES["simple"] == "BFCL_v4_simple_python.json"
    assert Counter(i.meta["category"] for i in all_items) == EXPECTED_COUNTS
    assert len({i.id for i in all_items}) == len(all_items) == 1240
    for item in all_items:
        assert item.messages and item.messages[-1]["role"] == "user"
        assert item.tools and len(item.tools) == len(item.target["functions"])
        has_answer = item.target["possible_answer"] is not None
        assert has_answer == (item.meta["category"] != "irrelevance"), item.id


def test_smoke_is_deterministic_and_evenly_spread() -> None:
    a, b = TASK.load("smoke"), TASK.load("smoke")
    assert [i.id for i in a] == [i.id for i in b]
    assert Counter(i.meta["category"] for i in a) == {c: 6 for c in bfcl.CATEGORIES}
    assert [i.id for i in TASK.load("smoke", seed=1)] != [i.id for i in a]
    seven = Counter(i.meta["category"] for i in TASK.load("smoke", n=7))
    assert sorted(seven.values()) == [1, 1, 1, 2, 2] and sum(seven.values()) == 7
    assert TASK.name == "bfcl" and TASK.graded is False and TASK.max_new_tokens == 256


def test_missing_data_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bfcl, "package_file", lambda *_: None)
    bfcl._category_items.cache_clear()
    try:
        with pytest.raises(TaskDataMissing, match="pip install"):
            TASK.load("smoke", n=5)
    finally:
        monkeypatch.undo()
        bfcl._category_items.cache_clear()


def test_schemas_are_converted_to_json_schema_types(all_items: list[Item]) -> None:
    def types(schema: Any) -> list[Any]:
        if isinstance(schema, dict):
            own = [schema["type"]] if isinstance(schema.get("type"), str) else []
            return own + [t for v in schema.values() for t in types(v)]
        if isinstance(schema, list):
            return [t for v in schema for t in types(v)]
        return []

    seen = Counter(t for i in all_items for tool in i.tools or () for t in types(tool["function"]["parameters"]))
    assert not {"dict", "float", "tuple", "any"} & set(seen)
    assert {"object", "number", "array", "integer", "string", "boolean"} <= set(seen)
    tool = convert_schema(
        {
            "name": "f",
            "description": "d",
            "parameters": {
                "type": "dict",
                "properties": {"x": {"type": "any"}, "p": {"type": "tuple", "items": {"type": "float"}}},
                "required": ["x"],
            },
        }
    )
    params = tool["function"]["parameters"]
    assert tool["type"] == "function" and params["type"] == "object"
    assert "type" not in params["properties"]["x"]
    assert params["properties"]["p"] == {"type": "array", "items": {"type": "number"}}


# ---- scoring real items ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gold_calls_are_correct_in_every_format(sample: list[Item], fmt: str) -> None:
    for item in sample:
        out = FORMATS[fmt](gold_calls(item))
        r = TASK.score(item, out)
        assert (r.verdict, r.score) == ("correct", 1.0), (item.id, fmt, r.detail, out)
        assert r.detail["calls"] and r.item_id == item.id


def test_all_answerable_items_accept_their_gold_calls(all_items: list[Item]) -> None:
    """The whole dataset, not just the sample: the matcher agrees with BFCL's answers everywhere."""
    bad = [
        i.id
        for i in all_items
        if i.meta["category"] != "irrelevance" and TASK.score(i, python_call(gold_calls(i))).verdict != "correct"
    ]
    assert bad == []


def test_wrong_function_name(sample: list[Item]) -> None:
    for item in sample:
        calls = gold_calls(item)
        calls[0] = ("not_a_function", calls[0][1])
        r = TASK.score(item, hermes(calls))
        assert r.verdict == "wrong_function" and r.score == 0.0, (item.id, r.detail)


def test_multiple_choosing_another_offered_function(all_items: list[Item]) -> None:
    for item in _by_cat(all_items, "multiple")[:20]:
        ((name, args),) = gold_calls(item)
        other = next(f["name"] for f in item.target["functions"] if f["name"] != name)
        assert TASK.score(item, python_call([(other, args)])).verdict == "wrong_function"


def test_missing_required_parameter(sample: list[Item]) -> None:
    for item in sample:
        calls = gold_calls(item)
        name, args = calls[0]
        func = next(f for f in item.target["functions"] if f["name"] == name)
        required = func["parameters"]["required"]
        if not required:
            continue
        calls[0] = (name, {k: v for k, v in args.items() if k != required[0]})
        assert TASK.score(item, bare_json(calls)).verdict == "wrong_args", item.id


def test_unknown_extra_parameter(sample: list[Item]) -> None:
    for item in sample:
        calls = gold_calls(item)
        calls[-1] = (calls[-1][0], {**calls[-1][1], "zzz_not_a_param": 1})
        assert TASK.score(item, python_call(calls)).verdict == "wrong_args", item.id


def test_wrong_values(sample: list[Item]) -> None:
    checked = 0
    for item in sample:
        calls = gold_calls(item)
        name, args = calls[0]
        for key in args:
            bad = dict(args, **{key: _perturb_value(args[key])})
            r = TASK.score(item, python_call([(name, bad), *calls[1:]]))
            assert r.verdict == "wrong_args", (item.id, key, bad, r.detail)
            checked += 1
    assert checked >= 20


def test_parallel_calls_match_in_any_order_but_not_in_any_number(all_items: list[Item]) -> None:
    for item in _by_cat(all_items, "parallel")[:10] + _by_cat(all_items, "parallel_multiple")[:10]:
        calls = gold_calls(item)
        assert len(calls) >= 2
        assert TASK.score(item, hermes(calls[::-1])).verdict == "correct"
        assert TASK.score(item, python_call(calls[1:] + calls[:1])).verdict == "correct"
        assert TASK.score(item, hermes(calls[:-1] + calls[:1])).verdict != "correct"  # a duplicate, one missing
        short = TASK.score(item, hermes(calls[:-1]))
        assert short.verdict in {"wrong_args", "wrong_function"} and short.score == 0.0


def test_no_call_and_parse_error(sample: list[Item]) -> None:
    item = sample[0]
    assert TASK.score(item, "I'm not sure which function to use.").verdict == "no_call"
    assert TASK.score(item, "").verdict == "no_call"
    assert TASK.score(item, "[]").verdict == "no_call"
    assert TASK.score(item, '<tool_call>{"name": "f", "arguments": {</tool_call>').verdict == "parse_error"
    assert TASK.score(item, "[calculate(base=10,").verdict == "parse_error"


def test_irrelevance(all_items: list[Item]) -> None:
    items = _by_cat(all_items, "irrelevance")[:20]
    for item in items:
        func = item.target["functions"][0]
        args = {p: 1 for p in func["parameters"].get("required", [])}
        for out in (
            hermes([(func["name"], args)]),
            python_call([(func["name"], args)]),
            python_call([("some_other_function", {})]),
        ):
            r = TASK.score(item, out)
            assert (r.verdict, r.score) == ("unexpected_call", 0.0), (item.id, out)
        for prose in (
            "None of the provided functions can answer this question.",
            "The answer is 42.",
            "",
            f"[{func['name']}(",
            "[]",
        ):
            r = TASK.score(item, prose)
            assert (r.verdict, r.score) == ("correct", 1.0), (item.id, prose)


# ---- matcher semantics (BFCL's AST checker) --------------------------------------------------------

FUNC = {
    "name": "geo.lookup",
    "parameters": {
        "type": "dict",
        "required": ["city", "radius"],
        "properties": {
            "city": {"type": "string"},
            "radius": {"type": "float"},
            "count": {"type": "integer"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "dict", "properties": {"k": {"type": "string"}}},
        },
    },
}
ANSWER = {
    "geo.lookup": {
        "city": ["New York City", "NYC"],
        "radius": [5.0],
        "count": [3, ""],
        "exact": [True, ""],
        "tags": [["Food", "Bars"], ""],
        "meta": [{"k": ["v"]}, ""],
    }
}


@pytest.mark.parametrize(
    "args,ok",
    [
        ({"city": "new york city", "radius": 5.0}, True),  # case-insensitive
        ({"city": "New-York  City.", "radius": 5}, True),  # punctuation/space normalised; int for float
        ({"city": "NYC", "radius": 5.0, "count": 3, "exact": True}, True),
        ({"city": "NYC", "radius": 5.0, "tags": ["food", "bars"], "meta": {"k": "V"}}, True),
        ({"city": "Boston", "radius": 5.0}, False),
        ({"city": "NYC", "radius": 5.5}, False),
        ({"city": "NYC", "radius": "5.0"}, False),  # a string is not a float
        ({"city": "NYC", "radius": 5.0, "count": 3.0}, False),  # a float is not an integer
        ({"city": "NYC", "radius": 5.0, "count": True}, False),  # nor is a bool
        ({"city": "NYC", "radius": 5.0, "tags": ["Bars", "Food"]}, False),  # lists keep their order
        ({"city": "NYC", "radius": 5.0, "meta": {"k": "v", "x": "y"}}, False),
        ({"city": "NYC"}, False),
        ({"city": "NYC", "radius": 5.0, "unknown": 1}, False),
    ],
)
def test_check_call_rules(args: dict[str, Any], ok: bool) -> None:
    assert check_call(FUNC, ToolCall("geo.lookup", args), ANSWER).ok is ok


def test_check_call_needs_the_name_and_the_schema_required_params() -> None:
    good = {"city": "NYC", "radius": 5.0}
    assert not check_call(FUNC, ToolCall("geo.other", good), ANSWER).ok
    lax = {"geo.lookup": {**ANSWER["geo.lookup"], "radius": [5.0, ""]}}  # the schema still requires it
    assert check_call(FUNC, ToolCall("geo.lookup", good), lax).ok
    assert not check_call(FUNC, ToolCall("geo.lookup", {"city": "NYC"}), lax).ok


def test_same_params_different_functions_are_not_swapped() -> None:
    props = {"type": "dict", "required": ["x"], "properties": {"x": {"type": "integer"}}}
    funcs = [{"name": "f", "parameters": props}, {"name": "g", "parameters": props}]
    answers = [{"f": {"x": [1]}}, {"g": {"x": [2]}}]
    assert check_calls(funcs, [ToolCall("g", {"x": 2}), ToolCall("f", {"x": 1})], answers)[0] == "correct"
    assert check_calls(funcs, [ToolCall("f", {"x": 2}), ToolCall("g", {"x": 1})], answers)[0] == "wrong_args"


def test_extra_calls_are_wrong(sample: list[Item]) -> None:
    for item in sample:
        calls = gold_calls(item)
        r = TASK.score(item, hermes(calls + calls[:1]))
        assert r.verdict == "wrong_args" and "calls, expected" in r.detail["reason"], (item.id, r.detail)


def test_dotted_names_may_be_underscored() -> None:
    verdict, _ = check_calls([FUNC], [ToolCall("geo_lookup", {"city": "NYC", "radius": 5.0})], [ANSWER])
    assert verdict == "correct"
    verdict, _ = check_calls([FUNC], [ToolCall("geolookup", {"city": "NYC", "radius": 5.0})], [ANSWER])
    assert verdict == "wrong_function"


def test_parallel_matching_is_not_greedy() -> None:
    """Call 0 fits both answers, call 1 only the first: a full matching exists and is found."""
    f = {"name": "f", "parameters": {"type": "dict", "required": [], "properties": {"x": {"type": "integer"}}}}
    answers = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    calls = [ToolCall("f", {"x": 1}), ToolCall("f", {"x": 2})]
    assert check_calls([f], calls, answers)[0] == "correct"
    assert check_calls([f], [ToolCall("f", {"x": 2}), ToolCall("f", {"x": 2})], answers)[0] == "wrong_args"
    twice = [{"f": {"x": [1]}}, {"f": {"x": [1]}}]  # one call cannot serve two answers
    assert check_calls([f], [ToolCall("f", {"x": 1}), ToolCall("f", {"x": 2})], twice)[0] == "wrong_args"


# ---- the parser --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,fmt",
    [
        ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "hermes"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', "hermes"),  # unclosed at the end
        ('{"name": "f", "parameters": {"a": 1}}', "json"),
        ('[{"name": "f", "arguments": {"a": 1}}]', "json"),
        ('{"function": "f", "parameters": {"a": 1}}', "json"),
        (
            '{"tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]}',
            "openai",
        ),
        ("[f(a=1)]", "python"),
        ("f(a=1)", "python"),
        ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}<|eom_id|>', "llama3"),
        ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]', "mistral"),
        ('[TOOL_CALLS]f[ARGS]{"a": 1}', "mistral"),
        ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', "fenced"),
        ("```python\n[f(a=1)]\n```", "fenced"),
        ('Sure, calling it now: {"name": "f", "arguments": {"a": 1}} done.', "embedded-json"),
        ("<TOOLCALL>[f(a=1)]</TOOLCALL>", "toolcall-tag"),
    ],
)
def test_parser_formats(text: str, fmt: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.format == fmt and parsed.calls == (ToolCall("f", {"a": 1}),), parsed


def test_parser_python_values() -> None:
    parsed = parse_tool_calls("[a.b.c(x=-1.5, y=[1, (2, 3)], z={'k': None}, w=True, v=var, u=2*3), g()]")
    assert parsed.calls == (
        ToolCall("a.b.c", {"x": -1.5, "y": [1, [2, 3]], "z": {"k": None}, "w": True, "v": "var", "u": 6}),
        ToolCall("g", {}),
    )
    assert parse_tool_calls("f(1, b=2)").calls == (ToolCall("f", {"b": 2}),)  # positional: ignored, as BFCL


def test_parser_prose_is_no_call() -> None:
    for text in ("The area is base * height / 2.", "Use the function f(x) to do that.", "   ", "42"):
        parsed = parse_tool_calls(text)
        assert parsed.calls == () and not parsed.malformed and parsed.reason, (text, parsed)


def test_parser_never_executes(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (
        f"__import__('os').system('touch {marker}')",
        f"[__import__('os').system('touch {marker}')]",
        f"[f(a=(lambda: __import__('os').system('touch {marker}'))())]",
        f"<tool_call>__import__('os').system('touch {marker}')</tool_call>",
        f"[f(a=open('{marker}', 'w'))]",
        f'[f(a=exec(\'open("{marker}", "w")\'))]',
        f"[f(a=[x for x in __import__('os').system('touch {marker}')])]",
        "[f(a=9**9**9**9)]",
    ):
        parsed = parse_tool_calls(text)
        assert not any(c.name.endswith("system") for c in parsed.calls), parsed
        for c in parsed.calls:  # a nested call may only survive as inert text
            assert all(isinstance(v, (str, dict)) for v in c.arguments.values()), parsed
    assert not marker.exists()
    bad = parse_tool_calls("__import__('os').system('true')")
    assert bad.calls == () and bad.malformed and "dotted name" in bad.reason


@pytest.mark.parametrize(
    "text",
    [
        "[" * 16_000 + "]" * 16_000,
        '{"name": "f", "arguments": ' + '{"a": ' * 4_000 + "1" + "}" * 4_001,
        "[f(a=" + "[" * 5_000 + "]" * 5_000 + ")]",
        "f(" * 10_000,
        "<tool_call>" * 3_000,
        "x" * 1_000_000,
        "<tool_call>" + '{"name": "f", "arguments": {"a": 1}}' * 2 + "</tool_call>" + "\x00\ud800",
    ],
)
def test_parser_hostile_inputs_are_bounded_and_safe(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert isinstance(parsed.reason, str)
    if len(text) > MAX_CHARS:
        assert parsed.calls == () and "too long" in parsed.reason
    elif text.startswith(("[", "{", "f(")):
        assert parsed.calls == () and parsed.malformed, parsed
    json.dumps(parsed.to_json())


@pytest.mark.parametrize(
    "text",
    [
        "[" + ", ".join("f(a=1)" for _ in range(500)) + "]",
        json.dumps([{"name": "f", "arguments": {}}] * 500),
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 500,
    ],
)
def test_parser_caps_call_count(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and parsed.malformed and "many" in parsed.reason


def test_parser_contains_unexpected_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_mlxgate.capability import toolcalls

    def boom(*_: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(toolcalls, "_whole", boom)
    parsed = parse_tool_calls("[f(a=1)]")
    assert parsed.calls == () and parsed.malformed and "RuntimeError" in parsed.reason


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "<tool_call>",
                    "</tool_call>",
                    "{",
                    "}",
                    "[",
                    "]",
                    '"name"',
                    ":",
                    ",",
                    '"f"',
                    "(",
                    ")",
                    "=",
                    "f",
                    "a",
                    "1",
                    "'",
                    '"',
                    "```",
                    "[TOOL_CALLS]",
                    "[ARGS]",
                    "<|python_tag|>",
                    '"arguments"',
                    "lambda",
                    ".",
                    "**",
                    "-",
                ]
            ),
            max_size=60,
        ).map("".join),
    )
)
def test_parser_never_raises(text: str) -> None:
    parsed = parse_tool_calls(text)
    for call in parsed.calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
    json.dumps(parsed.to_json(), default=str)


# ---- presentation ----------------------------------------------------------------------------------


def test_embedded_prompt_lists_the_functions(tokenizer: Any, sample: list[Item]) -> None:
    assert supports_tools(tokenizer) is False  # SmolLM2's ChatML template has no `tools`
    for item in sample[::4]:
        text = TASK.render(item, tokenizer)
        assert text.startswith("<|im_start|>system\nYou are an expert in composing functions.")
        assert text.endswith("<|im_start|>assistant\n")
        assert "func_name1(params_name1=params_value1" in text
        for f in item.target["functions"]:
            assert json.dumps(f["name"]) in text
        assert str(item.messages[0]["content"]) in text  # type: ignore[index]


def test_fallback_prompt_is_bfcls_own_default() -> None:
    """Rebuilt from BFCL's prompt pieces (its default: python calls, JSON docs, plaintext, classic)."""
    from bfcl_eval.constants import default_prompts as dp  # type: ignore[import-untyped]

    functions = [{"name": "f.g", "description": "d", "parameters": {"type": "dict", "properties": {}}}]
    style = dp.PROMPT_STYLE_TEMPLATES["classic"]
    theirs = dp.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(
            output_format=dp.OUTPUT_FORMAT_MAPPING["python"], param_types=dp.PARAM_TYPE_MAPPING["python"]
        ),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(functions, indent=4)),
    )
    assert bfcl.fallback_system_prompt(functions) == theirs


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tool_templates_get_the_converted_schemas(sample: list[Item]) -> None:
    from transformers import AutoTokenizer

    from pytest_mlxgate.models.embedded import ensure_embedded_snapshot

    tok = AutoTokenizer.from_pretrained(os.fspath(ensure_embedded_snapshot()))
    tok.chat_template = TOOL_TEMPLATE
    assert supports_tools(tok)
    item = sample[-1]
    text = TASK.render(item, tok)
    assert "expert in composing functions" not in text and text.startswith("<|im_start|>system\nTools:")
    for tool in item.tools or ():
        assert json.dumps(tool["function"]["name"]) in text
    assert '"type": "object"' in text and '"type": "dict"' not in text
