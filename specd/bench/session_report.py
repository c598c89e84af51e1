"""``specd bench --workload session``: run the typing scripts through each configuration's
daemon and report, per configuration, what a user of ghost text sees.

- ``latency_p50_s``, ``latency_p90_s``: request to answer, over the answers that carried
  a suggestion (an empty answer is not a suggestion, however fast).
- ``empty_rate``: the share of requests answered with nothing.
- ``exact_line_rate``: the share of requests whose suggestion's first line is exactly the
  rest of the real line.
- ``typed_chars_per_request``: characters of the suggestion the user then typed (its
  common prefix with the real text), per request.
- ``ready_s``: from starting the process to the first non-empty suggestion;
  ``initialize_s``: to the answer to ``initialize``.
- ``first_request_empty_rate``: the share of files whose first request, right after
  opening, came back empty; ``first_request_p50_s``: the median latency of those requests
  (they read the whole prompt first); ``later_p90_s``: the p90 latency of the others.

Beside them, the fields of the other workloads that apply to a daemon: ``config``,
``drafter``, ``ttft_s``, ``tpot_p50_s``, ``tpot_p95_s``, ``mean_acceptance_length``
and ``auto_prefix_tokens`` (from the daemon's own ``specd/stats``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import BadInputError
from ..stats import percentile
from . import session, session_run
from .session_run import CONFIGS, Daemon, SessionConfig

NAME = "session"
DEFAULT_KEYSTROKE_MS = 15


def run(args: argparse.Namespace, server: list[str] | None = None) -> dict[str, Any]:
    """Build the scripts, start one daemon per configuration, replay, and report.

    :param server: the server command (default: ``specd serve --stdio`` with the model
        options of ``args``).
    """
    if args.keystroke_ms < 0:
        raise BadInputError(f"--keystroke-ms must be >= 0, got {args.keystroke_ms}")
    files = session.expand_files(args.files)
    scripts = session.build(files, limit=args.limit, seed=args.seed, block_lines=args.session_lines)
    configs = _configs(args.configs)
    with tempfile.TemporaryDirectory(prefix="specd-session-") as tmp:
        # An empty settings file: the user's own ~/.config/specd/lsp.toml stays out of it.
        settings = Path(tmp) / "lsp.toml"
        settings.write_text("", encoding="utf-8")
        command = server or session_run.server_command(
            _model_args(args) + ["--config", str(settings)]
        )
        load_start = _loadavg()
        root = Path.cwd().resolve().as_uri()
        daemons: list[Daemon] = []
        try:
            for k, script in enumerate(scripts, start=1):
                for i, cfg in enumerate(configs):
                    if i == len(daemons):
                        # Started just before its first file, so its time to ready is its
                        # own: the daemons started earlier sit idle meanwhile.
                        own = command + list(cfg.args) if server is None else command
                        daemons.append(
                            session_run.start(cfg, own, threads=args.threads, cwd_uri=root)
                        )
                    _say(args, f"[{k}/{len(scripts)}] {cfg.name}: {script.name}")
                    session_run.replay(daemons[i], script, keystroke_s=args.keystroke_ms / 1000)
        finally:
            for d in daemons:
                session_run.finish(d)
    return {
        "workload": NAME,
        "machine": _machine(args, load_start),
        "sessions": [{"name": s.name, "requests": s.asks} for s in scripts],
        "keystroke_ms": args.keystroke_ms,
        "results": [summarize(d) for d in daemons],
    }


def _configs(requested: str | None) -> list[SessionConfig]:
    if not requested:
        return list(CONFIGS)
    known = {c.name: c for c in CONFIGS}
    out = []
    for name in (n.strip() for n in requested.split(",") if n.strip()):
        if name not in known:
            raise BadInputError(
                f"unknown session configuration {name!r}; choose from {', '.join(known)}"
            )
        out.append(known[name])
    return out


def _model_args(args: argparse.Namespace) -> list[str]:
    out = []
    for flag, value in (
        ("--model", args.model),
        ("--dtype", args.dtype),
        ("--device", args.device),
        ("--max-tokens", args.max_tokens),
        ("--packed-weights", args.packed_weights),
        ("--weights", args.weights),
        ("--kv-dtype", args.kv_dtype),
    ):
        if value is not None:
            out += [flag, str(value)]
    if args.trust_remote_code:
        out.append("--trust-remote-code")
    return out


def summarize(d: Daemon) -> dict[str, Any]:
    """One configuration's row (see the module docstring for the fields)."""
    answers = d.answers
    n = len(answers)
    shown = [a.latency_s for a in answers if a.text]
    firsts = [a for a in answers if a.first_in_file]
    stats = d.stats or {}
    lat = stats.get("latency", {})
    unknown = [m for m in d.messages if any(k in m for k in d.config.options)]
    return {
        "config": d.config.name,
        "initialization_options": d.config.options,
        "latency_p50_s": percentile(shown, 50),
        "latency_p90_s": percentile(shown, 90),
        "empty_rate": sum(not a.text for a in answers) / n if n else None,
        "exact_line_rate": sum(a.exact_line for a in answers) / n if n else None,
        "typed_chars_per_request": sum(a.typed_chars for a in answers) / n if n else None,
        "ready_s": d.ready_s,
        "initialize_s": d.initialize_s,
        "first_request_empty_rate": (
            sum(not a.text for a in firsts) / len(firsts) if firsts else None
        ),
        "first_request_p50_s": percentile([a.latency_s for a in firsts], 50),
        "later_p90_s": percentile(
            [a.latency_s for a in answers if a.text and not a.first_in_file], 90
        ),
        "requests": n,
        "line_requests": sum(a.kind == "line" for a in answers),
        "pause_requests": sum(a.kind == "pause" for a in answers),
        "suggested_chars_per_request": sum(len(a.text) for a in answers) / n if n else None,
        "drafter": None,
        "ttft_s": (lat.get("ttft_s") or {}).get("p50"),
        "tpot_p50_s": (lat.get("tpot_s") or {}).get("p50"),
        "tpot_p95_s": (lat.get("tpot_s") or {}).get("p95"),
        "mean_acceptance_length": (stats.get("acceptance") or {}).get("mean_length"),
        # what ``prefix-tokens = "auto"`` stood for in this daemon (measured at its load)
        "auto_prefix_tokens": (stats.get("prompt") or {}).get("auto_prefix_tokens"),
        # A configuration whose options the daemon did not take measures the defaults.
        "options_refused": unknown,
        "server_messages": d.messages,
        # In replay order, for reading the noise: numbers only, no code.
        "per_request": [
            {
                "kind": a.kind,
                "latency_s": a.latency_s,
                "suggested_chars": len(a.text),
                "exact_line": a.exact_line,
                "typed_chars": a.typed_chars,
            }
            for a in answers
        ],
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"**Workload** `session`, {len(report['sessions'])} files, a keystroke every "
        f"{report['keystroke_ms']} ms · **model** {m.get('model') or 'default'} · **machine** "
        f"{m.get('cpu')}, {m.get('cpu_count')} CPUs, load average {m.get('load_avg_start')} "
        f"→ {m.get('load_avg_end')}",
        "",
        "| config | requests | p50 ms | p90 ms | empty | exact line | typed chars / request "
        "| initialize s | ready s | first request empty | first request ms | p90 after the first ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        refused = " (options refused: defaults)" if r["options_refused"] else ""
        lines.append(
            f"| {r['config']}{refused} | {r['requests']} | {_f(r['latency_p50_s'], '.0f', 1e3)} "
            f"| {_f(r['latency_p90_s'], '.0f', 1e3)} | {_f(r['empty_rate'], '.0%')} "
            f"| {_f(r['exact_line_rate'], '.0%')} | {_f(r['typed_chars_per_request'], '.1f')} "
            f"| {_f(r['initialize_s'], '.2f')} | {_f(r['ready_s'], '.2f')} "
            f"| {_f(r['first_request_empty_rate'], '.0%')} "
            f"| {_f(r.get('first_request_p50_s'), '.0f', 1e3)} "
            f"| {_f(r.get('later_p90_s'), '.0f', 1e3)} |"
        )
    return "\n".join(lines) + "\n"


def _f(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "–" if x is None else format(x * scale, fmt)


def _machine(args: argparse.Namespace, load_start: list[float] | None) -> dict[str, Any]:
    from ..forward import cpu_kernels
    from ..forward.pricing import cpu_name

    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "isa": cpu_kernels.isa(),
        "threads": args.threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "model": args.model,
        "weights": args.weights,
        "kv_dtype": args.kv_dtype,
        "load_avg_start": load_start,
        "load_avg_end": _loadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.no_progress:
        print(f"session: {text}", file=sys.stderr, flush=True)
