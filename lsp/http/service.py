"""What every HTTP request shares (:class:`HttpService`) and the helpers handlers answer
with: compact JSON, server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from aiohttp import web

from specd import ContextLimits, Delta, Engine, SamplingParams

from ..config import Settings
from ..prompter import PrefixSize
from ..runner import QueueFull, Runner, ServedGeneration
from .metrics import HttpMetrics
from .prompts import HttpPrompter
from .schema import BadRequest

#: A request body larger than this is refused (413) before it is read whole. Above what
#: the default model's context holds (its window times its longest token, 0.7 MB), so that
#: an over-long prompt gets the 400 that says so.
MAX_BODY_BYTES = 16 * 2**20
#: A request body that has not arrived whole this long after its headers is refused (408):
#: a client that stops sending half way holds no handler open for good.
BODY_TIMEOUT_S = 30.0


class HttpService:
    """What every request shares: one engine behind one queue, the prompt builder, the
    server's default sampling parameters, the metrics, and what was measured at load.

    :param queue_limit: requests that may wait while one generates; one more gets a 503.
    :param limits: the model's context window (default: read from the engine's target).
    """

    def __init__(
        self,
        engine: Engine,
        params: SamplingParams | None = None,
        *,
        settings: Settings | None = None,
        queue_limit: int = 16,
        limits: ContextLimits | None = None,
    ) -> None:
        self.engine = engine
        self.limits = limits or engine.limits
        self.body_timeout_s = BODY_TIMEOUT_S
        self.params = params or SamplingParams()
        self.metrics = HttpMetrics()
        self.runner = Runner(
            limit=queue_limit, on_queue=lambda w, r: self.metrics.queue(waiting=w, running=r)
        )
        #: what ``prefix-tokens = "auto"`` stands for: measured at load (``serve.warm_up``)
        self.prefix_size = PrefixSize()
        self.prompter = HttpPrompter(engine, settings or Settings(), self.prefix_size)
        self.model_name = engine.target.name
        self.started = int(time.time())

    async def body(self, request: web.Request) -> bytes:
        """The request's body, refused when it is larger than :data:`MAX_BODY_BYTES` or
        does not arrive in time. (What is left unread of a refused body, aiohttp reads and
        drops for a few seconds, so the client reads the answer rather than a reset.)"""
        too_large = BadRequest(
            f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", status=413
        )
        if (request.content_length or 0) > MAX_BODY_BYTES:
            raise too_large  # said so up front: nothing of it is read
        try:
            return await asyncio.wait_for(request.read(), self.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:  # chunked, without a length
            raise too_large from None
        except asyncio.TimeoutError:
            raise BadRequest(
                f"the request body did not arrive within {self.body_timeout_s:g} s", status=408
            ) from None

    async def stream(self, generation: ServedGeneration, client: str) -> AsyncIterator[Delta]:
        """Run ``generation`` on the engine in ``client``'s turn and yield its deltas; its
        stats go to the metrics when it ends.

        :raises QueueFull: when the queue is full (nothing was started).
        """
        stream = self.runner.stream(generation, self.engine, client, finished=self._finished)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            try:
                first = await anext(stream)
            except QueueFull:
                self.metrics.count("rejected_queue_full")
                raise
            except StopAsyncIteration:
                return
            yield first
            async for delta in stream:
                yield delta

    async def collect(self, generation: ServedGeneration, client: str) -> tuple[str, list[int]]:
        """Run ``generation`` to its end: (text, token ids)."""
        return await collect(self.stream(generation, client))

    def _finished(self, generation: ServedGeneration) -> None:
        if generation.completion is not None:
            self.metrics.generation(generation.completion.stats)

    @staticmethod
    def client_of(request: web.Request) -> str:
        """Who a request is from, for the fair queue: its API key when it sends one (a team
        server gives each user theirs), else its address."""
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        return f"key:{key}" if key else f"addr:{request.remote}"

    @staticmethod
    def json(obj: Any, status: int = 200) -> web.Response:
        # msgspec writes compact JSON, as llama.cpp does (llama.vim looks for `"content":"`)
        return web.Response(
            body=msgspec.json.encode(obj), status=status, content_type="application/json"
        )

    @staticmethod
    async def start_sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        return response

    @staticmethod
    async def send_event(response: web.StreamResponse, obj: Any) -> None:
        await response.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")


def request_params(
    base: SamplingParams,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
) -> SamplingParams:
    """The sampling fields a request sent, over the server's defaults (``base``): a field
    left out (None) keeps the default. Both ``/v1/completions`` and ``/infill`` read their
    bodies through this.

    :raises BadInputError: a bad value, named (``SamplingParams`` checks them; a 400).
    """
    sent: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "stop": tuple(stop) if stop is not None else None,
    }
    return dataclasses.replace(base, **{k: v for k, v in sent.items() if v is not None})


async def collect(stream: AsyncIterator[Delta]) -> tuple[str, list[int]]:
    """Run a stream to its end: (text, token ids)."""
    text, ids = "", []
    async with contextlib.aclosing(stream) as deltas:  # type: ignore[type-var]
        async for d in deltas:
            text += d.text
            ids += d.token_ids
    return text, ids


#: where handlers find the service: ``request.app[SERVICE]``
SERVICE = web.AppKey("service", HttpService)
