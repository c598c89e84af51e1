"""Replaying typing scripts (:mod:`.session`) through the real daemon, over LSP.

Every configuration gets its own ``specd serve --stdio`` subprocess, started from nothing,
so the time to ready covers what an editor waits for: the process starting, ``initialize``
answered, and the first non-empty suggestion. The scripts then run file by file, the
configurations taking turns on each file, so a machine that gets busier during the run
weighs on every configuration alike. Requests are ``textDocument/inlineCompletion`` with an
automatic trigger, each awaited before the next keystroke, as a user who stops to read
ghost text.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInputError
from ..jsonrpc import ServerError, ServerProcess
from ..options import EXIT_BAD_INPUT
from .session import Script

#: Seconds a request may take before the run gives up on the server.
REQUEST_TIMEOUT_S = 300.0
#: Seconds from start to the answer to ``initialize`` before the run gives up.
READY_TIMEOUT_S = 600.0
#: Unscored asks at the first place before the run stops waiting there for a non-empty
#: suggestion (a model that truly suggests nothing there must not hold the run).
READY_TRIES = 20


@dataclass(frozen=True)
class SessionConfig:
    """A configuration of the daemon: a name, the ``initializationOptions`` it gets,
    ``specd serve`` options beyond the bench's own, and environment variables it starts
    with."""

    name: str
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


#: The configurations the session workload compares, as data: one line per row.
CONFIGS = (
    SessionConfig("default"),
    SessionConfig("no-token-healing", {"token-healing": False}),
    # a request that would read more than 256 prompt tokens first uses the last 256 only
    SessionConfig("cold-prompt", {"cold-prompt-tokens": 256}),
    # no warm-up, no first-line answer, no completion cache, no debounce: each request
    # runs the model to the end of its suggestion
    SessionConfig(
        "no-pipeline",
        {"warm-up": False, "first-line": False, "completion-cache": False, "debounce-ms": 0},
    ),
    # without the prepacked weights for verify passes (the daemon's default is auto)
    SessionConfig("no-packed-weights", args=("--packed-weights", "off")),
    # warm-ups read only the window at the cursor, not the one it steps to next
    SessionConfig("no-read-ahead", {"read-ahead": False}),
    # the prompt's text before the cursor at its largest auto size, whatever the machine
    SessionConfig("prefix-1536", {"prefix-tokens": 1536}),
    # n-grams alone, without the EAGLE head the default drafter (hybrid) asks where they
    # have no match (docs/eagle.md)
    SessionConfig("ngram", args=("--drafter", "ngram")),
    # the prompt read in bfloat16, the suggestions written in float32: faster prefills on
    # CPUs with bfloat16 products, not token-identical (docs/benchmarks.md, bfloat16)
    SessionConfig("bf16-prefill", args=("--prefill-dtype", "bfloat16")),
    # the compiled step (specd.forward.compiled) made ready before the daemon answers `initialize`:
    # its compile counts in the start-up time, not in another daemon's turn (where the step
    # kernel runs, `auto` already does this)
    SessionConfig("compiled", args=("--compile", "on")),
    # neither of specd's CPU kernels (specd.forward.cpu_kernels): prefills attend through PyTorch's
    # kernels, decode and verify passes run eager
    SessionConfig("no-cpu-kernels", env=(("SPECD_CPU_KERNELS", "off"),)),
)


@dataclass
class Answer:
    """One request and how its answer scores against what the user typed next."""

    kind: str  # "line" | "pause"
    latency_s: float
    text: str  # what the suggestion inserts after the cursor ("" when empty)
    exact_line: bool
    typed_chars: int
    first_in_file: bool


@dataclass
class Daemon:
    """One configuration's server, with its answers and start-up times."""

    config: SessionConfig
    server: ServerProcess
    initialize_s: float = 0.0
    ready_s: float | None = None
    waiting: bool = True  # asks at one place again until a suggestion (READY_TRIES at most)
    answers: list[Answer] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    error: str | None = None


def server_command(model_args: list[str]) -> list[str]:
    """``specd serve --stdio`` with the model options, run by this Python."""
    return [sys.executable, "-m", "specd.cli", "serve", "--stdio", *model_args]


def start(
    config: SessionConfig, command: list[str], *, threads: int | None, cwd_uri: str
) -> Daemon:
    """Start a daemon and ``initialize`` it (offering UTF-32 positions: plain characters)."""
    env = dict(os.environ) | dict(config.env)
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    server = ServerProcess(command, env=env)
    daemon = Daemon(config, server)
    try:
        _initialize(server, config, cwd_uri)
    except ServerError as e:
        _refused(server, e)
        raise
    daemon.initialize_s = time.perf_counter() - server.started
    server.notify("initialized", {})
    return daemon


