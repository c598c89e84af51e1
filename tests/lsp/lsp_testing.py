"""Helpers for the language-server tests (a module, not a conftest, so tests import it).

End-to-end tests start the real server (``specd serve --stdio``) with ``--model tiny``:
a tiny random model (``specd.forward.tiny``), so a server starts in seconds and nothing is
downloaded. Its completions are random characters; the tests check the protocol, not the
text.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from specd.lsp.client import read_frame

SERVER = [sys.executable, "-m", "specd.cli", "serve", "--stdio", "--model", "tiny"]
# One thread per server: the suite runs several servers at once on few cores.
SERVER_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class RawClient:
    """A byte-level LSP client over a server subprocess's stdio, for sending what a
    well-behaved client never would."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, verbose: int = 0) -> None:
        command = SERVER if not verbose else [*SERVER[:3], "-" + "v" * verbose, *SERVER[3:]]
        self.proc = subprocess.Popen(
            [*command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or SERVER_ENV,
        )
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._next = 0

    # -- sending -------------------------------------------------------------------------

    def send_body(self, body: bytes) -> None:
        self.send_bytes(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_body(json.dumps(message).encode())

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: Any = None) -> int:
        """Send a request; :returns: its id (see :meth:`response`)."""
        self._next += 1
        self.send({"jsonrpc": "2.0", "id": self._next, "method": method, "params": params})
        return self._next

    def call(self, method: str, params: Any = None, timeout: float = 60) -> dict[str, Any]:
        return self.response(self.request(method, params), timeout)

    def initialize(self, options: Any = None) -> dict[str, Any]:
        result = self.call(
            "initialize",
            {
                "processId": None,
                "rootUri": "file:///w",
                "capabilities": {},
                "initializationOptions": options,
            },
        )
        self.notify("initialized", {})
        return result

    # -- receiving -----------------------------------------------------------------------

    def next_message(self, timeout: float = 60) -> dict[str, Any]:
        msg = self._messages.get(timeout=timeout)
        if msg is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.1)  # the stderr reader's last lines
            said = b"".join(self.stderr).decode(errors="replace")[-3000:]
            raise EOFError(
                f"the server closed its output (exit code {self.proc.returncode}); "
                f"its stderr ends:\n{said}"
            )
        return msg

    def response(self, msg_id: Any, timeout: float = 60) -> dict[str, Any]:
        """The response to ``msg_id``, skipping notifications and other responses."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.next_message(max(deadline - time.monotonic(), 0.01))
            if msg.get("id") == msg_id and "method" not in msg:
                return msg

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            msg = read_frame(out)
            self._messages.put(msg)
            if msg is None:
                return

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def close(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            try:
                self.call("shutdown", timeout=timeout)
                self.notify("exit")
            except (OSError, EOFError, queue.Empty):
                pass
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
