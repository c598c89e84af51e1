"""JSON-RPC over the LSP base protocol, for talking to a language server as an editor does.

``frame`` and ``read_frame`` put a message on the wire and take one off
(``Content-Length`` header, blank line, UTF-8 JSON body); they are the one framing specd
has: the language server answers through ``frame``, and its command-line client and the
session benchmark read with ``read_frame``. A public module of specd, like
:mod:`specd.options`. :class:`ServerProcess` starts a
server command as a subprocess and talks to it over its stdin and stdout: requests wait for
their answer, notifications from the server are kept, and requests from the server are
answered with ``null`` the way a minimal editor declines them. The session benchmark
(:mod:`specd.bench.session`) drives ``specd serve --stdio`` through it.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import IO, Any

from .errors import SpecdError

__all__ = ["ServerError", "ServerProcess", "frame", "read_frame"]

#: Lines of the server's stderr kept for error messages.
STDERR_LINES = 20


class ServerError(SpecdError):
    """The server answered a request with an error, exited, or did not answer in time."""


def frame(message: dict[str, Any]) -> bytes:
    """One JSON-RPC message with its LSP base-protocol header."""
    body = json.dumps(message).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    """Read one framed JSON-RPC message from a binary stream; None at end of input.

    :raises ValueError: a ``Content-Length`` that is not a number, a body cut short, or a
        body that is not a JSON object.
    """
    length = None
    while True:
        line = stream.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if length is not None:
                break
            continue  # a blank line between messages
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value)
            except ValueError:
                raise ValueError(f"Content-Length {value.strip()[:40]!r} is not a number") from None
    body = stream.read(length)
    if len(body) < length:
        raise ValueError(f"the message ended after {len(body)} of its {length} bytes")
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError(f"the message is a JSON {type(message).__name__}, not an object")
    return message


class ServerProcess:
    """A language server subprocess spoken to over stdio.

    :param command: the server's command line.
    :param env: its environment (None: this process's).
    Its stderr is read as it comes (a chatty server never blocks on a full pipe); the last
    lines say why, when it exits early.
    """

    def __init__(self, command: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        #: ``time.perf_counter()`` just before the process was started
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        #: the last lines the server wrote to stderr
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        threading.Thread(target=self._drain, name="jsonrpc-stderr", daemon=True).start()
        self.notifications: list[dict[str, Any]] = []
        self._answers: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="jsonrpc-reader", daemon=True)
        self._reader.start()

    def notify(self, method: str, params: Any = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: Any = None, *, timeout: float = 600.0) -> Any:
        """Send a request and wait for its answer.

        :returns: the ``result``.
        :raises ServerError: an error answer, the server exited, or no answer in ``timeout`` s.
        """
        answer: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        with self._lock:
            self._next_id += 1
            my_id = self._next_id
            self._answers[my_id] = answer
        self._send({"jsonrpc": "2.0", "id": my_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    msg = answer.get(timeout=0.1)
                    break
                except queue.Empty:
                    if self._closed.is_set():
                        raise ServerError(
                            f"the server exited before answering {method}{self._last_words()}"
                        ) from None
                    if time.monotonic() > deadline:
                        raise ServerError(f"no answer to {method} in {timeout:g} s") from None
        finally:
            with self._lock:
                self._answers.pop(my_id, None)
        if "error" in msg:
            err = msg["error"]
            raise ServerError(f"{method} failed with error {err.get('code')}: {err.get('message')}")
        return msg.get("result")

    def close(self, timeout: float = 10.0) -> int | None:
        """``shutdown`` and ``exit``, then wait for the process (killed when it lingers).

        :returns: its exit status.
        """
        try:
            if self.proc.poll() is None:
                self.request("shutdown", timeout=timeout)
                self.notify("exit")
        except (OSError, ServerError):
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        if stdin is None or self._closed.is_set():
            raise ServerError("the server has exited")
        try:
            stdin.write(frame(message))
            stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise ServerError("the server has exited") from e

    def _last_words(self) -> str:
        try:
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.1)  # the stderr reader's last lines
        lines = [ln for ln in self.stderr_tail if ln.strip()]
        return f"; it said: {lines[-1].strip()}" if lines else ""

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode("utf-8", "replace"))

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while (msg := read_frame(stdout)) is not None:
                if "method" not in msg:
                    with self._lock:
                        waiting = self._answers.get(msg.get("id"))  # type: ignore[arg-type]
                    if waiting is not None:
                        waiting.put(msg)
                elif "id" in msg:  # a request from the server: decline it
                    self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
                else:
                    self.notifications.append(msg)
        except (OSError, ValueError, ServerError):
            pass
        finally:
            self._closed.set()
