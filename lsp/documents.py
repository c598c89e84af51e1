"""Open documents: their text, incremental edits, and LSP positions.

LSP positions count a line's characters in the encoding negotiated at ``initialize``
(UTF-16 code units unless the client offers UTF-8 or UTF-32); Python strings count code
points. Everything that crosses that boundary goes through :func:`to_index` and
:func:`from_index`.

A position past the end of its line means the end of that line, as the LSP specification
says; a line past the end of the document means the end of the document. Both are
clamped, and :attr:`Position.clamped` says so, so callers can count or report it.

Each edit rebinds the document's list of lines instead of changing it in place, so a
reader on another thread (the generation worker) always sees one consistent version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"

_NEWLINE = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Split on LSP line ends (``\\n``, ``\\r\\n``, ``\\r``), keeping them. Always at
    least one element; the last has no line end (it may be empty)."""
    lines: list[str] = []
    start = 0
    for m in _NEWLINE.finditer(text):
        lines.append(text[start : m.end()])
        start = m.end()
    lines.append(text[start:])
    return lines


def strip_eol(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


def _units(ch: str, encoding: str) -> int:
    cp = ord(ch)
    if encoding == UTF16:
        return 2 if cp > 0xFFFF else 1
    if encoding == UTF8:
        # A lone surrogate cannot be encoded; count it as its 3-byte surrogatepass form.
        return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4
    return 1


def to_index(line: str, units: int, encoding: str = UTF16) -> int:
    """Code-point index in ``line`` (no line end) of a character offset in ``encoding``.
    An offset inside a character rounds down to its start; past the end gives ``len(line)``."""
    if encoding == UTF32 or line.isascii():
        return min(units, len(line))
    seen = 0
    for i, ch in enumerate(line):
        seen += _units(ch, encoding)
        if seen > units:
            return i
    return len(line)


def from_index(line: str, index: int, encoding: str = UTF16) -> int:
    """Character offset in ``encoding`` of code-point ``index`` in ``line``."""
    head = line[:index]
    if encoding == UTF32 or head.isascii():
        return len(head)
    return sum(_units(ch, encoding) for ch in head)


@dataclass(frozen=True)
class Position:
    """A resolved position: a line index and a code-point column within it."""

    line: int
    column: int
    clamped: bool = False


@dataclass(frozen=True)
class Cursor:
    """What the completion pipeline reads around a position, copied out of the document.

    ``before`` and ``after`` are windows of the text on either side of the cursor;
    ``line_before``/``line_after`` are the cursor's line split at the cursor (no line end).
    ``before_truncated`` tells whether ``before`` starts later than the document does.
    """

    before: str
    after: str
    line_before: str
    line_after: str
    line: int
    column: int
    before_truncated: bool = False
    clamped: bool = False


class Document:
    """One open text document.

    :param uri: the client's URI for it.
    :param text: its full text.
    :param version: the client's version number.
    :param language_id: the client's language identifier (``python``, ``rust``...).
    """

    def __init__(self, uri: str, text: str, version: int = 0, language_id: str = "") -> None:
        self.uri = uri
        self.version = version
        self.language_id = language_id
        self._lines = split_lines(text)
        # (lines, their text): one tuple, so a reader on another thread never pairs one
        # version's lines with another version's text
        self._joined: tuple[list[str], str] = (self._lines, text)

    @property
    def lines(self) -> list[str]:
        """The lines with their line ends. Treat as read-only: edits rebind it."""
        return self._lines

    @property
    def text(self) -> str:
        lines = self._lines
        joined = self._joined
        if joined[0] is lines:
            return joined[1]
        text = "".join(lines)
        self._joined = (lines, text)
        return text

    def __len__(self) -> int:
        """Length in code points (joins the text once after an edit)."""
        return len(self.text)

    def head(self, chars: int) -> str:
        """The first ``chars`` code points, without joining the whole text."""
        parts: list[str] = []
        for line in self._lines:
            if chars <= 0:
                break
            parts.append(line[:chars])
            chars -= len(line)
        return "".join(parts)

    def resolve(self, line: int, character: int, encoding: str = UTF16) -> Position:
        """Turn an LSP (line, character) into a code-point :class:`Position`, clamping
        positions past the end of a line or of the document."""
        lines = self._lines
        if line < 0 or character < 0:
            return Position(0, 0, clamped=True)
        if line >= len(lines):
            last = len(lines) - 1
            return Position(last, len(strip_eol(lines[last])), clamped=True)
        text = strip_eol(lines[line])
        col = to_index(text, character, encoding)
        return Position(line, col, clamped=from_index(text, col, encoding) != character)

    def apply_change(
        self,
        text: str,
        start: Position | None = None,
        end: Position | None = None,
        version: int | None = None,
    ) -> None:
        """Replace the text between ``start`` and ``end`` (the whole document when they
        are None) with ``text``."""
        if version is not None:
            self.version = version
        if start is None or end is None:
            self._lines = split_lines(text)
            self._joined = (self._lines, text)
            return
        if (end.line, end.column) < (start.line, start.column):
            start, end = end, start
        lines = self._lines
        # Re-split one line either side of the edit: an edit can join "\r" and "\n" across
        # the old line boundary, or split a "\r\n" pair.
        lo = max(start.line - 1, 0)
        hi = min(end.line + 2, len(lines))
        region = "".join(lines[lo:hi])
        offset_start = sum(len(x) for x in lines[lo : start.line]) + start.column
        offset_end = sum(len(x) for x in lines[lo : end.line]) + end.column
        region = region[:offset_start] + text + region[offset_end:]
        new = split_lines(region)
        if hi < len(lines):
            # The region's last line is untouched and keeps its line end, so splitting
            # leaves an empty tail; the next line follows it as before.
            new.pop()
        self._lines = lines[:lo] + new + lines[hi:]

    def cursor(
        self,
        pos: Position,
        *,
        before_chars: int,
        after_chars: int,
        align_lines: int = 32,
        ahead_chars: int = 0,
    ) -> Cursor:
        """Copy out the text around ``pos``.

        :param before_chars: at most this many code points before the cursor.
        :param after_chars: at most this many after it.
        :param align_lines: when the text before must be cut, cut at a line whose index is
            a multiple of this, so the window's start (and the prompt's first tokens, which
            the prefix cache reuses) stays put while the user types.
        :param ahead_chars: when fewer than this many more characters before the cursor
            would move the window's start, the window it moves to (``align_lines`` further
            down) instead: what a warm-up reads before the request that needs it.
        """
        lines = self._lines
        cur = strip_eol(lines[pos.line])
        line_before, line_after = cur[: pos.column], cur[pos.column :]

        parts = [line_before]
        used = len(line_before)
        first = pos.line
        while first > 0 and used + len(lines[first - 1]) <= before_chars:
            first -= 1
            used += len(lines[first])
            parts.append(lines[first])
        truncated = first > 0
        if truncated and align_lines > 1:
            aligned = -(-first // align_lines) * align_lines
            while first < aligned and first < pos.line:
                parts.pop()
                first += 1
        if ahead_chars and align_lines > 1 and before_chars - sum(map(len, parts)) < ahead_chars:
            step = min(first + align_lines, pos.line)  # the next start, once typing moves it
            while first < step:
                parts.pop()
                first += 1
            truncated = first > 0
        parts.reverse()
        before = "".join(parts)
        if len(before) > before_chars:  # the cursor's own line is longer than the window
            before, truncated = before[len(before) - before_chars :], True

        tail = [line_after + lines[pos.line][len(cur) :]]
        used = len(tail[0])
        i = pos.line + 1
        while i < len(lines) and used < after_chars:
            tail.append(lines[i])
            used += len(lines[i])
            i += 1
        after = "".join(tail)[:after_chars]
        return Cursor(
            before=before,
            after=after,
            line_before=line_before,
            line_after=line_after,
            line=pos.line,
            column=pos.column,
            before_truncated=truncated,
            clamped=pos.clamped,
        )


class DocumentStore:
    """The open documents of one session, by URI."""

    def __init__(self, max_documents: int = 10_000) -> None:
        self.max_documents = max_documents
        self._docs: dict[str, Document] = {}

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, uri: str) -> bool:
        return uri in self._docs

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def open(self, uri: str, text: str, version: int = 0, language_id: str = "") -> Document:
        """Open (or reopen, replacing) a document. Past ``max_documents`` the oldest
        opened is forgotten, so a client that never closes cannot grow memory forever."""
        self._docs.pop(uri, None)
        doc = self._docs[uri] = Document(uri, text, version, language_id)
        while len(self._docs) > self.max_documents:
            self._docs.pop(next(iter(self._docs)))
        return doc

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def others(self, uri: str) -> list[Document]:
        """Every open document but ``uri``, most recently opened first."""
        return [d for k, d in reversed(self._docs.items()) if k != uri]
