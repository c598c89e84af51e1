"""The language server's handlers: one per LSP method, registered on every
:class:`~.server.SpecdServer` (pygls registers handlers per instance). Each hands its
message to the session, which holds the documents, settings and requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lsprotocol import types

from .server import SpecdServer  # pygls reads the handlers' annotations at registration

STATS_METHOD = "specd/stats"
COMPLETE_METHOD = "specd/complete"

FEATURES: list[tuple[str, Any, Callable[..., Any]]] = []


def feature(method: str, options: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a handler for every :class:`SpecdServer` (pygls registers per instance)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        FEATURES.append((method, options, fn))
        return fn

    return register


@feature(types.INITIALIZE)
def initialize(ls: SpecdServer, params: types.InitializeParams) -> None:
    """initialize: position encoding, workspace root, initializationOptions."""
    ls.start(params)


@feature(types.INITIALIZED)
def initialized(ls: SpecdServer, params: types.InitializedParams) -> None:
    """initialized: report settings problems now that the client listens."""
    ls.show_messages()


@feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: SpecdServer, params: types.DidChangeConfigurationParams) -> None:
    """workspace/didChangeConfiguration: settings under the ``specd`` key apply at once."""
    if isinstance(params.settings, dict) and "specd" in params.settings:
        ls.configure(params.settings["specd"], source="workspace/didChangeConfiguration")
        ls.show_messages()


@feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: SpecdServer, params: types.DidOpenTextDocumentParams) -> None:
    """textDocument/didOpen."""
    ls.open(params.text_document)


@feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SpecdServer, params: types.DidChangeTextDocumentParams) -> None:
    """textDocument/didChange (incremental): apply edits; a pending completion is stale."""
    ls.change(params)


@feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SpecdServer, params: types.DidCloseTextDocumentParams) -> None:
    """textDocument/didClose."""
    ls.close(params.text_document.uri)


@feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: SpecdServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    """textDocument/inlineCompletion: ghost text at the cursor."""
    request = ls.request(params.text_document.uri, params.position)
    result = await ls.complete(request)
    return ls.inline_result(request, result)


@feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
async def completion(ls: SpecdServer, params: types.CompletionParams) -> types.CompletionList:
    """textDocument/completion: the completion as an item; with a partialResultToken,
    first lines and then the whole stream through ``$/progress``."""
    request = ls.request(
        params.text_document.uri, params.position, partial_token=params.partial_result_token
    )
    result = await ls.complete(request)
    return ls.completion_result(request, result, params.partial_result_token)


@feature(COMPLETE_METHOD)
async def complete(ls: SpecdServer, params: types.TextDocumentPositionParams) -> dict[str, Any]:
    """specd/complete: the inline completion with its token ids and stats
    (``specd complete --server``)."""
    request = ls.request(params.text_document.uri, params.position)
    result = await ls.complete(request, pipeline=False)
    return result.as_json()


@feature(STATS_METHOD)
def stats(ls: SpecdServer, params: Any) -> dict[str, Any]:
    """specd/stats: metrics since the server started (aggregates only, no code)."""
    return ls.service.stats()


def accepted(ls: SpecdServer, completion_id: str) -> None:
    """workspace/executeCommand specd.accepted: the user took a completion."""
    ls.accepted(completion_id)
