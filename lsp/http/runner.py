"""One engine behind many HTTP requests: a fair, bounded queue and one generation thread.

The engine runs one generation at a time. Requests wait in a queue served round-robin by
client (a client that sends ten requests does not make another wait behind all ten), at
most ``limit`` of them; one more gets :class:`QueueFull` (a 503). A generation runs on a
thread of its own and streams its deltas to the event loop; when the request goes away
(the client disconnected, or the handler stopped reading) its cancel flag is set, and the
engine, which checks it before every target step, stops within one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from specd import Completion, Delta, Engine, SamplingParams

from .metrics import HttpMetrics


class QueueFull(Exception):
    """Every place in the queue is taken."""


class FairQueue:
    """Admission to the single engine: round-robin across clients, FIFO within one."""

    def __init__(self, limit: int, on_change: Callable[[int, int], None] | None = None) -> None:
        self.limit = limit
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._busy = False
        self._on_change = on_change

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def acquire(self, client: str) -> None:
        """Wait for the engine. :raises QueueFull: when ``limit`` requests already wait."""
        if not self._busy and not self._waiting:
            self._busy = True
            self._changed()
            return
        if self.waiting >= self.limit:
            raise QueueFull
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(fut)
        self._changed()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as the request went away: pass it on
            else:
                self._drop(client, fut)
            raise

    def release(self) -> None:
        """The running generation ended: admit the next client in turn."""
        while self._waiting:
            client, q = next(iter(self._waiting.items()))
            fut = q.popleft()
            del self._waiting[client]
            if q:
                self._waiting[client] = q  # to the back of the round
            if not fut.done():
                fut.set_result(None)
                self._changed()
                return
        self._busy = False
        self._changed()

    def _drop(self, client: str, fut: asyncio.Future[None]) -> None:
        q = self._waiting.get(client)
        if q is not None and fut in q:
            q.remove(fut)
            if not q:
                del self._waiting[client]
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.waiting, int(self._busy))


@dataclass
class Job:
    """One generation.

    :param stop_ids: template tokens that end the text (``<file_sep>``...): the text is
        cut before them and the generation stops.
    :param should_stop: called with the text so far before every target step; a
        non-empty reason (``"time"``, ``"stop"``) ends the generation there, and becomes
        its finish reason (``/infill``'s ``t_max_predict_ms`` and ``n_indent``).
    """

    prompt: str | Sequence[int]
    params: SamplingParams
    client: str = ""
    stop_ids: frozenset[int] = frozenset()
    should_stop: Callable[[str], str] | None = None
    #: token healing's constraint (the engine writes the cut text again first)
    constraint: Any = None
    #: set at the end: the engine's completion (its text, token ids and stats)
    completion: Completion | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


_END = object()


class Runner:
    """Runs jobs on the engine, one at a time, in the order the :class:`FairQueue` gives."""

    def __init__(self, engine: Engine, metrics: HttpMetrics, *, queue_limit: int = 16) -> None:
        self.engine = engine
        self.metrics = metrics
        self.queue = FairQueue(queue_limit, lambda w, r: metrics.queue(waiting=w, running=r))
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specd-generate")

    async def stream(self, job: Job) -> AsyncIterator[Delta]:
        """Queue ``job``, run it, and yield its deltas. Closing the iterator early (or the
        request being cancelled) cancels the generation.

        :raises QueueFull: when the queue is full (nothing was started).
        """
        try:
            await self.queue.acquire(job.client)
        except QueueFull:
            self.metrics.count("rejected_queue_full")
            raise
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[object] = asyncio.Queue()
        errors: list[BaseException] = []

        def put(item: object) -> None:
            loop.call_soon_threadsafe(deltas.put_nowait, item)

        def work() -> None:
            try:
                self._generate(job, put)
            except BaseException as e:  # handed to the request's handler
                errors.append(e)
            finally:
                put(_END)

        done = loop.run_in_executor(self._thread, work)
        # The next request is admitted when the engine is free, not when this handler is.
        done.add_done_callback(lambda _: self.queue.release())
        try:
            while (item := await deltas.get()) is not _END:
                assert isinstance(item, Delta)
                yield item
            if errors:
                raise errors[0]
        finally:
            # Gone before the end (disconnect, handler error): stop before the next step.
            job.cancel.set()

    def _generate(self, job: Job, put: Callable[[object], None]) -> None:
        text = ""
        ours = ""  # why this side ended the generation ("stop", "time"), if it did

        def cancel() -> bool:
            nonlocal ours
            if job.cancel.is_set() or ours:
                return True
            if job.should_stop is not None:
                ours = job.should_stop(text)
            return bool(ours)

        heal = {"constraint": job.constraint} if job.constraint is not None else {}
        gen = self.engine.stream(job.prompt, job.params, cancel=cancel, **heal)
        kept: list[int] = []
        for delta in gen:
            if ours:
                continue  # drain: the engine ends before its next target step
            piece, ids, cut = _cut_at(delta, job.stop_ids, self.engine)
            if cut:
                ours = "stop"
            if piece or ids:
                text += piece
                kept += ids
                put(Delta(piece, ids))
        job.completion = gen.completion
        if job.completion is not None:
            if ours == "stop":  # what the client got: nothing from the stop token on
                job.completion.text, job.completion.token_ids = text, kept
            stats = job.completion.stats
            if ours and stats.finish_reason == "cancelled" and not job.cancel.is_set():
                stats.finish_reason = ours
            self.metrics.generation(stats)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def _cut_at(delta: Delta, stop_ids: frozenset[int], engine: Engine) -> tuple[str, list[int], bool]:
    """The delta's text and tokens, cut before a template stop token, and whether it was."""
    for i, t in enumerate(delta.token_ids):
        if t in stop_ids:
            ids = delta.token_ids[:i]
            return engine.tokenizer.decode(ids, skip_special_tokens=True), ids, True
    return delta.text, delta.token_ids, False


async def collect(stream: AsyncIterator[Delta]) -> tuple[str, list[int]]:
    """Run a stream to its end: (text, token ids)."""
    text, ids = "", []
    async with contextlib.aclosing(stream) as deltas:  # type: ignore[type-var]
        async for d in deltas:
            text += d.text
            ids += d.token_ids
    return text, ids
