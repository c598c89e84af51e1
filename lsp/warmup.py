"""One session's work around its requests: the completion cache, warm-ups, prefetches and
the debounce (docs/editors.md, "How suggestions are produced").

- **Warm-up**: when a document opens, when an edit lands far from the last one, and while
  the user types (at most once per pause interval of their rhythm), the prompt the next
  request will need is prefilled in the background (``Completer.warm``), so the request
  computes only the few tokens typed since. When the prompt's window is about to move
  down (its start steps by whole lines once the text before the cursor outgrows it), the
  window after the move is read too, so the request after it does not read it all anew.
- **Completion cache**: a request whose typed text follows what the model already wrote is
  answered from it (:mod:`.cache`), waiting if needed for the generation still writing it.
- **Prefetch**: once the user has typed a cached suggestion through, the completion at the
  new cursor is generated in the background, before it is asked for.
- **Debounce**: a request waits briefly when the typing rhythm says a keystroke that would
  make it stale is due (:mod:`.debounce`).

Everything here runs on the event loop; the model work goes to the service's worker as
background jobs, which any request preempts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .cache import CompletionCache
from .completer import Completer, CompletionRequest, CompletionResult, shape_of
from .config import Settings
from .debounce import Rhythm
from .documents import Document, Position
from .metrics import Metrics
from .postprocess import after_word
from .runner import Job, Runner

#: an edit this many lines from the last warmed position is warmed at once
FAR_LINES = 24
#: a warm-up also reads the window the prompt steps to next when fewer than this many
#: more characters typed before the cursor would make the step (about three lines of code)
AHEAD_CHARS = 120
#: how often a request waiting for a running generation looks at it again
POLL_S = 0.01
#: a document's warm-up on opening waits this long: an edit right after the opening (a
#: jump to a line, typing at once) shows where the cursor is, and its warm-up takes the
#: place of one at the file's end, which a request could otherwise wait behind for a
#: chunk (~0.1 s on a 2-core CPU)
OPEN_WARM_S = 0.25


class Background:
    """The pipeline around one session's requests.

    :param request_at: builds the request for a document at a position (None: the end of
        the document); None when the document is not open.
    :param version_of: the current version of a document (None when closed).
    :param key: the session's job-key prefix.
    :param request_ahead: builds the request at a position with the window its prompt
        steps to next, where that step is less than :data:`AHEAD_CHARS` characters of
        typing away (None: no read-ahead).
    """

    def __init__(
        self,
        worker: Runner,
        completer: Completer,
        metrics: Metrics,
        *,
        key: str,
        request_at: Callable[[str, Position | None], CompletionRequest | None],
        version_of: Callable[[str], int | None],
        request_ahead: Callable[[str, Position], CompletionRequest | None] | None = None,
    ) -> None:
        self.worker = worker
        self.completer = completer
        self.metrics = metrics
        self.key = key
        self.request_at = request_at
        self.version_of = version_of
        self.request_ahead = request_ahead
        self.cache = CompletionCache()
        self.rhythm = Rhythm()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._warmed_line: dict[str, int] = {}
        self._cursor: dict[str, Position] = {}  # where the last edit left the cursor

    # -- document events ---------------------------------------------------------------------

    def opened(self, uri: str, settings: Settings) -> None:
        """A document opened: warm the prompt at its end (the whole file, for a file that
        fits the prompt window), unless an edit within :data:`OPEN_WARM_S` says where."""
        if settings.warm_up:
            self._cursor.pop(uri, None)
            self._schedule(uri, OPEN_WARM_S)

    def edited(self, uri: str, pos: Position | None, settings: Settings) -> None:
        """A document changed; ``pos`` is where the edit left the cursor, if known."""
        self.rhythm.edited(uri)
        if pos is None:
            return
        self._cursor[uri] = pos
        if settings.completion_cache:
            req = self.request_at(uri, pos)
            hit = self.cache.lookup(uri, req.cursor) if req is not None else None
            if hit is not None and req is not None:
                if hit.exhausted and not hit.entry.prefetched:
                    hit.entry.prefetched = True
                    self.prefetch(req)
                return  # the suggestion still applies: its generation is the best warm-up
            if settings.cancel_on_change:  # the user left the suggestion being written
                self.worker.cancel_key(self.request_key(uri), "changed")
        if settings.warm_up:
            far = abs(pos.line - self._warmed_line.get(uri, -FAR_LINES - 1)) > FAR_LINES
            if far:
                self._schedule(uri, 0.0)
            elif uri not in self._timers:  # a throttle, not a debounce: fast typing
                self._schedule(uri, self.rhythm.pause_s())  # may never pause

    def closed(self, uri: str) -> None:
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self.cache.forget(uri)
        self.rhythm.forget(uri)
        self._warmed_line.pop(uri, None)
        self._cursor.pop(uri, None)
        for kind in ("warm", "prefetch"):
            self.worker.cancel_key(f"{self.key}{kind}:{uri}", "changed")

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # -- requests ------------------------------------------------------------------------------

    async def from_cache(self, req: CompletionRequest) -> CompletionResult | None:
        """The answer from the completion cache, or None when the request needs the model.

        When the request follows a generation that is still running but has not finished
        the line the user is on, wait for it (up to the time budget) rather than start
        another generation for the same text."""
        hit = self.cache.lookup(req.uri, req.cursor)
        if hit is None:
            return None
        s = req.settings
        shape = shape_of(req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.time_budget_ms / 1000
        waited = False
        while not (text := hit.shown(shape)):
            if hit.entry.done or loop.time() > deadline or self.stale(req):
                return None
            waited = True
            await asyncio.sleep(POLL_S)
        self.metrics.count("from_cache")
        self.metrics.count("cache_waits", waited)
        return CompletionResult(text, hit.rest, finish_reason="cache")

    async def debounce(self, req: CompletionRequest) -> bool:
        """Wait as the typing rhythm says; :returns: False when an edit made ``req`` stale."""
        setting = req.settings.debounce_ms
        self.rhythm.fixed_delay_s = None if setting == "auto" else setting / 1000
        delay = self.rhythm.request_delay(req.uri, mid_word=after_word(req.cursor.line_before))
        if delay <= 0:
            return True
        self.metrics.count("debounced")
        await asyncio.sleep(delay)
        return not self.stale(req)

    def stale(self, req: CompletionRequest) -> bool:
        return req.settings.cancel_on_change and self.version_of(req.uri) != req.version

    def prefetch(self, req: CompletionRequest) -> None:
        """Generate the completion at ``req``'s cursor into the cache, in the background."""
        req.entry = self.cache.start(req.uri, req.cursor)
        self._warmed_line[req.uri] = req.cursor.line
        job = Job(
            key=f"{self.key}prefetch:{req.uri}",
            run=lambda job: self.completer.complete(req),
            done=self._done("prefetches", req),
            cancel_event=req.cancel,
            background=True,
        )
        self.worker.submit(job)

    def request_key(self, uri: str) -> str:
        return f"{self.key}{uri}"

    # -- warm-ups -----------------------------------------------------------------------------

    def _schedule(self, uri: str, delay: float) -> None:
        old = self._timers.pop(uri, None)
        if old is not None:
            old.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a server driven in-process): nothing to time
            return
        self._timers[uri] = loop.call_later(delay, self._warm, uri)

    def _warm(self, uri: str) -> None:
        self._timers.pop(uri, None)
        if self.version_of(uri) is None:
            return  # closed
        at = self._cursor.get(uri)
        self._warmed_line[uri] = at.line if at is not None else 1 << 30

        def run(job: Job) -> tuple[int, int]:
            # The prompt is built when the job runs, at the cursor of the latest edit: the
            # user may have typed on while the worker was busy.
            return self.warm_now(uri, self._cursor.get(uri), job.cancel_event)

        job = Job(
            key=f"{self.key}warm:{uri}",
            run=run,
            done=self._done("warmups"),
            background=True,
        )
        self.worker.submit(job)

    def warm_now(self, uri: str, at: Position | None, cancel: threading.Event) -> tuple[int, int]:
        """Prefill the prompt of a request at ``at`` (None: the document's end) and, with
        ``read-ahead``, the window that prompt steps to next when the step is near.

        :returns: (tokens already cached, tokens computed now), both prompts together."""
        req = self.request_at(uri, at)
        if req is None:
            return 0, 0
        req.cancel = cancel
        cached, computed = self.completer.warm(req)
        ahead = None
        if self.request_ahead is not None and at is not None and req.settings.read_ahead:
            ahead = self.request_ahead(uri, at)
        if ahead is None or ahead.cursor.before == req.cursor.before or cancel.is_set():
            return cached, computed
        ahead.cancel = cancel
        more = self.completer.warm(ahead)
        self.metrics.count("read_ahead", int(more[1] > 0))
        return cached + more[0], computed + more[1]

    def _done(
        self, counter: str, req: CompletionRequest | None = None
    ) -> Callable[[Any, BaseException | None, Job], None]:
        def done(result: Any, error: BaseException | None, job: Job) -> None:
            if req is not None and req.entry is not None and not req.entry.done:
                req.entry.finish_reason = "cancelled"  # it never ran: nobody waits on it
            if error is not None or result is None:
                if job.cancelled:
                    self.metrics.count("background_stopped")
                return
            self.metrics.count(counter)
            if counter == "warmups":
                self.metrics.count("warmed_tokens", result[1])
            if job.cancelled:
                self.metrics.count("background_stopped")

        return done


def cursor_after(doc: Document, changes: Sequence[Any], encoding: str) -> Position | None:
    """Where the last ranged edit left the cursor: the end of its inserted text."""
    change = changes[-1] if changes else None
    rng = getattr(change, "range", None)
    if change is None or rng is None:
        return None
    start = doc.resolve(rng.start.line, rng.start.character, encoding)
    text = change.text.replace("\r\n", "\n").replace("\r", "\n")
    if "\n" not in text:
        return Position(start.line, start.column + len(text))
    return Position(start.line + text.count("\n"), len(text.rsplit("\n", 1)[1]))
