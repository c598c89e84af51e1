"""JSON-RPC framing and dispatch that answer every bad message instead of dropping it.

pygls parses a message and its parameters in one step and, when that fails, logs the
payload and answers nothing; a client waiting on that request waits forever. Here a
message is read, parsed and checked in stages, and each failure gets the JSON-RPC answer
it calls for:

- a body that is not JSON: ``-32700`` (parse error), id null;
- JSON that is not a request object, or a bad ``id``/``method``: ``-32600``;
- a request whose params do not match the method: ``-32602``, with the request's id;
- an unknown method: ``-32601`` (pygls); a request before ``initialize``: ``-32002``;
  a request after ``shutdown``: ``-32600``.

Notifications are never answered, per JSON-RPC; a bad one is logged and dropped. End of
input ends the session. Log records from pygls carry message bodies; unless the user asks
for code in logs, :class:`RedactPayloads` replaces them with their sizes.

What of pygls this relies on beyond its documented use (``LanguageServer(protocol_cls=)``,
``@server.feature``, ``set_writer``, ``notify``, ``handle_message``,
``structure_message``, ``get_message_type``, ``report_server_error``); pygls has no
public hook that answers a malformed message, so :class:`SpecdProtocol` reads messages
itself and reaches these (tests/lsp/test_pygls_contract.py fails when one changes):

- ``LanguageServerProtocol.__init__(server, converter)``: the constructor pygls calls for
  ``protocol_cls``; the converter it is given structures params as pygls would.
- ``lsp_method`` and the builtin handlers ``lsp_exit``,
  ``lsp_text_document__did_open|did_change|did_close``: overridden by name, so that
  ``exit`` ends the session rather than the process and document notifications skip
  pygls' own copy of the documents.
- ``fm.features``: the handlers those overrides hand a notification to.
- ``JsonRPCRequestMessage``/``JsonRPCNotification`` (``pygls.protocol``): the message
  types pygls dispatches a method without typed params as.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    LanguageServerProtocol,
    lsp_method,
)

from specd.jsonrpc import frame

log = logging.getLogger(__name__)

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32602, -32603
SERVER_NOT_INITIALIZED = -32002
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 20


@attrs.define
class TextPositionRequest:
    """A request of our own (``specd/complete``) whose params are a text position."""

    id: int | str
    params: types.TextDocumentPositionParams
    method: str
    jsonrpc: str = "2.0"


TYPED_METHODS: dict[str, type] = {"specd/complete": TextPositionRequest}


class SpecdProtocol(LanguageServerProtocol):
    """The LSP protocol with strict message checking and our own document state.

    Document notifications go straight to the server's handlers: the server keeps its
    documents in :mod:`specd.lsp.documents`, so pygls' copy is not maintained twice.

    :param server: the session's server (it has ``end_session``).
    :param converter: the cattrs converter pygls structures messages with.
    """

    def __init__(self, server: Any, converter: cattrs.Converter) -> None:
        super().__init__(server, converter)
        self.session = server
        self.converter = converter
        self.initialize_seen = False
        self.shutdown_seen = False
        self.exit_code: int | None = None

    # -- entry point from the transport ----------------------------------------------------

    def handle_body(self, body: bytes) -> None:
        """Parse, check and dispatch one message body."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            self.send_error(
                None,
                PARSE_ERROR,
                f"Parse error: the message is not valid JSON ({type(e).__name__})",
            )
            return
        if not isinstance(data, dict):
            self.send_error(
                None, INVALID_REQUEST, f"Invalid Request: expected a JSON object, got {_kind(data)}"
            )
            return
        has_id = "id" in data
        msg_id = data.get("id")
        if has_id and not (
            msg_id is None or (isinstance(msg_id, (int, str)) and not isinstance(msg_id, bool))
        ):
            self.send_error(
                None,
                INVALID_REQUEST,
                f"Invalid Request: id must be an integer or a string, got {_kind(msg_id)}",
            )
            return
        method = data.get("method")
        is_request = has_id and "method" in data
        if data.get("jsonrpc") != "2.0" or ("method" in data and not isinstance(method, str)):
            if is_request:
                self.send_error(
                    msg_id,
                    INVALID_REQUEST,
                    'Invalid Request: needs "jsonrpc": "2.0" and a string "method"',
                )
            else:
                log.warning("dropped a malformed message (no valid jsonrpc/method)")
            return
        try:
            message = self._structure(data, has_id, method)
        except Exception as e:  # noqa: BLE001 - any structuring failure is bad params
            if is_request:
                self.send_error(msg_id, INVALID_PARAMS, f"Invalid params for {method}: {_why(e)}")
            else:
                log.warning("dropped notification %s with invalid params: %s", method, _why(e))
            return
        if not self.initialize_seen and method not in (types.INITIALIZE, types.EXIT):
            if is_request:
                self.send_error(
                    msg_id, SERVER_NOT_INITIALIZED, f"{method}: the server is not initialized yet"
                )
            return  # notifications before initialize are dropped, as the LSP asks
        if is_request and self.shutdown_seen and method != types.EXIT:
            self.send_error(msg_id, INVALID_REQUEST, f"{method}: the server is shutting down")
            return
        if method == types.INITIALIZE:
            self.initialize_seen = True
        try:
            self.handle_message(message)
        except Exception:  # noqa: BLE001 - a handler bug answers an error, never ends the session
            log.exception("failed to handle %s", method or "a response")
            if is_request:
                self.send_error(
                    msg_id, INTERNAL_ERROR, f"{method}: internal error (see the server log)"
                )
        if is_request and method == types.SHUTDOWN:
            self.shutdown_seen = True

    def send_error(self, msg_id: Any, code: int, message: str) -> None:
        """Answer ``msg_id`` (None: a message whose id could not be read) with an error."""
        if self.writer is None:
            log.error("no transport to answer with %s: %s", code, message)
            return
        error = {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}
        self.writer.write(frame(error))

    def _structure(self, data: dict[str, Any], has_id: bool, method: str | None) -> Any:
        if method is None:  # a response to a request of ours: pygls knows its result type
            return self.structure_message(data)
        typed = TYPED_METHODS.get(method) or self.get_message_type(method)
        if typed is not None:
            return self.converter.structure(data, typed)
        # Our own methods (specd/...) and unknown ones: params stay plain JSON.
        if has_id:
            return JsonRPCRequestMessage(
                id=data["id"], method=method, jsonrpc="2.0", params=data.get("params")
            )
        return JsonRPCNotification(method=method, jsonrpc="2.0", params=data.get("params"))

    # -- lifecycle ---------------------------------------------------------------------------

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args) -> None:  # type: ignore[override]
        """``exit``: end this session (0 after ``shutdown``, else 1), not the process: the
        transport decides what ending a session means."""
        self.exit_code = 0 if self.shutdown_seen else 1
        self.session.end_session()

    # -- documents go to the server's own store -----------------------------------------------

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield handler, (params,), None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _why(exc: BaseException) -> str:
    """A short reason without values from the message (they may be code)."""
    if isinstance(exc, cattrs.BaseValidationError):
        reasons = cattrs.transform_error(exc, path="$")
        return "; ".join(reasons[:3]) or type(exc).__name__
    return type(exc).__name__


