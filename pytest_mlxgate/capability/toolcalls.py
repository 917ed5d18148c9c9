"""Tool calls out of a model's free text, in whichever common format the model chose.

Models emit calls as Hermes/Qwen `<tool_call>{json}</tool_call>`, bare JSON (`{"name", "arguments"}`,
`{"name", "parameters"}`, lists of those, OpenAI's `{"tool_calls": [...]}` with string arguments),
Python call syntax (`[f(a=1), g()]`, BFCL's prompting format), Llama-3 `<|python_tag|>`, Mistral
`[TOOL_CALLS]`, or fenced ```json blocks. A quality gate compares two arms of the same model, so the
parser must be lenient about format yet strict about meaning: Python syntax is read with `ast` as
literals only (nothing is ever evaluated or imported), input length, call count and nesting depth are
capped, and hostile or malformed text never raises: it yields no calls and a reason.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "MAX_CALLS",
    "MAX_CHARS",
    "MAX_DEPTH",
    "ParsedCalls",
    "ToolCall",
    "parse_tool_calls",
]

MAX_CHARS = 32_768  # a 256-token answer is ~1 KB; anything near this is not a tool call
MAX_CALLS = 64
MAX_DEPTH = 32  # nesting of argument values (lists/dicts), and of the JSON/ast trees we walk
_MAX_NAME = 256
_MAX_EMBEDDED_STARTS = 16
_MAX_MAGNITUDE = 1e18  # arithmetic on literals (BFCL evaluates `2*3`); bounded, never `eval`

_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>")
_TAG_RE = re.compile(r"<(tool_call|TOOLCALL)>\s*(.*?)\s*(?:</\1>|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_EMBEDDED_JSON_RE = re.compile(r'\[?\s*\{\s*"(?:name|function|tool_calls)"\s*:')
_CALL_START_RE = re.compile(r"\s*\[?\s*[A-Za-z_][\w.]*\s*\(")


class ToolCall(NamedTuple):
    """One call: the function's name and its keyword arguments (JSON-like values)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedCalls:
    """What the text held: the calls, the format that matched, and why nothing did if so."""

    calls: tuple[ToolCall, ...]
    format: (
        str | None
    )  # "hermes", "toolcall-tag", "mistral", "llama3", "json", "openai", "python", "fenced", "embedded-json"
    malformed: bool  # it looked like a call (tags, leading JSON/call syntax) but did not parse
    reason: str = ""  # why no calls were found ("" when some were)
    notes: tuple[str, ...] = ()  # leniencies applied, e.g. positional arguments ignored (as BFCL does)

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": [{"name": c.name, "arguments": c.arguments} for c in self.calls],
            "format": self.format,
            "malformed": self.malformed,
            "reason": self.reason,
            "notes": list(self.notes),
        }


class _Fail(Exception):
    """A format did not match; the message says why (becomes `ParsedCalls.reason`)."""


def parse_tool_calls(text: str, *, max_chars: int = MAX_CHARS) -> ParsedCalls:
    """All tool calls in `text`, or none with a reason. Never raises, never executes anything."""
    try:
        return _parse(text, max_chars)
    except Exception as e:  # RecursionError, MemoryError, anything a hostile input provokes
        return ParsedCalls((), None, True, f"unparseable output ({type(e).__name__})")


def _parse(text: str, max_chars: int) -> ParsedCalls:
    if not isinstance(text, str):
        return ParsedCalls((), None, False, f"output is {type(text).__name__}, not text")
    if len(text) > max_chars:
        return ParsedCalls((), None, True, f"output too long to parse ({len(text)} > {max_chars} chars)")
    for tok in _END_TOKENS:
        text = text.replace(tok, "")
    text = text.strip()
    if not text:
        return ParsedCalls((), None, False, "empty output")
    notes: list[str] = []

    tags = _TAG_RE.findall(text)
    if tags:
        fmt = "hermes" if tags[0][0] == "tool_call" else "toolcall-tag"
        try:
            calls = [c for _, body in tags for c in _from_any(body, notes)]
        except _Fail as e:
            return ParsedCalls((), fmt, True, f"<{tags[0][0]}> block: {e}")
        return _done(calls, fmt, notes)
    if "[TOOL_CALLS]" in text:
        try:
            return _done(_mistral(text.split("[TOOL_CALLS]", 1)[1], notes), "mistral", notes)
        except _Fail as e:
            return ParsedCalls((), "mistral", True, f"[TOOL_CALLS]: {e}")
    if "<|python_tag|>" in text:
        body = text.split("<|python_tag|>", 1)[1]
        try:
            return _done(_from_any(body, notes, separators=",;"), "llama3", notes)
        except _Fail as e:
            return ParsedCalls((), "llama3", True, f"<|python_tag|>: {e}")

    first_error = ""
    try:
        calls, fmt = _whole(text, notes)
        return _done(calls, fmt, notes)
    except _Fail as e:
        first_error = str(e)
    fences = _FENCE_RE.findall(text) if "```" in text else []
    if fences:
        try:
            calls = [c for body in fences if body.strip() for c in _from_any(body, notes)]
            if calls:
                return _done(calls, "fenced", notes)
        except _Fail as e:
            return ParsedCalls((), "fenced", True, f"fenced block: {e}")
    embedded = _embedded_json(text, notes)
    if embedded:
        return _done(embedded, "embedded-json", notes)
    malformed = text[0] in "[{" or bool(_CALL_START_RE.match(text))
    return ParsedCalls((), None, malformed, first_error if malformed else "no tool call found")


