"""The dependency arrows point one way: ``lsp -> specd <- plugins``.

The core (specd/) imports neither the language server nor a plugin, not even by a string
handed to importlib, and nothing imports the command line's module ``specd.cli`` (commands
share ``specd.options``). The language server imports only the core's public API.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What ``from specd...`` may name outside the core: the package and its documented modules.
PUBLIC = {"specd", "specd.options"}


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


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, by absolute name (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            names.add(name)
            # ``from . import x`` and ``from specd import options`` import modules too
            names.update(f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in ALL)
    return names


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
