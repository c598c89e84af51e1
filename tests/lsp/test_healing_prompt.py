"""Token healing in the completion pipeline: the prompt ends at a token boundary, the model
writes the cut text again, and the suggestion starts at the cursor."""

from __future__ import annotations

import pytest
from specd.lsp import prompting
from specd.lsp.completer import Completer, CompletionRequest
from specd.lsp.config import Settings
from specd.lsp.documents import Document

from specd import Constraint, Engine, SamplingParams
from specd.forward.tiny import tiny_target


def _cursor(text: str):
    """``text`` with ``|`` at the cursor."""
    i = text.index("|")
    doc = Document("file:///w/a.py", text[:i] + text[i + 1 :])
    line = text[:i].count("\n")
    col = len(text[:i].rsplit("\n", 1)[-1])
    return doc.cursor(doc.resolve(line, col), before_chars=4000, after_chars=400)


class Chars:
    """One token per character; control tokens by name."""

    bos_token_id = None

    def get_vocab(self):
        return {"<fim_prefix>": 1001, "<fim_suffix>": 1002, "<fim_middle>": 1003}


def _heal(ids):
    return ids[:-1], Constraint(chr(ids[-1]))


def test_the_prefix_is_healed_before_the_fim_suffix():
    """The cut is made at the end of the prefix, not at the end of the prompt (which for a
    FIM template is ``<fim_middle>``)."""
    vocab = prompting.Vocabulary(lambda s: [ord(c) for c in s], Chars())
    template = prompting.TEMPLATES["starcoder"]
    p = prompting.build(template, vocab, _cursor("x = fo|\ny = 1\n"), heal=_heal)
    assert p.constraint == Constraint("o")
    assert p.ids[: p.ids.index(1002)] == [1001, *map(ord, "x = f")]
    assert p.ids[-1] == 1003
    assert p.at_cursor("oo(1)") == "o(1)" and p.at_cursor("") == ""


@pytest.fixture(scope="module")
def completer():
    return Completer(Engine(tiny_target(logit_scale=8.0)), SamplingParams(max_tokens=12))


@pytest.mark.parametrize("before", ["def f(x):\n    re|", "value = compute(|", "x = 1\n    |"])
def test_with_one_token_per_character_healing_changes_nothing_shown(completer, before):
    """With one token per character, the only token that writes the cut character is that
    character, so the healed completion must equal the unhealed one. Guards against showing
    the cut text again (the suggestion would start with it) and against a constraint lost
    on the way to the engine."""
    cursor = _cursor(before)
    budget = 120_000  # a budget no loaded machine runs out of
    # healing spends one token of max-tokens writing the cut character again
    on = CompletionRequest(cursor, "a.py", Settings(time_budget_ms=budget, max_tokens=13))
    off = CompletionRequest(
        cursor, "a.py", Settings(time_budget_ms=budget, max_tokens=12, token_healing=False)
    )
    healed, plain = completer.complete(on), completer.complete(off)
    assert completer.build_prompt(on).constraint is not None
    assert healed.text == plain.text
    assert healed.raw_text == cursor.before[-1] + plain.raw_text
