"""The llama.cpp ``/infill`` rules that llama.vim depends on, and the template stop tokens,
checked without a model (the rules alone, or a server over a scripted engine)."""

from __future__ import annotations

import time

from specd.lsp.http.llama import _fields, _stop_rule, cut_indent

from specd import ContextLimits


def test_time_limit_waits_for_a_newline():
    """Guards against a plain wall-clock cut: llama.vim's first request has 250 ms, and a
    cut before the first line ends returns nothing it can show."""
    should_stop = _stop_rule(t_max_predict_ms=1, n_indent=0)
    assert should_stop is not None
    assert should_stop("") == ""  # the first check starts the clock
    time.sleep(0.01)
    assert should_stop("    return compute(") == ""
    assert should_stop("    return compute(x)\n") == "time"


def test_no_rule_without_limits():
    assert _stop_rule(0, 0) is None


def test_indent_rule_stops_at_a_line_that_leaves_the_block():
    should_stop = _stop_rule(t_max_predict_ms=0, n_indent=4)
    assert should_stop is not None
    assert should_stop("x = 1\n    y = 2\n    ") == ""  # blank so far: not judged yet
    assert should_stop("x = 1\n    y = 2\nz") == "indent"


def test_cut_indent_drops_the_first_outdented_line_and_what_follows():
    """Guards against keeping the line that leaves the block (llama.vim would show code
    from the next function) and against judging the first line, which continues the
    cursor's line whatever its indentation."""
    text = "a + b\n        c = 1\n\n    return c\ndef g():\n    pass"
    assert cut_indent(text, 4) == "a + b\n        c = 1\n\n    return c"
    assert cut_indent(text, 8) == "a + b\n        c = 1\n"
    assert cut_indent("x\ny", 0) == "x\ny"
    assert cut_indent("x", 4) == "x"
    assert cut_indent("x\n\t\ty", 2) == "x\n\t\ty"  # a tab counts as one column, like llama.cpp


def test_response_fields_flatten_nested_paths_and_skip_unknown_ones():
    """Guards against nested ``timings`` where llama.vim reads ``timings/prompt_n``."""
    result = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "stop": True}
    picked = _fields(result, ["content", "timings/prompt_n", "timings/nope", "missing"])
    assert picked == {"content": "x", "timings/prompt_n": 3}
    assert _fields(result, None) is result


class _Scripted:
    """An engine that writes the same pieces whatever the prompt, checking ``cancel``
    before each one as the real engine does before each target step."""

    PIECES = ["a + b\n", "        c = 1\n", "\n    ret", "urn c\n", "def g():\n", "    pass"]
    #: a model's context window, which a scripted engine has none of
    LIMITS = ContextLimits(window=4096, token_chars=1)

    def __init__(self):
        from types import SimpleNamespace

        self.tokenizer = SimpleNamespace(decode=lambda ids, **kw: "")
        self.limits = self.LIMITS
        self.target = SimpleNamespace(name="scripted", vocab_size=1000)
        self.steps = 0
        self.step_s = 0.0

    def tokenize(self, text):
        return [ord(c) % 1000 for c in text]

    def heal(self, prompt):
        return list(prompt), None  # no token healing

    def stream(self, prompt, params, cancel=None, **kw):
        from specd import Completion, Delta, Stats

        engine = self

        class Gen:
            completion = None

            def __iter__(self):
                stats = Stats(prompt_tokens=len(prompt))
                for i, piece in enumerate(engine.PIECES[: params.max_tokens]):
                    if cancel is not None and cancel():
                        stats.finish_reason = "cancelled"
                        break
                    engine.steps += 1
                    time.sleep(engine.step_s)
                    stats.new_tokens = i + 1
                    yield piece if isinstance(piece, Delta) else Delta(piece, [i])
                else:
                    stats.finish_reason = "length"
                self.completion = Completion("", list(range(stats.new_tokens)), stats)

        return Gen()


