"""``specd serve --http`` against clients that send what they should not: malformed and
oversize bodies, a prompt of megabytes, huge headers, a burst past the queue, sockets left
half open, streams hung up half way.

Each case checks the status the client gets, that the server logged no traceback and
nothing at ERROR while it was handled, and that the server's next greedy answer is the one
it gave before (``unharmed``). The server is a real process (``--model tiny``, whose
context window is 4,096 tokens of one character each), so its log is its stderr and its
memory its RSS; the cases that need a shorter timeout than the server's run the same
application in this process.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time

import psutil
import pytest
from http_testing import HttpServer, InProcessServer, metrics, post, wait_for
from specd.lsp.http import HttpService, app

from specd import Engine, SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
GREEDY = {"prompt": PROMPT, "max_tokens": 16}
WINDOW = 4096  # the tiny model's context window
QUEUE = 1


@pytest.fixture(scope="module")
def server():
    s = HttpServer("--model", "tiny", "--max-tokens", "24", "--queue", str(QUEUE))
    status, reply = post(s, "/v1/completions", GREEDY)
    assert status == 200
    s.greedy = reply["choices"][0]["text"]
    yield s
    s.close()


@pytest.fixture
def unharmed(server):
    """After the case: the same greedy answer as before, and a log without a traceback or
    an ERROR record from the case."""
    start = len(server.log)
    yield server
    status, reply = post(server, "/v1/completions", GREEDY)
    assert status == 200
    assert reply["choices"][0]["text"] == server.greedy
    time.sleep(0.2)  # what the server wrote reaches server.log through a pipe
    logged = "".join(server.log[start:])
    assert "Traceback" not in logged and "ERROR" not in logged, logged


def _raw(server, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send bytes as they are; what came back until the server closed or went quiet."""
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    try:
        sock.sendall(data)
        return _read_all(sock)
    finally:
        sock.close()


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        pass  # a keep-alive connection stays open after its answer
    return out


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _rss(server) -> int:
    return psutil.Process(server.proc.pid).memory_info().rss


DEEP = b'{"prompt": "x", "junk": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b'{"prompt": "\xff\xfe"}', None),  # not UTF-8
        ("/v1/completions", b'{"prompt": "\\ud800"}', None),  # half a surrogate pair
        ("/v1/completions", DEEP, None),
        ("/v1/completions", {"prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": {"a": [1]}}, "prompt"),
        ("/v1/completions", {"prompt": [1.5]}, "prompt[0]"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/completions", {"prompt": [-1]}, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**30}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1e3}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
        ("/v1/completions", {"prompt": "x", "seed": 10**30}, "seed"),
        ("/v1/completions", {"prompt": "x", "temperature": 1e308}, "temperature"),
        ("/v1/completions", {"prompt": "x", "stop": ["a"] * 17}, "stop"),
        ("/v1/completions", {"prompt": "x", "stop": "s" * 1_000_000}, "stop"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}, "stop[1]"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
        ("/infill", {"input_prefix": "x", "stop": ["a"] * 100_000}, "stop"),
        ("/infill", {"input_extra": [{"text": "x"}] * 1000}, "input_extra"),
        ("/infill", {"input_extra": [{"text": "x", "filename": "f" * 100_000}]}, None),
        ("/infill", {"input_prefix": "x", "response_fields": ["content"] * 1000}, None),
        ("/infill", {"input_prefix": "x", "n_predict": -2}, "n_predict"),
    ],
)
def test_malformed_body_gets_400_naming_the_field(unharmed, path, body, param):
    """Guards against a hostile body answered 500 (msgspec's depth limit raised past the
    handler), served anyway (an empty prompt list, a stop list of 100,000 strings checked
    after every step), or refused without naming the field."""
    status, reply = post(unharmed, path, body)
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert reply["error"]["param"] == param
        assert param.split("[")[0] in reply["error"]["message"]
    elif isinstance(body, dict):
        assert reply["error"]["param"] is not None  # the field at fault, whichever it is


def test_a_prompt_of_3_mb_is_refused_fast_without_growing_the_server(unharmed):
    """Guards against tokenizing (and then prefilling) a prompt no context window holds:
    the refusal comes from its length, in OpenAI's ``context_length_exceeded`` shape,
    before the engine sees it, and the server's memory is where it was."""
    before_rss = _rss(unharmed)
    before_prompts = metrics(unharmed)["specd_prompt_tokens_total"]
    t0 = time.perf_counter()
    status, reply = post(unharmed, "/v1/completions", {"prompt": "x" * 3_000_000})
    elapsed = time.perf_counter() - t0
    assert status == 400
    error = reply["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "3,000,000 characters" in error["message"] and f"{WINDOW:,} tokens" in error["message"]
    assert elapsed < 2.0
    assert metrics(unharmed)["specd_prompt_tokens_total"] == before_prompts
    assert abs(_rss(unharmed) - before_rss) <= 0.10 * before_rss


def test_a_token_id_prompt_longer_than_the_window_is_refused(unharmed):
    status, reply = post(unharmed, "/v1/completions", {"prompt": [1] * (WINDOW + 1)})
    assert status == 400
    assert reply["error"]["code"] == "context_length_exceeded"
    assert f"{WINDOW + 1:,} tokens" in reply["error"]["message"]


def test_an_oversize_infill_is_cut_not_refused(unharmed):
    """Guards against an ``/infill`` of megabytes tokenized whole, or refused where
    llama.cpp cuts: the far end of the prefix goes, and the answer says it was cut."""
    body = {"input_prefix": "x = 1\n" * 400_000, "input_suffix": "y\n" * 1_000_000}
    status, reply = post(unharmed, "/infill", {**body, "n_predict": 4})
    assert status == 200
    assert reply["truncated"] is True
    assert reply["tokens_evaluated"] + reply["tokens_predicted"] <= WINDOW


def test_an_oversize_body_gets_413_naming_the_limit(unharmed):
    """Guards against reading a body past the limit (or answering it with aiohttp's plain
    text), whether it says its length up front or comes in chunks."""
    data = b'{"prompt": "' + b"x" * (17 * 2**20) + b'"}'
    status, reply = post(unharmed, "/v1/completions", data)
    assert status == 413 and "16 MiB" in reply["error"]["message"]
    chunk = b"x" * 2**20
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20))
    raw = _raw(
        unharmed,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n",
    )
    assert _status(raw) == 413 and b"16 MiB" in raw


