"""The pipeline around a request, without a server: warm-ups in the engine, background
jobs on the worker, the first line answered early with the rest kept, the debounce.

The completer runs against a scripted engine (it writes a fixed text, a piece per step,
checking its cancel before each step as the engine does), so these tests control when
lines end and how long a prefill takes; the warm-up tests use the real engine with a tiny
random model.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import replace

import pytest
from lsprotocol import types
from specd.lsp import prompting
from specd.lsp.cache import CompletionCache
from specd.lsp.completer import (
    Completer,
    CompletionRequest,
    CompletionResult,
    chars_per_token,
    cursor_at,
)
from specd.lsp.config import Settings
from specd.lsp.debounce import BURST_GAP_S, MAX_DELAY_S, Rhythm
from specd.lsp.documents import Document, Position
from specd.lsp.metrics import Metrics
from specd.lsp.runner import Job, Runner
from specd.lsp.server import SpecdServer
from specd.lsp.service import Service
from specd.lsp.warmup import AHEAD_CHARS, OPEN_WARM_S, Background

from specd import (
    Completion,
    ContextLimits,
    Delta,
    Engine,
    Generation,
    SamplingParams,
    Stats,
)
from specd.forward.passes import PREFILL_CHUNK
from specd.forward.tiny import tiny_target

# -- Engine.warm ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_target(logit_scale=8.0), drafter="none")


def _prompt(n: int, start: int = 1) -> list[int]:
    return [start + (i * 7) % 90 for i in range(n)]


def test_a_warmed_prompt_is_answered_without_its_prefill_and_unchanged(engine):
    """Guards against a warm-up that fills the cache with other tokens than a request
    keeps (all of the prompt but its last token), which would make the request prefill
    everything again, or reuse keys and values that do not belong to its prompt."""
    prompt = _prompt(150)
    params = SamplingParams(max_tokens=10)
    engine.prefix_cache.clear()
    cold = engine.generate(prompt, params)
    engine.prefix_cache.clear()
    assert engine.warm(prompt) == (0, 149)
    warm = engine.generate(prompt, params)
    assert warm.stats.reused_tokens == 149
    assert warm.token_ids == cold.token_ids


def test_a_request_continues_a_cancelled_warm_up_where_it_stopped(engine):
    """Guards against a request that interrupts a warm-up starting its prefill over: the
    warm-up stops between chunks and what it computed stays in the prefix cache."""
    engine.prefix_cache.clear()
    prompt = _prompt(200, start=3)
    looks = []

    def cancel() -> bool:  # a request arrives after the second chunk
        looks.append(1)
        return len(looks) > 2

    reused, computed = engine.warm(prompt, cancel, chunk=50)
    assert (reused, computed) == (0, 100)
    result = engine.generate(prompt, SamplingParams(max_tokens=4))
    assert result.stats.reused_tokens == 100


def test_warming_a_prompt_already_held_keeps_what_was_generated_after_it(engine):
    """Guards against a warm-up of a stale prompt cropping the cache entry that holds it
    and the tokens generated after it: the next request would compute them again."""
    engine.prefix_cache.clear()
    prompt = _prompt(120, start=5)
    first = engine.generate(prompt, SamplingParams(max_tokens=8))
    assert engine.warm(prompt) == (119, 0)
    follow = prompt + first.token_ids[:6]
    assert engine.generate(follow, SamplingParams(max_tokens=2)).stats.reused_tokens == 125


# -- the worker: requests before background jobs --------------------------------------------------


def _job(key: str, run: Callable[[Job], object], done: list, background: bool = False) -> Job:
    return Job(key, run, lambda r, e, j: done.append((j.key, r, j.reason)), background=background)


def test_a_request_preempts_the_running_background_job():
    """Guards against background work (a warm-up, the rest of a suggestion) holding the
    worker while a request waits: submitting a request cancels it at its next check."""
    worker = Runner()
    done: list = []
    started = threading.Event()

    def long_warm(job: Job) -> str:
        started.set()
        while not job.cancelled:
            time.sleep(0.005)
        return "stopped"

    try:
        worker.submit(_job("1:warm:a", long_warm, done, background=True))
        assert started.wait(10)
        worker.submit(_job("1:b", lambda job: "answer", done))
        deadline = time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done == [("1:warm:a", "stopped", "preempted"), ("1:b", "answer", None)]
    finally:
        worker.stop()


def test_queued_requests_run_before_queued_background_jobs_and_edits_spare_them():
    """Guards against a queue that runs background jobs in arrival order ahead of a
    request, and against an edit cancelling background work (only a request's cursor is
    made stale by an edit)."""
    worker = Runner()
    done: list = []
    gate = threading.Event()
    try:
        worker.submit(_job("1:gate", lambda job: gate.wait(10), done))  # holds the worker
        worker.submit(_job("1:a", lambda job: "bg", done, background=True))
        worker.submit(_job("1:warm:b", lambda job: "warm", done, background=True))
        worker.submit(_job("1:c", lambda job: "request", done))
        worker.cancel_key("1:warm:b", "changed", background=False)
        gate.set()
        deadline = time.monotonic() + 10
        while len(done) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [d[1] for d in done] == [True, "request", "bg", "warm"]
    finally:
        worker.stop()


# -- the completer: first line early, the rest kept -----------------------------------------------


class ScriptedEngine:
    """What the completer needs of an engine, writing ``pieces`` one per step."""

    def __init__(self, pieces: list[str], *, step_s: float = 0.0, prefill_s: float = 0.0):
        self.pieces = pieces
        self.step_s = step_s
        self.prefill_s = prefill_s
        self.tokenizer = object()
        self.limits = ContextLimits(window=1 << 20, token_chars=1)
        self.written: list[str] = []

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 97 for c in text]

    def heal(self, prompt) -> tuple[list[int], None]:
        return list(prompt), None  # no token healing

    def warm(self, prompt, cancel=None, **_) -> tuple[int, int]:
        time.sleep(self.prefill_s)
        return 0, len(prompt) - 1

    def stream(self, prompt, params, *, cancel, corpus=None, **kw) -> Generation:
        def steps() -> Generator[Delta, None, Completion]:
            stats = Stats(prompt_tokens=len(prompt))
            for piece in self.pieces:
                if cancel():
                    stats.finish_reason = "cancelled"
                    break
                time.sleep(self.step_s)
                self.written.append(piece)
                stats.new_tokens += 1
                yield Delta(piece, [1])
            else:
                stats.finish_reason = "length"
            return Completion("".join(self.written), [1] * stats.new_tokens, stats)

        return Generation(steps())


DOC = "def area(w, h):\n    "
BODY = ["if w < 0", ":\n", "        raise ValueError(w)\n", "    return w", " * h\n", "\n"]


def _background(
    engine: ScriptedEngine, worker: Runner, version_of: Callable[[str], int | None]
) -> Background:
    """A session's pipeline around ``engine`` that builds no requests of its own."""
    return Background(
        worker,
        Completer(engine),  # type: ignore[arg-type]
        Metrics(),
        key="1:",
        request_at=lambda uri, pos: None,
        version_of=version_of,
    )


