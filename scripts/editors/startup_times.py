#!/usr/bin/env python3
"""Time a language server's start as an editor sees it: process start -> ``initialize``
answered -> first non-empty inline completion.

    python scripts/editors/startup_times.py --rounds 3
    python scripts/editors/startup_times.py --rounds 3 --compare "/other/venv/bin/specd serve --stdio"

The server is this Python's ``specd serve --stdio`` (the default model). ``--compare CMD``
times a second server command in the same rounds, alternating with the first, so both see
the same machine. Prints one JSON object with the medians and every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from specd.jsonrpc import ServerProcess

SAMPLE = (
    "def fibonacci(n):\n"
    '    """The n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    return "
)


def once(command: list[str], timeout: float = 300) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    server = ServerProcess(command, env=env)
    try:
        server.request(
            "initialize",
            {"processId": os.getpid(), "rootUri": None, "capabilities": {}},
            timeout=timeout,
        )
        initialize = time.perf_counter() - server.started
        server.notify("initialized", {})
        uri = Path("/tmp/startup_check.py").as_uri()
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 0, "text": SAMPLE}},
        )
        lines = SAMPLE.split("\n")
        position = {"line": len(lines) - 1, "character": len(lines[-1])}
        while True:
            result = server.request(
                "textDocument/inlineCompletion",
                {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": 2}},
                timeout=timeout,
            )
            items = (result or {}).get("items") if isinstance(result, dict) else result
            if items and items[0].get("insertText"):
                break
            if time.perf_counter() - server.started > timeout:
                raise SystemExit("no non-empty completion")
        ready = time.perf_counter() - server.started
    finally:
        server.close()
    return {"initialize_s": initialize, "ready_s": ready}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compare", help="a second server command, timed in the same rounds")
    args = p.parse_args()
    here = [sys.executable, "-m", "specd.cli", "serve", "--stdio"]
    commands = {"specd": here}
    if args.compare:
        commands["compare"] = shlex.split(args.compare)
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in commands}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            rounds[name].append(once(cmd))
    report = {
        name: {
            "initialize_s_median": statistics.median(r["initialize_s"] for r in runs),
            "ready_s_median": statistics.median(r["ready_s"] for r in runs),
            "rounds": runs,
        }
        for name, runs in rounds.items()
    }
    report["load_avg"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