@pytest.mark.parametrize(
    "headers",
    [
        b"Authorization: Bearer " + b"k" * 60_000 + b"\r\n",
        b"".join(b"X-H%d: v\r\n" % i for i in range(500)),
    ],
    ids=["60-kB-header", "500-headers"],
)
def test_huge_headers_get_400_without_a_traceback(unharmed, headers):
    """Guards against aiohttp's handler logging a refused header at ERROR with its
    traceback (a client could fill the log at will)."""
    raw = _raw(
        unharmed,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"Content-Length: 2\r\n\r\n{}",
    )
    assert _status(raw) in (400, 431)


def _stream_started(server, body: dict) -> socket.socket:
    """A streamed completion whose first event has arrived: the engine is generating."""
    data = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    seen = b""
    while b"data: " not in seen:
        chunk = sock.recv(4096)
        assert chunk, "the stream ended before its first event"
        seen += chunk
    return sock


def test_a_burst_past_the_queue_gets_503s_and_the_queued_request_runs(unharmed):
    """Guards against an unbounded queue under a burst, a 503 without ``Retry-After``, and
    a queued request lost when the stream ahead of it hangs up."""
    long = _stream_started(unharmed, {"prompt": "x", "max_tokens": WINDOW - 2})
    answers: list[tuple[int, str | None]] = []

    def one() -> None:
        conn = http.client.HTTPConnection(unharmed.host, unharmed.port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 4}))
        r = conn.getresponse()
        r.read()
        answers.append((r.status, r.getheader("Retry-After")))
        conn.close()

    burst = [threading.Thread(target=one) for _ in range(QUEUE + 5)]
    for t in burst:
        t.start()
    wait_for(lambda: len(answers) == 5)  # all but the queued one are answered at once
    long.close()  # the stream ahead hangs up: its generation stops, the queued one runs
    for t in burst:
        t.join(60)
    assert sorted(s for s, _ in answers) == [200] * QUEUE + [503] * 5
    assert all(retry == "1" for s, retry in answers if s == 503)


def test_a_client_hanging_up_mid_stream_leaves_the_server_as_it_was(unharmed):
    before = metrics(unharmed).get("specd_disconnects_total", 0)
    _stream_started(unharmed, {"prompt": PROMPT, "max_tokens": 2000}).close()
    wait_for(lambda: metrics(unharmed).get("specd_disconnects_total", 0) == before + 1)
    wait_for(lambda: metrics(unharmed)["specd_generating"] == 0)


def test_half_open_sockets_do_not_hold_up_other_clients(unharmed):
    """Guards against a handler (or the engine) held by a client that stopped sending:
    with sockets open that sent nothing, half a request line, or half a body, another
    client is answered; then they hang up."""
    partial = [
        b"",
        b"POST /v1/compl",
        b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro',
    ]
    socks = []
    for data in partial * 5:
        sock = socket.create_connection((unharmed.host, unharmed.port))
        sock.sendall(data)
        socks.append(sock)
    status, reply = post(unharmed, "/v1/completions", GREEDY)
    assert status == 200 and reply["choices"][0]["text"] == unharmed.greedy
    for sock in socks:
        sock.close()


# -- what needs a shorter timeout than the server's: the same application in this process


@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny", drafter="none")


@pytest.fixture
def local(engine, caplog, monkeypatch):
    """The application over the tiny engine, with the idle and body timeouts short; after
    the case, a clean log and the same greedy answer."""
    monkeypatch.setattr(app, "IDLE_S", 0.5)
    service = HttpService(engine, SamplingParams(max_tokens=24))
    service.body_timeout_s = 0.5
    caplog.set_level(logging.INFO)
    s = InProcessServer(service)
    greedy = post(s, "/v1/completions", GREEDY)[1]["choices"][0]["text"]
    yield s
    assert post(s, "/v1/completions", GREEDY)[1]["choices"][0]["text"] == greedy
    s.close()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def test_a_body_that_stops_half_way_gets_408(local):
    """Guards against a handler waiting for good on a client that sent half its body."""
    sock = socket.create_connection((local.host, local.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    head = sock.recv(4096)
    sock.close()
    assert _status(head) == 408 and b"did not arrive" in head


def test_a_connection_that_sends_no_request_is_closed(local):
    """Guards against idle and half-sent connections held for an hour (aiohttp's default),
    each holding a file descriptor."""
    for data in (b"", b"POST /v1/completions HTTP/1.1\r\nHost:"):
        sock = socket.create_connection((local.host, local.port), timeout=10)
        sock.sendall(data)
        assert sock.recv(4096) == b""  # closed by the server
        sock.close()


def test_a_malformed_request_is_logged_as_one_line(local, caplog):
    """Guards against the client's header (which may hold a key) copied into the log."""
    _raw(local, b"GET /health HTTP/1.1\r\nAuthorization: Bearer sk-" + b"s" * 9000 + b"\r\n\r\n")
    lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.levelname for r in lines] == ["INFO"]
    assert "sk-" not in caplog.text