def _request(engine: ScriptedEngine, text: str = DOC, **kw) -> CompletionRequest:
    doc = Document("file:///w/a.py", text)
    line = text.count("\n")
    column = len(text) - (text.rfind("\n") + 1)
    cursor = doc.cursor(doc.resolve(line, column), before_chars=4000, after_chars=400)
    settings = kw.pop("settings", Settings(time_budget_ms=60_000))
    return CompletionRequest(cursor, "a.py", settings, uri=doc.uri, **kw)


def test_the_answer_comes_at_the_first_line_and_the_rest_goes_to_the_cache():
    """Guards against answering only when the whole block is written (the user waits for
    lines they may never take), and against dropping what the model writes after the
    answer (the next keystrokes would need a new generation)."""
    engine = ScriptedEngine(BODY)
    answers: list[tuple[str, int]] = []
    req = _request(engine)
    req.entry = CompletionCache().start(req.uri, req.cursor)
    req.on_answer = lambda r: answers.append((r.text, len(engine.written)))
    Completer(engine).complete(req)  # type: ignore[arg-type]
    # answered once the first line ended (two pieces), not after all six
    assert answers == [("if w < 0:", 2)]
    assert req.entry.raw == "".join(BODY) and req.entry.done


LONG_DOC = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(150))


@pytest.mark.parametrize("limit", [256, 0])
def test_a_cold_request_is_answered_from_a_short_prompt_until_the_full_one_is_warm(engine, limit):
    """Guards against the first request after opening a file waiting for the prefill of
    the whole window (seconds on a CPU), and against the short prompt sticking once the
    full one is warm. ``cold-prompt-tokens = 0`` always takes the full prompt."""
    metrics = Metrics()
    completer = Completer(engine, SamplingParams(max_tokens=2), metrics)
    settings = Settings(time_budget_ms=60_000, max_tokens=2, cold_prompt_tokens=limit)
    engine.prefix_cache.clear()
    full = completer.build_prompt(_request(engine, LONG_DOC, settings=settings))
    assert len(full.ids) > 4 * 256
    cold = completer.complete(_request(engine, LONG_DOC, settings=settings))
    assert cold.stats is not None
    if limit:
        assert metrics.cold_prompts == 1
        assert limit - prompting.cut_step(limit) < cold.stats.prompt_tokens <= limit
    else:
        assert metrics.cold_prompts == 0 and cold.stats.prompt_tokens == len(full.ids)
    completer.warm(_request(engine, LONG_DOC, settings=settings))  # what the warm-ups do
    warm = completer.complete(_request(engine, LONG_DOC + "x", settings=settings))
    assert warm.stats is not None
    assert metrics.cold_prompts == (1 if limit else 0)
    assert warm.stats.prompt_tokens >= len(full.ids)
    assert warm.stats.reused_tokens >= len(full.ids) - 1


