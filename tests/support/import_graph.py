"""The package's import graph, read from the source with `ast` (nothing imported): what the layering
test checks. Every import counts — module level, inside functions, under TYPE_CHECKING — because each
is a dependency someone can trip over; `module_level_only` narrows to what importing a module runs."""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (an internal one trimmed to a module that exists)
    line: int
    module_level: bool  # run when the source is imported (not in a function, not under TYPE_CHECKING)
    in_function: bool = False  # inside a function or lambda body: run only when that is called


def modules(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `package_dir`."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(
    node: ast.AST,
    module_level: bool,
    in_function: bool = False,
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, module_level, in_function
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, False, True)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), False, in_function)
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), module_level, in_function)
        else:
            yield from _walk(child, module_level, in_function)


@functools.cache
def imports(package_dir: Path) -> tuple[Import, ...]:
    mods = modules(package_dir)
    root = package_dir.name
    found = []
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node, module_level, in_function in _walk(ast.parse(path.read_text(), str(path)), True):
            targets: list[str]
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".")[: None if is_package else -1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                # `from pkg import mod`: the module, as `import pkg.mod` (pkg itself runs first either way)
                targets = subs if len(subs) == len(node.names) else [target, *subs]
            for target in targets:
                if target == root or target.startswith(root + "."):
                    while target not in mods and "." in target:
                        target = target.rsplit(".", 1)[0]
                found.append(Import(name, target, node.lineno, module_level, in_function))
    return tuple(found)


def is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as the modules along it (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def reach(start: str, found: tuple[Import, ...], *, module_level_only: bool) -> dict[str, list[str]]:
    """Every module `start` reaches, internal and external, each with the chain of imports to it."""
    edges: dict[str, list[Import]] = {}
    for imp in found:
        if imp.module_level or not module_level_only:
            edges.setdefault(imp.source, []).append(imp)
    chains = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop()
        for imp in edges.get(node, ()):
            # importing a.b.c runs a and a.b first: their imports are reached too
            parts = imp.target.split(".")
            for target in [".".join(parts[:i]) for i in range(1, len(parts))] + [imp.target]:
                if target not in chains:
                    chains[target] = chains[node] + [f"{target} (line {imp.line} of {node})"]
                    todo.append(target)
    return chains


HOST = {"pytest", "_pytest", "pluggy"}  # the controller is a pytest process: these are always there


def internal_cycle(package_dir: Path) -> list[str] | None:
    """An import cycle among the package's modules, every import counted, or None."""
    root = package_dir.name
    edges: dict[str, set[str]] = {}
    for imp in imports(package_dir):
        if imp.target.startswith(root + ".") or imp.target == root:
            edges.setdefault(imp.source, set()).add(imp.target)
    return find_cycle(edges)


def third_party_reached(package_dir: Path, start: str, *, allowed: set[str] = HOST) -> dict[str, list[str]]:
    """The non-standard-library modules importing `start` runs (module-level imports, transitively,
    parent packages included), or that `start` itself imports anywhere; each with its chain."""
    found = imports(package_dir)
    root = package_dir.name

    def outside(module: str) -> bool:
        return not (
            module == root or module.startswith(root + ".") or is_stdlib(module) or module.split(".")[0] in allowed
        )

    chains = {k: v for k, v in reach(start, found, module_level_only=True).items() if outside(k)}
    for imp in found:
        if imp.source == start and outside(imp.target):
            chains.setdefault(imp.target, [start, f"{imp.target} (line {imp.line}, inside a function)"])
    return chains


def layer_of(module: str, layers: Sequence[str]) -> int | None:
    """The index of `module`'s layer: the longest entry that is the module or a package above it."""
    best: int | None = None
    for i, entry in enumerate(layers):
        if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > len(layers[best])):
            best = i
    return best


def upward_imports(package_dir: Path, layers: Sequence[str]) -> list[str]:
    """Every import (any kind: module level, in a function, under TYPE_CHECKING) of a module in a
    higher layer than its importer's, each as a sentence naming both and the rule it breaks."""
    root = package_dir.name
    out = []
    for imp in imports(package_dir):
        if not (imp.target == root or imp.target.startswith(root + ".")):
            continue
        source, target = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if source is None or target is None:
            out.append(f"{imp.source} (line {imp.line}) imports {imp.target}: one of them is in no layer")
        elif target > source:
            out.append(
                f"{imp.source} (line {imp.line}) imports {imp.target}: layer {source} ({layers[source]}) "
                f"may import its own layer and those below it, not layer {target} ({layers[target]})"
            )
    return out


def function_level(package_dir: Path) -> list[Import]:
    """The imports inside function bodies, every one counted (a statement naming two modules: two)."""
    return [imp for imp in imports(package_dir) if imp.in_function]
