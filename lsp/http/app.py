"""The aiohttp application behind ``specd serve --http``: routes, errors, and running it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from aiohttp import web

from specd import BadInputError

from . import llama, openai
from .runner import QueueFull
from .schema import BadRequest
from .service import SERVICE, HttpService

log = logging.getLogger(__name__)

#: A request body larger than this is refused (413) before it is read.
MAX_BODY_BYTES = 16 * 2**20


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"code": status, "message": message, "type": kind, "param": param}}
    return HttpService.json(body, status)


@web.middleware
async def _errors_and_metrics(request: web.Request, handler: Callable) -> web.StreamResponse:
    svc: HttpService = request.app[SERVICE]
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
    svc: HttpService = request.app[SERVICE]
    return web.Response(
        body=svc.metrics.render().encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def create_app(service: HttpService) -> web.Application:
    app = web.Application(middlewares=[_errors_and_metrics], client_max_size=MAX_BODY_BYTES)
    app[SERVICE] = service
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
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise BadInputError(f"--http {host}:{port}: cannot listen there: {e.strerror}") from None
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
