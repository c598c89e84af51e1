#!/usr/bin/env python3
"""Send ``specd serve --http`` a prompt of megabytes and measure what it costs the server.

    python scripts/oversize_prompt.py                     # the default model, 3 MB prompt
    python scripts/oversize_prompt.py --model tiny --mb 1 --json

Starts the server on a free loopback port, asks for a greedy completion, records the
server's resident memory, posts the oversize prompt (timing the answer), records the
memory again and asks for the same greedy completion. Prints the status, the time to the
answer, RSS before and after, and whether the two greedy answers are identical. Exit
status 0 when the prompt was refused with a 400 ``context_length_exceeded``, the server's
memory moved less than 10% and the answers match; 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import psutil

GREEDY = {"prompt": "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n", "max_tokens": 24}


def start(model: str | None) -> tuple[subprocess.Popen, int]:
    """``specd serve --http 127.0.0.1:0``; the process and the port it bound."""
    command = [sys.executable, "-m", "specd.cli", "serve", "--http", "127.0.0.1:0"]
    if model:
        command += ["--model", model]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"serving HTTP on http://[\d.]+:(\d+)", line):
            return proc, int(m.group(1))
    raise SystemExit("the server did not start")


def post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def measure(model: str | None, mb: float) -> dict[str, Any]:
    proc, port = start(model)
    server = psutil.Process(proc.pid)
    try:
        _, first = post(port, GREEDY)
        rss_before = server.memory_info().rss
        t0 = time.perf_counter()
        status, reply = post(port, {"prompt": "x" * int(mb * 1_000_000)})
        seconds = time.perf_counter() - t0
        rss_after = server.memory_info().rss
        _, second = post(port, GREEDY)
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "prompt_bytes": int(mb * 1_000_000),
        "status": status,
        "code": reply.get("error", {}).get("code"),
        "message": reply.get("error", {}).get("message"),
        "seconds": round(seconds, 3),
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_after_mib": round(rss_after / 2**20, 1),
        "greedy_identical": first["choices"][0]["text"] == second["choices"][0]["text"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="as specd serve takes it (default model)")
    parser.add_argument("--mb", type=float, default=3.0, help="prompt size in MB (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    out = measure(args.model, args.mb)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>16}: {value}")
    grown = abs(out["rss_after_mib"] - out["rss_before_mib"]) / out["rss_before_mib"]
    ok = out["code"] == "context_length_exceeded" and grown < 0.10 and out["greedy_identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