def test_a_request_reads_its_prompt_in_large_chunks_and_a_keystroke_in_its_first_step(engine):
    """Guards against a request's own prefill running in a warm-up's small chunks (a third
    slower on a long prompt, and nothing but a newer request for the same prompt would
    interrupt it) rather than in one pass into an empty cache, and against a keystroke's few new tokens costing a forward pass of their
    own before the first step."""
    completer = Completer(engine, SamplingParams(max_tokens=2))
    settings = Settings(time_budget_ms=60_000, max_tokens=2)
    engine.prefix_cache.clear()
    chunks: list[int] = []
    prefill = engine.target.prefill
    engine.target.prefill = lambda cache, tokens, *a, **k: (
        chunks.append(len(tokens)) or prefill(cache, tokens, *a, **k)
    )
    try:
        cold = completer.complete(_request(engine, LONG_DOC, settings=settings))
        assert cold.stats is not None and cold.stats.prompt_tokens > 3 * PREFILL_CHUNK
        assert len(chunks) == 1 and chunks[0] > 3 * PREFILL_CHUNK  # one pass
        chunks.clear()
        typed = completer.complete(_request(engine, LONG_DOC + "value_150 =", settings=settings))
        assert typed.stats is not None and typed.stats.reused_tokens > 3 * PREFILL_CHUNK
        assert chunks == []
    finally:
        del engine.target.prefill


def test_without_an_answer_callback_the_whole_block_is_answered():
    """Guards against the first-line answer leaking into ``specd complete`` and
    ``specd/complete``, which show the whole completion."""
    engine = ScriptedEngine(BODY)
    result = Completer(engine).complete(_request(engine))  # type: ignore[arg-type]
    assert result.text.splitlines() == [
        "if w < 0:",
        "        raise ValueError(w)",
        "    return w * h",
    ]


def test_a_slow_prefill_does_not_spend_the_time_budget():
    """Guards against charging the prompt's prefill to the time budget: on a large file
    the budget ran out before the first token and the answer was empty."""
    engine = ScriptedEngine(["return w * h", "\n"], prefill_s=0.3)
    req = _request(engine, settings=Settings(time_budget_ms=100))
    result = Completer(engine).complete(req)  # type: ignore[arg-type]
    assert result.text == "return w * h"


@pytest.mark.parametrize("early", [True, False], ids=["server", "cli"])
def test_the_time_budget_never_turns_written_text_into_an_empty_answer(early):
    """Guards against answering empty when the budget runs out in the middle of the
    first line of a block (post-processing drops an unfinished line at the end of a
    block): what the model wrote is shown."""
    engine = ScriptedEngine(["\n", "    return", " w", " *", " h"] * 50, step_s=0.05)
    answers: list[CompletionResult] = []
    req = _request(engine, "def area(w, h):", settings=Settings(time_budget_ms=150))
    if early:
        req.on_answer = answers.append
    result = Completer(engine).complete(req)  # type: ignore[arg-type]
    assert result.finish_reason == "time" and result.text.startswith("\n    return w")
    assert [a.text for a in answers] == ([result.text] if early else [])


