"""Debounce from the user's own typing rhythm.

Editors ask for a completion at nearly every keystroke. A request that arrives while the
user is in the middle of a burst of typing is likely to be stale before it is answered;
starting a generation for it would also stop the background work (a warm-up, the rest of
a suggestion) that the request after the burst needs. So a request waits a little when,
judging from the intervals between this user's recent edits, another keystroke is due;
an edit during the wait cancels it. The same rhythm sets how often the next prompt is
warmed up while the user types.
"""

from __future__ import annotations

import time
from collections import deque

from specd import percentile

#: intervals longer than this are pauses, not typing rhythm
BURST_GAP_S = 1.0
#: a request never waits longer than this for the next keystroke
MAX_DELAY_S = 0.12
#: the interval between warm-ups before any rhythm is known, and the shortest
DEFAULT_PAUSE_S = 0.3


class Rhythm:
    """Intervals between one session's edits, and the delays they suggest.

    :param window: how many recent intervals the rhythm is taken from.
    :param fixed_delay_s: a fixed request delay instead of the adaptive one (0: none).
    """

    def __init__(self, window: int = 32, fixed_delay_s: float | None = None) -> None:
        self._intervals: deque[float] = deque(maxlen=window)
        self._last: dict[str, float] = {}
        self.fixed_delay_s = fixed_delay_s

    def edited(self, uri: str, now: float | None = None) -> None:
        """Record an edit of ``uri``."""
        now = time.monotonic() if now is None else now
        last = self._last.get(uri)
        if last is not None and 0 < now - last < BURST_GAP_S:
            self._intervals.append(now - last)
        self._last[uri] = now

    def forget(self, uri: str) -> None:
        self._last.pop(uri, None)

    @property
    def interval_s(self) -> float | None:
        """The user's typical interval between keystrokes (median), once known."""
        if len(self._intervals) < 4:
            return None
        return percentile(list(self._intervals), 50)

    def request_delay(self, uri: str, now: float | None = None, *, mid_word: bool = True) -> float:
        """How long a request for ``uri`` should wait for a keystroke that may make it
        stale: until 1.5 typical intervals after the last edit, at most
        :data:`MAX_DELAY_S`, and not at all once the user has paused.

        :param mid_word: whether the cursor follows a word character. Only there is the
            next keystroke sure to make the suggestion stale; at the start of a line, after
            a bracket, an operator or a space, where users stop to read a suggestion, the
            request does not wait (a fixed delay applies everywhere).
        """
        if self.fixed_delay_s is not None:
            return self.fixed_delay_s
        if not mid_word:
            return 0.0
        typical = self.interval_s
        last = self._last.get(uri)
        if typical is None or last is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(0.0, min(1.5 * typical, MAX_DELAY_S) - (now - last))

    def pause_s(self) -> float:
        """The interval between warm-ups while typing: eight typical keystroke intervals,
        within 0.3-1 s (each warm-up costs a prompt build the next request may wait for)."""
        typical = self.interval_s
        if typical is None:
            return DEFAULT_PAUSE_S
        return min(max(8 * typical, DEFAULT_PAUSE_S), BURST_GAP_S)
