"""End to end over stdio with pytest-lsp: the real server, a tiny random model.

The capability is checked first, then the results: ghost text arrives, partial results
arrive through $/progress, cancellation answers RequestCancelled, and of a burst of
requests for one document only the newest ever runs.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_lsp
from lsp_testing import SERVER, SERVER_ENV
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

pytestmark = pytest.mark.asyncio(loop_scope="module")

URI = "file:///w/main.py"
OPTIONS = {"max-tokens": 24, "time-budget-ms": 60_000, "max-lines": "many"}


def _client() -> LanguageClient:
    """pytest-lsp's client, but keeping partial results (lists) sent through $/progress,
    which its default handler only knows as work-done reports."""
    client = LanguageClient(
        converter_factory=__import__(
            "pygls.protocol", fromlist=["default_converter"]
        ).default_converter
    )

    def progress(client: LanguageClient, params: types.ProgressParams):
        client.progress_reports.setdefault(params.token, []).append(params.value)

    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES, types.PROGRESS: progress})
    return client


@pytest_lsp.fixture(
    config=ClientServerConfig(
        server_command=[*SERVER, "--drafter", "none"], server_env=SERVER_ENV, client_factory=_client
    ),
    scope="module",
)
async def client(lsp_client: LanguageClient):
    lsp_client.init_result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri="file:///w",
            initialization_options=OPTIONS,
        )
    )
    lsp_client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(URI, "python", 1, "def add(a, b):\n    return a + b\n\nx = ")
        )
    )
    yield
    await lsp_client.shutdown_session()


def _inline(uri: str = URI, line: int = 3, character: int = 4) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic
        ),
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(line, character),
    )


def _plain(value):
    """pygls hands untyped results over as namedtuples; tests read plain JSON."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def _stats(client: LanguageClient) -> dict:
    return _plain(await client.protocol.send_request_async("specd/stats", None))


async def _configure(client: LanguageClient, **settings) -> None:
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"specd": settings})
    )
    await _stats(client)  # a round trip: the notification has been handled


async def test_stats_say_what_the_auto_prefix_measured(client: LanguageClient):
    """The daemon times its prefill at load and sizes ``prefix-tokens = "auto"`` from it;
    the report says the size, within the documented bounds."""
    from specd.lsp.config import AUTO_PREFIX_SIZES

    assert (await _stats(client))["prompt"]["auto_prefix_tokens"] in AUTO_PREFIX_SIZES


async def test_capabilities_are_advertised(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental


async def test_a_bad_initialization_option_is_shown_by_name(client: LanguageClient):
    for _ in range(50):
        if client.messages:
            break
        await asyncio.sleep(0.1)
    assert any("`max-lines`" in m.message for m in client.messages)


async def test_inline_completion_arrives(client: LanguageClient):
    result = await client.text_document_inline_completion_async(_inline())
    assert len(result.items) == 1
    item = result.items[0]
    assert item.insert_text and item.range.start == types.Position(3, 4)
    assert item.command is not None and item.command.command == "specd.accepted"
    # accepting reports back and is answered
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(item.command.command, item.command.arguments)
    )


async def test_incremental_edits_then_completion(client: LanguageClient):
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=2, uri=URI),
            [
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(3, 4), types.Position(3, 4)), text="add(1, "
                )
            ],
        )
    )
    result = _plain(
        await client.protocol.send_request_async(
            "specd/complete",
            {"textDocument": {"uri": URI}, "position": {"line": 3, "character": 11}},
        )
    )
    assert result["finish_reason"] in ("length", "complete", "stop")
    assert result["stats"]["prompt_tokens"] > 0 and result["token_ids"]


async def test_partial_results_arrive_through_progress(client: LanguageClient):
    token = "partial-1"
    result = await client.text_document_completion_async(
        types.CompletionParams(
            types.TextDocumentIdentifier(URI), types.Position(3, 11), partial_result_token=token
        )
    )
    assert (
        not result.items and result.is_incomplete
    )  # with partial results the response carries none
    reports = client.progress_reports.get(token)
    assert reports, "no $/progress with partial results"
    item = reports[-1][0]
    assert item["textEdit"]["range"]["end"] == {"line": 3, "character": 11}
    assert item["textEdit"]["newText"]


async def test_completion_without_partial_results_returns_the_item(client: LanguageClient):
    result = await client.text_document_completion_async(
        types.CompletionParams(types.TextDocumentIdentifier(URI), types.Position(3, 11))
    )
    assert result.is_incomplete  # the client asks again as the user types
    assert len(result.items) == 1 and result.items[0].text_edit.new_text


async def _wait_running(client: LanguageClient) -> None:
    for _ in range(400):
        if (await _stats(client))["generations"]["running"]:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the generation never started")


