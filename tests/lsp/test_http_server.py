"""``specd serve --http`` end to end: a real server process (``--model tiny``) and a real
HTTP client."""

from __future__ import annotations

import json
import subprocess

import pytest
from http_testing import ENV, SPECD, HttpServer, events, metrics, post, request

pytestmark = pytest.mark.slow  # a server process per module, and `specd` processes beside it

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def server():
    s = HttpServer("--model", "tiny", "--max-tokens", "24")
    yield s
    s.close()


def test_greedy_completion_equals_specd_generate(server):
    """Guards against the HTTP path building a different prompt or different sampling
    settings than the engine's own command (a template wrapped around a plain prompt, the
    server's defaults dropped)."""
    out = subprocess.run(
        [*SPECD, "generate", "--model", "tiny", "--max-tokens", "24", "--json", PROMPT],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=True,
    )
    want = json.loads(out.stdout)
    status, got = post(server, "/v1/completions", {"prompt": PROMPT, "model": "tiny"})
    assert status == 200
    assert got["object"] == "text_completion"
    assert got["choices"][0]["text"] == want["text"]
    assert got["specd"]["token_ids"] == want["token_ids"]
    assert got["usage"]["completion_tokens"] == len(want["token_ids"])
    assert got["choices"][0]["finish_reason"] == "length"


def test_streamed_completion_is_the_same_text_and_ends_with_done(server):
    """Guards against a stream that drops or repeats pieces, or never sends ``[DONE]``
    (OpenAI clients wait for it)."""
    body = {"prompt": PROMPT, "max_tokens": 12}
    _, whole = post(server, "/v1/completions", body)
    status, raw = request(server, "POST", "/v1/completions", {**body, "stream": True})
    assert status == 200
    data = list(events(raw))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) > 2
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 12
    assert last["specd"]["stats"]["new_tokens"] == 12


def test_infill_answers_llama_vim_request_shape(server):
    """Guards against what makes llama.vim drop a reply: a space after ``"content":``, a
    refused empty Bearer key or ``time`` list, nested ``timings`` where it asked for
    flattened ``timings/...`` keys."""
    fields = [
        "content",
        "timings/prompt_n",
        "timings/prompt_ms",
        "timings/prompt_per_token_ms",
        "timings/prompt_per_second",
        "timings/predicted_n",
        "timings/predicted_ms",
        "timings/predicted_per_token_ms",
        "timings/predicted_per_second",
        "truncated",
        "tokens_cached",
    ]
    body = {
        "id_slot": 0,
        "input_prefix": "import os\n\ndef main():\n",
        "input_suffix": "\n\nmain()\n",
        "input_extra": [{"text": "x = 1\n", "time": [1733000000, 0], "filename": "util.py"}],
        "prompt": "    ",
        "n_predict": 16,
        "stop": [],
        "n_indent": 4,
        "top_k": 40,
        "top_p": 0.9,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250,
        "response_fields": fields,
        "model": "",
    }
    headers = {"Authorization": "Bearer "}
    # llama.vim first sends the context alone, to warm the cache
    status, raw = request(server, "POST", "/infill", {**body, "n_predict": 0}, headers=headers)
    assert status == 200, raw
    warm = json.loads(raw)
    assert warm["content"] == "" and warm["timings/predicted_n"] == 0
    status, raw = request(server, "POST", "/infill", body, headers=headers)
    assert status == 200, raw
    assert b'"content":"' in raw
    reply = json.loads(raw)
    assert sorted(reply) == sorted(fields)
    assert reply["timings/predicted_n"] > 0
    # the warm request left the shared context in the prefix cache
    assert reply["timings/prompt_n"] < reply["tokens_cached"] - reply["timings/predicted_n"]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
        ("/v1/completions", {"prompt": "x", "n": 3}, "n"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
        ("/infill", {"input_prefix": 3}, "input_prefix"),
        ("/infill", {"input_extra": [{"filename": "a.py"}]}, "input_extra[0].text"),
    ],
)
def test_bad_body_gets_400_naming_the_field(server, path, body, field):
    """Guards against bad bodies answered with a 500 (or served with a default), and
    against a message that does not say which field was wrong."""
    status, reply = post(server, path, body)
    assert status == 400
    assert reply["error"]["param"] == field
    assert field.split("[")[0] in reply["error"]["message"] or field in reply["error"]["message"]
    assert request(server, "GET", "/health")[0] == 200


def test_malformed_json_gets_400(server):
    status, reply = post(server, "/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in reply["error"]["message"]


def test_models_health_and_metrics(server):
    """Guards against /metrics missing what dashboards read: requests by status, tokens,
    drafted and accepted, acceptance per draft position, latency histograms."""
    post(server, "/v1/completions", {"prompt": "abcabcabcabcabcabc", "max_tokens": 8})
    status, raw = request(server, "GET", "/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "tiny"
    assert json.loads(request(server, "GET", "/health")[1]) == {"status": "ok"}
    m = metrics(server)
    assert m['specd_http_requests_total{endpoint="/v1/completions",code="200"}'] >= 1
    assert m["specd_generated_tokens_total"] >= 8
    assert "specd_drafted_total" in m and "specd_accepted_total" in m
    assert m["specd_request_seconds_count"] >= 1
    assert m['specd_request_seconds_bucket{le="+Inf"}'] == m["specd_request_seconds_count"]
    assert any(k.startswith("specd_position_drafted_total{") for k in m) == (
        m["specd_drafted_total"] > 0
    )


def test_refuses_a_non_loopback_address_without_allow_remote():
    """Guards against the HTTP server listening on every interface by default: it has no
    authentication and answers with completions of whatever code it is sent."""
    out = subprocess.run(
        [*SPECD, "serve", "--http", "0.0.0.0:0", "--model", "tiny"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 2
    assert "--http" in out.stderr and "--allow-remote" in out.stderr


def test_listens_on_loopback(server):
    assert server.host == "127.0.0.1"


def test_streamed_infill_is_the_same_content_in_llama_cpp_events(server):
    """Guards against a stream that loses or repeats text around the held-back last line,
    or ends without llama.cpp's final ``stop: true`` event."""
    body = {"input_prefix": "def f(x):\n", "prompt": "    ", "n_predict": 20}
    _, whole = post(server, "/infill", body)
    status, raw = request(server, "POST", "/infill", {**body, "stream": True})
    assert status == 200
    data = [json.loads(d) for d in events(raw)]
    assert all(not d["stop"] for d in data[:-1]) and data[-1]["stop"] is True
    assert "".join(d["content"] for d in data) == whole["content"]
    assert data[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_a_port_in_use_is_a_clear_error(server):
    """Guards against a traceback where a message naming the address belongs."""
    out = subprocess.run(
        [*SPECD, "serve", "--http", f"127.0.0.1:{server.port}", "--model", "tiny"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 2
    assert f"--http 127.0.0.1:{server.port}: " in out.stderr
    assert "Traceback" not in out.stderr
