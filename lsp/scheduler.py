"""One worker thread that runs generations one at a time, newest first per document.

The event loop stays free to read messages (cancellations above all) while a generation
runs. Each job has a key (session and document); submitting a job cancels every older job
with the same key: a queued one never starts, the running one stops at its next decode
step (its cancel event is what ``Engine.stream`` checks). So a burst of keystrokes runs at
most one generation per document, and only ever one at a time.

Background jobs (warm-ups, prefetches, and a completion that has already answered and goes
on filling the completion cache) run only when no request waits: a request that arrives
cancels the running background job, which stops at its next prefill chunk or decode step
and keeps what it computed in the prefix cache, so the request continues from there.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """Work for the worker.

    :param key: jobs with equal keys supersede each other.
    :param run: called on the worker thread with the job; its return value is the result.
    :param done: called once with (result, error, job): on the worker thread after
        ``run``, or on the cancelling thread when the job is cancelled before it started
        (then result and error are None and ``job.reason`` says why).
    """

    key: str
    run: Callable[[Job], Any]
    done: Callable[[Any, BaseException | None, Job], None]
    cancel_event: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # client, superseded, changed, preempted, shutdown
    started: bool = False
    #: yields to every request (set on the worker thread once a request has answered)
    background: bool = False

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class Worker:
    """The generation thread. ``on_start``/``on_end`` bracket each request's run (for
    metrics); background jobs run unbracketed."""

    def __init__(
        self,
        *,
        on_start: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._on_start = on_start
        self._on_end = on_end
        self._thread = threading.Thread(target=self._loop, name="specd-generation", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``, superseding older jobs with its key; a request (not background)
        also preempts the background job running now."""
        with self._cond:
            if self._stopping:
                job.reason = "shutdown"
                job.cancel_event.set()
                stale = [job]
            else:
                stale = self._take(job.key, "superseded")
                running = self._running
                if not job.background and running is not None and running.background:
                    if not running.cancel_event.is_set():
                        running.reason = "preempted"
                        running.cancel_event.set()
                self._queue.append(job)
                self._cond.notify()
        self._settle(stale)

    def cancel(self, job: Job, reason: str) -> None:
        """Cancel one job (no-op when it already finished)."""
        with self._cond:
            if job.cancel_event.is_set():
                return
            job.reason = reason
            job.cancel_event.set()
            queued = job in self._queue
            if queued:
                self._queue.remove(job)
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

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (self._running is not None)

    # -- internals ------------------------------------------------------------------------

    def _take(self, key: str, reason: str, *, background: bool = True) -> list[Job]:
        """Cancel the jobs matching ``key`` (lock held); :returns: the queued ones removed."""
        by_key = (lambda k: k.startswith(key[:-1])) if key.endswith("*") else (lambda k: k == key)

        def match(job: Job) -> bool:
            return by_key(job.key) and (background or not job.background)

        removed = [j for j in self._queue if match(j)]
        for j in removed:
            self._queue.remove(j)
            j.reason = reason
            j.cancel_event.set()
        running = self._running
        if running is not None and match(running) and not running.cancel_event.is_set():
            running.reason = reason
            running.cancel_event.set()
        return removed

    def _settle(self, jobs: list[Job]) -> None:
        for j in jobs:
            _call_done(j, None, None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._queue:
                    return
                # requests first, in order; then background jobs, in order
                job = next((j for j in self._queue if not j.background), self._queue[0])
                self._queue.remove(job)
                self._running = job
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
            _call_done(job, result, error)


def _call_done(job: Job, result: Any, error: BaseException | None) -> None:
    try:
        job.done(result, error, job)
    except Exception:  # noqa: BLE001 - one job's callback must not stop the worker
        log.exception("completion callback failed")
