"""The shape every module of the package keeps (meshsched/, daemon/ and cli/, as installed: meshsched, meshsched.daemon,
meshsched.cli): small modules, short functions, no reach into another module's `_private` names, no import cycles.

Each test lists its offenders (path:line and what to fix) in its failure message. Lazy imports inside functions count
as imports; those under `if TYPE_CHECKING:` do not (they never run, so they make no cycle).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"meshsched": "meshsched", "daemon": "meshsched.daemon", "cli": "meshsched.cli"}  # pyproject package-dir
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
SELF_NAMES = {"self", "cls"}
STDLIB_PRIVATE = {("os", "_exit"), ("sys", "_getframe")}  # documented underscore APIs of the standard library


@dataclass(frozen=True)
class Module:
    name: str  # dotted, as installed (daemon/node.py is meshsched.daemon.node)
    rel: str  # path from the repository root
    text: str

    @property
    def is_package(self) -> bool:
        return self.rel.endswith("__init__.py")


@cache
def _modules() -> dict[str, Module]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            dotted = ".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else [parts[-1]])))
            found[dotted] = Module(dotted, path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    return found


@cache
def _tree(name: str) -> ast.Module:
    module = _modules()[name]
    return ast.parse(module.text, filename=module.rel)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the statements inside `if TYPE_CHECKING:` blocks."""
    inside = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: Module) -> list[tuple[str, int]]:
    """The package's modules this one imports (at any level, TYPE_CHECKING blocks left out), with the import's line."""
    known, tree = _modules(), _tree(module.name)
    skip = _type_checking_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside c: the deepest known module
                target = target.rpartition(".")[0]
            if target and target != module.name:
                out.append((target, node.lineno))
    return out


def test_no_module_is_over_600_lines():
    long = sorted((len(m.text.splitlines()), m.rel) for m in _modules().values())
    offenders = [f"{rel}: {n} lines" for n, rel in reversed(long) if n > MAX_MODULE_LINES]
    if offenders:
        pytest.fail(f"modules over {MAX_MODULE_LINES} lines (split them):\n" + "\n".join(offenders), pytrace=False)


def test_no_function_is_over_80_lines():
    offenders = []
    for module in _modules().values():
        for node in ast.walk(_tree(module.name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{module.rel}:{node.lineno} {node.name}: {length} lines")
    if offenders:
        pytest.fail(f"functions over {MAX_FUNCTION_LINES} lines, def to last line (split them):\n" +
                    "\n".join(sorted(offenders)), pytrace=False)


def _defined_names(tree: ast.Module) -> set[str]:
    """Every name this module defines: functions, classes, assignment targets (dataclass fields included), attributes
    set on self/cls, `__slots__` entries and import aliases."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.partition(".")[0])
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def _is_self(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in SELF_NAMES) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_reaches_into_another_modules_private_names():
    offenders = []
    for module in _modules().values():
        tree = _tree(module.name)
        own = _defined_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr) and not _is_self(node.value):
                receiver = node.value.id if isinstance(node.value, ast.Name) else None
                if node.attr not in own and (receiver, node.attr) not in STDLIB_PRIVATE:
                    offenders.append(f"{module.rel}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and _absolute(module, node).startswith("meshsched"):
                offenders += [f"{module.rel}:{node.lineno}: from {_absolute(module, node)} import {alias.name}"
                              for alias in node.names if _is_private(alias.name)]
    if offenders:
        pytest.fail("another module's _private names (make them public, or move the code that needs them into the "
                    "module that defines them):\n" + "\n".join(sorted(set(offenders), key=_by_place)), pytrace=False)


def _by_place(line: str) -> tuple[str, int]:
    path, number, _ = line.split(":", 2)
    return path, int(number)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    modules = _modules()
    edges = {name: _imports(m) for name, m in modules.items()}
    graph = {name: {target for target, _ in imports} for name, imports in edges.items()}
    lines = []
    for component in _cycles(graph):
        links = [f"{a} imports {b} ({modules[a].rel}:{n})" for a in component for b, n in sorted(set(edges[a]))
                 if b in component]
        lines.append(f"cycle among {', '.join(component)}:\n    " + "\n    ".join(links))
    if lines:
        pytest.fail("import cycles (lazy imports count; move what both sides need where it belongs):\n" +
                    "\n".join(lines), pytrace=False)