def _done(calls: list[ToolCall], fmt: str, notes: list[str]) -> ParsedCalls:
    if len(calls) > MAX_CALLS:
        return ParsedCalls((), fmt, True, f"too many calls ({len(calls)} > {MAX_CALLS})")
    reason = "" if calls else "an empty list of calls"
    return ParsedCalls(tuple(calls), fmt, False, reason, tuple(dict.fromkeys(notes)))


def _whole(text: str, notes: list[str]) -> tuple[list[ToolCall], str]:
    """The whole output is one format: JSON value(s), or Python call syntax (BFCL's default)."""
    if text[0] in "[{":
        try:
            calls = _from_json_text(text)
            fmt = "openai" if '"tool_calls"' in text else "json"
            return calls, fmt
        except _Fail as e:
            if text[0] == "{":
                raise
            json_error = str(e)
        try:
            return _from_python(text, notes), "python"
        except _Fail as e:
            raise _Fail(f"{json_error}; as Python: {e}") from None
    return _from_python(text, notes), "python"


def _from_any(body: str, notes: list[str], separators: str = ",;") -> list[ToolCall]:
    """A tagged/fenced payload: JSON first, then Python call syntax."""
    body = body.strip()
    if not body:
        raise _Fail("empty payload")
    try:
        return _from_json_text(body, separators)
    except _Fail as e:
        if body[0] == "{":
            raise
        json_error = str(e)
    try:
        return _from_python(body, notes)
    except _Fail as e:
        raise _Fail(f"not JSON ({json_error}) nor Python call syntax ({e})") from None


def _mistral(body: str, notes: list[str]) -> list[ToolCall]:
    """`[TOOL_CALLS] [{...}]` (v3) or `[TOOL_CALLS]name[ARGS]{...}` repeated (v11+)."""
    if "[ARGS]" not in body:
        return _from_any(body, notes)
    calls: list[ToolCall] = []
    for seg in body.split("[TOOL_CALLS]"):
        if not seg.strip():
            continue
        name, sep, args = seg.partition("[ARGS]")
        name = name.split("[CALL_ID]", 1)[0].strip()
        if not sep:
            raise _Fail("a call without [ARGS]")
        value = _json_values(args.strip(), ",;")
        if len(value) != 1:
            raise _Fail("[ARGS] must hold one JSON object")
        calls.append(ToolCall(_name(name), _arguments(value[0])))
    return calls


# ---- JSON ------------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()


def _json_values(text: str, separators: str = ",;") -> list[Any]:
    """Every JSON value in `text`, back to back (whitespace or `separators` between); all or nothing."""
    values: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and (text[i].isspace() or text[i] in separators):
            i += 1
        if i >= n:
            break
        try:
            value, i = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError) as e:
            raise _Fail(f"invalid JSON ({type(e).__name__}: {str(e)[:80]})") from None
        values.append(value)
        if len(values) > MAX_CALLS:
            raise _Fail("too many JSON values")
    if not values:
        raise _Fail("no JSON value")
    return values


def _from_json_text(text: str, separators: str = ",;") -> list[ToolCall]:
    calls: list[ToolCall] = []
    for value in _json_values(text, separators):
        calls.extend(_from_json_value(value, 0))
    return calls


def _from_json_value(value: Any, depth: int) -> list[ToolCall]:
    """A call object, or a list of them; OpenAI's `tool_calls` wrapper and `function` nesting too."""
    if depth > 3:
        raise _Fail("calls nested too deeply")
    if isinstance(value, list):
        return [c for v in value for c in _from_json_value(v, depth + 1)]
    if not isinstance(value, dict):
        raise _Fail(f"a JSON {type(value).__name__} is not a tool call")
    if isinstance(value.get("tool_calls"), list):
        return [c for v in value["tool_calls"] for c in _from_json_value(v, depth + 1)]
    fn = value.get("function")
    if isinstance(fn, dict):  # OpenAI: {"type": "function", "function": {"name", "arguments"}}
        return _from_json_value(fn, depth + 1)
    if isinstance(fn, str):  # BFCL's JSON prompting format: {"function": name, "parameters": {...}}
        return [ToolCall(_name(fn), _arguments(value.get("parameters", value.get("arguments", {}))))]
    if "name" in value:
        args = value.get("arguments", value.get("parameters", value.get("args", {})))
        return [ToolCall(_name(value["name"]), _arguments(args))]
    raise _Fail('JSON object has no "name"/"function"/"tool_calls"')


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_NAME:
        raise _Fail(f"bad function name {str(name)[:40]!r}")
    return name.strip()


