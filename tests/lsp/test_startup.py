"""Starting the server: a busy port fails at once, before the model loads; the model loads
behind the protocol, and a model that cannot load ends the server with one line."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from lsp_testing import RawClient
from lsprotocol import types
from specd.lsp.completer import CompletionResult
from specd.lsp.server import SpecdServer
from specd.lsp.service import Service

from specd import Engine
from specd.cli import main
from specd.forward.tiny import tiny_target


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


def test_a_session_is_served_before_the_model_is_loaded_and_requests_wait_for_it():
    """Guards against a session that needs the engine to start (a server built on
    ``service.engine.tokenize`` blocks until the load ends, so ``initialize`` waits for
    the model), against ``didOpen`` holding the event loop until the model is there (it
    measured the document with the engine's tokenizer), and against a request made
    before the model is there failing instead of waiting for it. The model is attached by
    another thread, as the loader does, only once the session has answered ``initialize``."""
    service = Service(None)
    outcome: dict[str, object] = {}

    def load() -> None:
        service.attach(Engine(tiny_target()))

    async def scenario() -> None:
        ls = SpecdServer(service)
        ls.start(types.InitializeParams(capabilities=types.ClientCapabilities()))
        outcome["initialized_before_the_model"] = not service.ready
        threading.Timer(0.5, load).start()
        ls.open(types.TextDocumentItem("file:///w/a.py", "python", 1, "def f(x):\n    return "))
        outcome["opened_before_the_model"] = not service.ready
        request = ls.request("file:///w/a.py", types.Position(1, 11))
        outcome["result"] = await asyncio.wait_for(ls.complete(request), 120)

    runner = threading.Thread(target=lambda: asyncio.run(scenario()), daemon=True)
    try:
        runner.start()
        runner.join(90)
        assert not runner.is_alive(), "the session blocked on the engine"
        assert outcome["initialized_before_the_model"] is True
        assert outcome["opened_before_the_model"] is True  # didOpen left the loop free
        result = outcome["result"]
        assert isinstance(result, CompletionResult)
        # answered at its first line; the worker adds the stats when the generation ends
        deadline = time.monotonic() + 60
        while result.stats is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert result.stats is not None and result.stats.new_tokens > 0
    finally:
        service.close()


@pytest.mark.slow
def test_a_model_that_cannot_load_ends_the_server_with_one_line_and_exit_2(tmp_path):
    """Guards against a load that fails behind the protocol and leaves a server that
    answers ``initialize`` and then never answers a completion."""
    client = RawClient("--model", str(tmp_path / "no-such-model"))
    try:
        code = client.proc.wait(120)
    finally:
        client.close()
    err = b"".join(client.stderr).decode()
    assert code == 2
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "no-such-model" in line] == [
        err.strip().splitlines()[-1]
    ]
