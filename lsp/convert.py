"""Translation between LSP types and the domain (documents, completions).

Handlers call these so they stay a few lines each; nothing here does I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any

from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder

from .documents import UTF16, Cursor, Document, from_index

_WORD = re.compile(r"[\w$]*$")
LABEL_CHARS = 60


def position_encoding(capabilities: types.ClientCapabilities) -> str:
    """The encoding pygls will announce for these client capabilities."""
    chosen = ServerCapabilitiesBuilder.choose_position_encoding(capabilities)
    return chosen.value if isinstance(chosen, enum.Enum) else str(chosen)


def apply_changes(doc: Document, changes: Sequence[Any], encoding: str = UTF16) -> None:
    """Apply ``didChange`` content changes, in order, each against the result of the last."""
    for change in changes:
        rng = getattr(change, "range", None)
        if rng is None:
            doc.apply_change(change.text)
        else:
            start = doc.resolve(rng.start.line, rng.start.character, encoding)
            end = doc.resolve(rng.end.line, rng.end.character, encoding)
            doc.apply_change(change.text, start, end)


def lsp_position(
    cursor: Cursor, encoding: str = UTF16, *, column: int | None = None
) -> types.Position:
    """The LSP position of the cursor (or of another ``column`` on its line, left of it)."""
    col = cursor.column if column is None else column
    return types.Position(line=cursor.line, character=from_index(cursor.line_before, col, encoding))


def inline_list(
    text: str, cursor: Cursor, encoding: str, command: types.Command | None
) -> types.InlineCompletionList:
    """``textDocument/inlineCompletion`` result: one item inserted at the cursor, or none."""
    if not text:
        return types.InlineCompletionList(items=[])
    here = lsp_position(cursor, encoding)
    return types.InlineCompletionList(
        items=[
            types.InlineCompletionItem(
                insert_text=text, range=types.Range(here, here), command=command
            )
        ]
    )


def completion_item(
    text: str, cursor: Cursor, encoding: str, command: types.Command | None, *, rank: int = 0
) -> types.CompletionItem:
    """A ``textDocument/completion`` item for ``text`` inserted at the cursor.

    The edit starts at the beginning of the word under the cursor, and so does the filter
    text, so clients that filter by the typed word keep the item.
    """
    word = _WORD.search(cursor.line_before).group(0)  # type: ignore[union-attr]
    start = lsp_position(cursor, encoding, column=cursor.column - len(word))
    here = lsp_position(cursor, encoding)
    first = text.lstrip("\r\n").split("\n", 1)[0].rstrip("\r")
    label = word + first
    if len(label) > LABEL_CHARS:
        label = label[: LABEL_CHARS - 1] + "…"
    elif "\n" in text.strip("\r\n"):
        label += " …"
    return types.CompletionItem(
        label=label or text.strip()[:LABEL_CHARS],
        kind=types.CompletionItemKind.Text,
        detail="specd",
        documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=word + text),
        sort_text=f"{rank:04d}",
        filter_text=word + text,
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=types.Range(start, here), new_text=word + text),
        command=command,
    )
