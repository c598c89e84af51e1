"""The code stays ruff-clean and mypy-clean (the tools come with the test extras)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff():
    r = run("ruff", "check", "specd", "plugins", "lsp", "tests", "scripts")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format():
    r = run("ruff", "format", "--check", ".")
    assert r.returncode == 0, "run `ruff format` and commit:\n" + r.stdout + r.stderr


@pytest.mark.slow
def test_mypy():
    r = run("mypy")  # files from [tool.mypy]; its cache stays in this checkout
    assert r.returncode == 0, r.stdout + r.stderr
