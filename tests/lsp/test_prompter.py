"""One prompt builder for both servers: an editor over LSP and a client of ``/infill``
asking at the same place, with the same other file, get the same prompt."""

from __future__ import annotations

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
