"""The HTTP server keeps every request within the model's context window.

``/v1/completions`` follows OpenAI: a ``max_tokens`` the client asks for that does not fit
after the prompt is refused (``context_length_exceeded``); the server's own default is cut
to the room left. ``/infill`` follows llama.cpp: the prompt is cut to fit and ``n_predict``
capped. The server runs in this process over the tiny engine, told its window is 128 to
1,024 tokens, so a full window costs little (a character is a token; the limits say up
to two, so that texts are counted by their tokens); the engine is wrapped to record what
it was asked to tokenize and to generate from.
"""

from __future__ import annotations

import pytest
from http_testing import InProcessServer, post
from specd.lsp.config import Settings
from specd.lsp.http import HttpService

from specd import ContextLimits, Engine, SamplingParams

DEFAULT_MAX_TOKENS = 64


class Recording:
    """An engine that records the texts it tokenizes and the prompts it generates from."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.tokenized: list[str] = []
        self.prompts: list[list[int]] = []

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def tokenize(self, text: str) -> list[int]:
        self.tokenized.append(text)
        return self._engine.tokenize(text)

    def stream(self, prompt, *args, **kw):
        self.prompts.append(list(prompt))
        return self._engine.stream(prompt, *args, **kw)


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny", drafter="none")


def _server(tiny, window: int, settings: Settings | None = None):
    engine = Recording(tiny)
    service = HttpService(
        engine,
        SamplingParams(max_tokens=DEFAULT_MAX_TOKENS),
        settings=settings,
        limits=ContextLimits(window=window, token_chars=2),
    )
    return engine, InProcessServer(service)


@pytest.fixture
def small(tiny):
    engine, server = _server(tiny, 128)
    yield engine, server
    server.close()


def test_an_explicit_max_tokens_that_does_not_fit_is_refused_in_openais_shape(small):
    """Guards against silently generating fewer tokens than asked (or running past the
    window): OpenAI clients read ``context_length_exceeded`` and shorten the prompt."""
    _, server = small
    status, reply = post(server, "/v1/completions", {"prompt": "x" * 100, "max_tokens": 29})
    assert status == 400
    error = reply["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "100 tokens with max_tokens 29" in error["message"] and "128" in error["message"]
    status, reply = post(server, "/v1/completions", {"prompt": "x" * 100, "max_tokens": 28})
    assert status == 200 and reply["usage"]["completion_tokens"] == 28


def test_the_default_max_tokens_is_cut_to_the_room_left(small):
    """Guards against the server's own default pushing a prompt that fits past the window."""
    engine, server = small
    status, reply = post(server, "/v1/completions", {"prompt": "x" * 100})
    assert status == 200
    assert reply["usage"] == {"prompt_tokens": 100, "completion_tokens": 28, "total_tokens": 128}


@pytest.mark.parametrize(
    "prompt, needle",
    [("x" * 128, "128 tokens leave no room"), ([1] * 500, "500 tokens leave no room")],
)
def test_a_prompt_that_fills_the_window_is_refused(small, prompt, needle):
    engine, server = small
    status, reply = post(server, "/v1/completions", {"prompt": prompt})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert needle in reply["error"]["message"]
    assert engine.prompts == []


def test_a_text_too_long_for_the_window_is_never_tokenized(small):
    """Guards against tokenizing a text whose length alone shows it cannot fit."""
    engine, server = small
    status, reply = post(server, "/v1/completions", {"prompt": "x" * 100_000})
    assert status == 400 and "100,000 characters" in reply["error"]["message"]
    assert engine.tokenized == []


def test_max_tokens_as_large_as_the_window_is_refused_naming_it(small):
    _, server = small
    status, reply = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 128})
    assert status == 400 and reply["error"]["param"] == "max_tokens"


def test_infill_cuts_the_far_end_of_the_prefix_and_caps_n_predict(tiny):
    """Guards against an ``/infill`` prompt and ``n_predict`` that overflow the window
    together, and against cutting the wrong end: what is kept is the text nearest the
    cursor. ``n_predict`` keeps at most half the window; the prompt gets the rest."""
    engine, server = _server(tiny, 256)
    try:
        before = "".join(f"line {i}\n" for i in range(2000))
        body = {"input_prefix": before, "prompt": "    ", "n_predict": 200}
        status, reply = post(server, "/infill", body)
    finally:
        server.close()
    assert status == 200 and reply["truncated"] is True
    (prompt,) = engine.prompts
    assert len(prompt) <= 256 - 128
    assert reply["tokens_evaluated"] + reply["tokens_predicted"] == 256
    full = tiny.tokenize(before + "    ")
    assert 0 < len(prompt) < len(full)  # the far end went
    # what is left ends at the cursor, but for the indent token healing backs up over
    assert any(full[: len(full) - k][-len(prompt) :] == prompt for k in range(8))
    assert max(len(t) for t in engine.tokenized) <= 2 * 256  # no more than the window holds


def test_infill_drops_extra_chunks_past_the_budget_unread(tiny):
    """Guards against tokenizing every ``input_extra`` chunk a client sends when the
    budget for other files is full after the first."""
    settings = Settings(prefix_tokens=64, suffix_tokens=16, context_tokens=32)
    engine, server = _server(tiny, 1024, settings)
    try:
        extra = [{"filename": f"f{i}.py", "text": f"chunk{i} " * 20} for i in range(200)]
        status, _ = post(server, "/infill", {"input_prefix": "x = 1\n", "input_extra": extra})
    finally:
        server.close()
    assert status == 200
    chunks = [t for t in engine.tokenized if t.startswith("chunk")]
    assert len(chunks) == 1 and chunks[0].startswith("chunk0 ")
    assert all(len(t) <= 32 * 8 for t in chunks)
