"""The aiohttp application behind ``specd serve --http``: routes, errors, and running it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from specd import BadInputError, ContextLengthExceeded

from ..runner import QueueFull
from . import llama, openai
from .schema import BadRequest
from .service import MAX_BODY_BYTES, SERVICE, HttpService

log = logging.getLogger(__name__)

#: A request line or header longer than this is refused (400) by the HTTP parser, before
#: any handler runs (aiohttp's default, named here because clients meet it).
MAX_HEADER_BYTES = 8190
#: A connection that sends no complete request for this long is closed: an idle
#: keep-alive connection, or one that stopped half way through its headers.
IDLE_S = 60.0


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> web.Response:
    body = {"error": {"code": code or status, "message": message, "type": kind, "param": param}}
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
        status = e.status
        return _error(e.status, str(e), "invalid_request_error", e.param)
    except ContextLengthExceeded as e:  # in OpenAI's shape, which clients look for
        status = 400
        code = "context_length_exceeded"
        return _error(400, str(e), "invalid_request_error", e.param, code)
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
    except asyncio.CancelledError:
        status = 499  # the client went away; its generation has been cancelled
        svc.metrics.count("disconnects")
        raise
    except ConnectionResetError:
        # the client went away while its body was read or its answer written: nothing to
        # answer, and nothing for aiohttp to log as a failure of the server (it would)
        status = 499
        svc.metrics.count("disconnects")
        return web.Response(status=499)
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
    runner = web.AppRunner(
        create_app(service),
        handler_cancellation=True,
        access_log=None,
        logger=_MalformedRequests(logging.getLogger("aiohttp.server")),
        keepalive_timeout=IDLE_S,
        max_line_size=MAX_HEADER_BYTES,
        max_field_size=MAX_HEADER_BYTES,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise BadInputError(f"--http {host}:{port}: cannot listen there: {e.strerror}") from None
    bound = runner.addresses[0]
    return runner, (str(bound[0]), int(bound[1]))


class _MalformedRequests(logging.LoggerAdapter):
    """aiohttp's server log, where a request the HTTP parser refused (a header over
    :data:`MAX_HEADER_BYTES`, a broken request line) is one line at INFO: the client's
    mistake, answered 400, not a failure of the server. Its message is left out: it quotes
    the header, which may hold a key. Any other exception is logged as aiohttp logs it."""

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.info("refused a malformed request (%s)", type(exc_info).__name__)
        else:
            super().exception(msg, *args, exc_info=exc_info, **kw)


def run_http(
    service: HttpService, host: str, port: int, *, ready: Callable[[str, int], None]
) -> int:
    """Serve until SIGINT or SIGTERM."""

    worst = service.engine.request_memory(service.limits.window)
    log.info(
        "a request may take up to %.0f MiB beyond the weights: a context window of %d tokens "
        "(KV cache %.0f MiB, activations %.0f MiB, logits %.0f MiB)",
        worst.total / 2**20,
        worst.tokens,
        worst.kv_cache / 2**20,
        worst.activations / 2**20,
        worst.logits / 2**20,
    )

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
