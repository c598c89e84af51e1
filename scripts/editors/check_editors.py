#!/usr/bin/env python3
"""Run the editor configurations of docs/editors.md headless, as written.

    python scripts/editors/check_editors.py                 # every editor found here
    python scripts/editors/check_editors.py nvim-0.7 emacs  # some of them
    python scripts/editors/check_editors.py --list          # the blocks and editors found

For each configuration, the block under its heading in docs/editors.md is copied verbatim
into an init file; the editor starts headless with it on a small Python file, and a check
script (nvim_check.lua, eglot_check.el, next to this file) waits for the specd client to
attach, types ``(`` at the end of the file, and asks for a completion item and an inline
completion. One JSON line per editor is printed; the exit status is 0 when every
editor run attached and got both completions back, 1 otherwise.

The blocks start ``specd``: the directory of this Python's ``specd`` command goes first on
PATH, so the checked server is this checkout's. A settings file in a temporary config
directory lifts the time budget (a loaded machine still answers); ``--model`` wraps the
command so the server loads that model (the tests use ``tiny``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent.parent / "docs" / "editors.md"
# The check types "(" at the end: a completion there starts no word of its own, so even
# the tiny model's random characters are a suggestion the post-processing keeps.
SAMPLE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci"
)


@dataclass(frozen=True)
class Editor:
    """A configuration of docs/editors.md and the editor versions that run it."""

    key: str
    heading: str  # the heading the block sits under
    language: str  # the block's fence language
    program: str  # nvim | emacs
    versions: tuple[tuple[int, int], tuple[int, int]]  # lowest, highest (inclusive)


EDITORS = (
    Editor("nvim-0.7", "### Neovim 0.7 to 0.10", "lua", "nvim", ((0, 7), (0, 10))),
    Editor("nvim-0.11", "### Neovim 0.11", "lua", "nvim", ((0, 11), (0, 11))),
    Editor("nvim-0.12", "### Neovim 0.12", "lua", "nvim", ((0, 12), (0, 99))),
    Editor("emacs", "## Emacs (eglot)", "elisp", "emacs", ((28, 0), (99, 0))),
)


def block(editor: Editor, doc: str | None = None) -> str:
    """The first ``language`` code block under the editor's heading in docs/editors.md."""
    text = doc if doc is not None else DOC.read_text(encoding="utf-8")
    start = text.find(editor.heading + "\n")
    if start < 0:
        raise SystemExit(f"docs/editors.md has no heading {editor.heading!r}")
    found = re.compile(r"^```" + editor.language + r"\n(.*?)^```", re.M | re.S).search(text, start)
    if not found:
        raise SystemExit(f"no ```{editor.language} block under {editor.heading!r}")
    return found.group(1)


def version(binary: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(?:NVIM v|GNU Emacs )(\d+)\.(\d+)", out.stdout)
    return (int(m[1]), int(m[2])) if m else None


def binaries(program: str) -> list[str]:
    """Candidate binaries: $SPECD_NVIM/$SPECD_EMACS, PATH, beside this Python (a pip-installed
    Neovim), the system's."""
    found = [os.environ.get(f"SPECD_{program.upper()}", "")]
    found += [shutil.which(program) or "", str(Path(sys.executable).with_name(program))]
    found += [f"/usr/bin/{program}", f"/usr/local/bin/{program}"]
    out: list[str] = []
    for b in found:
        if b and os.access(b, os.X_OK) and os.path.realpath(b) not in map(os.path.realpath, out):
            out.append(b)
    return out


def find(editor: Editor) -> str | None:
    """An installed binary whose version runs this configuration."""
    low, high = editor.versions
    for b in binaries(editor.program):
        v = version(b)
        if v is not None and low <= v <= high:
            return b
    return None


def run(editor: Editor, binary: str, *, model: str | None = None, timeout: float = 300) -> dict:
    """Run one configuration headless. :returns: the check's JSON result (plus the
    editor's output when it printed none)."""
    with tempfile.TemporaryDirectory(prefix="specd-editor-") as tmp:
        root = Path(tmp)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (root / "config" / "specd").mkdir(parents=True)
        (root / "config" / "specd" / "lsp.toml").write_text("time-budget-ms = 600000\n")
        project = root / "project"
        project.mkdir()
        source = project / "fib.py"
        source.write_text(SAMPLE)
        specd = Path(sys.executable).with_name("specd")
        if model is not None or not specd.exists():
            wrapper = bin_dir / "specd"
            extra = f" --model {model}" if model else ""
            wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m specd.cli "$@"{extra}\n')
            wrapper.chmod(0o755)
        env = {
            **os.environ,
            "PATH": os.pathsep.join([str(bin_dir), str(specd.parent), os.environ.get("PATH", "")]),
            "XDG_CONFIG_HOME": str(root / "config"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        if editor.program == "nvim":
            init = root / "init.lua"
            init.write_text(block(editor))
            cmd = [binary, "--headless", "-u", str(init)]
            cmd += ["-c", f"luafile {HERE / 'nvim_check.lua'}", str(source)]
        else:
            init = root / "init.el"
            init.write_text(block(editor))
            cmd = [binary, "--batch", "-l", str(init), "-l", str(HERE / "eglot_check.el")]
            cmd += [str(source)]
        try:
            proc = subprocess.run(
                cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {"editor": editor.key, "ok": False, "error": f"no result in {timeout:g} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"output": (proc.stdout + proc.stderr)[-2000:]}
    result["editor"] = editor.key
    result["ok"] = bool(
        not result.get("init_error")
        and result.get("attached") is True
        and result.get("inline")
        and result.get("completion")
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("editors", nargs="*", help=f"some of {', '.join(e.key for e in EDITORS)}")
    p.add_argument("--model", help="the model the server loads (default: its default)")
    p.add_argument("--list", action="store_true", help="show the editors found and stop")
    args = p.parse_args(argv)
    chosen = [e for e in EDITORS if not args.editors or e.key in args.editors]
    unknown = set(args.editors) - {e.key for e in EDITORS}
    if unknown:
        p.error(f"unknown editor(s): {', '.join(sorted(unknown))}")
    ok = True
    for editor in chosen:
        binary = find(editor)
        if args.list or binary is None:
            print(json.dumps({"editor": editor.key, "binary": binary}))
            ok = ok and (args.list or not args.editors)
            continue
        result = run(editor, binary, model=args.model)
        print(json.dumps(result))
        ok = ok and result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
