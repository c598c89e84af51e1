"""Every hook is documented: in its docstring (:param: and :returns:) and in docs/plugins.md.

A new hookspec without a section in the plugin guide, or without its parameters described,
fails here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pluggy
import pytest

from specd import hookspecs

ROOT = Path(__file__).resolve().parent.parent
PLUGINS_MD = ROOT / "docs" / "plugins.md"
EXAMPLE_MODULE = ROOT / "docs" / "examples" / "specd-example-drafter" / "specd_example_drafter.py"


def _hookspecs() -> dict[str, Any]:
    pm = pluggy.PluginManager("specd")
    pm.add_hookspecs(hookspecs)
    specs = {}
    for name, caller in vars(pm.hook).items():
        if isinstance(caller, pluggy.HookCaller) and caller.spec is not None:
            specs[name] = caller.spec
    return specs


HOOKSPECS = _hookspecs()


def _headings(markdown: str) -> set[str]:
    """Hook names that appear in a Markdown heading, with or without backticks."""
    return set(re.findall(r"^#{2,6} +`?(specd_\w+)`?", markdown, flags=re.MULTILINE))


def test_the_hookspecs_are_found():
    assert "specd_register_drafters" in HOOKSPECS


@pytest.mark.parametrize("name", sorted(HOOKSPECS))
def test_hook_has_a_section_in_plugins_md(name):
    documented = _headings(PLUGINS_MD.read_text(encoding="utf-8"))
    assert name in documented, f"docs/plugins.md has no heading for the hook {name}"


@pytest.mark.parametrize("name", sorted(HOOKSPECS))
def test_hook_is_in_the_architecture_hook_list(name):
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f"`{name}(" in text, f"docs/architecture.md does not list the hook {name}"


@pytest.mark.parametrize("name", sorted(HOOKSPECS))
def test_hook_docstring_describes_params_and_result(name):
    spec = HOOKSPECS[name]
    doc = inspect.getdoc(spec.function) or ""
    assert doc.strip(), f"hookspec {name} has no docstring"
    for param in spec.argnames:
        assert f":param {param}:" in doc, (
            f"hookspec {name} does not describe {param!r} with :param {param}:"
        )
    assert ":returns:" in doc, f"hookspec {name} has no :returns: line"
    if spec.opts.get("firstresult"):
        assert "Stops at first non-None result" in doc, (
            f"hookspec {name} is firstresult and must say so"
        )


def test_plugins_md_shows_the_example_module_as_it_is():
    """The guide walks through the example plugin's module; the two must not drift apart."""
    markdown = PLUGINS_MD.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)
    source = EXAMPLE_MODULE.read_text(encoding="utf-8")
    assert source in blocks, (
        "docs/plugins.md must quote docs/examples/.../specd_example_drafter.py verbatim"
    )


def _relative_links(markdown: str) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [link for link in links if not re.match(r"[a-z]+:", link)]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_resolve(page):
    """Relative links in the README and docs/ point at files (and headings) that exist."""
    path = ROOT / page
    broken = []
    for link in _relative_links(path.read_text(encoding="utf-8")):
        target, _, anchor = link.partition("#")
        file = (path.parent / target) if target else path
        if not file.exists():
            broken.append(link)
        elif (
            anchor
            and file.suffix == ".md"
            and anchor not in _anchors(file.read_text(encoding="utf-8"))
        ):
            broken.append(link)
    assert not broken, f"{page} has broken links: {broken}"


@pytest.mark.parametrize("page", ["docs/architecture.md", "docs/plugins.md"])
def test_source_files_named_in_the_docs_exist(page):
    """The docs point readers at modules by path; a renamed module must take its docs along."""
    text = (ROOT / page).read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:specd|lsp|plugins)/[\w/]+\.py)`", text))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"{page} names source files that do not exist: {missing}"
