"""The ``specd`` command line.

The core's commands join through :data:`CORE_COMMANDS`: generate and plugins (here),
verify (:mod:`specd.conformance.command`) and bench (:mod:`specd.bench.command`). Packages
above the core, such as the language server's serve, complete and stats, add theirs through
the ``specd_register_commands`` hook. Each command's ``func`` takes the parsed arguments and
returns an exit code (:mod:`specd.options`): 0 success, 1 a check failed, 2 bad usage or
bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from . import allocator, registry
from .bench import command as bench_command
from .conformance import command as verify_command
from .errors import BadInputError, ModelNotFoundError, SpecdError
from .limits import UTF8_MAX_BYTES, ContextLengthExceeded
from .options import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_OK,
    add_decoding_args,
    add_model_args,
    build_engine,
    sampling_params,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 already; keep its message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"specd: error: {message}\n")


# -- generate ---------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    if args.file is None and args.prompt is None:
        raise BadInputError("give a PROMPT or --file")
    size = _file_size(args.file) if args.file is not None else 0  # unreadable: before loading
    params = sampling_params(args)
    engine = build_engine(args)
    limits = engine.limits
    what = f"--file {args.file}" if args.file is not None else "PROMPT"
    if args.file is not None:
        limits.check_bytes(size, what)
        prompt = _read_prompt(args.file, UTF8_MAX_BYTES * limits.max_chars) + (args.prompt or "")
    else:
        prompt = args.prompt
    # --max-tokens is asked for: a prompt that leaves less room than that is refused
    ids = limits.encode(engine.tokenize, prompt, params.max_tokens, what, "--max-tokens")
    gen = engine.stream(ids, params)
    if args.json:
        completion = gen.result()
        print(json.dumps(completion.as_json()))
    else:
        for delta in gen:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        s = gen.result().stats
        print(
            f"[{s.new_tokens} tokens, {s.target_steps} target steps, "
            f"mean acceptance {s.mean_acceptance_length:.2f}, {s.tokens_per_s:.1f} tok/s, "
            f"ttft {s.ttft_s * 1000:.0f} ms]",
            file=sys.stderr,
        )
    return EXIT_OK


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as e:
        raise BadInputError(f"cannot read --file {path}: {e.strerror}") from e


def _read_prompt(path: str, max_bytes: int) -> str:
    """The file's text, reading no more than ``max_bytes`` (a pipe has no size to check)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise BadInputError(f"cannot read --file {path}: {e.strerror}") from e
    if len(data) > max_bytes:
        raise ContextLengthExceeded(
            f"--file {path}: more than {max_bytes:,} bytes, which cannot fit in the "
            "model's context window; give a shorter file",
            "--file",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(f"--file {path}: not UTF-8 text (byte {e.start:,})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # newlines as text mode reads them


def cmd_plugins(args: argparse.Namespace) -> int:
    found = registry.list_plugins()
    if args.json:
        print(json.dumps(found))
    else:
        for kind, entries in found.items():
            print(f"{kind}:")
            for e in entries:
                print(f"  {e['name']:<16} {e['module']}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``generate`` and ``plugins``."""
    p = sub.add_parser(
        "generate",
        help="generate a completion for a prompt",
        description="Generate a completion, streaming it to stdout.",
    )
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="prompt text (appended to --file when both are given)",
    )
    p.add_argument("--file", default=None, help="read the prompt from this file")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object: text, token_ids, stats"
    )
    add_model_args(p)
    add_decoding_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("plugins", help="list installed drafters, verifiers and exit policies")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)


#: The core's commands, each a function adding its parsers to the subparsers.
CORE_COMMANDS = (register, verify_command.register, bench_command.register)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specd", description="Exact speculative decoding for fast local code completion."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in CORE_COMMANDS:
        add(sub)
    registry.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="specd: %(levelname)s %(name)s: %(message)s")
    if args.verbose == 0:
        _quiet_libraries()
    allocator.keep_freed_memory()
    try:
        return int(args.func(args))
    except (BadInputError, ModelNotFoundError) as e:
        print(f"specd: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SpecdError as e:
        print(f"specd: error: {e}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except KeyboardInterrupt:
        return 130


def _quiet_libraries() -> None:
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", module="transformers")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