# -- transport ---------------------------------------------------------------------------------


class SafeWriter:
    """The writer pygls sends through; a peer that went away ends the session instead of
    raising into whatever callback was sending."""

    def __init__(
        self, write: Callable[[bytes], Any], close: Callable[[], Any], on_broken: Callable[[], None]
    ) -> None:
        self._write = write
        self._close = close
        self._on_broken = on_broken
        self.broken = False

    def write(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self._write(data)
        except (OSError, ValueError, RuntimeError):  # closed pipe, closed file, closed transport
            self.broken = True
            self._on_broken()

    def close(self) -> None:
        try:
            self._close()
        except (OSError, ValueError, RuntimeError):
            pass


async def read_messages(
    reader: Any,
    protocol: SpecdProtocol,
    stopped: Callable[[], bool],
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> None:
    """Read framed messages until end of input or ``stopped()``, dispatching each one."""
    while not stopped():
        length, problem = await _read_header(reader)
        if length is None and problem is None:
            return  # end of input
        if problem is not None:
            protocol.send_error(None, INVALID_REQUEST, problem)
            continue
        assert length is not None
        if length > max_bytes:
            if not await _discard(reader, length):
                return
            protocol.send_error(
                None,
                INVALID_REQUEST,
                f"Invalid Request: a message of {length} bytes exceeds the limit of {max_bytes}",
            )
            continue
        try:
            body = await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        if len(body) < length:
            return  # end of input in the middle of a message
        protocol.handle_body(body)


async def _read_header(reader: Any) -> tuple[int | None, str | None]:
    """:returns: (content length, None), (None, a problem to report), or (None, None) at
    end of input."""
    length: int | None = None
    problem: str | None = None
    seen = False
    while True:
        try:
            line = await reader.readline()
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            return None, None
        if not line:
            return None, None
        if line in (b"\r\n", b"\n"):
            if not seen:
                continue  # stray blank line between messages
            if length is None and problem is None:
                problem = "Invalid Request: the message has no Content-Length header"
            return (None, problem) if problem else (length, None)
        seen = True
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip())
                if length < 0:
                    raise ValueError
            except ValueError:
                problem = "Invalid Request: Content-Length is not a non-negative integer"


async def _discard(reader: Any, n: int) -> bool:
    while n > 0:
        try:
            chunk = await reader.readexactly(min(n, _CHUNK))
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        if not chunk:
            return False
        n -= len(chunk)
    return True


# -- logs ----------------------------------------------------------------------------------


class RedactPayloads(logging.Filter):
    """Keep message bodies (which hold code) out of pygls' log records.

    Arguments that are short single-line strings or numbers (methods, ids) are kept; any
    other argument is replaced by its size. ``enabled`` is read per record, so the setting
    can change while the server runs.
    """

    def __init__(self, enabled: Callable[[], bool] = lambda: True) -> None:
        super().__init__()
        self.enabled = enabled

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("pygls") and record.args and self.enabled():
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(_redact(a) for a in args)
        return True


_NAME = re.compile(r"[\w$/.:\-]{0,120}")


def _redact(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value  # a method name, an id, a URI
    size = len(value) if isinstance(value, (str, bytes)) else len(str(value))
    return f"<{type(value).__name__}, {size} chars redacted>"
