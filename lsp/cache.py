"""The completion cache: what the model wrote at a cursor, kept beyond what was shown.

A completion is answered as soon as its first line is ready, and the generation goes on
in the background, appending to its :class:`Entry`. A later request whose text before the
cursor is the entry's text plus something the user typed, where that typed text is the
start of what the model wrote, is answered from the rest of the entry with no model step:
typing along a suggestion, or accepting part of it, costs nothing.

Entries are matched by the last characters before the cursor (the *anchor*) and the first
characters after it, so an entry stays valid however the document changes elsewhere, and
the match costs one substring search per entry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from . import postprocess
from .documents import Cursor

#: characters before the cursor that identify where a completion was generated
ANCHOR_CHARS = 1024
#: characters after the cursor that must be unchanged for an entry to apply
AFTER_CHARS = 256


@dataclass
class Entry:
    """One generation's text, growing while it runs.

    :param anchor: the last characters before the cursor it was generated at.
    :param after: the first characters after that cursor.
    :param raw: what the model wrote so far (written by the generation worker only).
    :param finish_reason: set when the generation ended ("" while it runs).
    """

    uri: str
    anchor: str
    after: str
    raw: str = ""
    finish_reason: str = ""
    prefetched: bool = False  # a prefetch at its end has been asked for

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


@dataclass(frozen=True)
class Hit:
    """A request that follows an entry: the user typed ``typed`` since its cursor."""

    entry: Entry
    typed: str

    @property
    def rest(self) -> str:
        """What the model wrote after the typed text (read live: the entry may grow)."""
        return self.entry.raw[len(self.typed) :]

    @property
    def usable(self) -> str:
        """The part of :attr:`rest` that may be shown: its finished lines while the
        generation runs (the last line may still change) or after it was interrupted;
        all of it once the generation ended, for post-processing to judge exactly as it
        judged the first answer."""
        rest = self.rest
        if self.entry.done and self.entry.finish_reason != "cancelled":
            return rest
        return rest[: rest.rfind("\n") + 1]

    @property
    def exhausted(self) -> bool:
        """The entry ended and the user typed all of it that is worth showing."""
        return self.entry.done and not self.usable.strip()

    def shown(self, shape: postprocess.Shape) -> str:
        """The completion to show at the new cursor ("" when nothing usable yet)."""
        usable = self.usable
        if not usable:
            return ""
        return postprocess.finish(usable, shape, finish_reason=self.entry.finish_reason)


class CompletionCache:
    """The most recent entries of one session, least recently used dropped first."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, uri: str, cursor: Cursor) -> Entry:
        """A new, empty entry for a generation at ``cursor``."""
        entry = Entry(uri, cursor.before[-ANCHOR_CHARS:], cursor.after[:AFTER_CHARS])
        with self._lock:
            self._next += 1
            self._entries[self._next] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def lookup(self, uri: str, cursor: Cursor) -> Hit | None:
        """The newest entry that the text before ``cursor`` follows, if any."""
        after = cursor.after[:AFTER_CHARS]
        with self._lock:
            candidates = [(k, e) for k, e in reversed(self._entries.items()) if e.uri == uri]
        for key, entry in candidates:
            if entry.after != after or not entry.anchor:
                continue
            at = cursor.before.rfind(entry.anchor)
            if at < 0:
                continue
            typed = cursor.before[at + len(entry.anchor) :]
            if entry.raw.startswith(typed):
                with self._lock:
                    if key in self._entries:
                        self._entries.move_to_end(key)
                return Hit(entry, typed)
        return None

    def forget(self, uri: str) -> None:
        """Drop a closed document's entries."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.uri == uri]:
                del self._entries[key]
