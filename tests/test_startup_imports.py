"""What starting costs: ``import specd`` and the command line's help load no model library.

The public names resolve on first use, so ``from specd import Engine`` still works and loads
torch only then; every command's module adds its parsers with argparse alone, so
``specd --help`` and each command's ``--help`` answer without torch or transformers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import specd

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers")

#: Every ``--help`` of the command line, the commands' subcommands included.
HELPS = [
    [],
    ["generate"],
    ["plugins"],
    ["verify"],
    ["bench"],
    ["serve"],
    ["complete"],
    ["stats"],
    ["train"],
    ["train", "eagle"],
]

#: Names of the public API: one taken out breaks the plugins and packages that import it.
PUBLIC = {
    "BadInputError", "Completion", "Constraint", "ContextLengthExceeded", "ContextLimits",
    "CorpusIndex", "Delta", "Draft", "DraftContext", "Drafter", "DrafterUnavailable", "Engine",
    "ExitPolicy", "Generation", "KVCache", "ModelNotFoundError", "NgramIndex", "PluginError",
    "RequestMemory", "SamplingParams", "SpecdError", "Stats", "Target", "UnknownPluginError",
    "Verdict", "Verifier", "hookimpl", "make_drafter", "percentile", "request_memory", "sample",
    "warp",
}  # fmt: skip


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_specd_loads_no_model_library():
    out = _python(
        "import json, sys, specd\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    assert out == [], f"import specd imported {out}"


def test_no_help_loads_a_model_library():
    """Each ``--help`` runs through :func:`specd.cli.main` in one process; the first that
    imports torch or transformers is named."""
    code = f"""
import contextlib, io, json, sys
from specd.cli import main

found = {{}}
for argv in {HELPS!r}:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit as e:
            assert e.code == 0, (argv, e.code)
    assert "usage: specd" in out.getvalue(), argv
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    if heavy:
        found = {{"argv": argv, "heavy": heavy}}
        break
print(json.dumps(found))
"""
    found = _python(code)
    assert not found, f"{' '.join(['specd', *found['argv'], '--help'])} imported {found['heavy']}"


def test_the_help_process_imports_no_model_library():
    """``python -m specd.cli --help`` as its own process, every import it makes timed."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "specd.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout and "generate" in r.stdout
    imported = {line.rpartition("|")[2].strip() for line in r.stderr.splitlines()}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_the_public_names_stay_and_each_resolves():
    assert PUBLIC <= set(specd.__all__), sorted(PUBLIC - set(specd.__all__))
    for name in specd.__all__:
        assert getattr(specd, name) is not None, name
    assert specd.KVCache.__module__ == "specd.kvcache"
    from specd import Engine

    assert Engine.__module__ == "specd.engine"


def test_type_checkers_see_every_public_name():
    """The ``TYPE_CHECKING`` imports, the lazy table and ``__all__`` name the same names,
    each from the module the table says."""
    tree = ast.parse((ROOT / "specd" / "__init__.py").read_text(encoding="utf-8"))
    checked = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1
                checked.update({a.name: imp.module for a in imp.names})
    assert checked == specd._SOURCES
    assert set(checked) == set(specd.__all__)


def test_an_unknown_name_is_an_attribute_error():
    try:
        specd.Engin  # noqa: B018
    except AttributeError as e:
        assert "Engin" in str(e)
    else:
        raise AssertionError("specd.Engin resolved")


def test_a_command_that_loads_a_model_imports_torch_with_no_collection_passing_over_it():
    """Guards against the import of torch collected as it goes (three full collections over
    its objects on the Zen 3 of docs/benchmarks.md, ~0.13 s of a one-token generate) or the
    collector left off afterwards."""
    out = _python(
        "import gc, json, sys\n"
        "from specd import cli\n"
        "full = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and info['generation'] == 2"
        " and full.append(1))\n"
        "cli._import_model_library()\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'full': len(full),"
        " 'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count()}))"
    )
    assert out["torch"] and out["enabled"], out
    assert out["full"] == 0, out
    assert out["frozen"] > 10_000, out  # torch's objects, out of every later collection's way
