"""A minimal blocking LSP client for the CLI's talks with a running daemon
(``specd complete --server``, ``specd stats --server``)."""

from __future__ import annotations

import os
import socket
from typing import Any

from specd import BadInputError, SpecdError
from specd.jsonrpc import frame, read_frame


class DaemonError(SpecdError):
    """The daemon answered a request with an error."""


class Client:
    """One connection to ``specd serve --tcp``, initialized and ready for requests.

    Offers only the UTF-32 position encoding, so positions are plain character counts.
    """

    def __init__(self, host: str, port: int, *, timeout: float = 60.0) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise BadInputError(
                f"cannot connect to a specd daemon at {host}:{port} ({e.strerror or e}); "
                f"start one with: specd serve --tcp {host}:{port}"
            ) from e
        self._file = self._sock.makefile("rb")
        self._next_id = 0
        self.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": None,
                "capabilities": {"general": {"positionEncodings": ["utf-32"]}},
                "clientInfo": {"name": "specd-cli"},
            },
        )
        self.notify("initialized", {})

    def request(self, method: str, params: Any) -> Any:
        self._next_id += 1
        my_id = self._next_id
        self._send({"jsonrpc": "2.0", "id": my_id, "method": method, "params": params})
        while True:
            msg = self._receive()
            if msg.get("id") == my_id and ("result" in msg or "error" in msg):
                if "error" in msg:
                    err = msg["error"]
                    raise DaemonError(
                        f"the daemon answered {method} with error {err.get('code')}: {err.get('message')}"
                    )
                return msg["result"]
            if "method" in msg and "id" in msg:  # a request from the server: decline politely
                self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})

    def notify(self, method: str, params: Any) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self) -> None:
        try:
            self.request("shutdown", None)
            self.notify("exit", None)
        except (OSError, SpecdError):
            pass
        finally:
            self._file.close()
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(frame(message))

    def _receive(self) -> dict[str, Any]:
        try:
            message = read_frame(self._file)
        except ValueError as e:
            raise SpecdError(f"the daemon sent a malformed message: {e}") from None
        if message is None:
            raise SpecdError("the daemon closed the connection")
        return message
