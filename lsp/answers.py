"""Turning completion results into LSP answers: inline items, completion items,
partial results through ``$/progress``, and the command that reports an acceptance.

:class:`Answers` is the part of :class:`~.server.SpecdServer` that does this; it keeps the
recently shown completions so an acceptance can be matched to its text.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

from lsprotocol import types

from . import convert
from .completer import CompletionRequest, CompletionResult

ACCEPT_COMMAND = "specd.accepted"
RECENT_COMPLETIONS = 64


class Answers:
    """LSP answers for one session (mixed into the server, which provides ``encoding``,
    ``index``, ``ended`` and ``protocol``)."""

    encoding: str
    index: Any
    ended: bool
    protocol: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recent: OrderedDict[str, str] = OrderedDict()  # completion id -> text shown
        self._partial_sent: OrderedDict[Any, str] = OrderedDict()  # token -> text sent

    def accept_command(self, text: str) -> types.Command | None:
        """The command an item runs when accepted (it reports the acceptance to us)."""
        if not text:
            return None
        completion_id = uuid.uuid4().hex[:12]
        self._recent[completion_id] = text
        while len(self._recent) > RECENT_COMPLETIONS:
            self._recent.popitem(last=False)
        return types.Command(
            title="specd: accepted", command=ACCEPT_COMMAND, arguments=[completion_id]
        )

    def accepted(self, completion_id: str) -> None:
        text = self._recent.pop(completion_id, None)
        if text:
            self.index.accepted(text)

    def inline_result(
        self, request: CompletionRequest | None, result: CompletionResult
    ) -> types.InlineCompletionList:
        if request is None:
            return types.InlineCompletionList(items=[])
        return convert.inline_list(
            result.text, request.cursor, self.encoding, self.accept_command(result.text)
        )

    def completion_result(
        self, request: CompletionRequest | None, result: CompletionResult, partial_token: Any
    ) -> types.CompletionList:
        """Items for ``textDocument/completion``, marked incomplete so the client asks
        again as the user types. With partial results, the completion goes through
        ``$/progress`` and the response itself is empty, as the protocol asks."""
        items: list[types.CompletionItem] = []
        if request is not None and result.text:
            if partial_token is None:
                items = [
                    convert.completion_item(
                        result.text, request.cursor, self.encoding, self.accept_command(result.text)
                    )
                ]
            elif self._partial_sent.get(partial_token) != result.text:
                self._send_progress(partial_token, request, result.text, rank=1)
        self._partial_sent.pop(partial_token, None)
        return types.CompletionList(is_incomplete=True, items=items)

    def _send_partial(self, token: Any, request: CompletionRequest, text: str) -> None:
        """First finished line(s) of a completion still running: send them as an item."""
        if token in self._partial_sent or not text.strip() or self.ended:
            return
        self._partial_sent[token] = text
        while len(self._partial_sent) > RECENT_COMPLETIONS:  # tokens of cancelled requests
            self._partial_sent.popitem(last=False)
        self._send_progress(token, request, text, rank=0)

    def _send_progress(
        self, token: Any, request: CompletionRequest, text: str, *, rank: int
    ) -> None:
        item = convert.completion_item(
            text, request.cursor, self.encoding, self.accept_command(text), rank=rank
        )
        value = [self.protocol.converter.unstructure(item)]
        self.protocol.notify(types.PROGRESS, types.ProgressParams(token=token, value=value))
