"""What every HTTP request shares (:class:`HttpService`) and the helpers handlers answer
with: compact JSON, server-sent events."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from specd import Engine, SamplingParams

from ..config import Settings
from .metrics import HttpMetrics
from .prompts import Prompter
from .runner import Job, Runner, collect


class HttpService:
    """What every request shares: one engine behind one queue, the prompt builder, the
    server's default sampling parameters and the metrics.

    :param queue_limit: requests that may wait while one generates; one more gets a 503.
    """

    def __init__(
        self,
        engine: Engine,
        params: SamplingParams | None = None,
        *,
        settings: Settings | None = None,
        queue_limit: int = 16,
    ) -> None:
        self.engine = engine
        self.params = params or SamplingParams()
        self.metrics = HttpMetrics()
        self.runner = Runner(engine, self.metrics, queue_limit=queue_limit)
        self.prompter = Prompter(engine, settings or Settings())
        self.model_name = engine.target.name
        self.started = int(time.time())

    async def collect(self, job: Job) -> tuple[str, list[int]]:
        return await collect(self.runner.stream(job))

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


#: where handlers find the service: ``request.app[SERVICE]``
SERVICE = web.AppKey("service", HttpService)
