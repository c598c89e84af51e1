"""The aiohttp application behind ``specd serve --http``: routes, errors, and running it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from specd import BadInputError, Engine, SamplingParams

from ..config import Settings
from . import llama, openai
from .metrics import HttpMetrics
from .prompts import Prompter
from .runner import Job, QueueFull, Runner, collect
from .schema import BadRequest

log = logging.getLogger(__name__)

#: A request body larger than this is refused (413) before it is read.
MAX_BODY_BYTES = 16 * 2**20


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


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"code": status, "message": message, "type": kind, "param": param}}
    return HttpService.json(body, status)


@web.middleware
async def _errors_and_metrics(request: web.Request, handler: Callable) -> web.StreamResponse:
    svc: HttpService = request.app["service"]
    route = request.match_info.route.resource
    endpoint = route.canonical if route is not None else "other"
    t0 = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except BadRequest as e:
        status = 400
        return _error(400, str(e), "invalid_request_error", e.param)
    except BadInputError as e:  # the engine refused something the body asked for
        status = 400
        return _error(400, str(e), "invalid_request_error")
    except QueueFull:
        status = 503
        response = _error(503, "the server is busy: the queue is full; retry", "unavailable")
        response.headers["Retry-After"] = "1"
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499  # the client went away; its generation has been cancelled
        svc.metrics.count("disconnects")
        raise
    except Exception:
        log.exception("an HTTP request failed")
        return _error(500, "internal error; see the server's log", "server_error")
    finally:
        seconds = time.perf_counter() - t0 if endpoint in _TIMED else None
        svc.metrics.request(endpoint, status, seconds)


_TIMED = {"/v1/completions", "/infill"}


async def _health(request: web.Request) -> web.Response:
    return HttpService.json({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    svc: HttpService = request.app["service"]
    return web.Response(
        body=svc.metrics.render().encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def create_app(service: HttpService) -> web.Application:
    app = web.Application(middlewares=[_errors_and_metrics], client_max_size=MAX_BODY_BYTES)
    app["service"] = service
    app.router.add_post("/v1/completions", openai.completions)
    app.router.add_get("/v1/models", openai.models)
    app.router.add_post("/infill", llama.infill)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def start(
    service: HttpService, host: str, port: int
) -> tuple[web.AppRunner, tuple[str, int]]:
    """Start serving; returns the runner (``cleanup()`` stops it) and the bound address.

    Handlers are cancelled when their client disconnects, which cancels the generation.
    """
    runner = web.AppRunner(create_app(service), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    return runner, (str(bound[0]), int(bound[1]))


def run_http(
    service: HttpService, host: str, port: int, *, ready: Callable[[str, int], None]
) -> int:
    """Serve until SIGINT or SIGTERM."""

    async def main() -> None:
        runner, (h, p) = await start(service, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ready(h, p)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            service.runner.close()

    asyncio.run(main())
    return 0
