"""``specd serve``, ``specd complete`` and ``specd stats``.

They join the ``specd`` command line through :func:`register`, the ``lsp`` entry point of
the ``specd.commands`` group; the language server's modules load when a command runs.
``serve`` and ``complete`` take the model and decoding options of ``specd generate``;
end-to-end tests run them with ``--model tiny``, which starts in seconds and downloads
nothing (its completions are random characters).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from specd import BadInputError
from specd.options import (
    EXIT_OK,
    add_decoding_args,
    add_model_args,
    build_engine,
    sampling_params,
)

from . import config

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve``, ``complete`` and ``stats``."""
    p = subparsers.add_parser(
        "serve",
        help="run the language server (editors: --stdio; a shared local daemon: --tcp)",
        description="Run the specd language server. Over --stdio and --tcp it answers initialize at once and loads the model behind it (requests wait for it); --http loads the model first.",
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
    # a long-lived daemon trades the weights' size in memory for faster verify passes
    p.set_defaults(func=_serve, packed_weights="auto", loads_model=True)

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

    settings, _ = config.load_settings(args.config, strict=True)
    from .serve import with_backend

    completer = Completer(with_backend(args, build_engine(args)), sampling_params(args))
    cursor = cursor_at(doc, doc.resolve(line, col, "utf-32"), settings)
    request = CompletionRequest(cursor, display_path(doc.uri), settings, uri=doc.uri)
    return completer.complete(request).as_json()


def _complete_remote(
    args: argparse.Namespace, uri: str, doc: Any, line: int, col: int
) -> dict[str, Any]:
    from .client import Client
    from .daemon import parse_address

    host, port = parse_address(args.server, allow_remote=True, flag="--server")
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

    host, port = parse_address(args.server, allow_remote=True, flag="--server")
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
    if prompt := report.get("prompt"):
        print(f"prompt            prefix-tokens auto = {prompt['auto_prefix_tokens']}")
    pl = report.get("pipeline") or {}
    if pl:
        print(
            f"suggestions       {pl['from_cache']} from cache ({pl['cache_waits']} after a wait), {pl['first_line_answers']} at the first line, {pl['prefetches']} prefetched, {pl['warmups']} warm-ups ({pl['warmed_tokens']} tokens, {pl['read_ahead']} read ahead), {pl['debounced']} debounced, {pl['cold_prompts']} from a short prompt while cold"
        )
    return EXIT_OK


# -- shared ------------------------------------------------------------------------------------


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


def _serve(args: argparse.Namespace) -> int:
    from .serve import cmd_serve

    return cmd_serve(args)
