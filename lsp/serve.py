"""``specd serve``: the language server over stdio or TCP, or the engine over HTTP.

Over stdio and TCP the protocol starts at once and the model loads behind it
(``initialize`` is answered while it loads); over HTTP the model loads first.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from specd import BadInputError, ModelNotFoundError
from specd.options import EXIT_BAD_INPUT, build_engine, sampling_params

from . import config

if TYPE_CHECKING:
    from .prompter import PrefixSize

log = logging.getLogger(__name__)

#: Tokens of the timed prefills at load (about a third of a second each on a 2-core CPU).
PREFILL_PROBE = 256


def cmd_serve(args: argparse.Namespace) -> int:
    from .daemon import listen, parse_address

    where = args.tcp or args.http
    flag = "--http" if args.http else "--tcp"
    address = parse_address(where, allow_remote=args.allow_remote, flag=flag) if where else None
    if args.queue < 0:
        raise BadInputError(f"--queue {args.queue}: must be at least 0")
    settings, messages = config.load_settings(args.config, strict=False)
    params = sampling_params(args)
    if args.cache_entries is not None and args.cache_entries < 1:
        raise BadInputError(f"--cache-entries {args.cache_entries}: must be at least 1")
    if args.cache_mib is not None and args.cache_mib < 1:
        raise BadInputError(f"--cache-mib {args.cache_mib}: must be at least 1")
    cache: dict[str, int] = {}
    if args.cache_entries is not None:
        cache["prefix_cache_entries"] = args.cache_entries
    if args.cache_mib is not None:
        cache["prefix_cache_bytes"] = args.cache_mib * 2**20
    if args.http and args.backend:
        raise BadInputError("--backend: use it with --stdio or --tcp; --http serves a local model")
    if args.http and address is not None:  # (--http always has one: parsed above)
        try:  # a busy port is a one-line error before the model loads
            listen(*address).close()
        except BadInputError as e:
            raise BadInputError(str(e).replace("--tcp", "--http", 1)) from None
        engine = build_engine(args, **cache)
        return _serve_http(engine, params, settings, address, args.queue)
    sock = listen(*address) if address else None

    # The model loads behind the protocol: ``initialize`` is answered while it loads, and
    # completion requests wait for it on the generation worker.
    from .server import Service

    service = Service(None, params, settings=settings, settings_messages=messages)
    loader = threading.Thread(
        target=_load, args=(service, args, cache), name="specd-load", daemon=True
    )
    loader.start()
    from .daemon import run_stdio, run_tcp
    from .rpc import RedactPayloads

    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactPayloads(lambda: not service.log_code))
    if sock is None:
        # stdout carries the protocol: anything else printed by accident goes to stderr
        stdout = sys.stdout.buffer
        sys.stdout = sys.stderr
        code = run_stdio(service, sys.stdin.buffer, stdout)
    else:

        def ready(host: str, port: int) -> None:
            print(f"specd: serving on {host}:{port}", file=sys.stderr, flush=True)

        code = run_tcp(service, sock, ready=ready)
    if loader.is_alive():
        # Told to exit while the model loads: Python's own shutdown would stop the loader
        # inside torch and abort, so end here, with what is buffered written out.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    return code


def _load(service: Any, args: argparse.Namespace, cache: dict[str, int]) -> None:
    """Build and warm the engine for ``service``. A model that cannot be loaded ends the
    server with a one-line error (exit 2 for bad input, as the command line does)."""
    t0 = time.perf_counter()
    try:
        engine = build_engine(args, **cache)
        warm_up(engine, service.prefix_size)
        engine = with_backend(args, engine)
    except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
        service.load_failed(exc)
        bad_input = isinstance(exc, (BadInputError, ModelNotFoundError))
        if not bad_input:
            log.error("the model failed to load", exc_info=exc)
        print(f"specd: error: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_BAD_INPUT if bad_input else 1)
    # The model and the libraries are loaded for good: keep the collector from walking
    # their objects again, during requests and at exit.
    gc.freeze()
    service.attach(engine)
    log.info("model loaded and warmed up in %.2f s", time.perf_counter() - t0)


def _serve_http(
    engine: Any, params: Any, settings: config.Settings, address: Any, queue: int
) -> int:
    from .http import HttpService, run_http

    service = HttpService(engine, params, settings=settings, queue_limit=queue)
    warm_up(engine, service.prefix_size)
    gc.freeze()  # see _load

    def ready(host: str, port: int) -> None:
        print(f"specd: serving HTTP on http://{host}:{port}", file=sys.stderr, flush=True)

    return run_http(service, *address, ready=ready)


def with_backend(args: argparse.Namespace, engine: Any) -> Any:
    """The remote backend to generate with when ``--backend`` names one, else ``engine``.
    The local model still builds the prompts (its tokenizer and template)."""
    if not args.backend:
        return engine
    from .backend import Backend
    from .daemon import is_loopback

    backend = Backend(
        args.backend,
        engine.tokenizer,
        engine.tokenize,
        model=args.backend_model,
        api_key=os.environ.get("SPECD_BACKEND_KEY") or None,
    )
    if not (args.allow_remote or backend.host == "localhost" or is_loopback(backend.host)):
        raise BadInputError(
            f"--backend {args.backend}: {backend.host} is not a loopback address; the code "
            f"around the cursor is sent there, so pass --allow-remote to say that is intended"
        )
    return backend


def warm_up(engine: Any, prefix_size: PrefixSize) -> None:
    """One tiny generation, so the first real request does not pay for lazy setup; then a
    timed prefill into an empty cache, which sizes ``prefix-tokens = "auto"``.

    :param prefix_size: the service's, sized by the measured prefill.
    """
    from specd import SamplingParams

    line = engine.tokenize("def main():\n") or [0]
    # with the configured drafter: it is built (a head file read) now, and options it
    # rejects end the start with their error instead of failing every request
    engine.generate(line, SamplingParams(max_tokens=2))
    ids = (line * (PREFILL_PROBE // len(line) + 1))[:PREFILL_PROBE]
    rate = 0.0
    # the first pass pays for setup; the faster of two then, as a busy moment is slower
    for n in (PREFILL_PROBE // 4, PREFILL_PROBE, PREFILL_PROBE):
        engine.prefix_cache.clear()
        t0 = time.perf_counter()
        engine.warm(ids[:n], request=True)
        if n == PREFILL_PROBE:
            rate = max(rate, (n - 1) / max(time.perf_counter() - t0, 1e-6))
    engine.prefix_cache.clear()
    size = prefix_size.measured(rate)
    log.info("prefill %.0f tokens/s: prefix-tokens auto = %d", rate, size)


# -- complete ----------------------------------------------------------------------------------
