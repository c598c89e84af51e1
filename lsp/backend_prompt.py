"""Taking a built prompt apart again, for servers that build their own (llama.cpp's
``/infill`` asks for the prefix, the suffix and the other files separately)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from . import prompting


@dataclasses.dataclass
class SplitPrompt:
    """A built prompt taken apart again: what ``/infill`` asks for separately."""

    prefix: str
    suffix: str
    extra: list[tuple[str, str]]
    stops: tuple[str, ...]
    #: where the cursor is in the ids: the end of the prefix
    cursor: int


def split_prompt(
    ids: list[int], vocab: prompting.Vocabulary, decode: Callable[..., str]
) -> SplitPrompt:
    """Find the fill-in-the-middle template in ``ids`` (control tokens are added by id, so
    they cannot come from the user's text) and cut the prompt at its markers; a prompt
    without one is all prefix."""
    for t in prompting.TEMPLATES.values():
        p, s = vocab.special(t.prefix), vocab.special(t.suffix)
        if p is None or s is None or p not in ids or s not in ids:
            continue
        ip, is_ = ids.index(p), ids.index(s)
        m = vocab.special(t.middle)
        if t.order == "sp":
            head, suffix, prefix = ids[:is_], ids[is_ + 1 : ip], ids[ip + 1 :]
            cursor = len(ids)
        else:
            end = ids.index(m, is_) if m is not None and m in ids[is_:] else len(ids)
            head, prefix, suffix = ids[:ip], ids[ip + 1 : is_], ids[is_ + 1 : end]
            cursor = is_
        return SplitPrompt(
            decode(prefix, skip_special_tokens=True),
            decode(suffix, skip_special_tokens=True),
            _documents(head, vocab.special(t.file_sep), decode),
            t.stop,
            cursor,
        )
    return SplitPrompt(decode(ids, skip_special_tokens=True), "", [], (), len(ids))


def _documents(
    head: list[int], sep: int | None, decode: Callable[..., str]
) -> list[tuple[str, str]]:
    """The other files of a repository-level prompt: ``<file_sep>path\\ntext`` each."""
    if sep is None:
        return []
    out = []
    pieces: list[list[int]] = [[]]
    for t in head:
        if t == sep:
            pieces.append([])
        else:
            pieces[-1].append(t)
    for piece in pieces[1:]:
        name, _, text = decode(piece, skip_special_tokens=True).partition("\n")
        if text.strip():  # the current file's header has a path and no text
            out.append((name, text))
    return out
