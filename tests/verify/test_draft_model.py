"""The draft_model drafter: q is what it sampled from, its cache rolls back correctly, its
options fail clearly."""

from __future__ import annotations

import random

import pytest
import torch
from specd.plugins.draft_model import DraftModelDrafter, tiny_draft_model

from specd import (
    BadInputError,
    DraftContext,
    Engine,
    ExitPolicy,
    ModelNotFoundError,
    SamplingParams,
    warp,
)
from specd.forward.tiny import tiny_target

VOCAB = 16


def ctx_for(tokens, params, seed=0, policy=None, target=None) -> DraftContext:
    return DraftContext(
        tokens=list(tokens),
        params=params,
        generator=torch.Generator().manual_seed(seed),
        vocab_size=VOCAB,
        target=target,
        exit_policy=policy,
    )


def fresh_logits(tokens) -> torch.Tensor:
    """The draft model's logits after ``tokens``, computed from scratch."""
    model = tiny_draft_model(VOCAB, seed=1)
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0, -1]


def path(draft, node):
    return [draft.tokens[i] for i in draft.path_to(node)]


@pytest.mark.parametrize("tree", ["chain", "iid"])
def test_q_is_the_distribution_each_token_was_drawn_from_across_rollbacks(tree):
    """Over many steps with random acceptance, every q row equals warp(draft logits) of the
    node's path computed from scratch: the cache is rolled back to exactly the committed
    tokens."""
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.95)
    drafter = DraftModelDrafter(model="tiny:1", tree=tree, branch=2)
    ctx = ctx_for([3, 1, 4, 1, 5], params)
    drafter.start(ctx)
    rng = random.Random(0)
    for _ in range(12):
        draft = drafter.propose(ctx, 5)
        assert draft is not None and draft.q is not None and len(draft) <= 5
        for i in range(len(draft)):
            parent_path = path(draft, draft.parents[i]) if draft.parents[i] >= 0 else []
            want = warp(fresh_logits(ctx.tokens + parent_path), params)
            torch.testing.assert_close(draft.q[i], want, atol=1e-5, rtol=1e-4)
            assert draft.q[i][draft.tokens[i]] > 0  # it could have been drawn
        leaf = max(range(len(draft)), key=lambda i: len(draft.path_to(i)))
        accepted = rng.randint(0, len(draft.path_to(leaf)))
        new = path(draft, leaf)[:accepted] + [rng.randrange(VOCAB)]
        ctx.tokens.extend(new)
        drafter.commit(ctx, new, accepted)


def test_temperature_zero_drafts_the_argmax_chain_with_no_q():
    drafter = DraftModelDrafter(model="tiny:1")
    ctx = ctx_for([2, 7, 1], SamplingParams(temperature=0.0))
    drafter.start(ctx)
    draft = drafter.propose(ctx, 4)
    assert draft.q is None and draft.is_chain
    prefix = list(ctx.tokens)
    for t in draft.tokens:
        assert t == int(fresh_logits(prefix).argmax())
        prefix.append(t)


def test_iid_tree_siblings_share_their_row_and_the_likeliest_is_extended():
    params = SamplingParams(temperature=1.0)
    drafter = DraftModelDrafter(model="tiny:1", tree="iid", branch=3)
    ctx = ctx_for([5, 6, 7], params, seed=3)
    drafter.start(ctx)
    draft = drafter.propose(ctx, 7)
    root = [i for i, p in enumerate(draft.parents) if p == -1]
    assert len(root) == 3
    assert all(torch.equal(draft.q[i], draft.q[root[0]]) for i in root)
    extended = {p for p in draft.parents if p >= 0}
    assert len(extended) <= 2
    first_level_parent = min(extended)
    best = max(root, key=lambda i: float(draft.q[i][draft.tokens[i]]))
    assert draft.tokens[first_level_parent] == draft.tokens[best]


def test_topk_tree_is_deterministic_and_distinct():
    drafter = DraftModelDrafter(model="tiny:1", tree="topk", branch=3)
    ctx = ctx_for([1, 2, 3], SamplingParams(temperature=1.0))
    drafter.start(ctx)
    draft = drafter.propose(ctx, 6)
    assert draft.q is None
    root = [draft.tokens[i] for i, p in enumerate(draft.parents) if p == -1]
    assert root == fresh_logits(ctx.tokens).topk(3).indices.tolist()
    for node in set(draft.parents) - {-1}:
        kids = [draft.tokens[i] for i, p in enumerate(draft.parents) if p == node]
        assert len(kids) == len(set(kids))


