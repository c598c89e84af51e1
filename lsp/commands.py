"""``specd serve``, ``specd complete`` and ``specd stats``.

They join the ``specd`` command line through the ``specd_register_commands`` hook (this
module is the ``lsp`` entry point of the ``specd`` group). ``serve`` and ``complete`` take
the model and decoding options of ``specd generate``; end-to-end tests run them with
``--model tiny``, which starts in seconds and downloads nothing (its completions are random
characters).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from specd import BadInputError, ModelNotFoundError, hookimpl
from specd.options import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    add_decoding_args,
    add_model_args,
    build_engine,
    sampling_params,
)

from . import config

log = logging.getLogger(__name__)


@hookimpl
def specd_register_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve``, ``complete`` and ``stats``."""
    p = subparsers.add_parser(
        "serve",
        help="run the language server (editors: --stdio; a shared local daemon: --tcp)",
        description="Run the specd language server. The model loads once and is warmed up before the first request.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stdio", action="store_true", help="talk LSP on stdin/stdout (what editors start)"
    )
    where.add_argument(
        "--tcp",
        metavar="HOST:PORT",
        help="listen on a loopback address, e.g. 127.0.0.1:8765 (port 0: any free port)",
    )
    where.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve OpenAI /v1/completions and llama.cpp /infill over HTTP, e.g. 127.0.0.1:8080",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --tcp/--http on a non-loopback address (no authentication: trusted networks only)",
    )
    p.add_argument(
        "--queue",
        type=int,
        default=16,
        metavar="N",
        help="--http: requests that may wait for the engine; one more gets a 503 (default: 16)",
    )
    p.add_argument(
        "--cache-entries",
        type=int,
        default=None,
        metavar="N",
        help="KV caches kept for prefix reuse, least recently used evicted first (default: the engine's, 4)",
    )
    p.add_argument(
        "--cache-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="cap on the memory of those KV caches (default: no cap beyond the count)",
    )
    _add_common(p)
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser(
        "complete",
        help="complete a file at a line and column, like an editor would",
        description="Complete FILE at LINE:COL (1-based; columns count characters) with the language server's pipeline.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    p.add_argument(
        "--col", type=int, required=True, help="1-based column of the cursor, in characters"
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object: text, token_ids, stats, ..."
    )
    p.add_argument(
        "--server",
        metavar="HOST:PORT",
        help="ask a running `specd serve --tcp` daemon instead of loading the model here",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --backend on a non-loopback host (the file's code is sent there)",
    )
    _add_common(p)
    p.set_defaults(func=cmd_complete)

    p = subparsers.add_parser(
        "stats",
        help="metrics of a running daemon",
        description="Print a running daemon's metrics since it started (aggregates only, no code).",
    )
    p.add_argument("--server", metavar="HOST:PORT", required=True)
    p.add_argument("--json", action="store_true", help="print the raw JSON report")
    p.set_defaults(func=cmd_stats)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="PATH",
        help=f"settings file (default: {config.default_file()} when it exists)",
    )
    g = p.add_argument_group("remote backend")
    g.add_argument(
        "--backend",
        metavar="URL",
        help="generate on a server: http://HOST:PORT/v1 (OpenAI /v1/completions) or "
        "http://HOST:PORT/infill (llama.cpp); --model still builds the prompt. "
        "API key: $SPECD_BACKEND_KEY",
    )
    g.add_argument(
        "--backend-model",
        metavar="NAME",
        help="the model name to send to the backend (vLLM and SGLang check it)",
    )
    add_model_args(p)
    add_decoding_args(p)


# -- serve -------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from .daemon import listen, parse_address

    where = args.tcp or args.http
    try:
        address = parse_address(where, allow_remote=args.allow_remote) if where else None
    except BadInputError as e:
        flag = "--http" if args.http else "--tcp"
        raise BadInputError(str(e).replace("--tcp", flag, 1)) from None
    if args.queue < 0:
        raise BadInputError(f"--queue {args.queue}: must be at least 0")
    settings, messages = _settings(args, strict=False)
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
    if args.http:
        try:  # a busy port is a one-line error before the model loads
            listen(*address).close()
        except BadInputError as e:
            raise BadInputError(str(e).replace("--tcp", "--http", 1)) from None
        engine = build_engine(args, **cache)
        warm_up(engine)
        gc.freeze()  # see _load
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
        return run_stdio(service, sys.stdin.buffer, stdout)

    def ready(host: str, port: int) -> None:
        print(f"specd: serving on {host}:{port}", file=sys.stderr, flush=True)

    return run_tcp(service, sock, ready=ready)


def _load(service: Any, args: argparse.Namespace, cache: dict[str, int]) -> None:
    """Build and warm the engine for ``service``. A model that cannot be loaded ends the
    server with a one-line error (exit 2 for bad input, as the command line does)."""
    t0 = time.perf_counter()
    try:
        engine = build_engine(args, **cache)
        warm_up(engine)
        engine = _with_backend(args, engine)
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

    def ready(host: str, port: int) -> None:
        print(f"specd: serving HTTP on http://{host}:{port}", file=sys.stderr, flush=True)

    return run_http(service, *address, ready=ready)


def _with_backend(args: argparse.Namespace, engine: Any) -> Any:
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


def warm_up(engine: Any) -> None:
    """One tiny generation, so the first real request does not pay for lazy setup."""
    from specd import SamplingParams

    engine.generate(
        engine.tokenize("def main():\n") or [0], SamplingParams(max_tokens=2), drafter="none"
    )


# -- complete ----------------------------------------------------------------------------------


