"""Greedy speculation is token-identical to plain greedy decoding and to HF generate."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specd import Draft, Drafter, Engine, ExitPolicy, SamplingParams, hookimpl
from specd.forward.tiny import tiny_target
from specd.registry import get_plugin_manager

VOCAB = 48

pytestmark = pytest.mark.usefixtures("one_thread")


class OracleTreeDrafter(Drafter):
    """Proposes a random token tree. One branch follows a known continuation with random
    mistakes; the other branches are random. Exactness must not depend on the draft."""

    name = "test-oracle-tree"
    reads_cache = False
    reference: list[int] = []
    rng = random.Random(0)
    drafts: list[Draft | None] = []  # every draft proposed, in order

    def start(self, ctx):
        self.prompt_len = len(ctx.tokens)

    def propose(self, ctx, budget):
        done = len(ctx.tokens) - self.prompt_len
        truth = self.reference[done : done + budget]
        tokens, parents = [], []
        parent = -1
        for t in truth:
            if len(tokens) >= budget:
                break
            tok = t if self.rng.random() < 0.8 else self.rng.randrange(VOCAB)
            tokens.append(tok)
            parents.append(parent)
            parent = len(tokens) - 1
            if len(tokens) < budget and self.rng.random() < 0.5:  # a random sibling branch
                tokens.append(self.rng.randrange(VOCAB))
                parents.append(parents[-1])
        draft = Draft(tokens=tokens[:budget], parents=parents[:budget]) if tokens else None
        self.drafts.append(draft)
        return draft


class RecordingPolicy(ExitPolicy):
    """The full budget every step; remembers what each step reported."""

    name = "test-recording"
    seen: list[tuple[int, int]] = []

    def start(self, max_budget):
        self.budget = max_budget

    def draft_budget(self):
        return self.budget

    def observe(self, drafted, accepted):
        self.seen.append((drafted, accepted))


class CacheReadingDrafter(Drafter):
    """Drafts nothing; checks the contract a drafter that reads the target's cache has."""

    name = "test-cache-reader"
    seen: list[tuple[int, int]] = []

    def propose(self, ctx, budget):
        self.seen.append((ctx.cache.length, len(ctx.tokens) - 1))
        return None


class TestPlugin:
    @hookimpl
    def specd_register_drafters(self, register):
        register(OracleTreeDrafter)
        register(CacheReadingDrafter)

    @hookimpl
    def specd_register_exit_policies(self, register):
        register(RecordingPolicy)


@pytest.fixture(scope="module", autouse=True)
def _test_plugin():
    pm = get_plugin_manager()
    plugin = TestPlugin()
    pm.register(plugin, name="test-oracle-plugin")
    yield
    pm.unregister(plugin)


@pytest.fixture(scope="module")
def engines():
    return [
        Engine(tiny_target(VOCAB, seed=s, logit_scale=scale), max_draft=6, exit_policy="fixed")
        for s, scale in [(0, 1.0), (1, 20.0), (2, 60.0)]
    ]


prompts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)


def hf_greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    model = engine.target.model
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    return out[0, len(prompt) :].tolist()


@given(prompt=prompts, which=st.integers(0, 2), n=st.integers(1, 24), pattern=st.integers(0, 3))
def test_ngram_greedy_is_identical_to_plain_and_hf(engines, prompt, which, n, pattern):
    engine = engines[which]
    if pattern:  # repetitive prompts give the drafter something to copy
        prompt = (prompt[: pattern * 3] or [1]) * 4
    params = SamplingParams(max_tokens=n)
    plain = engine.generate(prompt, params, drafter="none")
    spec = engine.generate(prompt, params, drafter="ngram")
    assert spec.token_ids == plain.token_ids
    assert plain.stats.target_steps == n
    assert spec.token_ids == hf_greedy(engine, prompt, n)


