"""``--backend URL``: the completion pipeline generating on a server.

The server is a real ``specd serve --http`` (``--model tiny``), so a completion through the
backend must equal the one the same model gives locally: same prompt, same
post-processing. Cancellation is checked against the in-process server whose generation
is held still (see test_http_queue.py).
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest
from http_testing import ENV, SPECD, HttpServer, InProcessServer, metrics, wait_for
from lsp_testing import RawClient
from specd.lsp.backend import Backend, BackendError
from specd.lsp.backend_prompt import split_prompt
from specd.lsp.documents import Document
from specd.lsp.http import HttpService
from specd.lsp.prompting import ContextDocument, Vocabulary, build, choose_template
from test_http_queue import GatedEngine

from specd import Engine, SamplingParams

SOURCE = "import os\n\n\ndef main():\n    path = os.getcwd()\n    \n    return path\n"
LINE, COL = 6, 5  # 1-based: the blank indented line inside main()


@pytest.fixture(scope="module")
def http_server(no_healing):
    s = HttpServer("--model", "tiny", "--config", no_healing)  # /infill heals by default
    yield s
    s.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "main.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def no_healing(tmp_path_factory):
    """Settings without token healing, which a remote cannot do: only then is the prompt
    the same on both sides, and the completions comparable."""
    path = tmp_path_factory.mktemp("cfg") / "lsp.toml"
    path.write_text("token-healing = false\n")
    return str(path)


def _complete(source, config, *extra: str) -> dict:
    out = subprocess.run(
        [*SPECD, "complete", str(source), "--line", str(LINE), "--col", str(COL)]
        + ["--model", "tiny", "--json", "--config", config, *extra],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1", "/infill"])
def test_complete_through_a_backend_equals_the_local_completion(
    http_server, source, no_healing, path
):
    """Guards against the backend sending a different prompt than the local pipeline
    builds (control tokens dropped, the prompt cut up wrongly for /infill) or skipping
    post-processing."""
    local = _complete(source, no_healing)
    url = f"http://127.0.0.1:{http_server.port}{path}"
    remote = _complete(source, no_healing, "--backend", url)
    assert remote["text"] == local["text"]
    assert remote["raw_text"] == local["raw_text"]
    assert remote["stats"]["drafter"] == "remote"
    if path == "/v1":  # specd's extension carries the exact ids (the step counts follow the
        # draft lengths, which follow what verify passes cost on this host at each load)
        assert remote["token_ids"] == local["token_ids"]


@pytest.mark.slow
def test_unreachable_backend_is_a_clear_error(source):
    out = subprocess.run(
        [*SPECD, "complete", str(source), "--line", "1", "--col", "1", "--model", "tiny"]
        + ["--backend", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 2
    assert "--backend http://127.0.0.1:9/v1" in out.stderr


@pytest.mark.slow
def test_a_non_loopback_backend_needs_allow_remote(source):
    """Guards against code being sent off the machine without the user saying so."""
    out = subprocess.run(
        [*SPECD, "complete", str(source), "--line", "1", "--col", "1", "--model", "tiny"]
        + ["--backend", "http://192.0.2.1:8000/v1"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 2 and "--allow-remote" in out.stderr


def _inline(client: RawClient, uri: str) -> int:
    return client.request(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": LINE - 1, "character": COL - 1},
            "context": {"triggerKind": 1},
        },
    )


def _open(client: RawClient, uri: str) -> None:
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": SOURCE}},
    )


@pytest.mark.slow
def test_language_server_with_a_backend_answers_inline_completions(http_server):
    """``specd serve --stdio --backend URL`` answers as the local server does: the same
    inline items, and underneath the same generated text (post-processing may turn the
    tiny model's random characters into no item at all, on both sides alike)."""
    uri = "file:///w/main.py"
    answers = []
    for extra in ((), ("--backend", f"http://127.0.0.1:{http_server.port}/v1")):
        client = RawClient(*extra)
        try:
            client.initialize({"token-healing": False})
            _open(client, uri)
            reply = client.response(_inline(client, uri), timeout=120)
            items = [(i["insertText"], i["range"]) for i in reply["result"]["items"]]
            position = {"line": LINE - 1, "character": COL - 1}
            whole = client.call(
                "specd/complete", {"textDocument": {"uri": uri}, "position": position}
            )
            answers.append((items, whole["result"]["raw_text"], whole["result"]["text"]))
        finally:
            client.close()
    local, remote = answers
    assert local[1], "the local server generated nothing to compare with"
    assert remote == local


@pytest.fixture
def gated_server():
    g = GatedEngine(Engine.load("tiny", drafter="none"))
    server = InProcessServer(HttpService(g, SamplingParams(max_tokens=200)))
    yield g, server
    g.gate.set()
    server.close()


@pytest.mark.slow
def test_cancelling_an_lsp_request_reaches_the_server(gated_server):
    """Guards against a cancelled completion that keeps the server generating: the
    language server must close the stream, and the server must see the disconnect and
    stop its generation."""
    g, server = gated_server
    client = RawClient("--backend", f"http://127.0.0.1:{server.port}/v1")
    try:
        client.initialize()
        uri = "file:///w/main.py"
        _open(client, uri)
        msg_id = _inline(client, uri)
        assert g.paused.wait(120)
        client.notify("$/cancelRequest", {"id": msg_id})
        wait_for(lambda: metrics(server).get("specd_disconnects_total", 0) == 1)
        g.gate.set()
        wait_for(lambda: 'specd_generations_total{finish_reason="cancelled"}' in metrics(server))
        assert metrics(server)["specd_generated_tokens_total"] < 200
        client.response(msg_id, timeout=60)
    finally:
        client.close()


@pytest.mark.slow
def test_backend_cancel_closes_the_stream(gated_server):
    """The same at the Backend's level: a cancel while the read waits hangs up."""
    g, server = gated_server
    engine = g._engine
    url = f"http://127.0.0.1:{server.port}/v1"
    backend = Backend(url, engine.tokenizer, engine.tokenize, timeout_s=600)
    cancel = threading.Event()
    gen = backend.stream("def f(x):\n", SamplingParams(max_tokens=200), cancel=cancel)
    first = next(gen)
    assert first.text
    assert g.paused.wait(60)
    cancel.set()
    # nothing reads the stream now: the hang-up alone must reach the server
    wait_for(lambda: metrics(server).get("specd_disconnects_total", 0) == 1)
    rest = list(gen)
    assert gen.completion is not None
    assert gen.completion.stats.finish_reason == "cancelled"
    assert len(first.text + "".join(d.text for d in rest)) < 200


@pytest.mark.slow
def test_backend_http_error_names_the_backend(http_server):
    """Guards against a refused request read as an empty completion."""
    engine = Engine.load("tiny")
    url = f"http://127.0.0.1:{http_server.port}/v1"
    backend = Backend(url, engine.tokenizer, engine.tokenize)
    with pytest.raises(BackendError, match=f"--backend {url}: HTTP 400: .*max_tokens"):
        list(backend.stream("x", SamplingParams(max_tokens=100_000)))


@pytest.mark.slow
def test_no_watcher_thread_outlives_a_remote_generation(http_server):
    """Guards against the cancel watcher outliving its request: holding the last reference
    to the engine, it freed the model during Python's shutdown, which aborts the process
    (``specd complete --backend`` exited -6 after printing its answer)."""
    engine = Engine.load("tiny")
    ok = Backend(f"http://127.0.0.1:{http_server.port}/v1", engine.tokenizer, engine.tokenize)
    refused = Backend("http://127.0.0.1:9/v1", engine.tokenizer, engine.tokenize)
    list(ok.stream("def f():", SamplingParams(max_tokens=4)))
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        list(refused.stream("def f():", SamplingParams(max_tokens=4)))
    names = [t.name for t in threading.enumerate()]
    assert "specd-backend-watch" not in names


class _Tok:
    """One token per character; control tokens from 1_000_000."""

    bos_token_id = None

    def __init__(self, specials):
        self.specials = {t: 1_000_000 + i for i, t in enumerate(specials)}
        self.names = {i: t for t, i in self.specials.items()}

    def get_vocab(self):
        return dict(self.specials)

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(
            ("" if skip_special_tokens else self.names[i]) if i in self.names else chr(i)
            for i in ids
        )


def test_split_prompt_recovers_what_infill_asks_for():
    """Guards against /infill getting the template's pieces mixed up: the prefix, the
    suffix and each other file must come back as they went in."""
    tok = _Tok(["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>"])
    vocab = Vocabulary(tok.encode, tok)
    template = choose_template(vocab, "starcoder")
    doc = Document("file:///w/a.py", "def f():\n    ret\nprint(f())\n")
    cursor = doc.cursor(doc.resolve(1, 7), before_chars=10_000, after_chars=10_000)
    others = [ContextDocument("util.py", tok.encode("X = 1\n"))]
    prompt = build(template, vocab, cursor, path="a.py", others=others)
    split = split_prompt(prompt.ids, vocab, tok.decode)
    assert split.prefix == "def f():\n    ret"
    assert split.suffix == "\nprint(f())\n"
    assert split.extra == [("util.py", "X = 1\n\n")]
    assert "<file_sep>" in split.stops


class _Stub:
    """A server that answers like vLLM (OpenAI chunks, then a usage-only chunk) or like
    llama.cpp (``content`` events, the last with ``stop`` and ``timings``), and records
    what it was sent."""

    def __init__(self, pieces):
        import asyncio

        from aiohttp import web

        self.pieces = pieces
        self.bodies = []

        async def openai(request):
            self.bodies.append(await request.json())
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for p in self.pieces:
                chunk = {"choices": [{"index": 0, "text": p, "finish_reason": None}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            end = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
            await response.write(b"data: " + json.dumps(end).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            return response

        async def infill(request):
            self.bodies.append(await request.json())
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for p in self.pieces:
                event = {"content": p, "stop": False}
                await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            last = {"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": 5}
            last.update(tokens_evaluated=9, timings={"prompt_n": 2})
            await response.write(b"data: " + json.dumps(last).encode() + b"\n\n")
            return response

        app = web.Application()
        app.router.add_post("/v1/completions", openai)
        app.router.add_post("/infill", infill)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start():
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.port = self.runner.addresses[0][1]

    def close(self):
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


STARCODER = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>"]


def _fim_prompt(tok):
    vocab = Vocabulary(tok.encode, tok)
    doc = Document("file:///w/a.py", "def f():\n    ret\nprint(f())\n")
    cursor = doc.cursor(doc.resolve(1, 7), before_chars=10_000, after_chars=10_000)
    others = [ContextDocument("util.py", tok.encode("X = 1\n"))]
    return build(choose_template(vocab, "starcoder"), vocab, cursor, path="a.py", others=others)


def test_a_plain_openai_server_degrades_stats_and_cuts_at_a_template_stop():
    """Guards against invented numbers from a server that reports none (speculation counts
    must stay 0, token ids empty), and against text after a template stop token such as
    ``<file_sep>`` reaching the editor when the server does not stop there itself."""
    tok = _Tok(STARCODER)
    stub = _Stub(["urn 1", "\n<file_s", "ep>util.py\nX = 2"])
    try:
        backend = Backend(f"http://127.0.0.1:{stub.port}/v1", tok, tok.encode, model="m")
        prompt = _fim_prompt(tok)
        gen = backend.stream(prompt.ids, SamplingParams(max_tokens=16))
        text = "".join(d.text for d in gen)
        assert text == "urn 1\n"
        c = gen.completion
        assert c.token_ids == [] and c.stats.finish_reason == "stop"
        assert (c.stats.target_steps, c.stats.drafted, c.stats.accepted) == (0, 0, 0)
        sent = stub.bodies[0]
        assert sent["prompt"].startswith("<file_sep>util.py\nX = 1\n")
        assert "<fim_middle>" in sent["prompt"] and sent["model"] == "m"
        assert "<file_sep>" in sent["stop"] and sent["max_tokens"] == 16
    finally:
        stub.close()


def test_a_plain_openai_server_usage_fills_the_token_counts():
    tok = _Tok(STARCODER)
    stub = _Stub(["a", "b"])
    try:
        backend = Backend(f"http://127.0.0.1:{stub.port}/v1", tok, tok.encode)
        gen = backend.stream(tok.encode("x = "), SamplingParams(max_tokens=8))
        assert "".join(d.text for d in gen) == "ab"
        s = gen.completion.stats
        assert (s.prompt_tokens, s.new_tokens, s.finish_reason) == (7, 5, "eos")
    finally:
        stub.close()


def test_infill_backend_sends_the_pieces_llama_cpp_asks_for():
    """Guards against /infill getting the whole templated prompt as its prefix (llama.cpp
    would wrap it in a second template)."""
    tok = _Tok(STARCODER)
    stub = _Stub(["urn", " 1"])
    try:
        backend = Backend(f"http://127.0.0.1:{stub.port}/infill", tok, tok.encode)
        gen = backend.stream(_fim_prompt(tok).ids, SamplingParams(max_tokens=16))
        assert "".join(d.text for d in gen) == "urn 1"
        sent = stub.bodies[0]
        assert sent["input_prefix"] == "def f():\n    ret"
        assert sent["input_suffix"] == "\nprint(f())\n"
        assert sent["input_extra"] == [{"filename": "util.py", "text": "X = 1\n\n"}]
        assert sent["n_predict"] == 16 and sent["stream"] is True
        s = gen.completion.stats
        assert (s.prompt_tokens, s.new_tokens, s.reused_tokens) == (9, 5, 7)
    finally:
        stub.close()


def test_token_healing_cut_goes_back_into_the_prompt_and_starts_the_text():
    """Guards against a healed prompt sent without its cut text (the server would
    complete from the wrong place) or an answer the pipeline cannot strip the cut text
    from (it expects the generation to write it first)."""
    from specd.healing import Constraint

    tok = _Tok(STARCODER)
    stub = _Stub(["(x)"])
    try:
        prompt = _fim_prompt(tok)
        cut = prompt.ids.index(1_000_001) - 2  # heal away "et" of "ret"
        ids = prompt.ids[:cut] + prompt.ids[cut + 2 :]
        for path in ("/v1", "/infill"):
            backend = Backend(f"http://127.0.0.1:{stub.port}{path}", tok, tok.encode)
            gen = backend.stream(ids, SamplingParams(max_tokens=8), constraint=Constraint("et"))
            assert [d.text for d in gen][:2] == ["et", "(x)"]
            assert gen.completion.text == "et(x)"
        to_openai, to_infill = stub.bodies
        assert "    ret<fim_suffix>" in to_openai["prompt"]
        assert to_infill["input_prefix"] == "def f():\n    ret"
    finally:
        stub.close()
