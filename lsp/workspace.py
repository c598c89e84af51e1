"""Workspace drafting: an n-gram index over the open documents and the completions the
user accepted, which the engine's drafter copies from (``Engine.stream(corpus=...)``).

The event loop only *marks* what changed (a dictionary write per notification); the
generation worker calls :meth:`WorkspaceIndex.refresh` before each generation and
re-tokenizes just the documents marked since the last one. A burst of keystrokes therefore
costs one re-index of one document, done when a completion is actually computed. A
document already indexed is re-tokenized at most once every ``reindex_s`` seconds while
it keeps changing: its latest edits lie near the cursor, inside the prompt, which the
drafter searches before the index, and re-tokenizing a 65 kB file (plus rebuilding its
n-grams) costs ~45 ms of every request's time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from specd import CorpusIndex

from .documents import Document
from .prompting import CHARS_PER_TOKEN, scrub

ACCEPTED = "specd:accepted"  # the index document holding accepted completions
#: an indexed document that keeps changing is re-tokenized at most this often
REINDEX_S = 2.0


class WorkspaceIndex:
    """One session's drafting index.

    :param encode: text -> token ids (``Engine.tokenize``).
    :param max_chars: documents longer than this are left out (tokenizing them on every
        change would cost more than drafting saves).
    :param accepted_history: how many accepted completions to remember.
    :param max_tokens: cap on the tokens indexed in all (the index costs a few hundred
        bytes per token); past it the least recently updated documents leave the index.
    :param reindex_s: an indexed document is re-tokenized at most this often; its changes
        wait until then (new documents, closes and accepted completions apply at once).
    :param clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        *,
        max_chars: int = 1_000_000,
        accepted_history: int = 64,
        max_documents: int = 256,
        max_tokens: int = 400_000,
        reindex_s: float = REINDEX_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._encode = encode
        self.max_chars = max_chars
        self.max_documents = max_documents
        self.max_tokens = max_tokens
        self.corpus = CorpusIndex(max_documents=max_documents + 1)
        self._accepted: deque[list[int]] = deque(maxlen=max(accepted_history, 1))
        self._keep_accepted = accepted_history > 0
        self._lock = threading.Lock()
        self._pending: dict[str, Document | None] = {}  # uri -> document to index, None: drop
        self._pending_accepted: list[str] = []
        self._tokens: dict[str, tuple[list[str], list[int]]] = {}  # uri -> (lines indexed, ids)
        self._sizes: OrderedDict[str, int] = OrderedDict()  # uri -> tokens, least recent first
        self._total = 0
        self.reindex_s = reindex_s
        self._clock = clock
        self._indexed_at: dict[str, float] = {}  # uri -> when it was last tokenized
        self.reindexed = 0  # documents re-tokenized so far (for tests and stats)

    # -- called on the event loop ---------------------------------------------------------

    def changed(self, doc: Document) -> None:
        """``doc`` was opened or edited: re-index it before the next generation."""
        with self._lock:
            self._pending.pop(doc.uri, None)  # re-insert: the order is recency
            self._pending[doc.uri] = doc

    def closed(self, uri: str) -> None:
        with self._lock:
            if uri in self._sizes or uri in self._pending:
                self._pending[uri] = None
            # else it was never indexed: nothing to undo, and nothing to remember (an
            # open/close storm of new documents must not grow this dictionary)

    def accepted(self, text: str) -> None:
        """The user accepted a completion: draft from it too."""
        if text and self._keep_accepted:
            with self._lock:
                self._pending_accepted.append(text)
                keep = self._accepted.maxlen
                if keep is not None:
                    del self._pending_accepted[:-keep]

    # -- called by the generation worker --------------------------------------------------

    def refresh(self) -> int:
        """Apply what changed since the last call. :returns: documents re-tokenized."""
        now = self._clock()
        with self._lock:
            pending, self._pending = self._pending, {}
            accepted, self._pending_accepted = self._pending_accepted, []
            for uri, doc in list(pending.items()):  # indexed lately: its edits can wait
                last = self._indexed_at.get(uri)
                if doc is not None and last is not None and now - last < self.reindex_s:
                    self._pending[uri] = pending.pop(uri)
        n = 0
        # only the most recently changed documents: older ones would be evicted anyway
        fresh = [uri for uri, doc in pending.items() if doc is not None][-self.max_documents :]
        for uri, doc in pending.items():
            if doc is None or uri not in fresh or len(doc.text) > self.max_chars:
                self._forget(uri)
                continue
            lines = doc.lines
            ids = self.encode(doc.text)
            self._forget(uri)
            self._tokens[uri] = (lines, ids)
            self.corpus.set_document(uri, ids)
            self._sizes[uri] = len(ids)
            self._total += len(ids)
            self._indexed_at[uri] = now
            n += 1
        while self._total > self.max_tokens and len(self._sizes) > 1:
            self._forget(next(iter(self._sizes)))
        if accepted:
            for text in accepted:
                self._accepted.append(self.encode(text))
            self.corpus.set_document(ACCEPTED, [t for ids in self._accepted for t in ids])
        self.reindexed += n
        return n

    def _forget(self, uri: str) -> None:
        self._indexed_at.pop(uri, None)
        self.corpus.remove(uri)
        self._tokens.pop(uri, None)
        self._total -= self._sizes.pop(uri, 0)

    def head_tokens(self, doc: Document, limit: int) -> list[int]:
        """The first ``limit`` tokens of ``doc`` (from the index when it is current)."""
        cached = self._tokens.get(doc.uri)
        if cached is not None and cached[0] is doc.lines:
            return cached[1][:limit]
        return self.encode(doc.head(limit * CHARS_PER_TOKEN))[:limit]

    def encode(self, text: str) -> list[int]:
        return self._encode(scrub(text))

    def __len__(self) -> int:
        return len(self.corpus)
