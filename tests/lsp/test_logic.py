"""Workspace index, metrics, the generation worker and the completion pipeline, without a
server (the completion pipeline runs a tiny random model in-process)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from specd.lsp.completer import Completer, CompletionRequest
from specd.lsp.config import Settings
from specd.lsp.documents import Document
from specd.lsp.metrics import Metrics
from specd.lsp.rpc import RedactPayloads
from specd.lsp.runner import Job, Runner
from specd.lsp.workspace import ACCEPTED, WorkspaceIndex

from specd import Engine, SamplingParams, Stats
from specd.forward.tiny import tiny_target


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


# -- workspace index ------------------------------------------------------------------------


def test_only_changed_documents_are_reindexed_and_lazily():
    ws = WorkspaceIndex(_encode, reindex_s=0)
    a, b = Document("a", "alpha beta gamma"), Document("b", "one two three")
    ws.changed(a)
    ws.changed(b)
    assert ws.reindexed == 0  # nothing happens until a generation asks
    assert ws.refresh() == 2
    for i in range(10):  # a burst of keystrokes in one document
        a.apply_change("x", a.resolve(0, i), a.resolve(0, i))
        ws.changed(a)
    assert ws.refresh() == 1 and ws.refresh() == 0
    assert ws.corpus.lookup(_encode("one tw"), 4) == _encode("o th")


def test_a_document_being_typed_in_is_reindexed_at_most_every_interval():
    now = [100.0]
    ws = WorkspaceIndex(_encode, reindex_s=2.0, clock=lambda: now[0])
    a, b = Document("a", "alpha beta"), Document("b", "one two")
    ws.changed(a)
    assert ws.refresh() == 1
    a.apply_change("gamma ", a.resolve(0, 0), a.resolve(0, 0))
    ws.changed(a)
    ws.changed(b)  # a new document is indexed at once
    now[0] += 1.0
    assert ws.refresh() == 1 and "b" in ws.corpus
    assert ws.corpus.lookup(_encode("gamm"), 2) == []  # the edit waits...
    now[0] += 1.0
    assert ws.refresh() == 1  # ...until the interval has passed, and is not lost
    assert ws.corpus.lookup(_encode("gamm"), 2) == _encode("a ")
    assert ws.refresh() == 0
    ws.changed(a)
    ws.closed("a")  # a close is never deferred
    assert ws.refresh() == 0 and "a" not in ws.corpus


def test_closed_and_oversized_documents_leave_the_index():
    ws = WorkspaceIndex(_encode, max_chars=20)
    small, big = Document("s", "small text here"), Document("b", "x" * 50)
    ws.changed(small)
    ws.changed(big)
    ws.refresh()
    assert "s" in ws.corpus and "b" not in ws.corpus
    ws.closed("s")
    ws.refresh()
    assert len(ws) == 0


def test_the_index_is_capped_in_tokens_least_recent_first():
    ws = WorkspaceIndex(_encode, max_tokens=25)
    docs = [Document(f"d{i}", f"document number {i}") for i in range(3)]  # 17 tokens each
    for doc in docs:
        ws.changed(doc)
        ws.refresh()
    assert "d2" in ws.corpus and "d0" not in ws.corpus and "d1" not in ws.corpus
    ws.changed(docs[0])
    ws.refresh()
    assert "d0" in ws.corpus and "d2" not in ws.corpus


def test_closing_documents_never_indexed_leaves_nothing_behind():
    ws = WorkspaceIndex(_encode)
    for i in range(1000):
        ws.closed(f"never-opened-{i}")
    assert ws._pending == {}


def test_accepted_completions_are_drafted_from_and_bounded():
    ws = WorkspaceIndex(_encode, accepted_history=2)
    for text in ("first_accepted", "second_accepted", "third_accepted"):
        ws.accepted(text)
    ws.refresh()
    assert ACCEPTED in ws.corpus
    assert ws.corpus.lookup(_encode("thir"), 3) == _encode("d_a")
    assert ws.corpus.lookup(_encode("firs"), 3) == []  # only the last two are kept


def test_head_tokens_reuse_the_index_when_current():
    calls = []
    ws = WorkspaceIndex(lambda t: calls.append(t) or _encode(t))
    doc = Document("d", "abcdef")
    ws.changed(doc)
    ws.refresh()
    calls.clear()
    assert ws.head_tokens(doc, 3) == _encode("abc") and calls == []
    doc.apply_change("Z", doc.resolve(0, 0), doc.resolve(0, 0))
    assert ws.head_tokens(doc, 3) == _encode("Zab") and calls  # stale: tokenized again


def test_lone_surrogates_are_scrubbed_before_tokenizing():
    seen = []
    ws = WorkspaceIndex(lambda t: seen.append(t) or _encode(t))
    ws.changed(Document("d", "a\ud800b"))
    ws.refresh()
    assert seen == ["a\ufffdb"]


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_aggregate_acceptance_and_latency():
    m = Metrics()
    s = Stats(
        prompt_tokens=10,
        new_tokens=7,
        target_steps=4,
        drafted=6,
        accepted=3,
        reused_tokens=8,
        ttft_s=0.1,
        total_s=0.7,
    )
    s.position_drafted, s.position_accepted = [3, 2, 1], [2, 1, 0]
    m.record(s, text="x")
    snap = m.snapshot()
    acc = snap["acceptance"]
    assert acc["mean_length"] == 7 / 4
    assert acc["position_rates"] == [2 / 3, 1 / 2, 0.0]
    # 4 steps: 2 accepted nothing, 1 accepted one draft token, 1 accepted two
    assert acc["histogram"] == {"1": 2, "2": 1, "3": 1}
    assert snap["latency"]["ttft_s"]["p50"] == 0.1
    assert snap["prefix_cache"]["reused_fraction"] == 0.8


SECRET = "def leaked_secret_fn(): return TOKEN_1234"


def test_the_metrics_keep_no_completion_text():
    """Guards against a snapshot that carries the text shown (a last completion, a sample):
    only its emptiness is kept."""
    m = Metrics()
    m.record(Stats(new_tokens=1, target_steps=1, ttft_s=0.1, total_s=0.1), text="")
    m.record(Stats(new_tokens=3, target_steps=2, ttft_s=0.1, total_s=0.3), text=SECRET)
    snap = m.snapshot()
    assert snap["completed"] == 2 and snap["empty"] == 1
    dump = json.dumps(snap)
    assert "leaked_secret_fn" not in dump and "TOKEN_1234" not in dump


def test_pygls_message_bodies_are_redacted_unless_code_is_allowed(caplog):
    """Guards against message bodies (which hold the document) reaching the logs: pygls logs
    each message it reads with the body as an argument."""
    allow_code = False
    logger = logging.getLogger("pygls.protocol.json_rpc")
    body = json.dumps({"params": {"textDocument": {"text": SECRET}}})
    redact = RedactPayloads(lambda: not allow_code)
    caplog.handler.addFilter(redact)
    try:
        with caplog.at_level(logging.DEBUG, logger="pygls"):
            logger.debug("Received %s for %s", body, "textDocument/didOpen")
            allow_code = True
            logger.debug("Received %s for %s", body, "textDocument/didOpen")
    finally:
        caplog.handler.removeFilter(redact)
    hidden, shown = caplog.records[-2:]
    assert "leaked_secret_fn" not in hidden.getMessage()
    assert "textDocument/didOpen" in hidden.getMessage()  # methods and ids stay readable
    assert "leaked_secret_fn" in shown.getMessage()  # log-code = true


# -- the generation worker --------------------------------------------------------------------


def _job(key, log, gate=None, record=None):
    def run(job):
        log.append(("start", key))
        if gate is not None:
            while not gate.is_set() and not job.cancelled:
                time.sleep(0.001)
        return key

    sink = record if record is not None else []
    return Job(key=key, run=run, done=lambda r, e, j: sink.append((key, r, j.reason)))


def test_a_newer_job_supersedes_queued_and_running_ones():
    log, done = [], []
    running = Metrics()
    worker = Runner(on_start=running.generation_started, on_end=running.generation_ended)
    gate = threading.Event()
    a = _job("doc", log, gate, done)
    worker.submit(a)
    while not log:
        time.sleep(0.001)
    b = _job("doc", log, gate, done)
    other = _job("other", log, gate, done)
    worker.submit(other)
    worker.submit(b)
    c = _job("doc", log, None, done)
    worker.submit(c)  # b never started: it is dropped at once
    gate.set()
    deadline = time.monotonic() + 10
    while worker.pending and time.monotonic() < deadline:
        time.sleep(0.001)
    worker.stop()
    assert a.cancelled and a.reason == "superseded"
    assert (
        b.reason == "superseded" and log.count(("start", "doc")) == 2 and ("start", "other") in log
    )
    assert ("doc", None, "superseded") in done  # b, settled without running
    assert running.max_running == 1


def test_cancel_key_prefix_and_stop():
    log, done = [], []
    worker = Runner()
    gate = threading.Event()
    jobs = [_job(f"1:{i}", log, gate, done) for i in range(3)] + [_job("2:x", log, gate, done)]
    for j in jobs:
        worker.submit(j)
    worker.cancel_key("1:*", "changed")
    gate.set()
    deadline = time.monotonic() + 10
    while worker.pending and time.monotonic() < deadline:
        time.sleep(0.001)
    worker.stop()
    assert all(j.reason == "changed" for j in jobs[:3]) and jobs[3].reason is None
    assert ("2:x", "2:x", None) in done
    late = _job("3:y", log, None, done)
    worker.submit(late)
    assert late.reason == "shutdown"


# -- the completion pipeline ------------------------------------------------------------------


@pytest.fixture(scope="module")
def completer():
    return Completer(Engine(tiny_target(logit_scale=8.0)), SamplingParams(max_tokens=12))


def _request(doc: Document, line: int, col: int, **kw) -> CompletionRequest:
    cursor = doc.cursor(doc.resolve(line, col), before_chars=4000, after_chars=400)
    # A budget no loaded machine runs out of: these tests check what is generated, not when.
    settings = kw.pop("settings", Settings(time_budget_ms=120_000))
    return CompletionRequest(cursor, "main.py", settings, uri=doc.uri, **kw)


def test_a_one_character_edit_reuses_all_but_the_new_token(completer):
    doc = Document(
        "file:///w/main.py",
        "def total(values):\n    result = 0\n    for v in values:\n        result = ",
    )
    first = completer.complete(_request(doc, 3, 17))
    assert first.text and first.stats.new_tokens
    doc.apply_change("r", doc.resolve(3, 17), doc.resolve(3, 17))
    second = completer.complete(_request(doc, 3, 18))
    assert second.stats.reused_tokens == second.stats.prompt_tokens - 1


def test_workspace_drafting_and_context_from_other_documents(completer):
    doc = Document("file:///w/main.py", "import helpers\nx = ")
    other = Document("file:///w/helpers.py", "def helper(value):\n    return value * 2\n")
    ws = WorkspaceIndex(completer.engine.tokenize)
    ws.changed(doc)
    ws.changed(other)
    req = _request(doc, 1, 4, others=[other], workspace=ws)
    prompt = completer.build_prompt(req)
    healed = prompt.constraint.text if prompt.constraint else ""  # token healing's cut
    text = completer.engine.tokenizer.decode(prompt.ids) + healed
    assert text.startswith("# helpers.py") and text.endswith(
        "# main.py" + "import helpers" + "x = "
    )  # CharTokenizer drops \n
    result = completer.complete(req)
    assert ws.reindexed == 2
    assert result.finish_reason == "length" and result.stats.new_tokens == 12


def test_cancel_before_and_during(completer):
    doc = Document("file:///w/main.py", "x = ")
    req = _request(doc, 0, 4)
    req.cancel.set()
    assert completer.complete(req).finish_reason == "cancelled"
    req = _request(doc, 0, 4, settings=Settings(max_tokens=20_000, time_budget_ms=60_000))
    threading.Timer(0.2, req.cancel.set).start()
    t0 = time.monotonic()
    result = completer.complete(req)
    assert result.finish_reason == "cancelled" and result.text == ""
    assert time.monotonic() - t0 < 10


def test_time_budget_ends_a_request(completer):
    doc = Document("file:///w/main.py", "x = ")
    result = completer.complete(
        _request(doc, 0, 4, settings=Settings(max_tokens=50_000, time_budget_ms=200))
    )
    assert result.finish_reason == "time" and result.stats.new_tokens < 50_000


def test_a_completion_leaves_no_document_text_in_metrics_or_logs(completer, caplog):
    """Guards against the pipeline logging or counting the code it completes."""
    doc = Document("file:///w/main.py", f"{SECRET}\nx = ")
    with caplog.at_level(logging.DEBUG):
        result = completer.complete(_request(doc, 1, 4))
    assert result.stats.prompt_tokens > len(SECRET)  # the secret was in the prompt
    assert not [r for r in caplog.records if "leaked_secret_fn" in r.getMessage()]
    assert "leaked_secret_fn" not in json.dumps(completer.metrics.snapshot())


def test_lone_surrogates_in_a_document(completer):
    doc = Document("file:///w/main.py", "s = '\ud800\udfff'\nx = ")
    result = completer.complete(_request(doc, 1, 4))
    assert result.finish_reason == "length" and result.stats.new_tokens == 12 and result.text
