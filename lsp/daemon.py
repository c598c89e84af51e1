"""Running the server over stdio (one editor) or TCP (a long-lived local daemon that any
number of clients connect to, one session each, all sharing one loaded model)."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import queue
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from specd import BadInputError

from .handlers import build_server
from .rpc import SafeWriter, SpecdProtocol, read_messages
from .service import Service

log = logging.getLogger(__name__)


def parse_address(text: str, *, allow_remote: bool = False, flag: str = "--tcp") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port). Anything but a loopback
    address is refused unless ``allow_remote``: the daemon has no authentication, and it
    answers with the contents of the files it is sent. ``flag``: the option that gave
    ``text``, as the error names it."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise BadInputError(f"{flag} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise BadInputError(f"{flag} {text!r}: the port must be a number from 0 to 65535") from None
    if host == "localhost":
        host = "127.0.0.1"
    if not allow_remote and not is_loopback(host):
        raise BadInputError(
            f"{flag} {text!r}: {host} is not a loopback address; the daemon has no authentication, "
            f"so it listens only on 127.0.0.1, ::1 or localhost unless you also pass --allow-remote"
        )
    return host, port


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``, opened before the model loads: a busy port is
    a one-line error at once, not a traceback after the load.

    :raises BadInputError: the port is in use or the address cannot be listened on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # What asyncio's own servers set: a restarted daemon may reuse the port at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(100)
    except OSError as e:
        sock.close()
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            raise BadInputError(
                f"--tcp {where}: the port is in use (another specd daemon? "
                f"`specd stats --server {where}` asks it); choose another port or stop that process"
            ) from None
        raise BadInputError(f"--tcp {where}: cannot listen there ({e.strerror or e})") from None
    return sock


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StdinReader:
    """Blocking reads of a binary stream on one daemon thread, awaited from the loop.

    A daemon thread, so a read still blocked when the session ends (after ``exit``, with
    the client still holding the pipe) does not keep the process alive.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._calls: queue.SimpleQueue[
            tuple[Callable[..., bytes], tuple[Any, ...], asyncio.AbstractEventLoop, asyncio.Future]
        ] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="specd-stdin", daemon=True).start()

    async def readline(self) -> bytes:
        return await self._call(self._stream.readline)

    async def readexactly(self, n: int) -> bytes:
        return await self._call(self._stream.read, n)

    async def _call(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((fn, args, loop, future))
        return await future

    def _serve(self) -> None:
        while True:
            fn, args, loop, future = self._calls.get()
            try:
                result, error = fn(*args), None
            except (OSError, ValueError) as e:  # closed or broken stdin reads as end of input
                result, error = b"", e
            try:
                loop.call_soon_threadsafe(_resolve, future, result)
            except RuntimeError:
                return  # the loop is gone
            if error is not None:
                log.debug("stdin read failed: %s", type(error).__name__)


def _resolve(future: asyncio.Future, value: bytes) -> None:
    if not future.done():
        future.set_result(value)


def run_stdio(service: Service, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Serve one client on stdin/stdout until ``exit`` or end of input.

    :returns: the exit status: 0 after ``shutdown`` + ``exit`` or at end of input, 1 for
        ``exit`` without ``shutdown`` (as the LSP specification asks).
    """

    async def main() -> int | None:
        ls = build_server(service)

        def write(data: bytes) -> None:
            stdout.write(data)
            stdout.flush()

        ls.protocol.set_writer(SafeWriter(write, lambda: None, ls.end_session))
        protocol = cast(SpecdProtocol, ls.protocol)
        await read_messages(StdinReader(stdin), protocol, lambda: ls.ended)
        ls.end_session()
        return protocol.exit_code

    try:
        code = asyncio.run(main())
    finally:
        service.close()
    return 0 if code is None else code


def run_tcp(
    service: Service, sock: socket.socket, *, ready: Callable[[str, int], None] | None = None
) -> int:
    """Serve TCP clients on a listening socket (:func:`listen`) until SIGINT/SIGTERM. Each
    connection is its own session; ``exit`` ends the session, not the daemon. ``ready``
    gets the bound address."""

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ls = build_server(service)
        ls.protocol.set_writer(SafeWriter(writer.write, writer.close, ls.end_session))
        try:
            await read_messages(reader, cast(SpecdProtocol, ls.protocol), lambda: ls.ended)
        finally:
            ls.end_session()
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(session, sock=sock, limit=1 << 20)
        bound = server.sockets[0].getsockname()
        if ready is not None:
            ready(bound[0], bound[1])
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        async with server:
            await stop.wait()

    try:
        asyncio.run(main())
    finally:
        service.close()
    return 0
