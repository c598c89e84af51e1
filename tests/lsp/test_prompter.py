"""One prompt builder for both servers: an editor over LSP and a client of ``/infill``
asking at the same place, with the same other file, get the same prompt."""

from __future__ import annotations

from dataclasses import astuple

from specd.lsp import prompting
from specd.lsp.completer import Completer, CompletionRequest
from specd.lsp.config import Settings
from specd.lsp.documents import Document
from specd.lsp.http.prompts import HttpPrompter
from specd.lsp.prompter import PrefixSize

from specd import ContextLimits

STARCODER = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>")


class FimTokenizer:
    """One token per character; the StarCoder control tokens from 1_000_000."""

    bos_token_id = None

    def __init__(self) -> None:
        self.specials = {t: 1_000_000 + i for i, t in enumerate(STARCODER)}

    def get_vocab(self):
        return dict(self.specials)

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i < 1_000_000)


class FimEngine:
    """What prompting needs of an engine: a tokenizer, and no token healing."""

    def __init__(self) -> None:
        self.tokenizer = FimTokenizer()
        self.limits = ContextLimits(window=1 << 20, token_chars=1)
        self.prefix_cache = None

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def heal(self, prompt):
        return list(prompt), None


def test_the_completion_pipeline_and_infill_build_the_same_prompt():
    """Guards against the two servers' prompt assembly drifting apart (a context file laid
    out, cut or named differently, another budget): both go through one Prompter."""
    engine = FimEngine()
    settings = Settings(prefix_tokens=64, suffix_tokens=16, context_tokens=40)
    before, after = "import os\n" * 20 + "def main():\n    ", "\n    return 0\n" * 5
    other = Document("file:///w/util.py", "def helper():\n    return 1\n" * 4)
    doc = Document("file:///w/main.py", before + after)
    lines = before.split("\n")
    cursor = doc.cursor(
        doc.resolve(len(lines) - 1, len(lines[-1])), before_chars=10_000, after_chars=10_000
    )
    req = CompletionRequest(cursor, "main.py", settings, others=[other], root_uri="file:///w")
    lsp = Completer(engine).build_prompt(req)  # type: ignore[arg-type]
    http, _ = HttpPrompter(engine, settings).build(  # type: ignore[arg-type]
        before, after, path="main.py", extra=[("util.py", other.text)]
    )
    assert lsp.template == http.template == "starcoder"
    assert lsp.context_documents == http.context_documents == 1
    assert lsp.ids == http.ids


def test_auto_is_what_the_service_measured_on_both_servers():
    """The measured size reaches a prompt through the service's PrefixSize on either
    server, not through the settings module."""
    engine = FimEngine()
    size = PrefixSize()
    size.measured(1.0)  # a slow machine: the smallest size
    prompter = HttpPrompter(engine, Settings(), size)  # type: ignore[arg-type]
    assert prompter.budget().prefix_tokens == 256
    completer = Completer(engine, prefix_size=size)  # type: ignore[arg-type]
    assert completer.prompter.budget(Settings()).prefix_tokens == 256


def test_budgets_larger_than_the_model_are_fitted_to_its_window(caplog):
    """Guards against ``prefix-tokens = 100000`` on a 4k model: every prompt was over the
    window, the engine refused each one and every request came back empty."""
    engine = FimEngine()
    engine.limits = ContextLimits(window=1000, token_chars=1)
    huge = Settings(prefix_tokens=10**6, suffix_tokens=10**6, context_tokens=10**6)
    before, after = "x = 1\n" * 2000, "\ny = 2\n" * 2000
    doc = Document("file:///w/main.py", before + after)
    other = Document("file:///w/util.py", "z = 3\n" * 2000)
    lines = before.split("\n")
    cursor = doc.cursor(
        doc.resolve(len(lines) - 1, len(lines[-1])), before_chars=10**5, after_chars=10**5
    )
    req = CompletionRequest(cursor, "main.py", huge, others=[other], root_uri="file:///w")
    completer = Completer(engine)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="specd.lsp.prompter"):
        prompt = completer.build_prompt(req)
        completer.build_prompt(req)
    assert len(prompt.ids) <= 1000 - prompting.FIT_ROOM
    assert prompt.prefix_tokens > 500  # the text before the cursor kept first
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "prefix-tokens 1000000" in said[0]  # once, naming the settings
    # budgets that fit are left as they are
    fits = prompting.Budget(64, 16, 40)
    assert fits.fit(1000) == fits


def test_a_fitted_budget_keeps_the_prefix_first_then_the_suffix():
    assert prompting.Budget(10**6, 10**6, 10**6).fit(4096) == prompting.Budget(2976, 992, 0)
    # the default's own sizes on a 2k model: the prefix whole, the context cut
    assert prompting.Budget(1536, 256, 512).fit(2048) == prompting.Budget(1536, 256, 128)
    # a window smaller than the room keeps three quarters of it for the prompt
    assert sum(astuple(prompting.Budget(500, 50, 50).fit(200))) <= 150
