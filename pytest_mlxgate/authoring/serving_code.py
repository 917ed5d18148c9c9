"""The serving code a calibration was measured on, as one digest: the package code that changes the
numbers (`SERVING_CODE`), each file by the sha256 of its syntax tree without docstrings, imports or
annotations, so that formatting, comments and docstrings do not make a calibration stale, and a stale
file names the files that changed. Only the standard library."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["PACKAGE", "SERVING_CODE", "assigned_name", "code_digests", "serving_code", "source_digest"]

PACKAGE = Path(__file__).resolve().parents[1]
#: The package code that changes what a calibration measured (paths under pytest_mlxgate/; `FILE::NAME`
#: is one top-level definition of a file whose rest does not): the arms' logits and the serving loop
#: (kl/arms.py, serving/), how each lever changes an arm (levers/: patching, weights quantization, the
#: plain-ops kernels; serving/kv_plan.py: KV plans), which token ids are scored (kl/prompts.py and its
#: default set, kl/shape.py's step sizes), the per-token KL (stats/divergence.py, its blocks and threads
#: in stats/row_blocks.py), the arms and the A/A variant (kl/measure.py's measure_kl, _aa, _ReferenceAgain,
#: aa_chunk) and its floors (kl/result.py's aa_floors), the intervals the limits compare (stats/intervals.py,
#: stats/kl_stats.py) and the speed and memory trials (speed/). Not the assertions, reports or records:
#: they read the numbers, they do not make them.
SERVING_CODE = (
    "kl/arms.py",
    "stats/divergence.py",
    "kl/measure.py::measure_kl",
    "kl/measure.py::_aa",
    "kl/measure.py::_ReferenceAgain",
    "kl/measure.py::aa_chunk",
    "kl/prompts.py",
    "kl/prompts_default.jsonl",
    "kl/result.py::aa_floors",
    "kl/shape.py",
    "serving/attention.py",
    "serving/batch.py",
    "serving/caches.py",
    "serving/kv_plan.py",
    "levers/lever.py",
    "levers/patching.py",
    "levers/reference_ops.py",
    "levers/weights.py",
    "stats/intervals.py",
    "stats/kl_stats.py",
    "stats/row_blocks.py",
    "speed/measure.py",
    "speed/shape.py",
)


class _WhatItComputes(ast.NodeTransformer):
    """A syntax tree without what does not change what the code computes: docstrings, imports (where
    a name is imported from: the files that compute are digested themselves), `if TYPE_CHECKING:`
    blocks and type annotations. So moving an import, typing a function or rewording a docstring
    leaves a calibration fresh; changing an expression does not."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list):
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:]
            node.body = body or [ast.Pass()]  # type: ignore[attr-defined]
        return node

    def visit_Import(self, node: ast.Import) -> None:
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None

    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            return None
        return self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:  # a bare declaration (a dataclass field): its name counts, not its type
            return ast.Expr(value=node.target)
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, lineno=0))


def source_digest(path: Path, name: str | None = None) -> str:
    """sha256 of a Python file's syntax tree without docstrings, imports, type annotations and
    `TYPE_CHECKING` blocks (`_WhatItComputes`; formatting and comments do not count either), or of
    its top-level definition `name` alone; of the bytes for any other file; "absent" for a file or
    definition that is not there."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "absent"
    if path.suffix != ".py":
        return hashlib.sha256(data).hexdigest()
    try:
        tree = ast.parse(data, filename=str(path))
    except SyntaxError:
        return hashlib.sha256(data).hexdigest()
    if name is not None:
        found = [stmt for stmt in tree.body if _defines(stmt) == name]
        if not found:
            return "absent"
        tree = ast.Module(body=found, type_ignores=[])
    return hashlib.sha256(ast.dump(_WhatItComputes().visit(tree)).encode()).hexdigest()


def _defines(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name
    return assigned_name(stmt)


def code_digests(root: Path, files: Iterable[str]) -> dict[str, Any]:
    """{"digest": one sha256 over them all, "files": {entry: sha256}} of `files` under `root` (an
    entry `FILE::NAME`: that file's top-level definition NAME)."""
    digests = {
        entry: source_digest(root / entry.partition("::")[0], entry.partition("::")[2] or None) for entry in files
    }
    whole = hashlib.sha256("".join(f"{n}\0{d}\n" for n, d in sorted(digests.items())).encode()).hexdigest()
    return {"digest": whole, "files": digests}


def serving_code() -> dict[str, Any]:
    """The serving code digest of the installed package (`SERVING_CODE`)."""
    return code_digests(PACKAGE, SERVING_CODE)


def assigned_name(stmt: ast.stmt) -> str | None:
    """The one name a top-level assignment binds (None: not such an assignment)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None