# -- the debounce -----------------------------------------------------------------------------------


def test_the_debounce_follows_the_typing_rhythm_and_ends_at_a_pause():
    """Guards against a fixed debounce (slow typists wait for nothing, fast ones start
    generations each keystroke makes stale) and against delaying a request after the user
    has stopped typing."""
    fast, slow = Rhythm(), Rhythm()
    for i in range(10):
        fast.edited("a", now=i * 0.02)
        slow.edited("a", now=i * 0.06)
    assert fast.request_delay("a", now=0.18) == pytest.approx(0.03)
    assert slow.request_delay("a", now=0.54) == pytest.approx(0.09)
    assert fast.request_delay("a", now=0.18 + 0.05) == 0.0  # paused
    assert fast.pause_s() < slow.pause_s()
    hesitant = Rhythm()
    for i in range(10):
        hesitant.edited("a", now=i * BURST_GAP_S * 0.9)
    assert hesitant.request_delay("a", now=9 * BURST_GAP_S * 0.9) == MAX_DELAY_S


def test_the_debounce_waits_only_in_the_middle_of_a_word():
    """Guards against delaying the requests a user stops to read: at the start of a line
    or after punctuation the answer goes out at once, mid-word it waits for the next
    letter; a fixed delay the user set applies everywhere."""
    rhythm = Rhythm()
    for i in range(10):
        rhythm.edited("a", now=i * 0.02)
    assert rhythm.request_delay("a", now=0.18, mid_word=True) == pytest.approx(0.03)
    assert rhythm.request_delay("a", now=0.18, mid_word=False) == 0.0
    rhythm.fixed_delay_s = 0.05
    assert rhythm.request_delay("a", now=0.18, mid_word=False) == 0.05


@pytest.mark.parametrize(
    ("line_before", "waits"),
    [
        ("    ", False),
        ("    x = (", False),
        ("    return ", False),
        ("    ret", True),
        ("x_", True),
    ],
)
def test_a_request_waits_by_what_precedes_the_cursor(line_before, waits):
    """The pipeline hands the rhythm whether the cursor is mid-word."""
    engine = ScriptedEngine(BODY)
    req = _request(engine)
    req.cursor = replace(req.cursor, line_before=line_before)
    bg = _background(engine, Runner(), version_of=lambda uri: req.version)
    for i in range(10):
        bg.rhythm.edited(req.uri, now=time.monotonic() - 0.2 + i * 0.02)
    bg.rhythm.edited(req.uri)
    t0 = time.monotonic()
    assert asyncio.run(bg.debounce(req))  # no edit came: the request goes on
    assert bg.metrics.debounced == int(waits)
    if waits:  # until 1.5 intervals of 20 ms after the last edit
        assert time.monotonic() - t0 >= 0.025


# -- background work ---------------------------------------------------------------------------------


def test_a_prefetch_superseded_before_it_ran_releases_its_cache_entry():
    """Guards against a completion-cache entry whose generation never ran staying open:
    a request typed along it would wait for its whole time budget for lines that never
    come, instead of asking the model at once."""
    engine = ScriptedEngine(BODY)
    worker = Runner()
    gate = threading.Event()
    bg = _background(engine, worker, version_of=lambda uri: 1)
    try:
        worker.submit(Job("1:gate", lambda job: gate.wait(10), lambda r, e, j: None))
        first, second = _request(engine), _request(engine)
        bg.prefetch(first)
        bg.prefetch(second)  # the same document: the first, still queued, never runs
        assert first.entry is not None and first.entry.finish_reason == "cancelled"
        gate.set()
        deadline = time.monotonic() + 10
        while not (second.entry and second.entry.done) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second.entry is not None and second.entry.raw == "".join(BODY)
    finally:
        worker.stop()


LINES_DOC = Document("file:///w/a.py", "x = 1\n" * 40)  # its last line of text: 39


