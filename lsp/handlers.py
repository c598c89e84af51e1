"""The language server's handlers: :func:`build_server` makes one session's server and
registers one handler per LSP method on it with pygls' ``@server.feature`` (pygls keeps
handlers per server instance). Each hands its message to the session
(:class:`~.server.SpecdServer`), which holds the documents, settings and requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lsprotocol import types

from .answers import ACCEPT_COMMAND
from .server import SpecdServer
from .service import Service

STATS_METHOD = "specd/stats"
COMPLETE_METHOD = "specd/complete"


def build_server(service: Service, *, on_end: Callable[[], None] | None = None) -> SpecdServer:
    """A server for one client connection, its handlers registered.

    :param service: what every session shares (the model, the worker, the metrics).
    :param on_end: called once when the session ends.
    """
    server = SpecdServer(service, on_end=on_end)

    @server.feature(types.INITIALIZE)
    def initialize(ls: SpecdServer, params: types.InitializeParams) -> None:
        """initialize: position encoding, workspace root, initializationOptions."""
        ls.start(params)

    @server.feature(types.INITIALIZED)
    def initialized(ls: SpecdServer, params: types.InitializedParams) -> None:
        """initialized: report settings problems now that the client listens."""
        ls.show_messages()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(
        ls: SpecdServer, params: types.DidChangeConfigurationParams
    ) -> None:
        """workspace/didChangeConfiguration: settings under the ``specd`` key apply at once."""
        if isinstance(params.settings, dict) and "specd" in params.settings:
            ls.configure(params.settings["specd"], source="workspace/didChangeConfiguration")
            ls.show_messages()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: SpecdServer, params: types.DidOpenTextDocumentParams) -> None:
        """textDocument/didOpen."""
        ls.open(params.text_document)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: SpecdServer, params: types.DidChangeTextDocumentParams) -> None:
        """textDocument/didChange (incremental): apply edits; a pending completion is stale."""
        ls.change(params)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SpecdServer, params: types.DidCloseTextDocumentParams) -> None:
        """textDocument/didClose."""
        ls.close(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: SpecdServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList:
        """textDocument/inlineCompletion: ghost text at the cursor."""
        request = ls.request(params.text_document.uri, params.position)
        result = await ls.complete(request)
        return ls.inline_result(request, result)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
    async def completion(ls: SpecdServer, params: types.CompletionParams) -> types.CompletionList:
        """textDocument/completion: the completion as an item; with a partialResultToken,
        first lines and then the whole stream through ``$/progress``."""
        request = ls.request(
            params.text_document.uri, params.position, partial_token=params.partial_result_token
        )
        result = await ls.complete(request)
        return ls.completion_result(request, result, params.partial_result_token)

    @server.feature(COMPLETE_METHOD)
    async def complete(ls: SpecdServer, params: types.TextDocumentPositionParams) -> dict[str, Any]:
        """specd/complete: the inline completion with its token ids and stats
        (``specd complete --server``)."""
        request = ls.request(params.text_document.uri, params.position)
        result = await ls.complete(request, pipeline=False)
        return result.as_json()

    @server.feature(STATS_METHOD)
    def stats(ls: SpecdServer, params: Any) -> dict[str, Any]:
        """specd/stats: metrics since the server started (aggregates only, no code)."""
        return ls.service.stats()

    @server.command(ACCEPT_COMMAND)
    def accepted(ls: SpecdServer, completion_id: str) -> None:
        """workspace/executeCommand specd.accepted: the user took a completion."""
        ls.accepted(completion_id)

    return server