async def test_cancel_request_answers_request_cancelled(client: LanguageClient):
    await _configure(
        client, **{"max-tokens": 4000, "first-line": False, "completion-cache": False}
    )  # runs long
    try:
        before = await _stats(client)
        future = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, _inline(), msg_id="long-1"
            )
        )
        await _wait_running(client)
        t0 = time.monotonic()
        client.cancel_request(types.CancelParams(id="long-1"))
        with pytest.raises(JsonRpcRequestCancelled):
            await future
        answered_in = time.monotonic() - t0
        after = await _stats(client)
        while after["generations"]["running"] and time.monotonic() - t0 < 5:
            after = await _stats(client)  # the generation stops at its next decode step
        stopped_in = time.monotonic() - t0
        assert after["generations"]["running"] == 0
        assert after["cancellations"]["client"] == before["cancellations"]["client"] + 1
        assert after["completed"] == before["completed"]  # it stopped; it did not run to the end
        assert answered_in < 2.0 and stopped_in < 2.0
    finally:
        await _configure(client, **{"max-tokens": 24, "first-line": True, "completion-cache": True})


async def test_a_newer_request_for_the_document_cancels_the_older(client: LanguageClient):
    await _configure(
        client, **{"max-tokens": 4000, "first-line": False, "completion-cache": False}
    )  # runs long
    try:
        old = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, _inline(), msg_id="old-1"
            )
        )
        await _wait_running(client)
        await _configure(client, **{"max-tokens": 8})
        new = asyncio.ensure_future(client.text_document_inline_completion_async(_inline()))
        with pytest.raises(JsonRpcRequestCancelled):
            await old
        assert len((await new).items) == 1
    finally:
        await _configure(client, **{"max-tokens": 24, "first-line": True, "completion-cache": True})


@pytest.mark.parametrize("edits", [True, False], ids=["keystrokes", "re-requests"])
async def test_a_burst_of_50_requests_starts_one_generation_for_the_document(
    client: LanguageClient, edits: bool
):
    """Guards against a scheduler that lets stale requests run: 50 completion requests for
    one document (each after a keystroke, or repeated at one position) arrive while the
    worker is busy with another document; a queued request is superseded by the next one
    for its document, so exactly one of the 50 starts (the newest), and the other 49 are
    answered RequestCancelled without running."""
    uri = f"file:///w/burst-{edits}.py"
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, "def f():\n    "))
    )
    await _configure(
        client, **{"max-tokens": 4000, "first-line": False, "completion-cache": False}
    )  # runs long
    before = await _stats(client)
    busy_id = f"busy-{edits}"
    busy = asyncio.ensure_future(
        client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, _inline(), msg_id=busy_id
        )
    )
    try:
        await _wait_running(client)
        # the scheduler's rule, without the completion cache (which would answer the
        # re-requests from the first one's generation: tests/lsp/test_pipeline_e2e.py)
        await _configure(client, **{"max-tokens": 24, "first-line": True})
        futures = []
        for i in range(50):
            if edits:
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(
                        types.VersionedTextDocumentIdentifier(version=i + 2, uri=uri),
                        [
                            types.TextDocumentContentChangePartial(
                                range=types.Range(
                                    types.Position(1, 4 + i), types.Position(1, 4 + i)
                                ),
                                text="+",  # not a word: the suggestion need not extend one
                            )
                        ],
                    )
                )
            column = 5 + i if edits else 4
            futures.append(
                asyncio.ensure_future(
                    client.text_document_inline_completion_async(_inline(uri, 1, column))
                )
            )
            await asyncio.sleep(0)  # let it go out before the next one
        # every request has reached the worker's queue before the busy generation ends
        for _ in range(1000):
            if (await _stats(client))["requests"] - before["requests"] == 51:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the burst never reached the server")
        mid = await _stats(client)
        assert mid["generations"]["started"] - before["generations"]["started"] == 1
    finally:
        client.cancel_request(types.CancelParams(id=busy_id))
        with pytest.raises(JsonRpcRequestCancelled):
            await busy  # it was still running: the burst arrived behind it
        await _configure(client, **{"max-tokens": 24, "first-line": True, "completion-cache": True})
    results = await asyncio.gather(*futures, return_exceptions=True)
    after = await _stats(client)
    unexpected = [
        r
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, JsonRpcRequestCancelled)
    ]
    assert not unexpected
    assert (
        not isinstance(results[-1], BaseException) and len(results[-1].items) == 1
    )  # the newest is answered
    # the busy generation and the newest request's: nothing else ever started
    assert after["generations"]["started"] - before["generations"]["started"] == 2
    assert all(isinstance(r, JsonRpcRequestCancelled) for r in results[:-1])
    assert after["generations"]["max_running"] == 1
    stale = sum(
        after["cancellations"][k] - before["cancellations"][k] for k in ("superseded", "changed")
    )
    assert stale == 49