def _recording_background(
    version_of: Callable[[str], int | None], field: str
) -> tuple[Background, list[int]]:
    """A session's pipeline over :data:`LINES_DOC` whose warm-ups only record the
    ``field`` ("line" or "column") of the cursor they would prefill at (None: line 39)."""
    warmed: list[int] = []

    class Recorder:
        def warm(self, req: CompletionRequest) -> tuple[int, int]:
            warmed.append(getattr(req.cursor, field))
            return 0, 1

    def request_at(uri: str, pos: Position | None) -> CompletionRequest:
        at = pos or LINES_DOC.resolve(39, 0)
        cursor = LINES_DOC.cursor(at, before_chars=4000, after_chars=400)
        return CompletionRequest(cursor, "a.py", Settings(), uri=uri)

    bg = Background(
        Runner(),
        Recorder(),  # type: ignore[arg-type]
        Metrics(),
        key="1:",
        request_at=request_at,
        version_of=version_of,
    )
    return bg, warmed


def test_a_warm_up_that_waited_warms_the_prompt_at_the_latest_edit():
    """Guards against a warm-up queued behind a busy worker being skipped (or warming the
    cursor it was scheduled for) because the user typed on meanwhile: in a typing session
    the worker is busy whenever the user types, so no warm-up would ever run."""
    doc = LINES_DOC
    versions = {doc.uri: 1}

    async def session() -> list[int]:
        bg, warmed = _recording_background(versions.get, "line")
        worker = bg.worker
        gate = threading.Event()
        bg.rhythm.pause_s = lambda: 60.0  # type: ignore[method-assign]  # no pause in this test
        settings = Settings(completion_cache=False)
        try:
            worker.submit(Job("1:gate", lambda job: gate.wait(10), lambda r, e, j: None))
            bg.edited(doc.uri, Position(5, 0), settings)  # far from anything warmed: at once
            await asyncio.sleep(0.05)
            versions[doc.uri] = 2
            bg.edited(doc.uri, Position(6, 3), settings)  # typed on while the worker was busy
            gate.set()
            for _ in range(500):
                if warmed:
                    break
                await asyncio.sleep(0.01)
            return warmed
        finally:
            bg.stop()
            worker.stop()

    assert asyncio.run(session()) == [6]


@pytest.mark.parametrize("edit", [True, False])
def test_an_edit_right_after_opening_takes_the_place_of_the_open_warm_up(edit):
    """Guards against the first request after opening a file waiting behind a warm-up of
    the file's end: an editor that opens a file at a line and types there at once says
    where the prompt is; without an edit the end is warmed, a moment after opening."""
    doc = LINES_DOC

    async def session() -> list[int]:
        bg, warmed = _recording_background(lambda uri: 1, "line")
        settings = Settings(completion_cache=False)
        try:
            bg.opened(doc.uri, settings)
            await asyncio.sleep(0.015)
            if edit:
                bg.edited(doc.uri, Position(12, 4), settings)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if warmed:
                    break
            await asyncio.sleep(OPEN_WARM_S + 0.05)  # nothing else comes
            return warmed
        finally:
            bg.stop()
            bg.worker.stop()

    assert asyncio.run(session()) == ([12] if edit else [39])


@pytest.mark.parametrize("read_ahead", [True, False])
def test_typing_down_a_file_finds_each_moved_window_read_ahead(engine, read_ahead):
    """Guards against every step of the window's start down the file costing a request
    the whole prompt: the warm-up at a pause in the line before reads the window the
    prompt steps to next, and the request after the step reuses all of it but the text
    typed since. Without the read-ahead that request reads its whole prompt."""
    lines = [f"value_{i} = compute({i})\n" for i in range(400)]
    doc = Document("file:///w/a.py", "".join(lines[:200] + lines[260:]))
    settings = Settings(prefix_tokens=256, context_tokens=0, read_ahead=read_ahead)
    completer = Completer(engine)
    ratio = chars_per_token(doc.text, engine.tokenize)

    def request_at(uri: str, pos: Position | None, ahead: int = 0) -> CompletionRequest:
        assert pos is not None
        cursor = cursor_at(doc, pos, settings, ratio, ahead_chars=ahead)
        return CompletionRequest(cursor, "a.py", settings, uri=uri)

    metrics = Metrics()
    bg = Background(
        None,  # type: ignore[arg-type]  # warm_now runs here, not on a worker
        completer,
        metrics,
        key="1:",
        request_at=request_at,
        version_of=lambda uri: 1,
        request_ahead=lambda uri, pos: request_at(uri, pos, AHEAD_CHARS),
    )
    engine.prefix_cache.clear()
    missing, moves, previous = [], 0, None
    for line in range(200, 260):  # the block typed back, half a line at a time
        text = lines[line]
        at = doc.resolve(line, 0)
        doc.apply_change(text[:10], at, at)
        bg.warm_now(doc.uri, doc.resolve(line, 10), threading.Event())  # a pause mid-line
        at = doc.resolve(line, 10)
        doc.apply_change(text[10:], at, at)
        req = request_at(doc.uri, doc.resolve(line + 1, 0))  # a request at the new line
        ids = completer.build_prompt(req).ids
        missing.append(len(ids) - engine.cached_tokens(ids))
        moves += previous is not None and ids[:8] != previous[:8]
        previous = ids
        engine.warm(ids, request=True)  # the request reads the rest itself
    assert moves >= 2  # the start stepped down the file while the block was typed
    if read_ahead:
        assert max(missing) <= len(lines[0]) + 8, missing  # at most the line typed since
        assert metrics.read_ahead >= moves
    else:
        assert max(missing) > 100 and metrics.read_ahead == 0  # the whole prompt


