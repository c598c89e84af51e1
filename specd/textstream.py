"""Incremental detokenization with stop strings.

Text is released only when it is final: not the tail of an unfinished UTF-8 character and
not a possible beginning of a stop string. Each token decodes two short windows (the last
released tokens, and those plus the new ones), so the cost per token does not grow with
the length of the output and tokenizers that drop a leading space at the start of a
decode (SentencePiece) still join correctly.

The two rules about stop strings are functions of their own (:func:`find_stop`,
:func:`held_back`), for text that arrives as text: a remote server's stream.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """Where the first stop string in ``text[start:]`` begins, or -1 when there is none."""
    at = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(at, default=-1)


def held_back(text: str, stops: Sequence[str], released: int = 0) -> int:
    """How many characters at the end of ``text`` to hold back: the longest end that
    could still grow into a stop string, no further back than ``released`` (text already
    released stays so)."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text) - released), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


class TextStream:
    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.token_ids: list[int] = []
        self.stopped = False
        self._text = ""
        self._sent = 0
        self._prefix = 0  # window start
        self._read = 0  # tokens up to here are in _text

    @property
    def text(self) -> str:
        return self._text

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _catch_up(self, final: bool = False) -> None:
        ids = self.token_ids
        before = self._decode(ids[self._prefix : self._read])
        full = self._decode(ids[self._prefix :])
        if full.endswith("\ufffd") and not final:
            return  # an unfinished multi-byte character: wait for its other tokens
        self._text += full[len(before) :]
        self._prefix, self._read = self._read, len(ids)

    def push(self, token_ids: Sequence[int]) -> tuple[str, int]:
        """Add tokens. :returns: (newly final text, how many of ``token_ids`` were kept).
        Once a stop string appears, the text is cut before it and later tokens are dropped."""
        if self.stopped:
            return "", 0
        kept = 0
        for t in token_ids:
            self.token_ids.append(int(t))
            kept += 1
            self._catch_up()
            if self.stop and self._find_stop():
                break
        return self._release(), kept

    def _find_stop(self) -> bool:
        horizon = max(len(s) for s in self.stop)
        cut = find_stop(self._text, self.stop, max(0, self._sent - horizon))
        if cut < 0:
            return False
        self._text = self._text[:cut]
        self.stopped = True
        return True

    def _release(self) -> str:
        end = len(self._text)
        if not self.stopped:
            end -= held_back(self._text, self.stop, self._sent)
        end = max(end, self._sent)
        out = self._text[self._sent : end]
        self._sent = end
        return out

    def flush(self) -> str:
        """Release everything held back; call once when generation ends."""
        if not self.stopped and self._read < len(self.token_ids):
            self._catch_up(final=True)
        out = self._text[self._sent :]
        self._sent = len(self._text)
        return out
