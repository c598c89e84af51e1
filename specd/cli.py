"""The ``specd`` command line.

Every command joins it the same way, the core's and any package's: an entry point in the
``specd.commands`` group names a function that takes the command line's subparsers and adds
its parsers (:func:`register` here adds generate and plugins; verify, bench, serve,
complete, stats and train come from their own modules). Each command's ``func`` takes the
parsed arguments and returns an exit code (:mod:`specd.options`): 0 success, 1 a check
failed, 2 bad usage or bad input. A command's module is imported for every ``specd``
invocation, ``--help`` included, so it imports argparse and :mod:`specd.options` only, and
its function imports what the command needs.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

from . import allocator, entrypoints
from .errors import BadInputError, ModelNotFoundError, SpecdError
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
    from .limits import UTF8_MAX_BYTES

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
    from .limits import ContextLengthExceeded

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
    from . import registry

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
    p.set_defaults(func=cmd_generate, quick_exit=True, loads_model=True)

    p = sub.add_parser("plugins", help="list installed drafters, verifiers and exit policies")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)


#: The entry-point group of the command line's commands: ``NAME = "module:function"``.
COMMANDS_GROUP = "specd.commands"
log = logging.getLogger("specd.plugins")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specd", description="Exact speculative decoding for fast local code completion."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    add_commands(sub)
    return parser


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the commands of every ``specd.commands`` entry point, specd's own first.

    Each entry point runs on its own: one whose module fails to import, whose function
    raises, or that takes a command name already in use is logged with its traceback and
    skipped, the commands it added taken out again; the other commands still work.
    ``SPECD_LOAD_PLUGINS`` limits the other distributions' commands as it limits their
    plugins; specd's own commands always load.
    """
    eps = entrypoints.selected(COMMANDS_GROUP, builtin=True)
    eps.sort(key=lambda ep: not entrypoints.ships_with_specd(ep))  # stable: specd's first
    if not eps or not entrypoints.ships_with_specd(eps[0]):
        log.error(
            "specd's own commands are missing from the %r entry points its installation "
            "declares: install specd again (pip install -e . in a checkout)",
            COMMANDS_GROUP,
        )
    done: set[str] = set()
    for ep in eps:
        if ep.name in done:
            continue
        done.add(ep.name)
        names, listed = dict(sub.choices), list(sub._choices_actions)
        try:
            ep.load()(sub)
            taken = sorted(n for n, p in names.items() if sub.choices[n] is not p)
            if taken:  # Python 3.11 refuses this itself; 3.10 replaced the parser
                raise ValueError(f"command name already in use: {', '.join(taken)}")
        except Exception as exc:  # noqa: BLE001 - a broken command is skipped, not fatal
            sub.choices.clear()
            sub.choices.update(names)
            sub._choices_actions[:] = listed
            log.error(
                "commands %r (%s) failed to register and are skipped",
                ep.name,
                ep.value,
                exc_info=exc,
            )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="specd: %(levelname)s %(name)s: %(message)s")
    if args.verbose == 0:
        _quiet_libraries()
    allocator.keep_freed_memory()
    if argv is None and getattr(args, "loads_model", False):
        _import_model_library()
    try:
        code = int(args.func(args))
        if argv is None and getattr(args, "quick_exit", False):
            _exit_now(code)
        return code
    except (BadInputError, ModelNotFoundError) as e:
        print(f"specd: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SpecdError as e:
        print(f"specd: error: {e}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except KeyboardInterrupt:
        return 130


def _import_model_library() -> None:
    """Import torch for a command that loads a model (``generate``, ``serve``: their parsers
    set ``loads_model``) with the cyclic garbage collector off, then move every object made
    so far to the collector's permanent generation (:func:`gc.freeze`): the import makes
    ~170k objects that live as long as the process, and collected as it went, full
    collections passed over them three times (~0.13 s of a one-token ``specd generate``'s
    ~2 s on the 2-vCPU Zen 3 of docs/benchmarks.md); a daemon's later ones pass over what
    it made since. Only as the ``specd`` command: a caller in the same process keeps its own
    collector's state."""
    gc.disable()
    try:
        import torch  # noqa: F401
    finally:
        gc.freeze()
        gc.enable()


def _exit_now(code: int) -> None:
    """End the process of a one-off command whose output is written: flushed, then gone
    without the interpreter's teardown of every module (torch's among them), which took
    ~0.5 s of a one-token ``specd generate``'s ~2.2 s on the 2-vCPU EPYC of
    docs/benchmarks.md. Only as the ``specd`` command (``main()`` without ``argv``): a caller
    in the same process gets the code back."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _quiet_libraries() -> None:
    """Errors only from transformers and no progress bars, set before it is imported (a
    command that loads no model does not import it)."""
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", module="transformers")
    if "transformers" in sys.modules:  # too late for the environment: tell it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