# -- the prompt's layout --------------------------------------------------------------------------


def test_keystrokes_on_a_long_file_keep_the_prompt_start(engine):
    """Guards against a window before the cursor sized in characters that holds more
    tokens than the prefix budget: the budget then cuts the front by tokens, the cut moves
    as the user types, and every so many keystrokes the whole cached prompt is lost. Typing
    100 characters on one line pushes the window's start down ~4 lines: with a window of
    ~35 lines (256 tokens) that start moves at most once, in a step of whole lines."""
    completer = Completer(engine)
    doc = Document("file:///w/a.py", "".join(f"value_{i} = compute({i})\n" for i in range(400)))
    settings = Settings(prefix_tokens=256, context_tokens=0)
    ratio = chars_per_token(doc.text, engine.tokenize)
    previous: list[int] = []
    moves = 0
    for k in range(100):  # typing a long line
        at = doc.resolve(300, 10**6)
        doc.apply_change("x", at, at)
        cursor = cursor_at(doc, doc.resolve(300, 10**6), settings, ratio)
        ids = completer.build_prompt(CompletionRequest(cursor, "a.py", settings)).ids
        kept = next((i for i, (a, b) in enumerate(zip(previous, ids)) if a != b), len(previous))
        moves += kept < len(previous) - 2
        assert moves <= 1, f"keystroke {k} kept {kept} of {len(previous)} tokens"
        previous = ids


def test_a_small_window_keeps_at_least_half_of_its_lines_at_every_line(engine):
    """Guards against the window's start stepping by more lines than the window holds: a
    small prefix budget (a slow machine's auto size) stepping by 32 lines could leave the
    prompt only the cursor's own line, and the model wrote without any context."""
    doc = Document("file:///w/a.py", "".join(f"value_{i} = compute({i})\n" for i in range(400)))
    settings = Settings(prefix_tokens=256, context_tokens=0)
    full = cursor_at(doc, doc.resolve(300, 0), Settings(prefix_tokens=256 * 64), 4.0)
    fits = 256 * 4 // len("value_1 = compute(1)\n")  # about the lines 256 tokens hold
    assert full.before.count("\n") == 300
    for line in range(100, 400):
        cursor = cursor_at(doc, doc.resolve(line, 0), settings, 4.0)
        held = cursor.before.count("\n")
        assert fits // 2 - 1 <= held <= fits, f"line {line}: {held} lines before the cursor"


def test_a_window_denser_than_its_file_moves_its_start_once_per_quarter_budget(engine):
    """Guards against a prompt whose text before the cursor holds more tokens than the
    budget (a stretch denser than the file's measured characters per token) being re-cut
    every 64 tokens typed: each cut sends the whole prompt through the model again."""
    completer = Completer(engine)
    doc = Document("file:///w/a.py", "".join(f"v{i}=f({i})\n" for i in range(600)))
    settings = Settings(prefix_tokens=1024, context_tokens=0)
    previous: list[int] = []
    moves = 0
    for _ in range(600):  # 600 characters typed: one token each for this tokenizer
        at = doc.resolve(599, 10**6)
        doc.apply_change("x", at, at)
        cursor = cursor_at(doc, doc.resolve(599, 10**6), settings, chars_per_token=8.0)
        ids = completer.build_prompt(CompletionRequest(cursor, "a.py", settings)).ids
        # (token healing backs the prompt up by one more token)
        assert 1024 - prompting.cut_step(1024) - 1 <= len(ids) <= 1024
        moves += bool(previous) and ids[:8] != previous[:8]
        previous = ids
    assert moves <= 3  # 600 tokens typed, a quarter of 1,024 at a time (64: nine moves)


