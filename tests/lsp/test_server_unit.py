"""The server object in-process: a failing completion is logged and answered empty."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from specd.lsp.server import SpecdServer
from specd.lsp.service import Service

from specd import Engine
from specd.forward.tiny import tiny_target


def test_a_failing_completion_is_logged_once_and_answers_empty(caplog):
    service = Service(Engine(tiny_target()))
    try:

        def broken(request):
            raise RuntimeError("drafting index exploded")

        service.completer.complete = broken
        ls = SpecdServer(service)
        ls.open(types.TextDocumentItem("file:///w/a.py", "python", 1, "x = "))

        async def twice():
            first = await ls.complete(ls.request("file:///w/a.py", types.Position(0, 4)))
            second = await ls.complete(ls.request("file:///w/a.py", types.Position(0, 4)))
            return first, second

        with caplog.at_level(logging.DEBUG, logger="specd.lsp"):
            first, second = asyncio.run(twice())
        assert first.text == second.text == ""
        assert service.metrics.errors == 2
        tracebacks = [r for r in caplog.records if r.exc_info and "exploded" in str(r.exc_info[1])]
        assert len(tracebacks) == 1  # logged once, with its traceback
    finally:
        service.close()
