"""The HTTP server's queue and cancellation, with a generation held still between steps.

The server is the application of ``specd serve --http`` run in this process, over a tiny
engine whose generation waits on a gate after its first step: a test can then disconnect,
or fill the queue, while a generation is known to be running.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from http_testing import InProcessServer, metrics, post, request, wait_for
from specd.lsp.http import HttpService
from specd.lsp.runner import Job, QueueFull, Runner

from specd import Engine, SamplingParams

MAX_TOKENS = 200


class GatedEngine:
    """An engine whose generations pause after their first delta until ``gate`` is set."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.gate = threading.Event()
        self.paused = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def stream(self, *args, **kw):
        outer, gen = self, self._engine.stream(*args, **kw)

        class Held:
            completion = None

            def __iter__(self):
                for i, delta in enumerate(gen):
                    if i == 1:
                        outer.paused.set()
                        outer.gate.wait()
                    yield delta
                self.completion = gen.completion

        return Held()


@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny", drafter="none")


@pytest.fixture
def gated(engine):
    g = GatedEngine(engine)
    server = InProcessServer(HttpService(g, SamplingParams(max_tokens=MAX_TOKENS), queue_limit=1))
    yield g, server
    g.gate.set()
    server.close()


def _send_raw(server, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_stops_the_generation_within_a_step(gated, stream):
    """Guards against a generation that runs on to max_tokens for a client that has gone:
    the engine is held after its first step, the client disconnects, and once released
    the engine must stop at its next check instead of producing the other tokens."""
    g, server = gated
    sock = _send_raw(server, {"prompt": "def f(x):\n", "stream": stream})
    assert g.paused.wait(60)
    sock.close()
    wait_for(lambda: metrics(server).get("specd_disconnects_total", 0) == 1)
    g.gate.set()
    wait_for(lambda: 'specd_generations_total{finish_reason="cancelled"}' in metrics(server))
    m = metrics(server)
    assert m['specd_generations_total{finish_reason="cancelled"}'] == 1
    # two steps: the one before the pause and at most the one under way
    assert m["specd_target_steps_total"] <= 2
    assert m["specd_generated_tokens_total"] < MAX_TOKENS


def test_full_queue_gets_503_and_the_queued_request_still_runs(gated):
    """Guards against an unbounded queue (requests pile up behind a long generation and
    time out in the client) and against a full queue answered with anything but 503."""
    g, server = gated
    results: dict[str, tuple[int, dict]] = {}

    def run(name: str) -> None:
        results[name] = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 4})

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert g.paused.wait(60)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    wait_for(lambda: metrics(server)["specd_queue_waiting"] == 1)
    status, raw = request(server, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 4})
    assert status == 503
    assert "queue is full" in json.loads(raw)["error"]["message"]
    g.gate.set()
    first.join(60)
    second.join(60)
    assert results["first"][0] == 200 and results["second"][0] == 200
    assert metrics(server)["specd_rejected_queue_full_total"] == 1


def _gated_job(name: str, client: str, gate: threading.Event, order: list[str]) -> Job:
    def run(job: Job) -> None:
        order.append(name)
        gate.wait(30)

    return Job("", run, client=client)


def _drain(runner: Runner) -> None:
    deadline = time.monotonic() + 30
    while runner.pending and time.monotonic() < deadline:
        time.sleep(0.001)


def test_queue_takes_clients_in_turn():
    """Guards against a plain FIFO, where one client's burst makes every other client wait
    behind all of it."""
    runner, gate, order = Runner(limit=8), threading.Event(), []
    runner.submit(_gated_job("a1", "a", gate, order))
    wait_for(lambda: order == ["a1"])
    for client, name in [("a", "a2"), ("a", "a3"), ("a", "a4"), ("b", "b1"), ("c", "c1")]:
        runner.submit(_gated_job(name, client, gate, order))
    gate.set()
    _drain(runner)
    runner.stop()
    assert order == ["a1", "a2", "b1", "c1", "a3", "a4"]


def test_queue_full_raises_and_a_cancelled_waiter_leaves():
    """Guards against a waiter that went away keeping its place (and the bound full)."""
    runner, gate, order = Runner(limit=1), threading.Event(), []
    runner.submit(_gated_job("a", "a", gate, order))
    wait_for(lambda: order == ["a"])
    waiter = _gated_job("b", "b", gate, order)
    runner.submit(waiter)
    with pytest.raises(QueueFull):
        runner.submit(_gated_job("c", "c", gate, order))
    runner.cancel(waiter, "client")
    assert waiter.reason == "client" and runner.pending == 1
    runner.submit(_gated_job("c", "c", gate, order))
    gate.set()
    _drain(runner)
    runner.stop()
    assert order == ["a", "c"]


def test_http_client_sees_a_complete_answer_after_a_disconnected_one(gated):
    """After a client went away the engine is free again: the next request is served."""
    g, server = gated
    sock = _send_raw(server, {"prompt": "x", "stream": True})
    assert g.paused.wait(60)
    sock.close()
    wait_for(lambda: metrics(server).get("specd_disconnects_total", 0) == 1)
    g.gate.set()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "max_tokens": 3}))
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["usage"]["completion_tokens"] == 3
