"""The example plugin in docs/examples/ is a real distribution: install it, find it, verify it.

The example is installed into the running environment (from a copy, so no build output lands
in the source tree) and uninstalled afterwards, unless it was already installed before the
test started: the environment is left as it was found.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "specd-example-drafter"
DISTRIBUTION = "specd-example-drafter"
DRAFTER = "bigram"


def _installed() -> bool:
    try:
        distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return False
    return True


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _specd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("specd")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "specd.cli"]
    env = {k: v for k, v in os.environ.items() if k != "SPECD_LOAD_PLUGINS"}  # load everything
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory):
    was_installed = _installed()
    source = tmp_path_factory.mktemp("example") / EXAMPLE.name
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
    )
    # Offline and without touching specd itself: no index, no dependencies, the
    # environment's own setuptools.
    done = _pip("install", "--no-index", "--no-deps", "--no-build-isolation", str(source))
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    try:
        yield
    finally:
        if not was_installed:
            undone = _pip("uninstall", "--yes", DISTRIBUTION)
            assert undone.returncode == 0, f"pip uninstall failed:\n{undone.stderr}"


def test_example_declares_the_specd_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["name"] == DISTRIBUTION
    assert meta["project"]["entry-points"]["specd"] == {DRAFTER: "specd_example_drafter"}


@pytest.mark.slow
def test_specd_plugins_lists_the_installed_example(installed_example):
    done = _specd("plugins", "--json")
    assert done.returncode == 0, done.stderr
    drafters = {d["name"]: d["module"] for d in json.loads(done.stdout)["drafters"]}
    assert drafters.get(DRAFTER) == "specd_example_drafter"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("specd.conformance.command") is None,
    reason="`specd verify` (specd.conformance.command) is not part of this checkout yet",
)
def test_specd_verify_passes_the_installed_example(installed_example):
    done = _specd("verify", "--drafter", DRAFTER, timeout=500)
    assert done.returncode == 0, (
        f"specd verify --drafter {DRAFTER} failed:\n{done.stdout}\n{done.stderr}"
    )
