"""Turning what the model wrote into what the editor shows, and what a user keeps.

The cursor's context decides the *shape*: in the middle of a line the completion is one
line; at the end of a line, or on a blank line, it is a block that ends where the
indentation says the block ends. The completion never repeats text that already follows
the cursor (closing brackets included), keeps at most ``max_lines`` lines, and has no
trailing whitespace. It starts at the cursor's indentation (no extra space after an
indent), drops a last line that the token limit or the time budget cut in half (a lone
line stays), completes a word the cursor sits inside only with more of the word, never puts a block's body at the
level of the line that opens it, and, for Python, is cut back to the last line after which
the code around it still parses (:mod:`.syntax`).

:func:`should_stop` applies the same rules to a partial completion, so generation stops as
soon as the result cannot change any more instead of running to ``max_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import syntax
from .documents import Cursor

OPENERS = (":", "{", "(", "[", "=>", "->", " do", " then", " else", " begin")
CLOSERS = ("}", ")", "]", "end", "fi", "done", "esac", "until")
TAB = 4
#: Finish reasons that can leave the last line half-written.
CUT_SHORT = ("time", "length")
_WORD = re.compile(r"\w")


@dataclass(frozen=True)
class Shape:
    """How a completion may look at a cursor.

    :param mode: ``line`` (stop at the end of the line) or ``block``.
    :param indent: indentation width of the cursor's line.
    :param opens_block: the cursor follows a block opener (``:``, ``{``...): lines
        indented deeper are the block's body.
    :param line_after: the rest of the cursor's line (never repeated).
    :param next_line: the first non-blank line after the cursor's line (a completion
        stops before repeating it).
    :param after_indent: the cursor sits after indentation only.
    :param in_word: the cursor sits inside a word (word characters on both sides).
    :param body_of: the indentation of the line above when it opens a block and the
        cursor's line is blank (the body must go deeper), else None.
    :param python: judge the completion with the Python parser; ``before`` and ``after``
        are then the document's text on either side of the cursor.
    """

    mode: str
    indent: int
    opens_block: bool
    max_lines: int
    line_after: str = ""
    next_line: str = ""
    eol: str = "\n"
    line_before: str = ""
    after_indent: bool = False
    in_word: bool = False
    body_of: int | None = None
    python: bool = False
    before: str = ""
    after: str = ""


def shape_for(cursor: Cursor, *, mode: str = "auto", max_lines: int = 8, path: str = "") -> Shape:
    """Decide the shape of a completion at ``cursor`` (``mode``: auto, line or block;
    ``path``: the document's path, whose suffix says whether it is Python)."""
    before = cursor.line_before
    if before.strip():
        indent = _width(before)
    else:
        indent = len(before.expandtabs(TAB))
    opens = before.rstrip().endswith(OPENERS)
    if mode == "auto":
        mode = "line" if cursor.line_after.strip() else "block"
    following = cursor.after.split("\n")[1:]
    next_line = next((ln for ln in following if ln.strip()), "")
    eol = "\r\n" if "\r\n" in cursor.after[: len(cursor.line_after) + 2] else "\n"
    return Shape(
        mode,
        indent,
        opens,
        max_lines if mode == "block" else 1,
        cursor.line_after,
        next_line.rstrip("\r"),
        eol,
        line_before=before,
        after_indent=bool(before) and not before.strip(),
        in_word=after_word(before)
        and bool(cursor.line_after[:1] and _WORD.match(cursor.line_after[0])),
        body_of=_opener_above(cursor) if not before.strip() else None,
        python=syntax.is_python(path),
        before=cursor.before,
        after=cursor.after,
    )


def after_word(line_before: str) -> bool:
    """Whether the text before the cursor ends in a word character (the cursor is in or
    at the end of a word)."""
    return bool(line_before[-1:] and _WORD.match(line_before[-1]))


def should_stop(text: str, shape: Shape) -> bool:
    """True when more generated text cannot change the completion."""
    lines = _at_cursor(text.split("\n"), shape)
    if shape.mode == "line" or len(lines) > shape.max_lines or len(lines) == 1:
        return len(lines) > shape.max_lines
    # the last line may still grow (its indentation too): judge the ended ones
    return _scan(lines[:-1], shape)[1]


def finish(text: str, shape: Shape, *, finish_reason: str = "") -> str:
    """The completion to show for the generated ``text``.

    :param finish_reason: the engine's; when the time budget or the token limit ended the
        generation mid-line, that unfinished last line is dropped (a lone line is kept).
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if finish_reason in CUT_SHORT and len(lines) > 1:
        lines = lines[:-1]
    lines = _at_cursor(lines, shape)
    keep, _ = _scan(lines, shape)
    lines = [ln.rstrip() for ln in lines[:keep]]
    while len(lines) > 1 and not lines[-1]:
        lines.pop()
    if _body_too_shallow(lines, shape):
        return ""
    out = "\n".join(lines)
    if shape.in_word:
        out = _word_start(out)
    out = _before_closer(out, shape.line_after)
    out = _drop_overlap(out, shape.line_after)
    if shape.python and out.strip():
        out = _parsing_part(out, shape)
    if not out.strip():
        return ""
    return out.replace("\n", shape.eol) if shape.eol != "\n" else out


def _scan(lines: list[str], shape: Shape) -> tuple[int, bool]:
    """How many of ``lines`` to keep, and whether a stop rule fired (rather than the
    lines simply running out)."""
    if shape.mode == "line":
        return 1, len(lines) > 1
    seen_body = bool(lines[0].strip())
    blank_before = False
    for i in range(1, len(lines)):
        if i >= shape.max_lines:
            return i, True
        line = lines[i]
        if not line.strip():
            blank_before = True
            continue
        if shape.next_line and line.strip() == shape.next_line.strip():
            return i, True  # the document already continues with this line
        ind = _width(line)
        if shape.opens_block:
            if ind <= shape.indent:
                closes = ind == shape.indent and line.strip().startswith(CLOSERS)
                return (i + 1, True) if closes else (i, True)
        elif ind < shape.indent:
            return i, True  # the enclosing block ends
        elif blank_before and seen_body and ind <= shape.indent:
            return i, True  # a new paragraph at this level: the completion is done
        seen_body = True
        blank_before = False
    return len(lines), False


def _at_cursor(lines: list[str], shape: Shape) -> list[str]:
    """The lines starting at the cursor: on a blank line, no blank line first (the model's
    newline before its code), and the first line fitted to the cursor's indentation."""
    blank_line = not (shape.line_before + shape.line_after).strip()
    if len(lines) > 1 and not lines[0].strip() and blank_line:
        lines = lines[1:]
        if shape.after_indent:  # the model's block moves to the cursor's indentation
            shift = shape.indent - _width(lines[0])
            lines = [lines[0], *(_shifted(ln, shift) for ln in lines[1:])]
    return [_fit_first_line(lines[0], shape), *lines[1:]]


def _shifted(line: str, shift: int) -> str:
    """``line`` indented ``shift`` columns more (less when negative, as far as it can)."""
    if not line.strip():
        return line
    if shift >= 0:
        return " " * shift + line
    expanded = line.expandtabs(TAB)
    return expanded[min(-shift, _width(expanded)) :]


def _fit_first_line(first: str, shape: Shape) -> str:
    """The first line starts at the cursor: no indentation on top of the user's, no second
    space after a space."""
    if shape.after_indent:
        return first.lstrip(" \t")
    if shape.line_before.endswith((" ", "\t")) and first.startswith(" "):
        return first.lstrip(" ")
    return first


def _opener_above(cursor: Cursor) -> int | None:
    """The indentation of the statement that the last non-blank line before the cursor's
    ends, when that line opens a block (``if (a\n        and b):`` is at the ``if``'s)."""
    above = cursor.before[: len(cursor.before) - len(cursor.line_before)].rstrip()
    if not above:
        return None
    lines = above.replace("\r", "").split("\n")[-20:]
    if not lines[-1].rstrip().endswith(OPENERS):
        return None
    depth = 0  # brackets the lines from the opener line back up to here leave closed
    for line in reversed(lines):
        depth += sum(line.count(c) for c in ")]}") - sum(line.count(c) for c in "([{")
        if depth <= 0:
            return _width(line)
    return _width(lines[-1])


def _body_too_shallow(lines: list[str], shape: Shape) -> bool:
    """Whether the first line of a block body sits at (or left of) the level of the line
    that opens the block: ``if x:`` followed by ``y()`` at the ``if``'s indentation."""
    if shape.body_of is None:
        return False
    for i, line in enumerate(lines):
        if line.strip():
            width = _width(shape.line_before + line) if i == 0 else _width(line)
            return width <= shape.body_of and not line.strip().startswith(CLOSERS)
    return False


def _word_start(text: str) -> str:
    """Inside a word, only more of the word: the word characters the text starts with."""
    m = re.match(r"\w*", text)
    return m.group(0) if m else ""


def _before_closer(text: str, line_after: str) -> str:
    """Cut ``text`` before a closing bracket it adds when the same bracket already follows
    the cursor (``f(|)`` and ``x, y):`` give ``x, y``)."""
    after = line_after.lstrip()
    if not after or after[0] not in syntax.CLOSE:
        return text
    i = syntax.unmatched_closer(text)
    if i is None or text[i] != after[0]:
        return text
    return text[:i].rstrip()


def _parsing_part(text: str, shape: Shape) -> str:
    """Python: the lines of ``text`` up to the last after which the code around the cursor
    parses (all of it when the parser cannot tell)."""
    lines = text.split("\n")
    keep = syntax.python_keep(shape.before, lines, shape.after)
    if keep is None:
        return text
    lines = lines[:keep]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _drop_overlap(text: str, line_after: str) -> str:
    """Remove the longest end of ``text`` that is also the start of ``line_after``."""
    after = line_after.rstrip()
    if not after:
        return text
    for k in range(min(len(text), len(after)), 0, -1):
        if text.endswith(after[:k]):
            return text[:-k]
    return text


def _width(line: str) -> int:
    expanded = line.expandtabs(TAB)
    return len(expanded) - len(expanded.lstrip(" "))
