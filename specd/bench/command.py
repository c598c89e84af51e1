"""``specd bench``: run a workload through every configuration and report."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..errors import BadInputError
from ..options import EXIT_OK, add_model_args, parse_options, thread_count
from . import session, session_report, workloads

DEFAULT_LIMIT = 8
#: ``--rss``: a fresh process per configuration, this process, or no peak RSS.
RSS_MODES = ("isolated", "inprocess", "off")


def cmd_bench(args: argparse.Namespace) -> int:
    if args.workload == session_report.NAME:
        return cmd_session(args)
    import torch

    from . import configs as configs_mod
    from .harness import BenchOptions
    from .probe import TargetSpec

    if args.threads is not None:
        torch.set_num_threads(thread_count(args.threads))
    if args.repeats < 1:
        raise BadInputError(f"--repeats must be >= 1, got {args.repeats}")
    for flag in ("limit", "rss_prompts", "prefix_prompts"):
        if getattr(args, flag) < 1:
            name = "--" + flag.replace("_", "-")
            raise BadInputError(f"{name} must be >= 1, got {getattr(args, flag)}")
    for out in (args.json, args.plot, args.markdown):
        if out and out != "-" and not Path(out).expanduser().resolve().parent.is_dir():
            raise BadInputError(f"cannot write {out}: its directory does not exist")
    draft_options = parse_options(args.draft_option)
    requested = [c.strip() for c in args.configs.split(",") if c.strip()] if args.configs else None
    # Validate the names before loading anything.
    cfgs, skipped = configs_mod.resolve(
        requested, draft_model=args.draft_model, draft_options=draft_options
    )

    spec = TargetSpec(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        compile=args.compile,
        prefill_dtype=args.prefill_dtype,
        packed_weights=args.packed_weights or "off",
        weights=args.weights,
        kv_dtype=args.kv_dtype,
    )
    target = spec.load()
    draft_lm = spec.load_draft(args.draft_model, target) if any(c.assisted for c in cfgs) else None
    prompts = workloads.build(
        args.workload,
        target,
        limit=args.limit,
        seed=args.seed,
        source=args.source,
        context_tokens=args.context_tokens,
        max_tokens=args.max_tokens,
    )
    opts = BenchOptions(
        rss=args.rss,
        rss_prompts=args.rss_prompts,
        floor=not args.no_floor,
        prefix=not args.no_prefix,
        prefix_prompts=args.prefix_prompts,
        warmup=not args.no_warmup,
        repeats=args.repeats,
        context_tokens=args.context_tokens,
        progress=not args.no_progress,
        draft_model=args.draft_model,
        draft_options=draft_options,
    )
    from .harness import run
    from .render import markdown, plot

    report = run(
        args.workload, prompts, cfgs, target, spec, opts, skipped=skipped, draft_lm=draft_lm
    )
    report["command"] = command_line(args)

    text = json.dumps(report, indent=1)
    if args.json == "-":
        print(text)
    elif args.json:
        Path(args.json).expanduser().write_text(text + "\n", encoding="utf-8")
    table = markdown(report)
    if args.markdown:
        Path(args.markdown).expanduser().write_text(table, encoding="utf-8")
    if args.json != "-":
        sys.stdout.write(table)
    if args.plot:
        plot(report, str(Path(args.plot).expanduser()))
    return EXIT_OK


def cmd_session(args: argparse.Namespace) -> int:
    """The session workload: typing replayed through the daemon (:mod:`.session_report`)."""
    if args.threads is not None:
        thread_count(args.threads)
    for out in (args.json, args.markdown):
        if out and out != "-" and not Path(out).expanduser().resolve().parent.is_dir():
            raise BadInputError(f"cannot write {out}: its directory does not exist")
    report = session_report.run(args)
    report["command"] = command_line(args)
    text = json.dumps(report, indent=1)
    if args.json == "-":
        print(text)
    elif args.json:
        Path(args.json).expanduser().write_text(text + "\n", encoding="utf-8")
    table = session_report.markdown(report)
    if args.markdown:
        Path(args.markdown).expanduser().write_text(table, encoding="utf-8")
    if args.json != "-":
        sys.stdout.write(table)
    return EXIT_OK


def command_line(args: argparse.Namespace) -> str:
    """The ``specd bench`` command that reproduces this run (options that differ from the
    defaults, outputs left out)."""
    parts = ["specd", "bench", "--workload", args.workload]
    skip = {"workload", "func", "command", "verbose", "json", "plot", "markdown", "no_progress"}
    for key, value in vars(args).items():
        if key in skip or value in (None, False, []) or value == _DEFAULTS.get(key):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            for v in value:
                parts += [flag, str(v)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


_DEFAULTS = {
    "repeats": 1,
    "limit": DEFAULT_LIMIT,
    "context_tokens": 1024,
    "seed": 0,
    "rss": "isolated",
    "rss_prompts": 1,
    "prefix_prompts": 4,
    "session_lines": session.DEFAULT_BLOCK_LINES,
    "keystroke_ms": session_report.DEFAULT_KEYSTROKE_MS,
    "compile": "auto",
    "weights": "auto",
    "kv_dtype": "auto",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark specd against Hugging Face generate on a workload",
        description=(
            "Run a workload through the Hugging Face baselines and the specd configurations, "
            "interleaved per prompt, and report tokens/s, speedups of the same run, acceptance, "
            "TTFT, TPOT, peak RSS and the token-identical rate, plus the memory floor of a "
            "decode step and the TTFT after a one-character edit with the prefix cache."
        ),
    )
    p.add_argument(
        "--workload",
        required=True,
        choices=[*workloads.names(), session_report.NAME],
        help="which prompts to run; session: typing replayed through the daemon over LSP",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"number of prompts (default: {DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="OUT",
        help="write the JSON report to OUT ('-': print it instead of the table)",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="write the plots (speedup bars, acceptance histogram)",
    )
    p.add_argument(
        "--markdown", default=None, metavar="OUT.md", help="also write the markdown table to a file"
    )
    p.add_argument(
        "--configs",
        default=None,
        help="comma-separated configurations (default: every applicable one); e.g. "
        "hf-plain,hf-prompt-lookup-10,specd-plain,specd-ngram-adaptive-k8; llama.cpp through "
        "specd[llamacpp]: llamacpp-plain,llamacpp-lookup[-N]; "
        "hf-plain, hf-prompt-lookup and specd-plain always run; for the session workload: "
        "default,no-token-healing",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="new tokens per prompt (default: per workload, 64 for editor)",
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        default=1024,
        help="prompt length for editor and random, and the floor's context (default: 1024)",
    )
    p.add_argument(
        "--source",
        default=None,
        metavar="DIR",
        help="source files for editor and edit (default: the Python standard library)",
    )
    g = p.add_argument_group("session workload")
    g.add_argument(
        "--files",
        action="append",
        default=[],
        metavar="PATH",
        help="source files to type: a file, a directory or a glob (repeatable; default: the "
        "Python standard library); --limit is the number of files",
    )
    g.add_argument(
        "--session-lines",
        type=int,
        default=session.DEFAULT_BLOCK_LINES,
        help=f"lines removed and typed back per file (default: {session.DEFAULT_BLOCK_LINES})",
    )
    g.add_argument(
        "--keystroke-ms",
        type=float,
        default=session_report.DEFAULT_KEYSTROKE_MS,
        help=f"time between keystrokes (default: {session_report.DEFAULT_KEYSTROKE_MS})",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each configuration on each prompt, interleaved; the fastest counts (default: 1)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="chooses files and cursor positions (default: 0)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice); on a shared machine 1 is often fastest",
    )
    p.add_argument(
        "--rss",
        choices=RSS_MODES,
        default="isolated",
        help="peak RSS: a fresh process per configuration (isolated, default), this process (inprocess), or off",
    )
    p.add_argument(
        "--rss-prompts",
        type=int,
        default=1,
        help="prompts each isolated peak-RSS probe runs (default: 1)",
    )
    p.add_argument(
        "--prefix-prompts",
        type=int,
        default=4,
        help="prompts for the prefix-cache TTFT check (default: 4)",
    )
    p.add_argument("--no-prefix", action="store_true", help="skip the prefix-cache TTFT check")
    p.add_argument("--no-floor", action="store_true", help="skip the memory-floor measurement")
    p.add_argument(
        "--no-warmup", action="store_true", help="skip the warm-up pass over every configuration"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--draft-model",
        default=None,
        help="draft model for hf-assisted and the draft_model drafter (alias, directory or cached hub id)",
    )
    p.add_argument(
        "--draft-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra draft_model drafter option (repeatable)",
    )
    add_model_args(p)
    p.set_defaults(func=cmd_bench)
