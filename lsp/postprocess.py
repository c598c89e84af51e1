"""Turning what the model wrote into what the editor shows.

The cursor's context decides the *shape*: in the middle of a line the completion is one
line; at the end of a line, or on a blank line, it is a block that ends where the
indentation says the block ends. The completion never repeats text that already follows
the cursor, keeps at most ``max_lines`` lines, and has no trailing whitespace.

:func:`should_stop` applies the same rules to a partial completion, so generation stops as
soon as the result cannot change any more instead of running to ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .documents import Cursor

OPENERS = (":", "{", "(", "[", "=>", "->", " do", " then", " else", " begin")
CLOSERS = ("}", ")", "]", "end", "fi", "done", "esac", "until")
TAB = 4


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
    """

    mode: str
    indent: int
    opens_block: bool
    max_lines: int
    line_after: str = ""
    next_line: str = ""
    eol: str = "\n"


def shape_for(cursor: Cursor, *, mode: str = "auto", max_lines: int = 8) -> Shape:
    """Decide the shape of a completion at ``cursor`` (``mode``: auto, line or block)."""
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
    )


def should_stop(text: str, shape: Shape) -> bool:
    """True when more generated text cannot change the completion."""
    lines = text.split("\n")
    if shape.mode == "line" or len(lines) > shape.max_lines or len(lines) == 1:
        return len(lines) > shape.max_lines
    # the last line may still grow (its indentation too): judge the ended ones
    return _scan(lines[:-1], shape)[1]


def finish(text: str, shape: Shape, *, finish_reason: str = "") -> str:
    """The completion to show for the generated ``text``.

    :param finish_reason: the engine's; when the time budget ran out mid-line in block
        mode, the unfinished line is dropped.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if finish_reason == "time" and shape.mode == "block" and len(lines) > 1:
        lines = lines[:-1]
    keep, _ = _scan(lines, shape)
    lines = [ln.rstrip() for ln in lines[:keep]]
    while len(lines) > 1 and not lines[-1]:
        lines.pop()
    out = "\n".join(lines)
    out = _drop_overlap(out, shape.line_after)
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
