"""The language server: LSP methods in, completions out.

One :class:`SpecdServer` serves one client connection (an editor over stdio, or one TCP
connection to the daemon); the :class:`~.service.Service` it is given is shared by all of
them and holds the model, loaded once, and the single generation worker. Handlers are short
recipes: turn LSP params into a domain request (:mod:`.convert`, :mod:`.documents`), run
it (:mod:`.completer` on the worker), turn the result back.

Methods: ``initialize``/``initialized``, ``textDocument/didOpen|didChange|didClose``
(incremental sync), ``textDocument/inlineCompletion``, ``textDocument/completion`` (with
partial results), ``workspace/didChangeConfiguration``, ``workspace/executeCommand``
(``specd.accepted``), and two of our own: ``specd/stats`` and ``specd/complete``; their
handlers are registered by :func:`.handlers.build_server`, which makes a server for each
connection (a server built here directly has none: its methods are called in-process).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from lsprotocol import types
from pygls.exceptions import FeatureRequestError
from pygls.lsp.server import LanguageServer

from specd import __version__

from . import convert, prompting
from .answers import Answers
from .completer import CompletionRequest, CompletionResult, chars_per_token, cursor_at
from .config import overlay
from .documents import UTF16, DocumentStore, Position
from .prompting import display_path
from .rpc import SpecdProtocol
from .runner import Job
from .service import Service
from .warmup import AHEAD_CHARS, Background, cursor_after
from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)

#: how often a request made while the model loads looks whether it has
LOAD_POLL_S = 0.02


class SpecdServer(Answers, LanguageServer):
    """One client's session: its documents, settings and drafting index.

    :param on_end: called once when the session ends (``exit``, end of input, a broken
        connection).
    """

    def __init__(self, service: Service, *, on_end: Callable[[], None] | None = None) -> None:
        super().__init__(
            "specd",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=SpecdProtocol,
        )
        self.service = service
        self.session_id = service.new_session_id()
        self.documents = DocumentStore()
        self.settings = service.settings
        self.messages = list(service.settings_messages)
        self.encoding = UTF16
        self.root_uri: str | None = None
        self.index = self._new_workspace()
        self.ended = False
        self._on_end = on_end
        self._chars_per_token: dict[str, float] = {}  # uri -> measured at open
        self.background = Background(
            service.worker,
            service.completer,
            service.metrics,
            key=self._key(""),
            request_at=self.request_at,
            version_of=lambda uri: getattr(self.documents.get(uri), "version", None),
            request_ahead=lambda uri, pos: self.request_at(uri, pos, AHEAD_CHARS),
        )

    # -- session ------------------------------------------------------------------------------

    def start(self, params: types.InitializeParams) -> None:
        self.encoding = convert.position_encoding(params.capabilities)
        self.root_uri = params.root_uri or (
            params.workspace_folders[0].uri if params.workspace_folders else None
        )
        self.configure(params.initialization_options, source="initializationOptions")
        self.index = self._new_workspace()

    def configure(self, raw: Any, *, source: str) -> None:
        self.settings, messages = overlay(self.settings, raw, source=source)
        self.messages += messages
        self.index.max_chars = self.settings.index_max_chars
        self.service.log_code = self.service.log_code or self.settings.log_code

    def show_messages(self) -> None:
        """Report settings problems to the user (``window/showMessage``), once each."""
        for message in self.messages:
            log.warning("%s", message)
            self.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Warning, message=f"specd: {message}")
            )
        self.messages = []

    def end_session(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.background.stop()
        self.service.worker.cancel_key(f"{self.session_id}:*", "shutdown")
        if self._on_end is not None:
            self._on_end()

    def report_server_error(self, error: Exception, source: Any) -> None:
        # pygls would show every internal error to the user; the log is the place for
        # them. Request errors were already answered to the client.
        level = logging.DEBUG if source is FeatureRequestError else logging.ERROR
        log.log(
            level,
            "server error (%s): %s",
            getattr(source, "__name__", source),
            type(error).__name__,
        )

    def _new_workspace(self) -> WorkspaceIndex:
        s = self.settings
        return WorkspaceIndex(
            self.service.tokenize,  # not the engine's own: it may still be loading
            max_chars=s.index_max_chars,
            accepted_history=s.accepted_history,
        )

    # -- documents ----------------------------------------------------------------------------

    def open(self, item: types.TextDocumentItem) -> None:
        doc = self.documents.open(item.uri, item.text, item.version, item.language_id)
        self.index.changed(doc)
        self._chars_per_token.pop(doc.uri, None)
        self.background.opened(doc.uri, self.settings)

    def change(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            log.debug("didChange for a document that is not open")
            return
        convert.apply_changes(doc, params.content_changes, self.encoding)
        doc.version = params.text_document.version
        self.index.changed(doc)
        self._notice_acceptance(params.content_changes)
        if self.settings.cancel_on_change:  # requests only: background work may still apply
            self.service.worker.cancel_key(self._key(doc.uri), "changed", background=False)
        self.background.edited(
            doc.uri, cursor_after(doc, params.content_changes, self.encoding), self.settings
        )

    def close(self, uri: str) -> None:
        self.documents.close(uri)
        self.index.closed(uri)
        self._chars_per_token.pop(uri, None)
        self.background.closed(uri)
        self.service.worker.cancel_key(self._key(uri), "changed")

    def _notice_acceptance(self, changes: Sequence[Any]) -> None:
        """An insertion equal to a completion we showed means the user took it (for
        clients that do not run the item's command)."""
        for change in changes:
            text = getattr(change, "text", "")
            if len(text) >= 2 and text in self._recent.values():
                self.index.accepted(text)

    # -- completions --------------------------------------------------------------------------

    def request(
        self, uri: str, position: types.Position, *, partial_token: Any = None
    ) -> CompletionRequest | None:
        """A completion request at an LSP position, or None when the document is not open."""
        doc = self.documents.get(uri)
        if doc is None:
            return None
        pos = doc.resolve(position.line, position.character, self.encoding)
        if pos.clamped:
            self.service.metrics.count("clamped_positions")
        request = self.request_at(uri, pos)
        if request is not None and partial_token is not None:
            loop = asyncio.get_running_loop()
            request.on_lines = lambda text: _call_soon(
                loop, self._send_partial, partial_token, request, text
            )
        return request

    def request_at(
        self, uri: str, pos: Position | None, ahead_chars: int = 0
    ) -> CompletionRequest | None:
        """A completion request at a resolved position (None: the end of the document);
        ``ahead_chars``: with the window its prompt steps to next where fewer than that
        many more characters typed would make the step (:func:`cursor_at`)."""
        doc = self.documents.get(uri)
        if doc is None:
            return None
        s = self.settings
        if pos is None:
            pos = doc.resolve(len(doc.lines) - 1, 1 << 30)
        ratio = self._chars_per_token.get(uri)
        if ratio is None:  # measured once per document, when the tokenizer is there
            if not self.service.ready:  # never wait for the model on the event loop
                ratio = prompting.CHARS_PER_TOKEN
            else:
                ratio = chars_per_token(doc.head(20_000), self.service.tokenize)
                self._chars_per_token[uri] = ratio
        cursor = cursor_at(
            doc, pos, s, ratio, ahead_chars=ahead_chars, prefix_size=self.service.prefix_size
        )
        others = sorted(self.documents.others(uri), key=lambda d: d.language_id != doc.language_id)
        return CompletionRequest(
            cursor,
            display_path(uri, self.root_uri),
            s,
            others=others[:16],
            root_uri=self.root_uri,
            workspace=self.index,
            uri=uri,
            version=doc.version,
        )

    async def complete(
        self, request: CompletionRequest | None, *, pipeline: bool = True
    ) -> CompletionResult:
        """Run a request: from the completion cache, else on the worker, answered at its
        first line (``pipeline``; off: at its end, with its stats). A request cancelled by
        the client, by a newer request for its document, or by an edit raises
        CancelledError, which pygls answers with RequestCancelled."""
        self.service.metrics.count("requests")
        if request is None:
            return CompletionResult("")
        s, bg = request.settings, self.background
        try:
            if self.service.loading:
                await self._recut_when_loaded(request)
            if pipeline and s.completion_cache and (cached := await bg.from_cache(request)):
                return cached
            fresh = await bg.debounce(request)
        except asyncio.CancelledError:  # by the client, while it waited
            self.service.metrics.cancel("client")
            raise
        if not fresh:
            self.service.metrics.cancel("changed")
            raise asyncio.CancelledError()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[CompletionResult | None] = loop.create_future()

        def done(result: Any, error: BaseException | None, job: Job) -> None:
            if request.entry is not None and not request.entry.done:  # it never ran
                request.entry.finish_reason = "cancelled"  # requests waiting on it go on
            _call_soon(loop, _settle, future, result, error)

        job = Job(
            key=self._key(request.uri),
            client=str(self.session_id),
            run=lambda job: self.service.completer.complete(request),
            done=done,
            cancel_event=request.cancel,
        )
        if pipeline and (s.first_line or s.completion_cache):
            if s.completion_cache:
                request.entry = bg.cache.start(request.uri, request.cursor)

            def answered(result: CompletionResult) -> None:  # on the worker thread
                job.background = True  # from now on any request preempts it
                _call_soon(loop, _settle, future, result, None)

            request.on_answer = answered
        self.service.worker.submit(job)
        try:
            result = await future
        except asyncio.CancelledError:
            self.service.worker.cancel(job, "client")
            self.service.metrics.cancel(job.reason or "client")
            raise
        except Exception as exc:  # noqa: BLE001 - a failed completion is logged, not fatal
            self.service.failed(exc)
            return CompletionResult("")
        if result is None or result.cancelled:
            self.service.metrics.cancel(job.reason or "client")
            raise asyncio.CancelledError()
        return result

    async def _recut_when_loaded(self, request: CompletionRequest) -> None:
        """Wait for the model without holding the event loop, then cut the request's text
        window again. Before the load it was cut by a guessed characters-per-token ratio
        and prompt size; the requests after it, cut by the measured ones, would read a
        differently cut prompt anew."""
        while self.service.loading:
            await asyncio.sleep(LOAD_POLL_S)
        doc = self.documents.get(request.uri)
        if not self.service.ready or doc is None or doc.version != request.version:
            return  # failed (the job says so), or stale (the debounce says so)
        c = request.cursor
        fresh = self.request_at(request.uri, Position(c.line, c.column, c.clamped))
        if fresh is not None:
            request.cursor = fresh.cursor

    def _key(self, uri: str) -> str:
        return f"{self.session_id}:{uri}"


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn`` on the event loop (from the worker thread); dropped once the loop is
    closed (the session is over)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