def _arguments(args: Any) -> dict[str, Any]:
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            raise _Fail("arguments string is not JSON") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _Fail(f"arguments are a {type(args).__name__}, not an object")
    if _depth(args) > MAX_DEPTH:
        raise _Fail("arguments nested too deeply")
    return args


def _depth(value: Any) -> int:
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _embedded_json(text: str, notes: list[str]) -> list[ToolCall]:
    """Call-shaped JSON after some prose (`Sure: {"name": ...}`): only objects that are calls."""
    calls: list[ToolCall] = []
    end = 0
    for k, m in enumerate(_EMBEDDED_JSON_RE.finditer(text)):
        if k >= _MAX_EMBEDDED_STARTS:
            break
        start = m.start() + len(m.group()) - len(m.group().lstrip())
        if start < end:
            continue
        try:
            value, end = _DECODER.raw_decode(text, start)
            calls.extend(_from_json_value(value, 0))
        except (ValueError, RecursionError, _Fail):
            continue
    if calls:
        notes.append("tool-call JSON found inside prose")
    return calls


# ---- Python call syntax (ast, literals only) ------------------------------------------------------

_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _from_python(text: str, notes: list[str]) -> list[ToolCall]:
    """`[f(a=1), g(b="x")]` or `f(a=1)` as BFCL decodes it, but literals only: nothing runs."""
    src = text.strip("`\n ").strip("'")
    if not src.startswith("["):
        src = "[" + src
    if not src.endswith("]"):
        src = src + "]"
    try:
        tree = ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise _Fail(f"not Python call syntax ({type(e).__name__})") from None
    body = tree.body
    nodes = [body] if isinstance(body, ast.Call) else getattr(body, "elts", None)
    if not isinstance(nodes, list):
        raise _Fail("not a list of calls")
    if len(nodes) > MAX_CALLS:
        raise _Fail("too many calls")
    return [_call(node, notes, 0) for node in nodes]


def _call(node: ast.expr, notes: list[str], depth: int) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise _Fail(f"{type(node).__name__} is not a call")
    name = _dotted(node.func)
    if node.args:
        notes.append("positional arguments ignored (BFCL reads keyword arguments only)")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _Fail("**kwargs unpacking is not a literal")
        args[kw.arg] = _literal(kw.value, notes, depth + 1)
    return ToolCall(_name(name), args)


def _dotted(func: ast.expr) -> str:
    """`f`, `a.b.c`: a plain dotted name; anything else (`__import__('os').system`) is refused."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        raise _Fail("call target is not a plain dotted name")
    parts.append(func.id)
    return ".".join(reversed(parts))


def _literal(node: ast.expr, notes: list[str], depth: int) -> Any:
    """A literal value, the way BFCL resolves it, minus its `eval` of expressions and lambdas."""
    if depth > MAX_DEPTH:
        raise _Fail("argument nested too deeply")
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            return "..."
        if isinstance(node.value, (bytes, complex)):
            raise _Fail(f"{type(node.value).__name__} literal")
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):  # tuples become lists, as JSON would carry them
        return [_literal(e, notes, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                raise _Fail("**dict unpacking is not a literal")
            key = _literal(k, notes, depth + 1)
            if isinstance(key, (dict, list)):
                raise _Fail("unhashable dict key")
            out[key] = _literal(v, notes, depth + 1)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand, notes, depth + 1)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Fail("sign on a non-number")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        a, b = _literal(node.left, notes, depth + 1), _literal(node.right, notes, depth + 1)
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in (a, b)):
            raise _Fail("arithmetic on non-numbers")
        if abs(a) > _MAX_MAGNITUDE or abs(b) > _MAX_MAGNITUDE:
            raise _Fail("number too large for arithmetic")
        try:
            result = _ARITH[type(node.op)](a, b)
        except ZeroDivisionError:
            raise _Fail("division by zero") from None
        notes.append("arithmetic on literals computed")
        return result
    if isinstance(node, ast.Name):  # BFCL: a bare identifier is a variable, compared as its name
        return node.id
    if isinstance(node, ast.Call):  # nested call: BFCL keeps it as text (or {name: args}); never run
        if node.keywords:
            inner = _call(node, notes, depth + 1)
            return {inner.name: inner.arguments}
        return ast.unparse(node)
    raise _Fail(f"unsupported expression {type(node).__name__}")