def cmd_complete(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"cannot read {args.file}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise BadInputError(f"{args.file} is not UTF-8 text") from e
    from .documents import Document

    uri = path.resolve().as_uri()
    doc = Document(uri, text, language_id=_language_id(path))
    line, col = _check_position(doc, args)
    if args.server and args.backend:
        raise BadInputError("--server and --backend: a daemon already has its own; give one")
    if args.server:
        result = _complete_remote(args, uri, doc, line, col)
    else:
        result = _complete_here(args, doc, line, col)
    if args.json:
        print(json.dumps(result))
    else:
        sys.stdout.write(result["text"] + "\n")
        s = result.get("stats") or {}
        print(
            f"[{s.get('new_tokens', 0)} tokens, mean acceptance {s.get('mean_acceptance_length', 0):.2f}, "
            f"ttft {1000 * s.get('ttft_s', 0):.0f} ms, {result['finish_reason'] or 'done'}]",
            file=sys.stderr,
        )
    return EXIT_OK


def _complete_here(args: argparse.Namespace, doc: Any, line: int, col: int) -> dict[str, Any]:
    from .completer import Completer, CompletionRequest, cursor_at
    from .prompting import display_path

    settings, _ = _settings(args, strict=True)
    completer = Completer(_with_backend(args, build_engine(args)), sampling_params(args))
    cursor = cursor_at(doc, doc.resolve(line, col, "utf-32"), settings)
    request = CompletionRequest(cursor, display_path(doc.uri), settings, uri=doc.uri)
    return completer.complete(request).as_json()


def _complete_remote(
    args: argparse.Namespace, uri: str, doc: Any, line: int, col: int
) -> dict[str, Any]:
    from .client import Client
    from .daemon import parse_address

    host, port = parse_address(args.server, allow_remote=True)
    with Client(host, port) as client:
        client.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": uri,
                    "languageId": doc.language_id,
                    "version": 0,
                    "text": doc.text,
                }
            },
        )
        try:
            return client.request(
                "specd/complete",
                {"textDocument": {"uri": uri}, "position": {"line": line, "character": col}},
            )
        finally:
            client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def _check_position(doc: Any, args: argparse.Namespace) -> tuple[int, int]:
    """1-based --line/--col -> 0-based, or a BadInputError that says what is valid."""
    from .documents import strip_eol

    n_lines = len(doc.lines)
    if not 1 <= args.line <= n_lines:
        raise BadInputError(f"--line {args.line}: {args.file} has lines 1 to {n_lines}")
    body = strip_eol(doc.lines[args.line - 1])
    if not 1 <= args.col <= len(body) + 1:
        raise BadInputError(f"--col {args.col}: line {args.line} has columns 1 to {len(body) + 1}")
    return args.line - 1, args.col - 1


# -- stats -------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    from .client import Client
    from .daemon import parse_address

    host, port = parse_address(args.server, allow_remote=True)
    with Client(host, port) as client:
        report = client.request("specd/stats", None)
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    acc, lat, pc = report["acceptance"], report["latency"], report["prefix_cache"]
    print(f"uptime            {report['uptime_s']:.0f} s")
    print(
        f"requests          {report['requests']} ({report['completed']} completed, {report['cancellations']['total']} cancelled, {report['errors']} failed)"
    )
    print(f"fallbacks         {report['fallbacks']}")
    print(
        f"acceptance        mean {acc['mean_length']:.2f} tokens/step; per position {', '.join(f'{r:.2f}' for r in acc['position_rates']) or '-'}"
    )
    print(f"tokens per step   {', '.join(f'{k}: {n}' for k, n in acc['histogram'].items()) or '-'}")
    print(
        f"ttft              p50 {1000 * lat['ttft_s']['p50']:.0f} ms, p95 {1000 * lat['ttft_s']['p95']:.0f} ms"
    )
    print(
        f"tpot              p50 {1000 * lat['tpot_s']['p50']:.1f} ms, p95 {1000 * lat['tpot_s']['p95']:.1f} ms"
    )
    print(
        f"prefix cache      hit rate {pc['hit_rate']:.0%}, {pc['reused_fraction']:.0%} of prompt tokens reused"
    )
    pl = report.get("pipeline") or {}
    if pl:
        print(
            f"suggestions       {pl['from_cache']} from cache ({pl['cache_waits']} after a wait), {pl['first_line_answers']} at the first line, {pl['prefetches']} prefetched, {pl['warmups']} warm-ups ({pl['warmed_tokens']} tokens), {pl['debounced']} debounced"
        )
    return EXIT_OK


# -- shared ------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace, *, strict: bool) -> tuple[config.Settings, list[str]]:
    """Settings from --config, else from the default file when there is one."""
    path = Path(args.config) if args.config else config.default_file()
    if not args.config and not path.is_file():
        return config.Settings(), []
    raw, messages = config.read_file(path)
    if strict and messages:
        raise BadInputError(messages[0].rsplit("; ", 1)[0])
    if strict:
        return config.decode_strict(raw, source=str(path)), []
    settings, more = config.decode(raw, source=str(path))
    for m in messages + more:
        log.warning("%s", m)
    return settings, messages + more


_LANGUAGES = {
    "py": "python",
    "rs": "rust",
    "js": "javascript",
    "ts": "typescript",
    "go": "go",
    "c": "c",
    "h": "c",
    "cpp": "cpp",
    "java": "java",
    "rb": "ruby",
    "lua": "lua",
    "sh": "shellscript",
}


def _language_id(path: Path) -> str:
    return _LANGUAGES.get(path.suffix.lstrip(".").lower(), "plaintext")
