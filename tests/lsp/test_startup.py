"""Starting the daemon: a busy port fails at once, before the model loads."""

from __future__ import annotations

import socket

import pytest

from specd.cli import main


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_busy_port_is_one_line_and_exit_2_before_the_model_loads(busy_port, tmp_path, capsys):
    """Guards against checking the port only after loading the model: with a model that
    does not exist, the error must still be the port's (a load first would fail on the
    model, after seconds of loading a real one)."""
    missing = tmp_path / "no-such-model"
    code = main(["serve", "--tcp", f"127.0.0.1:{busy_port}", "--model", str(missing)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"127.0.0.1:{busy_port}: the port is in use" in err
