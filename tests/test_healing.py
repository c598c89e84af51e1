"""Token healing: the prompt backed up to a token boundary, the first tokens constrained to
write the removed text again, and exactness under the constraint for every drafter."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specd import Constraint, Draft, Drafter, Engine, SamplingParams, hookimpl
from specd.conformance.gtest import ALPHA, g_test
from specd.forward.target import Target
from specd.forward.tiny import tiny_model
from specd.healing import Guide, TokenBytes, heal
from specd.registry import get_plugin_manager

pytestmark = pytest.mark.usefixtures("one_thread")

# Single characters plus pieces that overlap them, so one text has many tokenizations.
PIECES = [
    *" abcdex_()=:\n",
    "ab",
    "abc",
    "abcd",
    "bc",
    "cd",
    "  ",
    "   ",
    "    ",
    " a",
    " ab",
    "\n ",
    "\n    ",
    "de",
    "ex",
    "x_",
    "):",
]


class PieceTokenizer:
    """Longest-match tokenizer over :data:`PIECES`; no control tokens."""

    eos_token_id = None
    bos_token_id = 0

    def __len__(self):
        return len(PIECES)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.encode(text)}

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            best = max((p for p in PIECES if text.startswith(p, i)), key=len)
            ids.append(PIECES.index(best))
            i += len(best)
        return ids

    def decode(self, ids, skip_special_tokens=True):
        return "".join(PIECES[int(i)] for i in ids)


class ChainDrafter(Drafter):
    """Proposes a chain of tokens read from ``PLAN`` (ids or None for a random token), so a
    test decides exactly what the verifier is offered."""

    name = "test-healing-chain"
    rng = random.Random(0)

    def propose(self, ctx, budget):
        tokens = [
            self.rng.randrange(len(PIECES)) if t is None else t for t in PLAN[: max(budget, 0)]
        ]
        return Draft(tokens=tokens, parents=list(range(-1, len(tokens) - 1))) if tokens else None


PLAN: list[int | None] = []


class TestPlugin:
    @hookimpl
    def specd_register_drafters(self, register):
        register(ChainDrafter)


@pytest.fixture(scope="module", autouse=True)
def _test_plugin():
    pm = get_plugin_manager()
    plugin = TestPlugin()
    pm.register(plugin, name="test-healing-plugin")
    yield
    pm.unregister(plugin)


def piece_engine(seed: int, scale: float) -> Engine:
    model = tiny_model(len(PIECES), seed=seed, logit_scale=scale)
    return Engine(Target(model, PieceTokenizer(), name="pieces"), max_draft=4, exit_policy="fixed")


@pytest.fixture(scope="module")
def engines():
    return [piece_engine(s, scale) for s, scale in [(0, 1.0), (1, 8.0), (2, 30.0)]]


def tok(text: str) -> int:
    return PIECES.index(text)


def allowed_by_text(rest: str) -> list[int]:
    """The allowed tokens, straight from the definition (no table, no bisect)."""
    return [i for i, p in enumerate(PIECES) if rest.startswith(p) or p.startswith(rest)]


# -- the vocabulary and the back-up -----------------------------------------------------------


def test_consistent_tokens_are_prefixes_of_the_rest_or_extend_it():
    """Guards against allowing only prefixes (``Er`` could never become ``Error``) or only
    extensions (an indent could not be written in two tokens)."""
    table = TokenBytes.from_tokenizer(PieceTokenizer(), len(PIECES))
    for rest in ["abc", "a", "   ", "\n  ", "x", "):", "e"]:
        assert table.consistent(rest.encode()) == allowed_by_text(rest), rest


# short byte strings over few symbols, 0xff among them: ranges end at the right place
BYTES = st.lists(st.sampled_from([b"a", b"\xfe", b"\xff", b" "]), min_size=1, max_size=4).map(
    b"".join
)


@given(
    st.lists(BYTES, max_size=40),
    BYTES,
)
def test_masks_match_the_definition_on_any_bytes(pieces, rest):
    """Guards the sorted-range lookup: every token that starts with the rest (up to the
    first string past them, ``\\xff`` bytes included) and every proper prefix of it, and
    nothing else; a mask asked again is the same."""
    table = TokenBytes([b""] + pieces)
    want = [
        i for i, p in enumerate(table.pieces) if p and (rest.startswith(p) or p.startswith(rest))
    ]
    assert table.consistent(rest) == want
    for _ in range(2):
        assert table.mask(rest, len(table) + 3).nonzero().flatten().tolist() == want


def test_heal_removes_the_last_token_and_constrains_its_text():
    table = TokenBytes.from_tokenizer(PieceTokenizer(), len(PIECES))
    ids = PieceTokenizer().encode("x = ab")
    healed, constraint = heal(ids, table)
    assert healed == ids[:-1] and constraint == Constraint(" ab")
    assert heal(ids[:1], table) == (ids[:1], None)  # nothing left to generate from


def test_byte_level_vocabularies_are_read_as_bytes():
    """GPT-2 style pieces: ``Ġ`` is a space, ``Ċ`` a newline; a byte that is half a
    character stays a byte. Decoding each token alone would turn it into U+FFFD."""

    class ByteLevel:
        all_special_ids = [3]

        def __len__(self):
            return 4

        def convert_ids_to_tokens(self, ids):
            return ["ĊĠĠĠĠ", "Ġindex", "Ã", "<|endoftext|>"][: len(ids)]

    table = TokenBytes.from_tokenizer(ByteLevel(), 5)
    assert table.pieces == [b"\n    ", b" index", b"\xc3", b"", b""]


def test_guide_constrains_draft_nodes_along_their_own_path():
    """Row i + 1 is constrained by what remains after node i's path, not by the root's rest:
    after ``ab`` only ``c``-tokens are allowed; after a token that breaks the text, any."""
    table = TokenBytes.from_tokenizer(PieceTokenizer(), len(PIECES))
    guide = Guide(Constraint("abc"), table, len(PIECES))
    draft = Draft(tokens=[tok("ab"), tok("c"), tok("x")], parents=[-1, 0, -1])
    rows = guide.allowed(draft, torch.device("cpu"))
    assert rows[0].nonzero().flatten().tolist() == allowed_by_text("abc")
    assert rows[1].nonzero().flatten().tolist() == allowed_by_text("c")
    assert rows[2].all() and rows[3].all()
    guide.commit([tok("a"), tok("bc")])
    assert not guide.active and guide.allowed(draft, torch.device("cpu")) is None


# -- exactness -----------------------------------------------------------------------------


def reference_greedy(engine: Engine, prompt: list[int], text: str, n: int) -> list[int]:
    """Greedy decoding under the constraint, from the model's full forward each step and the
    allowed set computed from the definition."""
    ids, out, rest = list(prompt), [], text
    model = engine.target.model
    for _ in range(n):
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1]
        if rest:
            mask = torch.full_like(logits, float("-inf"))
            mask[allowed_by_text(rest)] = 0
            logits = logits + mask
        t = int(logits.argmax())
        piece = PIECES[t]
        rest = rest[len(piece) :] if rest.startswith(piece) else ""
        ids.append(t)
        out.append(t)
    return out


@pytest.mark.parametrize("drafter", ["none", "ngram", "test-healing-chain"])
def test_greedy_under_a_constraint_equals_the_reference(engines, drafter):
    """Greedy output equals plain greedy of the healed prompt under the same constraint,
    for every drafter. Guards against a mask applied to the root row only (a drafted token
    the unconstrained argmax agrees with would be accepted mid-constraint) and against
    healing that changes what plain greedy picks."""
    rng = random.Random(1)
    texts = ["abcd", "    ", "\n    ", " ab", "x_", "):", "abc"]
    for engine in engines:
        for text in texts:
            prompt = engine.tokenize("".join(rng.choice("abcde x_()=:\n") for _ in range(12)))
            # drafts that follow the constraint with the wrong pieces, then random tokens
            PLAN[:] = [tok(text[0]), *engine.tokenize(text[1:]), None, None]
            params = SamplingParams(max_tokens=10)
            out = engine.generate(prompt, params, drafter=drafter, constraint=Constraint(text))
            want = reference_greedy(engine, prompt, text, 10)
            assert out.token_ids == want, (engine.target.model.config, text)
            assert out.text.startswith(text)


def exact_first_two(engine: Engine, prompt: list[int], text: str) -> dict[tuple[int, int], float]:
    """The law of the first two tokens under the constraint at temperature 1, exactly."""
    model = engine.target.model

    def row(ids, rest):
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        if rest:
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep[allowed_by_text(rest)] = True
            logits = logits.masked_fill(~keep, float("-inf"))
        return logits.softmax(-1)

    law = {}
    p1 = row(prompt, text)
    for a in p1.nonzero().flatten().tolist():
        piece = PIECES[a]
        rest = text[len(piece) :] if text.startswith(piece) else ""
        p2 = row(prompt + [a], rest)
        for b in p2.nonzero().flatten().tolist():
            law[(a, b)] = float(p1[a] * p2[b])
    return law


@pytest.mark.slow
def test_sampled_output_is_the_targets_law_conditioned_on_the_constraint():
    """Sampling with drafts (rejection verifier) under a two-token constraint gives the
    target's distribution restricted to the allowed tokens and renormalised, at both
    positions. The drafter always offers ``a`` then ``b`` (allowed, then allowed only on
    its own path); the G-test fails when the draft nodes' rows are left unconstrained or the
    mask is applied after warping without renormalising."""
    engine = piece_engine(3, 1.0)
    text = "abc"
    prompt = engine.tokenize("x = (d")
    law = exact_first_two(engine, prompt, text)
    PLAN[:] = [tok("a"), tok("b")]
    counts: Counter = Counter()
    n = 1500
    for seed in range(n):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=2)
        out = engine.generate(
            prompt, params, drafter="test-healing-chain", constraint=Constraint(text)
        )
        counts[tuple(out.token_ids)] += 1
    result = g_test(counts, law)
    assert not result.rejects(ALPHA), result.describe()


# -- the real model --------------------------------------------------------------------------

REAL_CASES = [
    # (text before the cursor, what the healed completion must start with after the cursor)
    ("import json\n\ntry:\n    x = json.loads(s)\nexcept json.JSONDecodeEr", "ror"),
    ("import argparse\n\ndef main():\n    parser = argparse.ArgumentParser()\n    ", "parser"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("before", "starts"), REAL_CASES, ids=["mid-word", "indent"])
def test_real_model_healed_greedy_equals_plain_greedy_under_the_constraint(
    real_engine, before, starts
):
    """On the default model: speculative greedy (n-gram drafts) equals plain greedy of the
    healed prompt under the same constraint, and the text after the cursor continues the
    word (``ror``, where the unhealed prompt gives ``rors``) or the indent (no extra
    space)."""
    ids, constraint = real_engine.heal(real_engine.tokenize(before))
    assert constraint is not None
    params = SamplingParams(max_tokens=16)
    spec = real_engine.generate(ids, params, drafter="ngram", constraint=constraint)
    plain = real_engine.generate(ids, params, drafter="none", constraint=constraint)
    assert spec.token_ids == plain.token_ids
    assert constraint.strip(spec.text).startswith(starts), spec.text
