"""The ``specd`` command line.

Each subcommand lives in a module exposing ``register(subparsers)``, which adds its parser
and sets ``func`` to a function taking the parsed arguments and returning an exit code:
0 success, 1 a check failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from .errors import BadInputError, ModelNotFoundError, SpecdError

COMMAND_MODULES = (
    "specd.cli",  # generate, plugins
    "specd.conformance.command",  # verify
    "specd.bench.command",  # bench
    "specd.lsp.commands",  # serve, complete, stats
)

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 already; keep its message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"specd: error: {message}\n")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options every command that loads a model takes."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help="alias (default: smollm2-135m), local HF directory, or cached hub id",
    )
    g.add_argument(
        "--dtype",
        default=None,
        help="float32 | bfloat16 | float16 (default: float32 on CPU, bfloat16 on CUDA)",
    )
    g.add_argument(
        "--device", default=None, help="cpu | cuda[:N] | mps (default: the best available)"
    )
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow model code from the model directory (off by default)",
    )


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """Options that choose drafter, verifier, policy and sampling."""
    g = p.add_argument_group("decoding")
    g.add_argument(
        "--drafter",
        default="ngram",
        help="drafter name, or 'none' for plain decoding (default: ngram)",
    )
    g.add_argument(
        "--drafter-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="drafter constructor option (repeatable)",
    )
    g.add_argument(
        "--verifier",
        default=None,
        help="verifier name (default: greedy at temperature 0, else rejection)",
    )
    g.add_argument("--exit-policy", default="adaptive", help="exit policy name (default: adaptive)")
    g.add_argument(
        "--max-draft", type=int, default=8, help="most draft tokens per step (default: 8)"
    )
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict, values parsed as JSON where they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInputError(f"option {item!r} is not KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def sampling_params(args: argparse.Namespace):
    from .sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
    )


def build_engine(args: argparse.Namespace):
    from .engine import Engine

    opts = parse_options(getattr(args, "drafter_option", []))
    return Engine.load(
        args.model,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        drafter=getattr(args, "drafter", "ngram"),
        verifier=getattr(args, "verifier", None),
        exit_policy=getattr(args, "exit_policy", "adaptive"),
        max_draft=getattr(args, "max_draft", 8),
        drafter_options={getattr(args, "drafter", "ngram"): opts} if opts else None,
    )


# -- generate ---------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            prompt = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            raise BadInputError(f"cannot read --file {args.file}: {e.strerror}") from e
        if args.prompt:
            prompt += args.prompt
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise BadInputError("give a PROMPT or --file")
    params = sampling_params(args)
    engine = build_engine(args)
    gen = engine.stream(prompt, params)
    if args.json:
        completion = gen.result()
        print(json.dumps(completion.as_json()))
    else:
        for delta in gen:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        completion = gen.completion
        assert completion is not None
        s = completion.stats
        print(
            f"[{s.new_tokens} tokens, {s.target_steps} target steps, "
            f"mean acceptance {s.mean_acceptance_length:.2f}, {s.tokens_per_s:.1f} tok/s, "
            f"ttft {s.ttft_s * 1000:.0f} ms]",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_plugins(args: argparse.Namespace) -> int:
    from .registry import list_plugins

    found = list_plugins()
    if args.json:
        print(json.dumps(found))
    else:
        for kind, entries in found.items():
            print(f"{kind}:")
            for e in entries:
                print(f"  {e['name']:<16} {e['module']}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specd", description="Exact speculative decoding for fast local code completion."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that command is not part of this installation
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="specd: %(levelname)s %(name)s: %(message)s")
    if args.verbose == 0:
        _quiet_libraries()
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