def _refused(server: ServerProcess, error: ServerError) -> None:
    """Raise ``error`` as bad input where the daemon ended refusing its options (exit 2: a
    model that does not load, say, found at start or while it loads after ``initialize``)."""
    try:  # its output ended: its exit status follows within moments
        code = server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return
    if code == EXIT_BAD_INPUT:
        raise BadInputError(str(error)) from None


def _initialize(server: ServerProcess, config: SessionConfig, cwd_uri: str) -> None:
    server.request(
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": cwd_uri,
            "capabilities": {
                "general": {"positionEncodings": ["utf-32"]},
                "textDocument": {"inlineCompletion": {"dynamicRegistration": False}},
            },
            "initializationOptions": config.options,
            "clientInfo": {"name": "specd-bench-session"},
        },
        timeout=READY_TIMEOUT_S,
    )


def replay(daemon: Daemon, script: Script, *, keystroke_s: float) -> None:
    """Open the script's document, type the block, close it."""
    server = daemon.server
    uri = script.path.resolve().as_uri()
    version = 0
    server.notify(
        "textDocument/didOpen",
        {
            "textDocument": {
                "uri": uri,
                "languageId": "python",
                "version": version,
                "text": script.text,
            }
        },
    )
    line, col = script.line, 0
    first = True
    current = ""  # the cursor line's text up to the cursor: the block starts a line
    for step in script.steps:
        if step.text:
            time.sleep(keystroke_s)
            version += 1
            pos = {"line": line, "character": col}
            server.notify(
                "textDocument/didChange",
                {
                    "textDocument": {"uri": uri, "version": version},
                    "contentChanges": [{"range": {"start": pos, "end": pos}, "text": step.text}],
                },
            )
            if step.text == "\n":
                line, col, current = line + 1, 0, ""
            else:
                col += len(step.text)
                current += step.text
        if step.ask is None:
            continue
        waiting_for_ready = daemon.waiting
        for tries in range(READY_TRIES, -1, -1):
            t0 = time.perf_counter()
            try:
                result = server.request(
                    "textDocument/inlineCompletion",
                    {
                        "textDocument": {"uri": uri},
                        "position": {"line": line, "character": col},
                        "context": {"triggerKind": 2},
                    },
                    timeout=REQUEST_TIMEOUT_S,
                )
            except ServerError as e:
                _refused(server, e)
                raise
            latency = time.perf_counter() - t0
            text = suggestion(result, current, col)
            if first or not waiting_for_ready:
                daemon.answers.append(score(step.ask.kind, latency, text, step.ask, first))
                first = False
            if text and daemon.ready_s is None:
                daemon.ready_s = time.perf_counter() - server.started
            if text or not waiting_for_ready or not tries:
                break
            time.sleep(0.1)  # not ready yet: ask again here (these tries are not scored)
        daemon.waiting = False
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def suggestion(result: Any, line_before: str, col: int) -> str:
    """What the first inline completion item inserts after the cursor.

    An item may replace text before the cursor on the cursor's line (its ``range``
    starting left of the cursor); its text then has to start with what it replaces.
    :returns: the text after the cursor, "" for no item, an empty item, or an item that
        does not keep the text before the cursor.
    """
    items = result.get("items") if isinstance(result, dict) else result
    if not items:
        return ""
    item = items[0]
    text = item.get("insertText", "")
    if isinstance(text, dict):  # a snippet: StringValue
        text = text.get("value", "")
    rng = item.get("range")
    if rng and rng["start"]["character"] < col:
        replaced = line_before[rng["start"]["character"] : col]
        if not text.startswith(replaced):
            return ""
        text = text[len(replaced) :]
    return str(text)


def score(kind: str, latency: float, text: str, ask: Any, first: bool) -> Answer:
    """Score a suggestion against the real text: is its first line the rest of the real
    line, and how many of its characters the user types next (the common prefix)."""
    first_line = text.split("\n", 1)[0].rstrip()
    exact = bool(text) and first_line == ask.line_rest.rstrip()
    typed = 0
    for a, b in zip(text, ask.rest):
        if a != b:
            break
        typed += 1
    return Answer(kind, latency, text, exact, typed, first)


def finish(daemon: Daemon) -> None:
    """Read the daemon's metrics and the messages it showed, then stop it."""
    try:
        daemon.stats = daemon.server.request("specd/stats", None, timeout=30)
    except ServerError:
        daemon.stats = None
    daemon.messages = [
        str(n.get("params", {}).get("message", ""))
        for n in daemon.server.notifications
        if n.get("method") == "window/showMessage"
    ]
    daemon.server.close()


def file_uri(path: Path) -> str:
    return path.resolve().as_uri()
