"""Whether a suggestion still makes sense in its surroundings: brackets for every language,
the parser for Python.

Python code is judged with the standard library's parser on a *chunk* of the document: the
outermost statement around the cursor that starts within :data:`CHUNK_LINES` lines, dedented
to column 0, with the suggestion put in at the cursor. A suggestion is kept up to the last of
its lines after which the chunk parses, either whole or cut at the end of the suggestion (the
code after the cursor may itself be half-typed); the first line is always kept. When the
chunk does not parse whatever is kept, the parser cannot tell and the suggestion is left
alone.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Sequence

PYTHON_SUFFIXES = (".py", ".pyi", ".pyw")
#: How far the chunk reaches on either side of the cursor, in lines.
CHUNK_LINES = 200
#: Lines that continue the statement above them at the same indentation.
CONTINUATIONS = ("else", "elif", "except", "finally", "case", ")", "]", "}")
OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = {v: k for k, v in OPEN.items()}


def is_python(path: str) -> bool:
    return path.lower().endswith(PYTHON_SUFFIXES)


def parses(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in the user's strings
            ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def python_keep(before: str, lines: Sequence[str], after: str) -> int | None:
    """How many of a suggestion's ``lines`` to keep so the Python around it parses.

    :param before: the document before the cursor (its last line is the cursor's line).
    :param lines: the suggestion, split into lines; the first continues the cursor's line.
    :param after: the document after the cursor (its first line is the rest of the
        cursor's line).
    :returns: the number of lines to keep, at least 1: a first line that does not parse
        may be the start of a statement that goes on over several lines (and the first
        line is what the user sees at once). None when the chunk does not parse with any
        of them, nor without them.
    """
    head = before.split("\n")
    tail = after.split("\n")
    line_before, line_after = head.pop(), tail.pop(0)
    head, tail, indent = _chunk(head, tail)

    def ok(k: int) -> bool:
        body = _put_in(line_before, list(lines[:k]), line_after, indent)
        if body is None:
            return False
        return parses("\n".join(head + body + tail)) or parses("\n".join(head + body))

    for k in range(len(lines), 1, -1):
        if ok(k):
            return k
    return 1 if ok(1) or ok(0) else None


def unmatched_closer(text: str) -> int | None:
    """The index of the first closing bracket in ``text`` that closes something opened
    before it (outside string literals), or None."""
    depth: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif c in "'\"`":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote) - 1
        elif c == "#" and not depth:
            break  # a comment: nothing after it closes anything
        elif c in OPEN:
            depth.append(c)
        elif c in CLOSE:
            if not depth:
                return i
            depth.pop()
        i += 1
    return None


# -- the chunk around the cursor -------------------------------------------------------------


def _width(line: str) -> int:
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip())


def _starts_statement(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#") and not s.startswith(CONTINUATIONS)


def _chunk(head: list[str], tail: list[str]) -> tuple[list[str], list[str], int]:
    """The lines of the chunk before and after the cursor's line, dedented, and the
    indentation removed."""
    window = head[-CHUNK_LINES:]
    starts = [i for i, ln in enumerate(window) if _starts_statement(ln)]
    if not starts:
        return [ln.expandtabs(8) for ln in window], [], 0
    indent = min(_width(window[i]) for i in starts)
    start = max(i for i in starts if _width(window[i]) == indent)
    before = [_dedent(ln, indent) for ln in window[start:]]
    after: list[str | None] = []
    for ln in tail[:CHUNK_LINES]:
        if ln.strip() and not ln.strip().startswith("#"):
            w = _width(ln)
            if w < indent or (w == indent and _starts_statement(ln)):
                break
        after.append(_dedent(ln, indent))
    return [b for b in before if b is not None], [a for a in after if a is not None], indent


def _dedent(line: str, indent: int) -> str | None:
    expanded = line.expandtabs(8)
    if not expanded.strip():
        return ""
    if _width(expanded) < indent:
        return None
    return expanded[indent:]


def _put_in(line_before: str, lines: list[str], line_after: str, indent: int) -> list[str] | None:
    """The cursor's line with ``lines`` put in at the cursor, dedented; None when a line
    sits left of the chunk (the suggestion left the chunk's block)."""
    joined = line_before + "\n".join(lines) + line_after
    out = []
    for ln in joined.split("\n"):
        d = _dedent(ln, indent)
        if d is None:
            return None
        out.append(d)
    return out
