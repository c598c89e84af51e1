"""Prompt templates per model family, the prefix-only fallback, and context budgets."""

from __future__ import annotations

import pytest
from specd.lsp import prompting
from specd.lsp.documents import Document
from specd.lsp.prompting import Budget, ContextDocument, Vocabulary, build, choose_template


class FakeTokenizer:
    """One token per character (id = code point); control tokens get ids from 1_000_000."""

    bos_token_id = 7

    def __init__(self, specials=()):
        self.specials = {t: 1_000_000 + i for i, t in enumerate(specials)}

    def get_vocab(self):
        return dict(self.specials)

    def encode(self, text):
        return [ord(c) for c in text]


def _vocab(*specials):
    tok = FakeTokenizer(specials)
    return Vocabulary(tok.encode, tok), tok


def _cursor(text="def f():\n    ret", after="\nprint(f())\n"):
    doc = Document("file:///w/a.py", text + after)
    lines = text.split("\n")
    return doc.cursor(
        doc.resolve(len(lines) - 1, len(lines[-1])), before_chars=10_000, after_chars=10_000
    )


def _render(ids, tok):
    names = {v: k for k, v in tok.specials.items()}
    return "".join(names.get(i, "<s>" if i == tok.bos_token_id else chr(i)) for i in ids)


def test_without_fim_tokens_the_prompt_is_the_prefix():
    vocab, tok = _vocab("<file_sep>", "<repo_name>")  # like SmolLM2: no FIM tokens
    assert choose_template(vocab) is None
    p = build(None, vocab, _cursor(), path="a.py")
    assert _render(p.ids, tok) == "def f():\n    ret" and p.template == "prefix-only"


def test_default_model_tokenizer_is_prefix_only():
    """Found the way ``specd`` finds it (specd.forward.models, which converts it on first use).
    Skipped only where the default model's package is not installed: installed but not
    found is a failure."""
    from importlib.metadata import PackageNotFoundError, distribution

    from specd.forward import models

    source = models.ALIASES[models.DEFAULT_MODEL]
    try:
        distribution(source.distribution)
    except PackageNotFoundError:
        pytest.skip(f"the default model is not installed ({source.install})")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.resolve(models.DEFAULT_MODEL))
    assert (
        choose_template(Vocabulary(lambda s: tok(s, add_special_tokens=False)["input_ids"], tok))
        is None
    )


@pytest.mark.parametrize(
    ("name", "specials", "expected"),
    [
        (
            "starcoder",
            ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"),
            "<fim_prefix>def f():\n    ret<fim_suffix>\nprint(f())\n<fim_middle>",
        ),
        (
            "qwen",
            ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"),
            "<|fim_prefix|>def f():\n    ret<|fim_suffix|>\nprint(f())\n<|fim_middle|>",
        ),
        (
            "codellama",
            ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"),
            "<s>▁<PRE>def f():\n    ret▁<SUF>\nprint(f())\n▁<MID>",
        ),
        (
            "deepseek",
            ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
            "<s><｜fim▁begin｜>def f():\n    ret<｜fim▁hole｜>\nprint(f())\n<｜fim▁end｜>",
        ),
        (
            "codestral",
            ("[PREFIX]", "[SUFFIX]"),
            "<s>[SUFFIX]\nprint(f())\n[PREFIX]def f():\n    ret",
        ),
    ],
)
def test_fim_templates(name, specials, expected):
    vocab, tok = _vocab(*specials)
    template = choose_template(vocab)
    assert template is not None and template.name == name
    p = build(template, vocab, _cursor(), path="a.py")
    assert _render(p.ids, tok) == expected
    stops = {tok.specials[t] for t in template.stop if t in tok.specials}
    assert p.stop_ids == stops


def test_setting_picks_or_disables_a_template():
    vocab, _ = _vocab("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert choose_template(vocab, "none") is None
    assert choose_template(vocab, "starcoder").name == "starcoder"
    assert choose_template(vocab, "qwen") is None  # asked for, but the tokens are missing


def test_qwen_repo_level_prompt_with_file_separators():
    vocab, tok = _vocab(
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>", "<|repo_name|>"
    )
    others = [ContextDocument("lib/util.py", [ord(c) for c in "def helper(): pass"])]
    p = build(choose_template(vocab), vocab, _cursor(), path="a.py", others=others)
    assert _render(p.ids, tok) == (
        "<|file_sep|>lib/util.py\ndef helper(): pass\n"
        "<|file_sep|>a.py\n<|fim_prefix|>def f():\n    ret<|fim_suffix|>\nprint(f())\n<|fim_middle|>"
    )
    assert p.context_documents == 1


def test_prefix_only_context_uses_comment_headers_within_budget():
    vocab, tok = _vocab()
    others = [
        ContextDocument("b.py", [ord(c) for c in "B = 1"]),
        ContextDocument("c.py", [ord(c) for c in "C" * 500]),  # does not fit: skipped
        ContextDocument("d.py", [ord(c) for c in "D = 2"]),
    ]
    p = build(None, vocab, _cursor(), path="a.py", others=others, budget=Budget(context_tokens=40))
    text = _render(p.ids, tok)
    assert text.startswith("# b.py\nB = 1\n\n# d.py\nD = 2\n\n# a.py\ndef f():")
    assert p.context_documents == 2
    assert len(p.ids) - p.prefix_tokens <= 40 + len("# a.py\n")


def test_long_prefix_is_cut_in_steps_so_the_start_is_stable():
    vocab, _ = _vocab()
    a = build(None, vocab, _cursor("x" * 1000, ""), budget=Budget(prefix_tokens=300))
    b = build(None, vocab, _cursor("x" * 1000 + "y", ""), budget=Budget(prefix_tokens=300))
    assert len(a.ids) <= 300 and len(b.ids) <= 300
    assert b.ids[: len(a.ids)] == a.ids  # one more keystroke only appends


def test_display_path():
    assert prompting.display_path("file:///w/src/a%20b.py", "file:///w") == "src/a b.py"
    assert prompting.display_path("file:///elsewhere/x.rs", "file:///w") == "x.rs"
    assert prompting.display_path("untitled:1", None) == "1"