class _StopAfter(ExitPolicy):
    name = "test-stop-after"

    def __init__(self, levels: int) -> None:
        self.levels = levels
        self.asked: list[tuple[int, float]] = []

    def draft_budget(self) -> int:
        return 8

    def continue_drafting(self, position: int, confidence: float) -> bool:
        self.asked.append((position, confidence))
        return position < self.levels


def test_drafting_stops_when_the_exit_policy_says_so():
    policy = _StopAfter(2)
    drafter = DraftModelDrafter(model="tiny:1")
    ctx = ctx_for([4, 4, 4], SamplingParams(temperature=1.0), policy=policy)
    drafter.start(ctx)
    draft = drafter.propose(ctx, 8)
    assert len(draft) == 2
    assert [pos for pos, _ in policy.asked] == [1, 2]
    # The confidence is the drafter's probability of the token it just drew.
    assert policy.asked[0][1] == pytest.approx(float(draft.q[0][draft.tokens[0]]))


def test_a_prompt_that_extends_the_last_one_is_not_recomputed():
    drafter = DraftModelDrafter(model="tiny:1")
    params = SamplingParams(temperature=1.0)
    ctx = ctx_for(list(range(10)), params)
    drafter.start(ctx)
    drafter.propose(ctx, 2)
    fed: list[int] = []
    model = drafter._model
    original = model.prefill

    def counting_prefill(cache, tokens):
        fed.extend(tokens)
        return original(cache, tokens)

    model.prefill = counting_prefill
    ctx2 = ctx_for(list(range(10)) + [3, 3, 3], params)
    drafter.start(ctx2)
    drafter.propose(ctx2, 2)
    assert fed == [3, 3]  # only the new tokens (the last one is fed by forward)


def test_drafting_with_the_target_itself_accepts_everything():
    """model=target: q equals p (up to rounding), so every draft token is accepted."""
    target = tiny_target(VOCAB, seed=0, logit_scale=4.0)
    engine = Engine(
        target,
        drafter="draft_model",
        exit_policy="fixed",
        max_draft=4,
        drafter_options={"draft_model": {"model": "target"}},
    )
    out = engine.generate([1, 2, 3], SamplingParams(temperature=1.0, seed=0, max_tokens=24))
    assert out.stats.drafted > 0 and out.stats.fallback is None
    assert out.stats.accepted == out.stats.drafted


def test_vocabularies_of_other_sizes_are_fitted():
    logits = torch.arange(5.0)
    assert DraftModelDrafter._fit(logits, 3).tolist() == [0.0, 1.0, 2.0]
    padded = DraftModelDrafter._fit(logits, 7)
    assert padded[:5].tolist() == logits.tolist() and torch.isinf(padded[5:]).all()


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({}, BadInputError, "--drafter-option model="),
        (
            {"model": "tiny:1", "tree": "bush"},
            BadInputError,
            "tree must be one of chain, iid, topk",
        ),
        (
            {"model": "tiny:1", "branch": 0},
            BadInputError,
            "branch=0: expected an integer from 1 to 64",
        ),
        (
            {"model": "tiny:1", "max_draft": 0},
            BadInputError,
            "max_draft=0: expected an integer from 1 to 256",
        ),
        ({"model": "/nonexistent/draft"}, ModelNotFoundError, "unknown model"),
    ],
)
def test_bad_options_fail_with_a_message_naming_them(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        DraftModelDrafter(**kwargs)


def test_a_malformed_tiny_spec_is_named():
    drafter = DraftModelDrafter(model="tiny:abc")
    with pytest.raises(BadInputError, match="tiny:SEED"):
        drafter.start(ctx_for([1, 2], SamplingParams()))


def test_proposing_again_without_a_commit_drafts_from_the_committed_tokens():
    """A step whose draft was dropped (the engine fell back) leaves the cache holding draft
    tokens; the next proposal must still start from what was committed."""
    params = SamplingParams(temperature=0.0)
    drafter = DraftModelDrafter(model="tiny:1")
    ctx = ctx_for([9, 8, 7, 6], params)
    drafter.start(ctx)
    first = drafter.propose(ctx, 4)
    again = drafter.propose(ctx, 4)
    assert again.tokens == first.tokens