def test_opening_and_editing_before_the_model_loads_does_not_wait_for_it():
    """Guards against measuring a document's characters per token (or anything else that
    needs the tokenizer) on the event loop while the model is still loading: didOpen would
    block every message behind it until the load ends."""
    service = Service(None)
    ls = SpecdServer(service)
    uri = "file:///w/a.py"

    def session() -> None:
        ls.open(types.TextDocumentItem(uri, "python", 1, "x = 1\n" * 50))
        ls.request(uri, types.Position(3, 2))

    worker = threading.Thread(target=session, daemon=True)
    try:
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "didOpen waited for the model"
    finally:
        service.load_failed(RuntimeError("not loaded in this test"))
        service.close()


def test_a_request_made_while_the_model_loads_is_cut_as_the_next_ones_are():
    """Guards against the first request of a session keeping the text window it was cut
    with while the model loaded, by a guessed characters-per-token ratio and prompt size:
    the request after it, cut by the measured ones, read its whole prompt anew."""
    service = Service(None)
    ls = SpecdServer(service)
    uri = "file:///w/a.py"
    ls.open(types.TextDocumentItem(uri, "python", 1, "value = compute(1)\n" * 400))
    request = ls.request(uri, types.Position(300, 0))
    assert request is not None
    guessed = request.cursor.before

    async def session() -> CompletionResult:
        task = asyncio.ensure_future(ls.complete(request))
        await asyncio.sleep(0.1)
        assert not task.done()
        service.attach(Engine(tiny_target(), drafter="none"))
        return await task

    try:
        assert asyncio.run(session()).text
    finally:
        service.close()
    later = ls.request(uri, types.Position(300, 0))
    assert later is not None
    assert request.cursor.before == later.cursor.before != guessed


def test_warm_ups_keep_up_with_typing_that_never_pauses():
    """Guards against warming only once typing pauses: at a fast, steady rhythm the pause
    never comes, and each request would prefill everything typed since the last one."""
    doc = LINES_DOC

    async def session() -> int:
        bg, warmed = _recording_background(lambda uri: 1, "column")
        bg.rhythm.pause_s = lambda: 0.05  # type: ignore[method-assign]
        bg._warmed_line[doc.uri] = 20  # near the last warm-up: no immediate one
        settings = Settings(completion_cache=False)
        try:
            for column in range(40):  # a keystroke every 10 ms, no pause
                bg.edited(doc.uri, Position(20, column), settings)
                await asyncio.sleep(0.01)
            return len(warmed)
        finally:
            bg.stop()
            bg.worker.stop()

    assert asyncio.run(session()) >= 2


def test_an_answer_from_the_cache_is_shaped_as_the_model_answer_would_be():
    """Guards against the cache shaping text with other rules than the completer (here:
    without the document's path, so the Python parse check is skipped): typing along would
    show text the model path cuts."""
    doc = Document("file:///w/a.py", "def f(a):\n    \n")
    cursor = doc.cursor(doc.resolve(1, 4), before_chars=4000, after_chars=400)
    req = CompletionRequest(cursor, "a.py", Settings(), uri=doc.uri, version=1)
    engine = ScriptedEngine(["return a\n", "    b = )\n"])
    direct = Completer(engine).complete(  # type: ignore[arg-type]
        CompletionRequest(cursor, "a.py", Settings(time_budget_ms=60_000), uri=doc.uri)
    )
    bg = _background(engine, Runner(), version_of=lambda uri: 1)
    try:
        entry = bg.cache.start(doc.uri, cursor)
        entry.raw, entry.finish_reason = "return a\n    b = )\n", "length"
        cached = asyncio.run(bg.from_cache(req))
    finally:
        bg.worker.stop()
    assert direct.text == "return a"
    assert cached is not None and cached.text == direct.text
