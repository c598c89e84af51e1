"""The one generation thread behind the language server and ``specd serve --http``: a
queue fair by client, one cancellation path, and the generation loop both run.

The engine runs one generation at a time, on a thread of its own, so the event loop stays
free to read messages (cancellations above all). Work waits in a queue:

- **Fair by client**: requests are taken round-robin across clients and first-in,
  first-out within one (a client that sends ten requests does not make another wait
  behind all ten). An HTTP client is its API key or address; a language-server session
  is one client.
- **Newest first per key**: a job cancels every older job with its key (a newer request
  for the same document): a queued one never starts, the running one stops at its next
  decode step.
- **Background jobs** (warm-ups, prefetches, a completion that has answered and goes on
  filling the completion cache) run only when no request waits; a request that arrives
  cancels the running one, which keeps what it computed in the prefix cache.
- **Bounded**: with a ``limit``, a request beyond it gets :class:`QueueFull` (a 503).

Every job has one cancel flag, which :class:`ServedGeneration` hands to the engine's check
before every target step: a cancel returns within one decode step. It also cuts the text
at a template stop token, ends a generation its owner halts, and drains the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specd import Completion, Delta, SamplingParams

from .engines import CompletionEngine

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """Every place in the queue is taken."""


@dataclass(eq=False)
class Job:
    """Work for the runner.

    :param key: jobs with equal non-empty keys supersede each other.
    :param run: called on the generation thread with the job; returns the job's result.
    :param done: called once with (result, error, job): on the generation thread after
        ``run``, or on the cancelling thread when the job is cancelled before it started
        (then result and error are None and ``job.reason`` says why).
    :param client: whom the job is for; the queue takes clients in turn.
    """

    key: str
    run: Callable[[Job], Any]
    done: Callable[[Any, BaseException | None, Job], None] | None = None
    client: str = ""
    cancel_event: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # client, superseded, changed, preempted, shutdown
    started: bool = False
    #: yields to every request (set on the generation thread once a request has answered)
    background: bool = False

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class _Turns:
    """Jobs waiting, round-robin across clients, in order within one."""

    def __init__(self) -> None:
        self._by_client: OrderedDict[str, deque[Job]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_client.values())

    def __iter__(self) -> Iterator[Job]:
        return iter([j for q in self._by_client.values() for j in q])

    def push(self, job: Job) -> None:
        self._by_client.setdefault(job.client, deque()).append(job)

    def pop(self) -> Job:
        """The next client's first job; that client goes to the back of the round."""
        client, q = next(iter(self._by_client.items()))
        job = q.popleft()
        del self._by_client[client]
        if q:
            self._by_client[client] = q
        return job

    def remove(self, job: Job) -> bool:
        q = self._by_client.get(job.client)
        if q is None or job not in q:
            return False
        q.remove(job)
        if not q:
            del self._by_client[job.client]
        return True


