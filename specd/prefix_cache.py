"""KV caches kept between requests, so a request that shares a prefix with an earlier one
computes only its new tokens (consecutive keystrokes in an editor)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

from .kvcache import KVCache

#: The default ``min_reuse`` of :class:`PrefixCache`.
MIN_REUSE = 32


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Entry:
    tokens: list[int]
    cache: KVCache


class PrefixCache:
    """An LRU of (token sequence, KV cache) pairs, capped by entry count and bytes.

    ``acquire`` hands out the cache whose tokens share the longest prefix with the request,
    cropped to that prefix, and removes it from the pool so no two requests write to one
    cache; ``release`` returns it with the tokens it now holds.

    :param min_reuse: an entry serves fewer tokens than this only when that is all it holds
        or all the request needs:
        cropping a long entry to a shared header (a template's, a file path's) would throw
        away a warm prompt to save a few tokens of compute.
    """

    def __init__(
        self,
        new_cache,
        *,
        max_entries: int = 4,
        max_bytes: int | None = None,
        min_reuse: int = MIN_REUSE,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.min_reuse = min_reuse
        self._new_cache = new_cache
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._ids = count()
        self._lock = threading.Lock()
        self.lookups = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def acquire(self, tokens: Sequence[int]) -> tuple[KVCache, int]:
        """:returns: a cache holding the first ``n`` of ``tokens``, and ``n``."""
        with self._lock:
            self.lookups += 1
            best_key, best_n = None, 0
            for key, entry in self._entries.items():
                n = self._reusable(entry.tokens, tokens)
                if n > best_n:
                    best_key, best_n = key, n
            if best_key is None:
                if len(self._entries) >= self.max_entries:
                    # recycle the least recently used buffer instead of allocating a new one
                    _, entry = self._entries.popitem(last=False)
                    entry.cache.crop(0)
                    return entry.cache, 0
                return self._new_cache(), 0
            entry = self._entries.pop(best_key)
            entry.cache.crop(best_n)
            self.hits += 1
            self.reused_tokens += best_n
            return entry.cache, best_n

    def cached(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the best entry holds, without taking or cropping it."""
        with self._lock:
            return max(
                (self._reusable(e.tokens, tokens) for e in self._entries.values()), default=0
            )

    def _reusable(self, entry_tokens: Sequence[int], tokens: Sequence[int]) -> int:
        """How many of ``tokens`` an entry holding ``entry_tokens`` serves (0: none)."""
        n = common_prefix(entry_tokens, tokens)
        return n if n >= self.min_reuse or n in (len(entry_tokens), len(tokens)) else 0

    def fill(
        self,
        tokens: Sequence[int],
        extend: Callable[[KVCache, Sequence[int]], object],
        cancel: Callable[[], bool] | None = None,
        chunk: int = 64,
        leave: int = 0,
        first: int | None = None,
    ) -> tuple[int, int]:
        """Make an entry hold ``tokens``: ``extend(cache, piece)`` computes what no entry
        holds, ``chunk`` tokens at a time (``first`` at a time into an empty cache, when
        given), with ``cancel`` checked between chunks; what was computed is kept either way.
        ``leave`` or fewer tokens left: none computed.

        :returns: (tokens an entry already held, tokens computed now).
        """
        held = self.cached(tokens)
        if len(tokens) - held <= leave:
            return held, 0  # acquiring would crop away what the entry holds after them

        def in_chunks(cache: KVCache, rest: Sequence[int], *_: object) -> str:
            start = 0
            while start < len(rest):
                if cancel is not None and cancel():
                    return "cancelled"
                size = first if first and cache.length == 0 else chunk
                extend(cache, rest[start : start + size])
                start += size
            return ""

        cache, held, _ = self.prefill(tokens, in_chunks)
        self.release(cache, tokens[: cache.length])
        return held, cache.length - held

    def prefill(
        self,
        tokens: Sequence[int],
        extend: Callable[..., str],
        stop: Callable[[], str] | None = None,
        hidden: list | None = None,
        leave: int = 0,
    ) -> tuple[KVCache, int, str]:
        """Take the entry holding the longest prefix of ``tokens`` and have ``extend(cache,
        rest, stop, hidden)`` (:meth:`specd.Target.prefill`) compute the rest; on an error
        the cache is dropped, not kept half-filled.

        :param leave: when at most this many tokens are left to compute, compute none of
            them (the caller feeds them with its first step; ``cache.length`` says where).
        :returns: (cache, tokens reused, why ``extend`` stopped early or "")."""
        cache, reused = self.acquire(tokens)
        if len(tokens) - reused <= leave:
            return cache, reused, ""
        try:
            why = extend(cache, list(tokens[reused:]), stop, hidden)
        except BaseException:
            cache.crop(0)
            self.release(cache, [])
            raise
        return cache, reused, why

    def release(self, cache: KVCache, tokens: Sequence[int]) -> None:
        """Return ``cache``, which now holds exactly ``tokens``."""
        if cache.length != len(tokens):
            return  # inconsistent (an error mid-step): drop it rather than risk reuse
        with self._lock:
            self._entries[next(self._ids)] = _Entry(list(tokens), cache)
            while len(self._entries) > self.max_entries or (
                self.max_bytes is not None
                and len(self._entries) > 1
                and sum(e.cache.nbytes() for e in self._entries.values()) > self.max_bytes
            ):
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def nbytes(self) -> int:
        return sum(e.cache.nbytes() for e in self._entries.values())