def test_streamed_infill_holds_back_lines_n_indent_may_still_cut():
    """Guards against streaming a line that ``n_indent`` then cuts (the client would show
    code from the next function), and against the stream and the whole answer differing."""
    import json

    from http_testing import InProcessServer, events, post, request
    from specd.lsp.http import HttpService

    from specd import SamplingParams

    engine = _Scripted()
    server = InProcessServer(
        HttpService(engine, SamplingParams(max_tokens=64), limits=_Scripted.LIMITS)
    )
    try:
        body = {"input_prefix": "def f():\n", "prompt": "    return ", "n_indent": 4}
        _, whole = post(server, "/infill", body)
        assert whole["content"] == "a + b\n        c = 1\n\n    return c"
        assert whole["stop_type"] == "limit"
        # the outdented line came with step 5: the rule stopped before step 6
        assert engine.steps == len(_Scripted.PIECES) - 1
        status, raw = request(server, "POST", "/infill", {**body, "stream": True})
        assert status == 200
        data = [json.loads(d) for d in events(raw)]
        streamed = [d["content"] for d in data]
        assert "".join(streamed) == whole["content"]
        assert all("def g" not in piece for piece in streamed)
        assert len(data) > 2  # finished lines went out before the end
    finally:
        server.close()


class _FimTokenizer:
    """Characters are their code points; control tokens from 1_000_000."""

    specials = {"<fim_prefix>": 1_000_000, "<fim_suffix>": 1_000_001, "<fim_middle>": 1_000_002}
    specials |= {"<file_sep>": 1_000_003, "<|endoftext|>": 1_000_004}
    bos_token_id = None

    def get_vocab(self):
        return dict(self.specials)

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i < 1_000_000)


def test_completion_stops_at_a_template_stop_token():
    """Guards against a fill-in-the-middle prompt sent as a plain prompt (what ``--backend``
    does) running past ``<file_sep>`` into another file, and against token ids that
    still hold the stop token."""
    from http_testing import InProcessServer, post
    from specd.lsp.http import HttpService

    from specd import Delta, SamplingParams

    engine = _Scripted()
    engine.tokenizer = _FimTokenizer()
    engine.target.vocab_size = 2_000_000
    sep = _FimTokenizer.specials["<file_sep>"]
    engine.PIECES = ["ab", "c", Delta("", [sep, 7]), "d"]
    server = InProcessServer(
        HttpService(engine, SamplingParams(max_tokens=64), limits=_Scripted.LIMITS)
    )
    try:
        fim = [1_000_000, ord("x"), 1_000_001, ord("y"), 1_000_002]
        status, reply = post(server, "/v1/completions", {"prompt": fim})
        assert status == 200
        assert reply["choices"][0]["text"] == "abc"
        assert reply["choices"][0]["finish_reason"] == "stop"
        assert reply["specd"]["token_ids"] == [0, 1]
        assert engine.steps == 3  # it stopped before the step after the stop token
    finally:
        server.close()


def test_healed_text_does_not_count_as_the_first_newline():
    """Guards against judging ``t_max_predict_ms`` on the raw text: when token healing
    backs up over a newline and its indent (the cursor line is just its indent, as
    llama.vim sends it), the healed text's newline would end the generation at its first
    step, and the answer would be empty."""
    from http_testing import InProcessServer, post
    from specd.lsp.http import HttpService

    from specd import SamplingParams
    from specd.healing import Constraint

    engine = _Scripted()
    engine.heal = lambda ids: (ids[:-5], Constraint("\n    "))
    engine.PIECES = ["\n    ", "return 1", "\n", "    x = 2"]
    engine.step_s = 0.02
    server = InProcessServer(
        HttpService(engine, SamplingParams(max_tokens=64), limits=_Scripted.LIMITS)
    )
    try:
        body = {"input_prefix": "def f():", "prompt": "\n    ", "t_max_predict_ms": 1}
        status, reply = post(server, "/infill", body)
        assert status == 200
        assert reply["content"] == "return 1\n"
        assert reply["stop_type"] == "limit"
    finally:
        server.close()
