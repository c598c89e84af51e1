#!/usr/bin/env python3
"""Soak the language server: keystroke-rate requests with cancellations across many
documents, then check that nothing crashed, every request was answered, and the server's
resident memory grew less than the allowed fraction after warm-up.

    python scripts/soak_server.py                       # 10,000 requests, tiny random model
    python scripts/soak_server.py --real --rate 10      # the default model (slower)
    python scripts/soak_server.py --requests 500 --rate 0 --json

Each step types a character into a document (incremental didChange) and asks for an
inline completion (or a completion, some with partial results) at the cursor, as an
editor does; a share of requests is cancelled with $/cancelRequest, documents are closed
and reopened, and the cursor jumps around. Exit status 0 when every check passes, 1
otherwise. ``tests/lsp/test_load.py`` runs a reduced version.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
from specd.lsp.client import frame, read_frame

SERVER = [sys.executable, "-m", "specd.cli", "serve", "--stdio"]
TYPED = "abcdefghij xyz_()=:,.0123456789\n    "


class _Server:
    def __init__(self, command: list[str]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.responses: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self.proc.stdin.write(frame(message))  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            msg = read_frame(out)
            if msg is None:
                self.responses.put(None)
                return
            if "id" in msg and "method" not in msg:
                self.responses.put(msg)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


class _Doc:
    def __init__(self, uri: str, text: str) -> None:
        self.uri = uri
        self.lines = text.split("\n")
        self.version = 1
        self.line = len(self.lines) - 1
        self.col = len(self.lines[-1])

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def type_char(self, ch: str) -> dict[str, Any]:
        """Insert ``ch`` at the cursor; :returns: the didChange content change."""
        pos = {"line": self.line, "character": self.col}
        cur = self.lines[self.line]
        if ch == "\n":
            self.lines[self.line : self.line + 1] = [cur[: self.col], cur[self.col :]]
            self.line, self.col = self.line + 1, 0
        else:
            self.lines[self.line] = cur[: self.col] + ch + cur[self.col :]
            self.col += 1
        self.version += 1
        return {"range": {"start": pos, "end": pos}, "text": ch}

    def jump(self, rng: random.Random) -> None:
        self.line = rng.randrange(len(self.lines))
        self.col = rng.randint(0, len(self.lines[self.line]))


def soak(
    *,
    requests: int = 10_000,
    documents: int = 40,
    rate: float = 30.0,
    cancel: float = 0.15,
    warmup: float = 0.1,
    seed: int = 0,
    server_args: list[str] | None = None,
    answer_timeout: float = 300.0,
    log: Any = None,
) -> dict[str, Any]:
    """Run the soak. :returns: the report (see ``failures`` for what went wrong)."""
    rng = random.Random(seed)
    server = _Server([*SERVER, *(server_args if server_args is not None else ["--model", "tiny"])])
    t_start = time.monotonic()
    next_id = 0
    outstanding: dict[int, str] = {}
    answers = {"result": 0, "cancelled": 0, "error": 0}
    error_codes: dict[str, int] = {}
    rss_warm = rss_max = 0

    kept: dict[int, Any] = {}  # ids of bookkeeping requests -> their results

    def request(method: str, params: Any, *, keep: bool = False) -> int:
        nonlocal next_id
        next_id += 1
        outstanding[next_id] = method
        if keep:
            kept[next_id] = None
        server.send({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params})
        return next_id

    def drain(block_until: int | None = None, timeout: float = 0.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if block_until is not None and block_until not in outstanding:
                return
            wait = deadline - time.monotonic()
            try:
                msg = (
                    server.responses.get(timeout=max(wait, 0.0))
                    if wait > 0
                    else server.responses.get_nowait()
                )
            except queue.Empty:
                return
            if msg is None:
                raise RuntimeError("the server closed its output (crashed?)")
            method = outstanding.pop(msg["id"], None)
            if method is None:
                continue
            if msg["id"] in kept:
                kept[msg["id"]] = msg.get("result")
                continue
            if "error" in msg:
                code = msg["error"]["code"]
                kind = "cancelled" if code == -32800 else "error"
                answers[kind] += 1
                if kind == "error":
                    error_codes[str(code)] = error_codes.get(str(code), 0) + 1
            else:
                answers["result"] += 1

    init = request(
        "initialize",
        keep=True,
        params={
            "processId": os.getpid(),
            "rootUri": "file:///soak",
            "capabilities": {},
            "initializationOptions": {"max-tokens": 16},
        },
    )
    drain(init, 600)
    server.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    docs = []
    for i in range(documents):
        text = f"def function_{i}(a, b):\n    total = a + b\n    return total\n\n"
        doc = _Doc(f"file:///soak/module_{i}.py", text)
        docs.append(doc)
        server.send(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didOpen",
                "params": {
                    "textDocument": {
                        "uri": doc.uri,
                        "languageId": "python",
                        "version": 1,
                        "text": doc.text,
                    }
                },
            }
        )

    doc = docs[0]
    sent = 0
    warm_at = max(int(requests * warmup), 1)
    for i in range(requests):
        t_step = time.monotonic()
        if rng.random() < 0.1:
            doc = rng.choice(docs)
        if rng.random() < 0.01:  # close and reopen: a storm in slow motion
            server.send(
                {
                    "jsonrpc": "2.0",
                    "method": "textDocument/didClose",
                    "params": {"textDocument": {"uri": doc.uri}},
                }
            )
            server.send(
                {
                    "jsonrpc": "2.0",
                    "method": "textDocument/didOpen",
                    "params": {
                        "textDocument": {
                            "uri": doc.uri,
                            "languageId": "python",
                            "version": doc.version,
                            "text": doc.text,
                        }
                    },
                }
            )
        if rng.random() < 0.05:
            doc.jump(rng)
        if len(doc.text) > 8000:  # keep documents editor-sized: start over
            doc.lines, doc.line, doc.col = ["def again():", "    "], 1, 4
            doc.version += 1
            server.send(
                {
                    "jsonrpc": "2.0",
                    "method": "textDocument/didChange",
                    "params": {
                        "textDocument": {"uri": doc.uri, "version": doc.version},
                        "contentChanges": [{"text": doc.text}],
                    },
                }
            )
        change = doc.type_char(rng.choice(TYPED))
        server.send(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didChange",
                "params": {
                    "textDocument": {"uri": doc.uri, "version": doc.version},
                    "contentChanges": [change],
                },
            }
        )
        where = {
            "textDocument": {"uri": doc.uri},
            "position": {"line": doc.line, "character": doc.col},
        }
        roll = rng.random()
        if roll < 0.8:
            msg_id = request(
                "textDocument/inlineCompletion", {**where, "context": {"triggerKind": 2}}
            )
        elif roll < 0.9:
            msg_id = request("textDocument/completion", where)
        else:
            msg_id = request("textDocument/completion", {**where, "partialResultToken": f"p{i}"})
        if rng.random() < cancel:
            victim = rng.choice([msg_id, *list(outstanding)[-3:]])
            server.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": victim}})
        sent += 1
        drain()
        if sent == warm_at:
            drain(msg_id, answer_timeout)  # let the server settle before measuring
            rss_warm = server.rss()
        if sent % 200 == 0:
            rss_max = max(rss_max, server.rss())
            if log is not None:
                log(
                    f"{sent}/{requests} sent, {len(outstanding)} outstanding, rss {server.rss() / 2**20:.0f} MiB"
                )
        if rate > 0:
            time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t_step)))

    deadline = time.monotonic() + answer_timeout
    while outstanding and time.monotonic() < deadline:
        drain(timeout=min(1.0, deadline - time.monotonic()))
    rss_end = server.rss()
    stats_id = request("specd/stats", None, keep=True)
    drain(stats_id, 60)
    stats = kept.get(stats_id)
    shutdown = request("shutdown", None, keep=True)
    drain(shutdown, 60)
    server.send({"jsonrpc": "2.0", "method": "exit", "params": None})
    try:
        exit_code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        exit_code = None
    time.sleep(0.2)
    stderr = b"".join(server.stderr).decode("utf-8", "replace")

    growth = (rss_end - rss_warm) / rss_warm if rss_warm else 0.0
    report: dict[str, Any] = {
        "requests": requests,
        "documents": documents,
        "seconds": round(time.monotonic() - t_start, 1),
        "answered": answers,
        "error_codes": error_codes,
        "unanswered": len(outstanding),
        "exit_code": exit_code,
        "rss_warm_mib": round(rss_warm / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_max_mib": round(max(rss_max, rss_end) / 2**20, 1),
        "rss_growth": round(growth, 4),
        "tracebacks": stderr.count("Traceback"),
        "server_stats": stats,
    }
    return report


def failures(report: dict[str, Any], *, max_growth: float) -> list[str]:
    out = []
    if report["unanswered"]:
        out.append(f"{report['unanswered']} requests were never answered")
    if report["answered"]["error"]:
        out.append(
            f"{report['answered']['error']} requests answered with errors {report['error_codes']}"
        )
    if report["exit_code"] != 0:
        out.append(f"the server exited with {report['exit_code']}")
    if report["tracebacks"]:
        out.append(f"{report['tracebacks']} tracebacks in the server log")
    if report["rss_growth"] >= max_growth:
        out.append(
            f"resident memory grew {report['rss_growth']:.1%} after warm-up (limit {max_growth:.0%})"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--documents", type=int, default=40)
    p.add_argument(
        "--rate", type=float, default=30.0, help="requests per second (0: as fast as possible)"
    )
    p.add_argument(
        "--cancel", type=float, default=0.15, help="share of requests followed by a $/cancelRequest"
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=0.1,
        help="share of requests before memory is first measured",
    )
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--real", action="store_true", help="use the default model instead of a tiny random one"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("server_args", nargs="*", help="extra `specd serve` arguments (after --)")
    args = p.parse_args(argv)
    server_args = ([] if args.real else ["--model", "tiny"]) + args.server_args
    report = soak(
        requests=args.requests,
        documents=args.documents,
        rate=args.rate,
        cancel=args.cancel,
        warmup=args.warmup,
        seed=args.seed,
        server_args=server_args,
        log=None if args.json else (lambda line: print(line, file=sys.stderr, flush=True)),
    )
    problems = failures(report, max_growth=args.max_rss_growth)
    report["failures"] = problems
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "server_stats"}, indent=2))
        for problem in problems:
            print(f"FAIL: {problem}")
        if not problems:
            print("ok: no crash, every request answered, memory flat")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
