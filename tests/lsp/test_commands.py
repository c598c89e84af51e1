"""`specd serve`, `specd complete` and `specd stats` from the command line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
from lsp_testing import SERVER_ENV

from specd.cli import main

SOURCE = "def add(a, b):\n    return a + b\n\nresult = add(1, "


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(SOURCE)
    return path


def _complete(capsys, *args) -> tuple[int, str, str]:
    code = main(["complete", *map(str, args), "--model", "tiny", "--max-tokens", "8"])
    out, err = capsys.readouterr()
    return code, out, err


def test_complete_in_process_prints_json(source, capsys):
    code, out, _ = _complete(capsys, source, "--line", 4, "--col", 17, "--json")
    assert code == 0
    result = json.loads(out)
    assert {"text", "token_ids", "stats", "finish_reason"} <= result.keys()
    assert result["stats"]["new_tokens"] == len(result["token_ids"]) <= 8


@pytest.mark.parametrize(
    ("line", "col", "message"),
    [
        (0, 1, "--line 0: "),
        (9, 1, "has lines 1 to 4"),
        (4, 99, "--col 99: line 4 has columns 1 to 17"),
    ],
)
def test_complete_positions_outside_the_file_exit_2(source, capsys, line, col, message):
    code, _, err = _complete(capsys, source, "--line", line, "--col", col)
    assert code == 2 and message in err


def test_complete_bad_config_exits_2_naming_the_field(source, tmp_path, capsys):
    config = tmp_path / "lsp.toml"
    config.write_text("max-lines = 0\n")
    code, _, err = _complete(capsys, source, "--line", 1, "--col", 1, "--config", config)
    assert code == 2 and "`max-lines`" in err


@pytest.mark.slow
def test_complete_builds_its_engine_with_the_drafter_options(source, capsys):
    """``complete`` builds the engine the options describe: a drafter option reaches the
    drafter's constructor (a builder that drops it would complete without complaint)."""
    code, _, err = _complete(
        capsys, source, "--line", 4, "--col", 17, "--drafter-option", "no_such_option=1"
    )
    assert code == 2 and "no_such_option" in err


def test_serve_refuses_a_non_loopback_address(capsys):
    assert main(["serve", "--tcp", "0.0.0.0:8765", "--model", "tiny"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["serve", "--tcp", "8765", "--model", "tiny"]) == 2


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["serve", "--http", "0.0.0.0:8765", "--model", "tiny"], "--http"),
        (["serve", "--tcp", "x:99999", "--model", "tiny"], "--tcp"),
        (["complete", __file__, "--line", "1", "--col", "1", "--server", "nope"], "--server"),
        (["stats", "--server", "nope"], "--server"),
    ],
)
def test_a_bad_address_is_named_by_the_flag_that_gave_it(capsys, argv, flag):
    """Guards against ``--server nope`` reported as ``--tcp 'nope'``."""
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"specd: error: {flag} ")


@pytest.mark.slow
def test_daemon_serves_complete_and_stats_over_tcp(source, tmp_path, capsys):
    # Both sides compare the whole completion, so neither may be cut by the time budget
    # (a loaded machine can spend the default 2 s on a first request).
    config = tmp_path / "untimed.toml"
    config.write_text("time-budget-ms = 600000\n")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specd.cli",
            "serve",
            "--tcp",
            "127.0.0.1:0",
            "--model",
            "tiny",
            "--max-tokens",
            "8",
            "--config",
            str(config),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=SERVER_ENV,
    )
    try:
        for line in daemon.stderr:
            m = re.search(r"serving on (127\.0\.0\.1:\d+)", line)
            if m:
                address = m.group(1)
                break
        else:
            raise AssertionError("the daemon did not start")
        local = _complete(capsys, source, "--line", 4, "--col", 17, "--json", "--config", config)
        remote = _complete(capsys, source, "--line", 4, "--col", 17, "--json", "--server", address)
        again = _complete(
            capsys, source, "--line", 4, "--col", 17, "--json", "--server", address
        )  # a second session
        assert local[0] == remote[0] == again[0] == 0
        # the same pipeline: greedy decoding gives the same completion here and there
        assert (
            json.loads(remote[1])["text"]
            == json.loads(local[1])["text"]
            == json.loads(again[1])["text"]
        )
        assert main(["stats", "--server", address, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["requests"] == 2 and report["completed"] == 2
        assert main(["stats", "--server", address]) == 0
        assert "prefix cache" in capsys.readouterr().out
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0


def test_stats_without_a_daemon_exits_2(capsys):
    assert main(["stats", "--server", "127.0.0.1:1"]) == 2
    assert "specd serve --tcp" in capsys.readouterr().err