@given(prompt=prompts, which=st.integers(0, 2), n=st.integers(1, 24), seed=st.integers(0, 10**6))
def test_tree_drafts_are_identical_to_plain(engines, prompt, which, n, seed):
    engine = engines[which]
    params = SamplingParams(max_tokens=n)
    plain = engine.generate(prompt, params, drafter="none")
    OracleTreeDrafter.reference = plain.token_ids
    OracleTreeDrafter.rng = random.Random(seed)
    tree = engine.generate(prompt, params, drafter="test-oracle-tree")
    assert tree.token_ids == plain.token_ids
    s = tree.stats
    # every step emits the draft tokens it accepted and one of the target's (drafts never
    # run past max_tokens, and these prompts have no stop)
    assert s.accepted <= s.drafted and s.new_tokens == s.accepted + s.target_steps


def test_the_policy_judges_a_tree_by_its_deepest_path(engines):
    # a tree of 6 nodes 3 deep that is accepted to its end was accepted whole: the policy
    # must hear 3 drafted, not 6, or it shrinks the budget of every tree drafter
    engine, prompt = engines[0], [1, 2, 3, 4, 5]
    params = SamplingParams(max_tokens=24)
    OracleTreeDrafter.reference = engine.generate(prompt, params, drafter="none").token_ids
    OracleTreeDrafter.rng = random.Random(3)
    OracleTreeDrafter.drafts, RecordingPolicy.seen = [], []
    engine.generate(prompt, params, drafter="test-oracle-tree", exit_policy="test-recording")
    drafts = OracleTreeDrafter.drafts
    assert len(RecordingPolicy.seen) == len(drafts) > 0
    assert any(d is not None and max(d.depths()) < len(d) for d in drafts)  # real trees
    for d, (drafted, accepted) in zip(drafts, RecordingPolicy.seen):
        assert drafted == (max(d.depths()) if d is not None else 0)
        assert accepted <= drafted


def test_ngram_speculation_on_a_repetitive_prompt_is_identical_and_counted(engines):
    """How much is accepted is checked on a target built to repeat (test_acceptance.py);
    here, that the counts of drafted and accepted tokens agree with what was emitted."""
    engine = engines[2]
    prompt = list(range(10)) * 6
    out = engine.generate(prompt, SamplingParams(max_tokens=32), drafter="ngram")
    plain = engine.generate(prompt, SamplingParams(max_tokens=32), drafter="none")
    assert out.token_ids == plain.token_ids
    s = out.stats
    assert s.new_tokens == 32 and s.drafted > 0
    assert s.accepted <= s.drafted
    # every step emits the draft tokens it accepted and one of the target's
    assert s.new_tokens == s.accepted + s.target_steps
    # a chain: each drafted token sits at one position
    assert sum(s.position_drafted) == s.drafted


def test_prefix_reuse_gives_the_same_tokens(engines):
    engine = engines[1]
    base = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5] * 3
    cold = Engine(engine.target, max_draft=6).generate(base + [7], SamplingParams(max_tokens=16))
    engine.generate(base + [8, 8], SamplingParams(max_tokens=16))
    warm = engine.generate(base + [7], SamplingParams(max_tokens=16))
    assert warm.stats.reused_tokens >= len(base)
    assert warm.token_ids == cold.token_ids


@given(
    base=st.lists(st.integers(0, VOCAB - 1), min_size=33, max_size=60),  # > min_reuse
    typed=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    which=st.integers(0, 2),
    drafter=st.sampled_from(["none", "ngram", "test-oracle-tree", "test-cache-reader"]),
)
def test_tokens_typed_since_a_cached_prompt_go_with_the_first_step(
    engines, base, typed, which, drafter
):
    """A prompt extending a cached one by fewer than FEED_TOKENS tokens is not prefilled:
    its new tokens are fed with the first step's draft, and the output is still plain
    greedy's. A drafter that reads the target's cache finds it complete."""
    from specd.engine import FEED_TOKENS

    engine = engines[which]
    n = 10
    OracleTreeDrafter.reference = hf_greedy(engine, base + typed, n)
    engine.generate(base, SamplingParams(max_tokens=2), drafter=drafter)
    chunks = []
    prefill = engine.target.prefill
    engine.target.prefill = lambda cache, tokens, *a, **k: (
        chunks.append(len(tokens)) or prefill(cache, tokens, *a, **k)
    )
    CacheReadingDrafter.seen.clear()
    try:
        out = engine.generate(base + typed, SamplingParams(max_tokens=n), drafter=drafter)
    finally:
        del engine.target.prefill
    assert out.token_ids == OracleTreeDrafter.reference
    assert out.stats.reused_tokens >= len(base) - 1
    left = len(base) + len(typed) - 1 - out.stats.reused_tokens  # not in the cache
    if left < FEED_TOKENS and drafter != "test-cache-reader":
        assert chunks == []  # one forward: the typed tokens, the pending one and the draft
    else:
        assert sum(chunks) == left
    if drafter == "test-cache-reader":
        assert CacheReadingDrafter.seen  # asked at every step, with the cache complete
        assert all(held == committed for held, committed in CacheReadingDrafter.seen)


