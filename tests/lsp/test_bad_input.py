"""Bad input to the server, much of it generated with Hypothesis: every request gets its
JSON-RPC answer, nothing crashes the server, and end of input ends it cleanly."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsp_testing import RawClient

URI = "file:///w/bad.py"
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
# Text with what trips position and encoding code: astral characters, lone surrogates,
# every kind of line end.
tricky_text = st.lists(
    st.sampled_from(list("ab \t\n\r") + ["\r\n", "😀", "é", "\ud800", "\udfff", "\u2028"]),
    max_size=60,
).map("".join)


@pytest.fixture(scope="module")
def server():
    client = RawClient()
    client.initialize({"max-tokens": 4, "time-budget-ms": 60_000})
    client.notify(
        "textDocument/didOpen",
        {
            "textDocument": {
                "uri": URI,
                "languageId": "python",
                "version": 1,
                "text": "def f(x):\n    return x\n",
            }
        },
    )
    yield client
    assert client.close() == 0
    assert b"Traceback" not in b"".join(client.stderr)


def _answers_before_ping(client: RawClient) -> list[dict]:
    """Responses that arrive before the answer to a fresh request (in order)."""
    ping = client.request("specd/stats")
    seen = []
    while True:
        msg = client.next_message(60)
        if msg.get("id") == ping and "result" in msg:
            return seen
        if "method" not in msg:
            seen.append(msg)


def _is_object(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except ValueError:
        return False


@SETTINGS
@given(
    st.one_of(
        st.binary(max_size=80),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.sampled_from(
            [b"", b"{", b'{"jsonrpc": "2.0", "id": 1', b"[1, 2]", b"null", b'"text"', b"\xff\xfe{}"]
        ),
    ).filter(lambda b: not _is_object(b))
)
def test_malformed_json_gets_a_parse_error(server, body):
    server.send_body(body)
    answers = _answers_before_ping(server)
    assert len(answers) == 1
    assert answers[0]["id"] is None and answers[0]["error"]["code"] in (-32700, -32600)


@pytest.mark.parametrize("bad_id", [{"x": 1}, [1], True, 1.5])
def test_a_bad_id_is_an_invalid_request(server, bad_id):
    server.send({"jsonrpc": "2.0", "id": bad_id, "method": "specd/stats"})
    answers = _answers_before_ping(server)
    assert [a["error"]["code"] for a in answers] == [-32600]


VALID = {
    "textDocument": {"uri": URI},
    "position": {"line": 1, "character": 4},
    "context": {"triggerKind": 2},
}
PATHS = [
    ("textDocument",),
    ("textDocument", "uri"),
    ("position",),
    ("position", "line"),
    ("position", "character"),
    ("context",),
    ("context", "triggerKind"),
]


def _mutate(path, value):
    params = json.loads(json.dumps(VALID))
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return params


@SETTINGS
@given(
    st.sampled_from(
        [
            "textDocument/inlineCompletion",
            "textDocument/completion",
            "specd/complete",
            "textDocument/hover",
        ]
    ),
    st.one_of(json_values, st.builds(_mutate, st.sampled_from(PATHS), json_values)),
)
def test_wrong_types_are_answered(server, method, params):
    reply = server.call(method, params)
    if "error" in reply:
        assert reply["error"]["code"] in (-32602, -32601), reply
    else:
        assert "result" in reply


@SETTINGS
@given(
    st.text(min_size=1, max_size=30).filter(
        lambda m: (
            m not in ("initialize", "shutdown", "exit")
            and not m.startswith(("textDocument/", "specd/", "workspace/"))
        )
    )
)
def test_unknown_methods(server, method):
    assert server.call(method, {})["error"]["code"] == -32601
    server.notify(method, {"x": 1})  # unknown notifications are ignored, not answered
    assert _answers_before_ping(server) == []


@SETTINGS
@given(tricky_text, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.booleans())
def test_positions_past_the_end_and_surrogates(server, text, line, character, small):
    uri = "file:///w/pos.py"
    if small:  # mostly near the end, where off-by-ones live
        line, character = line % 4, character % 8
    server.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )
    server.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [
                {
                    "range": {
                        "start": {"line": line, "character": character},
                        "end": {"line": line + 1, "character": 0},
                    },
                    "text": "\ud83d",
                }
            ],
        },
    )
    reply = server.call(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": line, "character": character},
            "context": {"triggerKind": 2},
        },
    )
    assert "items" in reply["result"]
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def test_framing_errors_are_answered_and_the_stream_recovers(server):
    server.send_bytes(b"Content-Type: application/json\r\n\r\n")  # no Content-Length
    server.send_bytes(b"Content-Length: -5\r\n\r\n")
    server.send_bytes(b"Content-Length: banana\r\n\r\n")
    answers = _answers_before_ping(server)
    assert [a["error"]["code"] for a in answers] == [-32600, -32600, -32600]


def test_a_ten_megabyte_document(server):
    uri = "file:///w/huge.py"
    line = "def function_%06d(argument):\n    return argument * 2  # padding padding padding padding padding\n"
    text = "".join(line % i for i in range(110_000))
    assert len(text) > 10_000_000
    n_lines = text.count("\n")
    t0 = time.monotonic()
    server.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )
    for line_no in (n_lines, n_lines // 2, 0):
        reply = server.call(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": uri},
                "position": {"line": line_no, "character": 4},
                "context": {"triggerKind": 1},
            },
        )
        assert "items" in reply["result"]
    server.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [
                {
                    "range": {
                        "start": {"line": 7, "character": 0},
                        "end": {"line": 7, "character": 0},
                    },
                    "text": "x = 1\n",
                }
            ],
        },
    )
    reply = server.call(
        "textDocument/completion",
        {"textDocument": {"uri": uri}, "position": {"line": 8, "character": 0}},
    )
    assert "result" in reply
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert time.monotonic() - t0 < 60


def test_open_close_storm(server):
    ids = []
    for i in range(300):
        uri = f"file:///w/storm/{i % 37}.py"
        server.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": uri,
                    "languageId": "python",
                    "version": i,
                    "text": f"v{i} = {i}\n",
                }
            },
        )
        if i % 10 == 0:
            ids.append(
                server.request(
                    "textDocument/inlineCompletion",
                    {
                        "textDocument": {"uri": uri},
                        "position": {"line": 1, "character": 0},
                        "context": {"triggerKind": 2},
                    },
                )
            )
        server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})  # twice: ignored
        server.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": 1}, "contentChanges": [{"text": "closed"}]},
        )
    for msg_id in ids:  # each answered: a result, or cancelled because its document closed
        reply = server.response(msg_id)
        assert "result" in reply or reply["error"]["code"] == -32800
    reply = server.call(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": "file:///w/never-opened.py"},
            "position": {"line": 0, "character": 0},
            "context": {"triggerKind": 2},
        },
    )
    assert reply["result"]["items"] == []


def test_lifecycle_errors_and_end_of_input():
    client = RawClient()
    try:
        early = client.call("textDocument/inlineCompletion", VALID)
        assert early["error"]["code"] == -32002  # not initialized yet
        client.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": URI, "languageId": "python", "version": 1, "text": "x = "}},
        )
        client.initialize()
        assert (
            client.call("textDocument/inlineCompletion", VALID)["result"]["items"] == []
        )  # that open was dropped
        assert client.call("shutdown")["result"] is None
        assert client.call("specd/stats")["error"]["code"] == -32600  # shutting down
        client.proc.stdin.close()  # end of input without exit
        assert client.proc.wait(30) == 0
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
    assert b"Traceback" not in b"".join(client.stderr)


@pytest.mark.slow
def test_end_of_input_mid_generation_exits_cleanly_and_logs_hold_no_code():
    marker = "SECRET_SOURCE_7f3a"
    client = RawClient(verbose=2)
    try:
        client.initialize({"max-tokens": 4})
        client.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": URI,
                    "languageId": "python",
                    "version": 1,
                    "text": f"{marker} = 1\n",
                }
            },
        )
        client.call(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": URI},
                "position": {"line": 1, "character": 0},
                "context": {"triggerKind": 2},
            },
        )
        client.call(
            "textDocument/inlineCompletion",
            {"textDocument": {"uri": URI}, "position": {"line": marker, "character": 0}},
        )
        client.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": URI}, "contentChanges": [{"text": marker, "range": 3}]},
        )
        client.send_body(f'{{"jsonrpc": "2.0", "id": 9, "params": "{marker}" '.encode())
        client.call("unknown/method", {"code": marker})
        client.notify("unknown/notification", {"code": marker})
        # a long generation, then the client disappears
        client.notify(
            "workspace/didChangeConfiguration",
            {"settings": {"specd": {"max-tokens": 4000, "time-budget-ms": 60_000}}},
        )
        client.request(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": URI},
                "position": {"line": 1, "character": 0},
                "context": {"triggerKind": 2},
            },
        )
        time.sleep(0.3)
        t0 = time.monotonic()
        client.proc.stdin.close()
        assert client.proc.wait(30) == 0
        assert time.monotonic() - t0 < 10
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
    time.sleep(0.2)  # let the stderr reader drain
    log = b"".join(client.stderr).decode("utf-8", "replace")
    assert "DEBUG" in log  # it was verbose
    assert marker not in log
    assert "Traceback" not in log