class Runner:
    """The generation thread and its queue.

    :param limit: requests that may wait while one runs (None: any number); one more
        raises :class:`QueueFull`.
    :param on_start: called before each request runs (background jobs run unbracketed).
    :param on_end: called after each request ran.
    :param on_queue: called with (waiting, running) whenever either changes.
    """

    def __init__(
        self,
        *,
        limit: int | None = None,
        on_start: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
        on_queue: Callable[[int, int], None] | None = None,
    ) -> None:
        self.limit = limit
        self._cond = threading.Condition()
        self._requests = _Turns()
        self._background = _Turns()
        self._running: Job | None = None
        self._stopping = False
        self._on_start, self._on_end, self._on_queue = on_start, on_end, on_queue
        self._thread = threading.Thread(target=self._loop, name="specd-generation", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``, superseding older jobs with its key; a request (not background)
        also preempts the background job running now.

        :raises QueueFull: a request, when ``limit`` requests already wait.
        """
        with self._cond:
            if self._stopping:
                job.reason = "shutdown"
                job.cancel_event.set()
                stale = [job]
            else:
                if not job.background and self.limit is not None:
                    # the job itself takes the engine when it is idle: not counted then
                    if len(self._requests) + (self._running is not None) > self.limit:
                        raise QueueFull
                stale = self._take(job.key, "superseded") if job.key else []
                if not job.background:
                    running = self._running
                    if running is not None and running.background:
                        self._cancel(running, "preempted")
                (self._background if job.background else self._requests).push(job)
                self._changed()
                self._cond.notify()
        self._settle(stale)

    def cancel(self, job: Job, reason: str) -> None:
        """Cancel one job (no-op when it already finished)."""
        with self._cond:
            if job.cancel_event.is_set():
                return
            self._cancel(job, reason)
            queued = self._requests.remove(job) or self._background.remove(job)
            if queued:
                self._changed()
        if queued:
            self._settle([job])

    def cancel_key(self, key: str, reason: str, *, background: bool = True) -> None:
        """Cancel every job with ``key``; keys ending with ``*`` match as prefixes.

        :param background: also cancel background jobs (False: only requests).
        """
        with self._cond:
            stale = self._take(key, reason, background=background)
        self._settle(stale)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel everything and end the thread."""
        with self._cond:
            self._stopping = True
            stale = self._take("*", "shutdown")
            self._cond.notify_all()
        self._settle(stale)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    close = stop

    @property
    def pending(self) -> int:
        """Jobs waiting or running."""
        with self._cond:
            return len(self._requests) + len(self._background) + (self._running is not None)

    async def stream(
        self,
        generation: ServedGeneration,
        engine: CompletionEngine,
        client: str = "",
        *,
        finished: Callable[[ServedGeneration], None] | None = None,
    ) -> AsyncIterator[Delta]:
        """Queue ``generation`` as a request of ``client``, run it, and yield its deltas.
        Closing the iterator early (or the request being cancelled) cancels it.

        :param finished: called on the generation thread once the generation has ended.
        :raises QueueFull: when the queue is full (nothing was started).
        """
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[object] = asyncio.Queue()

        def put(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads
                loop.call_soon_threadsafe(deltas.put_nowait, item)

        def run(job: Job) -> None:
            for delta in generation.run(engine, job.cancel_event):
                put(delta)
            if finished is not None:
                finished(generation)

        def done(result: Any, error: BaseException | None, job: Job) -> None:
            put(_End(error))

        job = Job("", run, done, client=client)
        self.submit(job)
        try:
            while not isinstance(item := await deltas.get(), _End):
                assert isinstance(item, Delta)
                yield item
            if item.error is not None:
                raise item.error
        finally:
            # Gone before the end (disconnect, handler error): stop before the next step.
            self.cancel(job, "client")

    def _cancel(self, job: Job, reason: str) -> None:
        if not job.cancel_event.is_set():
            job.reason = reason
            job.cancel_event.set()

    def _take(self, key: str, reason: str, *, background: bool = True) -> list[Job]:
        """Cancel the jobs matching ``key`` (lock held); :returns: the queued ones removed."""
        prefix = key.endswith("*")

        def match(job: Job) -> bool:
            hit = job.key.startswith(key[:-1]) if prefix else job.key == key
            return hit and (background or not job.background)

        removed = [j for j in [*self._requests, *self._background] if match(j)]
        for j in removed:
            self._requests.remove(j) or self._background.remove(j)
            self._cancel(j, reason)
        if removed:
            self._changed()
        if self._running is not None and match(self._running):
            self._cancel(self._running, reason)
        return removed

    def _changed(self) -> None:
        """Report the queue's state (lock held)."""
        if self._on_queue is not None:
            self._on_queue(len(self._requests), int(self._running is not None))

    def _settle(self, jobs: Sequence[Job]) -> None:
        for j in jobs:  # cancelled before they started: no result
            _call_done(j, None, None)

    def _next(self) -> Job | None:
        """Wait for the next job: requests first, then background ones; None: stop."""
        with self._cond:
            while not self._requests and not self._background and not self._stopping:
                self._cond.wait()
            if not self._requests and not self._background:
                return None
            job = (self._requests or self._background).pop()
            self._running = job
            self._changed()
            return job

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            result, error = None, None
            job.started = True
            counted = not job.background  # on_start/on_end bracket requests only
            if self._on_start and counted:
                self._on_start()
            try:
                result = job.run(job)
            except BaseException as e:  # noqa: BLE001 - reported to the job's owner
                error = e
            finally:
                if self._on_end and counted:
                    self._on_end()
                with self._cond:
                    self._running = None
                    self._changed()
            _call_done(job, result, error)


@dataclass
class _End:
    error: BaseException | None


def _call_done(job: Job, result: Any, error: BaseException | None) -> None:
    if job.done is None:
        return
    try:
        job.done(result, error, job)
    except Exception:  # noqa: BLE001 - one job's callback must not stop the thread
        log.exception("completion callback failed")


class ServedGeneration:
    """One generation on the engine, as both servers run it.

    Iterate :meth:`run` for the deltas. A delta is cut before a template stop token and
    the generation ends there (finish reason ``"stop"``); the engine's own stop strings
    are cut by the engine. :meth:`halt` ends it before the next target step, from the
    caller's side; ``should_stop`` does the same from inside, before every target step.
    Either way the engine still ends normally and reports its stats, and what it sends
    after the halt is drained, not shown.

    :param stop_ids: template tokens that end the text (``<file_sep>``...).
    :param should_stop: called with the text so far before every target step; a
        non-empty reason (``"time"``, ``"indent"``) ends the generation there and becomes
        its finish reason.
    :param engine_options: passed to ``engine.stream`` (``constraint``, ``corpus``) unless None.
    """

    def __init__(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        *,
        stop_ids: frozenset[int] = frozenset(),
        should_stop: Callable[[str], str] | None = None,
        **engine_options: Any,
    ) -> None:
        self.prompt = prompt
        self.params = params
        self.stop_ids = stop_ids
        self.should_stop = should_stop
        self.engine_options = {k: v for k, v in engine_options.items() if v is not None}
        #: the text and tokens shown so far
        self.text = ""
        self.token_ids: list[int] = []
        #: why this side ended it ("stop", "time"...); empty while the engine decides
        self.reason = ""
        #: set at the end: the engine's completion (its text, token ids and stats)
        self.completion: Completion | None = None
        self._halted = False

    def halt(self, reason: str = "") -> None:
        """End before the next target step. :param reason: the finish reason to report
        (empty: the engine's, ``"cancelled"``)."""
        self._halted = True
        self.reason = self.reason or reason

    def run(self, engine: CompletionEngine, cancel: threading.Event) -> Iterator[Delta]:
        """Generate on ``engine`` until it ends, ``cancel`` is set or the generation is
        halted; yields the deltas to show."""

        def stop() -> bool:  # the engine's check before every target step
            if cancel.is_set() or self._halted:
                return True
            if self.should_stop is not None and (why := self.should_stop(self.text)):
                self.halt(why)
            return self._halted

        gen = engine.stream(self.prompt, self.params, cancel=stop, **self.engine_options)
        for delta in gen:
            if self._halted:
                continue  # drain: the engine ends before its next target step
            piece, ids = self._cut(delta, engine)
            if piece or ids:
                self.text += piece
                self.token_ids += ids
                yield Delta(piece, ids)
        self.completion = c = gen.completion
        if c is not None:
            if self.reason == "stop":  # what the client got: nothing from the stop token on
                c.text, c.token_ids = self.text, list(self.token_ids)
            if self.reason and c.stats.finish_reason == "cancelled" and not cancel.is_set():
                c.stats.finish_reason = self.reason

    def _cut(self, delta: Delta, engine: CompletionEngine) -> tuple[str, list[int]]:
        """The delta's text and tokens, cut before a template stop token (then halted)."""
        for i, t in enumerate(delta.token_ids):
            if t in self.stop_ids:
                self.halt("stop")
                ids = list(delta.token_ids[:i])
                return engine.tokenizer.decode(ids, skip_special_tokens=True), ids
        return delta.text, list(delta.token_ids)
