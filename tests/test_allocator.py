import subprocess
import sys

import pytest

from specd import allocator


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_allocator_takes_the_thresholds_in_a_fresh_process():
    code = "from specd import allocator; print(allocator.keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_specd_malloc_system_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setenv("SPECD_MALLOC", "system")
    assert allocator.keep_freed_memory() is False


def test_the_cli_sets_the_thresholds_before_running_a_command(monkeypatch):
    from specd import cli

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    assert cli.main(["plugins", "--json"]) == 0
    assert calls == [1]
