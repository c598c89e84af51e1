"""The pipeline end to end over stdio, as an editor meets it: the real server with a tiny
random model; a document is warmed when it opens, typing along a suggestion is answered
from the completion cache with no model step, and once the suggestion is typed through the
next one is prefetched."""

from __future__ import annotations

import time

import pytest
from lsp_testing import RawClient

URI = "file:///w/main.py"
TEXT = "def add(a, b):\n    return a + b\n\nx = "
OPTIONS = {"max-tokens": 24, "time-budget-ms": 60_000, "debounce-ms": 0}


@pytest.fixture(scope="module")
def client():
    c = RawClient("--drafter", "none")
    try:
        assert "inlineCompletionProvider" in c.initialize(OPTIONS)["result"]["capabilities"]
        yield c
    finally:
        c.close()


def _stats(client: RawClient) -> dict:
    return client.call("specd/stats")["result"]


def _wait_for(client: RawClient, counter: str, value: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(client)
        if stats["pipeline"][counter] >= value or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _inline(client: RawClient, line: int, character: int) -> str:
    result = client.call(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": URI},
            "position": {"line": line, "character": character},
            "context": {"triggerKind": 2},
        },
    )["result"]
    items = result["items"] if isinstance(result, dict) else result
    return items[0]["insertText"] if items else ""


def _type(client: RawClient, version: int, line: int, character: int, text: str) -> None:
    here = {"line": line, "character": character}
    client.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": URI, "version": version},
            "contentChanges": [{"range": {"start": here, "end": here}, "text": text}],
        },
    )


def test_open_warm_type_along_and_prefetch(client: RawClient):
    """Guards against three bugs a user would meet: a document not warmed when it opens
    (the first request pays for the whole prompt), a cache that misses when the user
    types along a suggestion (each keystroke runs the model again), and no prefetch once
    a suggestion is typed through (the next request waits for a fresh generation)."""
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": URI, "languageId": "python", "version": 1, "text": TEXT}},
    )
    opened = _wait_for(client, "warmups", 1)
    assert opened["pipeline"]["warmups"] == 1 and opened["pipeline"]["warmed_tokens"] > 0

    shown = _inline(client, 3, 4)
    assert len(shown) > 5 and "\n" not in shown  # the tiny model writes no line ends
    before = _stats(client)

    _type(client, 2, 3, 4, shown[:5])
    assert _inline(client, 3, 9) == shown[5:]
    after = _stats(client)
    assert after["pipeline"]["from_cache"] == before["pipeline"]["from_cache"] + 1
    assert after["generations"]["started"] == before["generations"]["started"]

    _type(client, 3, 3, 9, shown[5:])
    prefetched = _wait_for(client, "prefetches", 1)
    assert prefetched["pipeline"]["prefetches"] == 1
    end = 4 + len(shown)
    assert _inline(client, 3, end)  # the prefetched completion, from the cache
    final = _stats(client)
    assert final["pipeline"]["from_cache"] == after["pipeline"]["from_cache"] + 1
    assert final["generations"]["started"] == before["generations"]["started"]
