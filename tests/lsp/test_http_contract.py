"""What ``specd serve --http`` promises about request fields: ``/infill`` honours the
request's ``stop`` strings, and both refuse what they cannot honour (``logprobs``, a
penalty, a bias, a grammar) with a 400 naming it. The server is the application run in this process over a
tiny engine."""

from __future__ import annotations

import json

import pytest
from http_testing import InProcessServer, events, post, request
from specd.lsp.http import HttpService

from specd import Engine, SamplingParams

PREFIX = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def server():
    engine = Engine.load("tiny", drafter="none")
    s = InProcessServer(HttpService(engine, SamplingParams(max_tokens=MAX_TOKENS)))
    yield s
    s.close()


def _stop_inside(text: str) -> tuple[str, int]:
    """A stop string that first occurs at a position > 0 of ``text`` (so the answer cut
    before it is shorter than ``text`` and not empty), and that position."""
    for n in (2, 1):
        for i in range(1, len(text) - n + 1):
            s = text[i : i + n]
            if text.find(s) == i and s.strip():
                return s, i
    raise AssertionError(f"no usable stop string in {text!r}")


def test_infill_stops_at_a_stop_string_of_the_request(server):
    """Guards against ``/infill`` dropping the request's ``stop`` (llama.vim and
    llama.vscode send them): the completion ran on past them to ``n_predict``."""
    body = {"input_prefix": PREFIX, "prompt": "    ", "n_predict": MAX_TOKENS}
    status, free = post(server, "/infill", body)
    assert status == 200
    assert free["stop_type"] == "limit"
    stop, at = _stop_inside(free["content"])
    status, stopped = post(server, "/infill", {**body, "stop": [stop]})
    assert status == 200
    assert stopped["content"] == free["content"][:at]
    assert stopped["stop_type"] == "word"
    assert stopped["tokens_predicted"] < free["tokens_predicted"]


def test_streamed_infill_stops_at_a_stop_string_of_the_request(server):
    """Guards against the streaming ``/infill`` path dropping ``stop``."""
    body = {"input_prefix": PREFIX, "prompt": "    ", "n_predict": MAX_TOKENS}
    _, free = post(server, "/infill", body)
    stop, at = _stop_inside(free["content"])
    status, raw = request(server, "POST", "/infill", {**body, "stop": [stop], "stream": True})
    assert status == 200
    data = [json.loads(d) for d in events(raw)]
    assert "".join(d["content"] for d in data) == free["content"][:at]
    assert data[-1]["stop"] is True and data[-1]["stop_type"] == "word"


@pytest.mark.parametrize("logprobs", [0, 1, 5])
def test_logprobs_is_refused_naming_the_field(server, logprobs):
    """Guards against ``logprobs`` answered with a 200 and ``"logprobs": null``: a client
    that asked for them would read a reply without them as if it had them."""
    status, reply = post(server, "/v1/completions", {"prompt": "x", "logprobs": logprobs})
    assert status == 400
    assert reply["error"]["param"] == "logprobs"
    assert "logprobs" in reply["error"]["message"]


def test_logprobs_null_is_the_default_and_served(server):
    """Guards against refusing ``"logprobs": null``, which OpenAI clients send by default."""
    status, reply = post(server, "/v1/completions", {"prompt": "x", "logprobs": None})
    assert status == 200
    assert reply["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "frequency_penalty", 0.5),
        ("/v1/completions", "presence_penalty", -1.0),
        ("/v1/completions", "logit_bias", {"50256": -100}),
        ("/infill", "repeat_penalty", 1.1),
        ("/infill", "frequency_penalty", 0.2),
        ("/infill", "logit_bias", [[15, False]]),
        ("/infill", "grammar", 'root ::= "x"'),
        ("/infill", "json_schema", {"type": "string"}),
    ],
)
def test_a_sampler_specd_does_not_run_is_refused_naming_it(server, path, field, value):
    """Guards against a penalty, bias or grammar answered with a 200 as if it had been
    applied: the client would take the model's own text for the one it asked to shape."""
    body = {"prompt": "x"} if path == "/v1/completions" else {"input_prefix": "x"}
    status, reply = post(server, path, {**body, field: value})
    assert status == 400
    assert reply["error"]["param"] == field
    assert field in reply["error"]["message"]


@pytest.mark.parametrize(
    ("path", "neutral"),
    [
        ("/v1/completions", {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}),
        (
            "/infill",
            {"repeat_penalty": 1.0, "frequency_penalty": 0, "grammar": "", "logit_bias": []},
        ),
    ],
)
def test_a_samplers_neutral_value_is_served(server, path, neutral):
    """Guards against refusing the defaults that clients send whatever they want."""
    body = {"prompt": "x"} if path == "/v1/completions" else {"input_prefix": "x"}
    status, _ = post(server, path, {**body, **neutral, "max_tokens": 2, "n_predict": 2})
    assert status == 200