def test_stop_strings_and_eos():
    target = tiny_target(VOCAB, seed=1, logit_scale=20.0)
    engine = Engine(target)
    free = engine.generate([5, 6, 7], SamplingParams(max_tokens=20))
    text = free.text
    stop = text[4:6]
    cut = engine.generate([5, 6, 7], SamplingParams(max_tokens=20, stop=(stop,)))
    assert cut.text == text[: text.index(stop)]
    assert cut.stats.finish_reason == "stop"
    eos = free.token_ids[3]
    eos_target = tiny_target(VOCAB, seed=1, logit_scale=20.0, eos_token_id=eos)
    out = Engine(eos_target).generate([5, 6, 7], SamplingParams(max_tokens=20))
    assert out.token_ids == free.token_ids[: free.token_ids.index(eos)]
    assert out.stats.finish_reason == "eos"


def test_cancellation_stops_within_one_step():
    engine = Engine(tiny_target(VOCAB, seed=0), drafter="none")
    steps = []

    def cancel():
        steps.append(1)
        return len(steps) > 3

    out = engine.generate([1], SamplingParams(max_tokens=50), cancel=cancel)  # no prefill
    assert out.stats.finish_reason == "cancelled"
    assert out.stats.target_steps == 3


def test_time_budget():
    engine = Engine(tiny_target(VOCAB, seed=0), drafter="none")
    out = engine.generate([1, 2, 3], SamplingParams(max_tokens=10_000), time_budget_s=0.5)
    assert out.stats.finish_reason == "time"
    assert out.stats.new_tokens < 10_000


def test_cancellation_during_a_long_prefill_keeps_what_was_computed():
    from specd.forward.passes import FIRST_CHUNK, PREFILL_CHUNK

    engine = Engine(tiny_target(VOCAB, seed=0), drafter="none")
    prompt = [i % VOCAB for i in range(FIRST_CHUNK + PREFILL_CHUNK * 2 + 5)]
    checks = []

    def cancel():
        checks.append(1)
        return len(checks) > 2  # after the first pass (FIRST_CHUNK) and one more chunk

    out = engine.generate(prompt, SamplingParams(max_tokens=5), cancel=cancel)
    assert out.stats.finish_reason == "cancelled" and out.token_ids == []
    again = engine.generate(prompt, SamplingParams(max_tokens=5))
    assert again.stats.reused_tokens == FIRST_CHUNK + PREFILL_CHUNK
    cold = Engine(engine.target, drafter="none").generate(prompt, SamplingParams(max_tokens=5))
    assert again.token_ids == cold.token_ids


def test_streaming_concatenates_to_the_text():
    engine = Engine(tiny_target(VOCAB, seed=3, logit_scale=20.0))
    gen = engine.stream([1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=30))
    pieces = list(gen)
    assert "".join(d.text for d in pieces) == gen.completion.text
    assert sum((d.token_ids for d in pieces), []) == gen.completion.token_ids


def test_same_seed_same_sample():
    engine = Engine(tiny_target(VOCAB, seed=3), drafter="none")
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=7)
    assert engine.generate([1, 2], p).token_ids == engine.generate([1, 2], p).token_ids
