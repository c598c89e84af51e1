"""specd.jsonrpc's framing, the one both the language server and its clients use: what
``frame`` writes ``read_frame`` reads back, and a broken frame is refused by name."""

from __future__ import annotations

import io
import json
import socket
import threading

import pytest
from specd.lsp.client import Client
from specd.lsp.rpc import SpecdProtocol

from specd import SpecdError
from specd.jsonrpc import frame, read_frame


def test_a_framed_message_reads_back_byte_for_byte():
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"x": "é → 😀"}},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    stream = io.BytesIO(b"".join(frame(m) for m in messages))
    assert [read_frame(stream), read_frame(stream), read_frame(stream)] == [*messages, None]


def test_the_length_counts_bytes_not_characters():
    body = json.dumps({"text": "é😀"}).encode()
    assert frame({"text": "é😀"}) == b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"Content-Length: twelve\r\n\r\n{}", "Content-Length 'twelve' is not a number"),
        (b"Content-Length: 40\r\n\r\n{}", "the message ended after 2 of its 40 bytes"),
        (b"Content-Length: 2\r\n\r\n[]", "the message is a JSON list, not an object"),
    ],
)
def test_a_broken_frame_is_refused_naming_what_is_wrong(raw, why):
    with pytest.raises(ValueError, match=why):
        read_frame(io.BytesIO(raw))


def test_the_language_server_answers_in_the_same_framing():
    """An error the server writes itself (not through pygls) reads back with read_frame."""
    out = io.BytesIO()
    protocol = SpecdProtocol.__new__(SpecdProtocol)
    protocol.writer = out  # what set_writer stores
    protocol.send_error(7, -32600, "Invalid Request: test")
    out.seek(0)
    assert read_frame(out) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32600, "message": "Invalid Request: test"},
    }


def test_the_daemon_client_names_a_malformed_answer():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_badly() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"Content-Length: 3\r\n\r\n[1]")
        conn.close()

    threading.Thread(target=answer_badly, daemon=True).start()
    try:
        with pytest.raises(SpecdError, match="malformed message: the message is a JSON list"):
            Client("127.0.0.1", port, timeout=10)
    finally:
        server.close()
