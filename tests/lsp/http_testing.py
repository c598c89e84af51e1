"""Helpers for the HTTP server tests: start ``specd serve --http`` (a subprocess, or the
same application in this process for tests that must hold a generation still), and talk to
it with a real HTTP client (``http.client``)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
SPECD = [sys.executable, "-m", "specd.cli"]


class HttpServer:
    """``specd serve --http 127.0.0.1:0 ARGS...`` in a subprocess."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*SPECD, "serve", "--http", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=ENV,
            text=True,
        )
        assert self.proc.stderr is not None
        self.log: list[str] = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"serving HTTP on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        else:
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class InProcessServer:
    """The application of ``specd serve --http`` on a loop thread of this process."""

    def __init__(self, service: Any) -> None:
        from specd.lsp.http import start

        self.service = service
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        future = asyncio.run_coroutine_threadsafe(start(service, "127.0.0.1", 0), self.loop)
        self.runner, (self.host, self.port) = future.result(timeout=30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.service.runner.close()
        self.loop.call_soon_threadsafe(self.loop.stop)


def request(
    server: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request; (status, raw body). ``body`` is sent as JSON unless it is bytes."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(
            method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def post(server: Any, path: str, body: Any, **kw: Any) -> tuple[int, dict[str, Any]]:
    status, raw = request(server, "POST", path, body, **kw)
    return status, json.loads(raw)


def events(raw: bytes) -> Iterator[str]:
    """The ``data:`` payloads of a server-sent event stream."""
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            yield block[len("data: ") :]


def metrics(server: Any) -> dict[str, float]:
    """``GET /metrics`` as {sample name with labels: value}."""
    status, raw = request(server, "GET", "/metrics")
    assert status == 200
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the server")
        time.sleep(0.02)
