"""The dependency arrows point one way: ``lsp -> specd <- plugins``.

The core (specd/) imports neither the language server nor a plugin, not even by a string
handed to importlib, and nothing imports the command line's module ``specd.cli`` (commands
share ``specd.options``). The language server and the plugins import only the core's public
API: the package ``specd`` and the documented modules. No module imports one that imports
it back, directly or through others (an import inside a function counts; one under ``if
TYPE_CHECKING:`` does not, since it never runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What ``from specd...`` may name outside the core: the package and its documented modules
# (docs/architecture.md, Layering): ``specd.options`` for commands, ``specd.jsonrpc`` for
# the base protocol's framing, ``specd.checks`` for reading plugin options.
PUBLIC = {"specd", "specd.options", "specd.jsonrpc", "specd.checks"}
# What a plugin may name: the package, ``specd.options`` for the commands it adds and
# ``specd.checks`` for its constructor's options.
PLUGIN_PUBLIC = {"specd", "specd.options", "specd.checks"}


def _modules(folder: str, package: str) -> list[tuple[Path, str]]:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT / folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((path, ".".join((package, *parts))))
    return out


CORE = _modules("specd", "specd")
LSP = _modules("lsp", "specd.lsp")
PLUGINS = _modules("plugins", "specd.plugins")
ALL = {m for _, m in CORE + LSP + PLUGINS}


def _imports(path: Path, module: str, *, runtime: bool = False) -> set[str]:
    """Every module ``path`` imports, by absolute name (relative imports resolved).

    :param runtime: only the imports that run: not those under ``if TYPE_CHECKING:``, and
        ``from PACKAGE import MODULE`` names the module, not the package (Python imports
        the package first, but the package's own modules are imported by it, not it by
        them: counting it would make every package a circle with its modules).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in _walk(tree, skip_type_checking=runtime):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # ``from . import x`` and ``from specd import options`` import modules too
            modules = {f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in ALL}
            names |= modules
            if not runtime or len(modules) < len(node.names):
                names.add(name)
    return names


def _walk(tree: ast.AST, *, skip_type_checking: bool):
    """``ast.walk``, leaving out the bodies of ``if TYPE_CHECKING:`` when asked."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if skip_type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _strings(path: Path) -> set[str]:
    """String constants other than docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    }


@pytest.mark.parametrize("path, module", CORE, ids=[m for _, m in CORE])
def test_the_core_names_nothing_above_it(path, module):
    above = ("specd.lsp", "specd.plugins")
    bad = {n for n in _imports(path, module) if n.startswith(above)}
    bad |= {s for s in _strings(path) if "specd.lsp" in s or "specd.plugins." in s}
    assert not bad, f"{module} names {sorted(bad)}"


@pytest.mark.parametrize(
    "path, module", CORE + LSP + PLUGINS, ids=[m for _, m in CORE + LSP + PLUGINS]
)
def test_nothing_imports_the_command_line_module(path, module):
    assert "specd.cli" not in _imports(path, module), f"{module} imports specd.cli"


@pytest.mark.parametrize("path, module", LSP, ids=[m for _, m in LSP])
def test_the_language_server_uses_only_the_public_core(path, module):
    private = {
        n
        for n in _imports(path, module)
        if n.startswith("specd.") and not n.startswith("specd.lsp") and n not in PUBLIC
    }
    assert not private, f"{module} imports {sorted(private)} (use what specd exports)"


@pytest.mark.parametrize("path, module", PLUGINS, ids=[m for _, m in PLUGINS])
def test_plugins_use_only_the_public_core(path, module):
    """A plugin is written against what a third-party plugin can import: ``specd``'s
    exported names and ``specd.options``; other first-party plugins' modules are its own."""
    private = {
        n
        for n in _imports(path, module)
        if n.startswith("specd.") and not n.startswith("specd.plugins") and n not in PLUGIN_PUBLIC
    }
    assert not private, f"{module} imports {sorted(private)} (use what specd exports)"


def import_graph() -> dict[str, set[str]]:
    """Module -> the first-party modules it imports when it runs."""
    graph = {}
    for path, module in CORE + LSP + PLUGINS:
        deps = set()
        for name in _imports(path, module, runtime=True):
            while name and name not in ALL:  # ``from x.y import name``: the module x.y
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_a_package_and_its_modules_are_not_a_circle():
    """``from . import llama, openai`` in lsp/http/app.py names those two modules, not the
    package lsp/http/__init__.py, which imports app.py."""
    graph = import_graph()
    assert {"specd.lsp.http.llama", "specd.lsp.http.openai"} <= graph["specd.lsp.http.app"]
    assert "specd.lsp.http" not in graph["specd.lsp.http.app"]
    assert "specd.lsp.http.app" in graph["specd.lsp.http"]


def test_no_import_circles():
    assert circles(import_graph()) == []
