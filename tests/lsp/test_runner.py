"""The one runner both servers use: its generation loop (cut at a template stop token,
halt, drain, cancel within one step), its queue (fair by client, newest first per key) and
its async stream, with an engine that writes one scripted token per step."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator

import pytest
from specd.lsp.http.service import request_params
from specd.lsp.runner import Job, Runner, ServedGeneration

from specd import BadInputError, Completion, Delta, SamplingParams, Stats
from specd.generation import Generation

STOP = 99  # a template stop token (``<file_sep>``)


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(96 + i) for i in ids if i != STOP)


class StepEngine:
    """Writes ``ids`` one token per target step; ``cancel`` is checked before each step.
    ``on_step`` runs after each step (a test's hook to act mid-generation)."""

    def __init__(self, ids: list[int], on_step=None) -> None:
        self.ids = ids
        self.on_step = on_step
        self.tokenizer = Tokenizer()
        self.steps = 0

    def stream(self, prompt, params, *, cancel, **_) -> Generation:
        def steps() -> Generator[Delta, None, Completion]:
            stats, out = Stats(prompt_tokens=len(prompt)), []
            for t in self.ids:
                if cancel():
                    stats.finish_reason = "cancelled"
                    break
                self.steps += 1
                out.append(t)
                stats.new_tokens += 1
                yield Delta(self.tokenizer.decode([t]), [t])
                if self.on_step is not None:
                    self.on_step(self.steps)
            else:
                stats.finish_reason = "length"
            return Completion(self.tokenizer.decode(out), out, stats)

        return Generation(steps())


def _run(gen: ServedGeneration, engine: StepEngine, cancel=None) -> str:
    return "".join(d.text for d in gen.run(engine, cancel or threading.Event()))


def test_a_template_stop_token_cuts_the_text_and_ends_the_generation():
    """Guards against text from the stop token on reaching the client (``<file_sep>`` and
    the next file after it), and against generating on past it."""
    engine = StepEngine([1, 2, STOP, 3, 4, 5])
    gen = ServedGeneration([0], SamplingParams(), stop_ids=frozenset({STOP}))
    assert _run(gen, engine) == "ab"
    assert gen.completion is not None
    assert gen.completion.token_ids == [1, 2] and gen.completion.text == "ab"
    assert gen.completion.stats.finish_reason == "stop"
    assert engine.steps == 3  # no step after the one that wrote the stop token


def test_a_halt_ends_before_the_next_step_and_drains_the_rest():
    """The caller's halt (an answer that is out) ends the generation at the next check;
    the engine still reports its stats (as cancelled), and nothing more is shown."""
    engine = StepEngine([1, 2, 3, 4, 5])
    gen = ServedGeneration([0], SamplingParams())
    shown = []
    for delta in gen.run(engine, threading.Event()):
        shown.append(delta.text)
        if len(shown) == 2:
            gen.halt()
    assert shown == ["a", "b"] and engine.steps == 2
    assert gen.completion is not None and gen.completion.stats.finish_reason == "cancelled"


def test_should_stop_ends_it_with_its_reason():
    """``should_stop`` (``/infill``'s ``n_indent``, the completer's time budget) is asked
    before every step with the text so far; its reason becomes the finish reason."""
    engine = StepEngine([1, 2, 3, 4, 5])
    gen = ServedGeneration(
        [0], SamplingParams(), should_stop=lambda text: "indent" if len(text) >= 3 else ""
    )
    assert _run(gen, engine) == "abc" and engine.steps == 3
    assert gen.completion is not None and gen.completion.stats.finish_reason == "indent"


def test_cancel_returns_within_one_step():
    """Guards against a cancel checked only at the end: the cancel flag set during step
    two stops the engine before step three, and the finish reason stays "cancelled" (not
    the reason of a halt from this side)."""
    cancel = threading.Event()
    engine = StepEngine(list(range(1, 20)), on_step=lambda n: n == 2 and cancel.set())
    gen = ServedGeneration([0], SamplingParams(), should_stop=lambda text: "")
    assert _run(gen, engine, cancel) == "ab" and engine.steps == 2
    assert gen.completion is not None and gen.completion.stats.finish_reason == "cancelled"


def test_a_newer_request_for_a_key_cancels_the_older_and_clients_take_turns():
    """The language server's rule and the HTTP server's fairness in one queue: a second
    request for document ``a`` supersedes the first (queued: never started), while the
    other client's request runs in its turn."""
    runner, gate, order = Runner(), threading.Event(), []

    def job(key: str, client: str) -> Job:
        def run(j: Job) -> None:
            order.append(key + "@" + client)
            gate.wait(10)

        return Job(key, run, client=client)

    blocker = job("x", "1")
    runner.submit(blocker)
    deadline = time.monotonic() + 10
    while not order and time.monotonic() < deadline:
        time.sleep(0.001)
    old, other, new = job("a", "1"), job("b", "2"), job("a", "1")
    for j in (old, other, new):
        runner.submit(j)
    gate.set()
    while runner.pending and time.monotonic() < deadline:
        time.sleep(0.001)
    runner.stop()
    assert old.reason == "superseded" and not old.started
    assert order == ["x@1", "b@2", "a@1"]


def test_closing_the_async_stream_cancels_the_generation_within_a_step():
    """The HTTP server's path: a client that goes away closes the stream; the generation
    stops at its next check instead of running to the end."""
    engine = StepEngine(list(range(1, 60)), on_step=lambda n: time.sleep(0.01))
    runner = Runner(limit=4)
    gen = ServedGeneration([0], SamplingParams())
    ended = threading.Event()

    async def read_two() -> list[str]:
        got = []
        stream = runner.stream(gen, engine, "c", finished=lambda g: ended.set())
        async for delta in stream:
            got.append(delta.text)
            if len(got) == 2:
                break
        await stream.aclose()
        return got

    assert asyncio.run(read_two()) == ["a", "b"]
    assert ended.wait(10)
    runner.stop()
    assert gen.completion is not None and gen.completion.stats.finish_reason == "cancelled"
    assert engine.steps <= 4  # the steps read, the one under way, at most one queued


def test_request_params_take_what_the_request_sent_over_the_servers_defaults():
    """One parser for ``/v1/completions`` and ``/infill``: a field left out keeps the
    server's default, a field sent replaces it, and a bad one is refused by name."""
    base = SamplingParams(max_tokens=64, temperature=0.2, top_k=40, seed=7, stop=("\n\n",))
    same = request_params(base)
    assert same == base
    sent = request_params(base, max_tokens=8, temperature=0.0, top_p=0.9, stop=["END"])
    assert (sent.max_tokens, sent.temperature, sent.top_p) == (8, 0.0, 0.9)
    assert (sent.top_k, sent.seed, sent.stop) == (40, 7, ("END",))
    with pytest.raises(BadInputError, match="top_p"):
        request_params(base, top_p=1.5)
