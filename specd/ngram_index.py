"""An incrementally updated n-gram index over token sequences, for prompt-lookup drafting.

For every n in [min_n, max_n] the index maps an n-gram to the position right after its most
recent occurrence whose continuation is already known. Appending tokens touches only the
n-grams that end at the new positions, so the cost per committed token is O(max_n), never a
rescan of the sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class Corpus(Protocol):
    """Text outside the request that a drafter may copy from."""

    def lookup(self, suffix: Sequence[int], budget: int) -> list[int]:
        """Continuation (at most ``budget`` tokens) of the longest n-gram ending ``suffix``."""
        ...


class NgramIndex:
    """An append-only token sequence with an n-gram -> continuation-start index."""

    def __init__(
        self, tokens: Iterable[int] = (), *, min_n: int = 1, max_n: int = 4, keep: int = 1
    ) -> None:
        if not (1 <= min_n <= max_n):
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.min_n = min_n
        self.max_n = max_n
        self.keep = keep  # occurrences remembered per n-gram (for alternative continuations)
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._older: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Iterable[int]) -> None:
        """Append tokens and index the n-grams whose continuation they reveal."""
        toks = self.tokens
        index = self._index
        for t in new_tokens:
            toks.append(int(t))
            end = len(toks) - 1  # n-grams ending just before the new token now have one
            for n in range(self.min_n, self.max_n + 1):
                start = end - n
                if start < 0:
                    break
                key = tuple(toks[start:end])
                if self.keep > 1:
                    prev = index.get(key)
                    if prev is not None:
                        older = self._older.setdefault(key, [])
                        older.insert(0, prev)
                        del older[self.keep - 1 :]
                index[key] = end

    def truncate(self, length: int) -> None:
        """Drop tokens past ``length``. Entries pointing past it are removed lazily by
        :meth:`match` (they fail its bounds check), so this costs O(removed)."""
        del self.tokens[length:]

    def match(self, suffix: Sequence[int], least: int = 1) -> tuple[int, int]:
        """Find the longest n (max_n down to min_n, and to ``least`` at the shortest) whose
        last n tokens of ``suffix`` occur in the index. :returns: (continuation start, n), or
        (-1, 0) when nothing matches."""
        toks = self.tokens
        for n in range(min(self.max_n, len(suffix)), max(self.min_n, least) - 1, -1):
            key = tuple(suffix[len(suffix) - n :])
            pos = self._index.get(key)
            if pos is not None and pos < len(toks) and tuple(toks[pos - n : pos]) == key:
                return pos, n
        return -1, 0

    def continuations(
        self, suffix: Sequence[int], budget: int, limit: int, least: int = 1
    ) -> list[list[int]]:
        """Up to ``limit`` continuations of the longest matching n-gram of at least ``least``
        tokens, most recent first, each starting with a different token (needs ``keep > 1``
        for more than one)."""
        pos, n = self.match(suffix, least)
        if pos < 0 or budget <= 0:
            return []
        key = tuple(suffix[len(suffix) - n :])
        out = [self.tokens[pos : pos + budget]]
        firsts = {out[0][0]}
        for p in self._older.get(key, ()):
            if len(out) >= limit:
                break
            if (
                p < len(self.tokens)
                and tuple(self.tokens[p - n : p]) == key
                and self.tokens[p] not in firsts
            ):
                firsts.add(self.tokens[p])
                out.append(self.tokens[p : p + budget])
        return out

    def lookup(self, suffix: Sequence[int], budget: int) -> list[int]:
        pos, _ = self.match(suffix)
        if pos < 0 or budget <= 0:
            return []
        return self.tokens[pos : pos + budget]

    def lookup_self(self, budget: int) -> list[int]:
        """Continuation for this sequence's own suffix, from an earlier occurrence."""
        return self.lookup(self.tokens, budget)


class CorpusIndex:
    """Several named NgramIndex documents searched together (the editor's workspace).

    ``set_document`` replaces one document's index, ``append`` grows one; lookups prefer the
    longest match and, among equal lengths, the most recently updated document.
    """

    def __init__(self, *, min_n: int = 2, max_n: int = 4, max_documents: int = 256) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_documents = max_documents
        self._docs: dict[str, NgramIndex] = {}

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, key: str) -> bool:
        return key in self._docs

    def set_document(self, key: str, tokens: Sequence[int]) -> None:
        self._docs.pop(key, None)
        self._docs[key] = NgramIndex(tokens, min_n=self.min_n, max_n=self.max_n)
        self._evict()

    def append(self, key: str, tokens: Sequence[int]) -> None:
        doc = self._docs.pop(key, None)
        if doc is None:
            doc = NgramIndex(min_n=self.min_n, max_n=self.max_n)
        doc.extend(tokens)
        self._docs[key] = doc
        self._evict()

    def remove(self, key: str) -> None:
        self._docs.pop(key, None)

    def _evict(self) -> None:
        while len(self._docs) > self.max_documents:
            self._docs.pop(next(iter(self._docs)))

    def lookup(self, suffix: Sequence[int], budget: int) -> list[int]:
        best: list[int] = []
        best_n = 0
        for doc in reversed(list(self._docs.values())):
            pos, n = doc.match(suffix)
            if pos >= 0 and n > best_n:
                best, best_n = doc.tokens[pos : pos + budget], n
                if n == doc.max_n:
                    break
        return best
