"""The EAGLE drafter: exact output, a head cache in step with the engine's, the true q, the
training-time test drafting the way the drafter does, and the head file's refusal."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specd.plugins.eagle.drafter import EagleDrafter
from specd.plugins.eagle.head import EagleHead, HeadConfig
from specd.plugins.eagle.headfile import (
    HeadMismatchError,
    load_head,
    random_head,
    save_head,
    shipped_head,
)

from specd import BadInputError, DraftContext, Engine, SamplingParams, Target
from specd.forward.products import weight_major
from specd.forward.tiny import tiny_model, tiny_target

VOCAB = 48
TARGET = tiny_target(VOCAB, seed=2, logit_scale=30.0, num_layers=2)
DRAFT_VOCAB = 40  # tokens 40..47 can never be drafted

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    """A fully random head (every weight random, unlike ``head=random``) for TARGET."""
    torch.manual_seed(1)
    head = EagleHead(HeadConfig.for_target(TARGET.config), torch.arange(DRAFT_VOCAB))
    path = tmp_path_factory.mktemp("heads") / "tiny.safetensors"
    save_head(path, head.to(torch.float64), TARGET, "specd train eagle --model tiny")
    return str(path)


def engine(head_file, **options) -> Engine:
    return Engine(
        TARGET, drafter_options={"eagle": {"head": head_file, **options}}, exit_policy="fixed"
    )


@settings(max_examples=20)
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    shape=st.sampled_from([(1, 1, 0.0), (2, 2, 0.0), (3, 2, 0.0), (3, 3, 0.05)]),
)
def test_greedy_eagle_is_identical_to_plain(head_file, prompt, shape):
    topk, width, min_prob = shape
    e = engine(head_file, topk=topk, width=width, min_prob=min_prob)
    params = SamplingParams(max_tokens=16)
    spec = e.generate(prompt, params, drafter="eagle")
    # a malformed draft would fall back to plain decoding and still match: rule that out
    assert spec.stats.fallback is None and spec.stats.drafted > 0
    assert spec.token_ids == e.generate(prompt, params, drafter="none").token_ids


@settings(max_examples=10)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=20, max_size=48))
def test_a_window_shorter_than_the_prompt_prefills_its_features_alone(head_file, prompt):
    """Prompts longer than the tokens a first step feeds (16) are prefilled first."""
    e = engine(head_file, window=3)
    seen: list[tuple[int, ...]] = []
    real = EagleDrafter.start

    def start(self, ctx):
        seen.append(tuple(ctx.hidden.shape) if ctx.hidden is not None else ())
        real(self, ctx)

    EagleDrafter.start = start  # type: ignore[method-assign]
    try:
        params = SamplingParams(max_tokens=12)
        spec = e.generate(prompt, params, drafter="eagle")
    finally:
        EagleDrafter.start = real  # type: ignore[method-assign]
    # the prompt's last three features only, and the same tokens as plain decoding
    assert seen == [(3, TARGET.config.hidden_size)]
    assert spec.token_ids == e.generate(prompt, params, drafter="none").token_ids


def test_both_forward_paths_return_the_features_the_lm_head_reads():
    """Bug guarded: the lean forward returned the hidden states before the final norm and
    Hugging Face's forward after it, so a head trained on one read garbage on the other."""
    model = tiny_model(VOCAB, seed=4)
    outs = []
    for fast in (True, False):
        target = Target(model, TARGET.tokenizer, fast=fast)
        outs.append(target.forward(target.new_cache(), [3, 1, 4, 1, 5], hidden=True))
    torch.testing.assert_close(outs[0].hidden, outs[1].hidden)
    with torch.no_grad():
        logits = model.lm_head(outs[0].hidden.clone())
    torch.testing.assert_close(logits, outs[0].logits)


def _fresh_outputs(head: EagleHead, tokens: list[int]) -> torch.Tensor:
    """The head's teacher-forced outputs for every position of ``tokens``, from scratch."""
    with torch.inference_mode():
        out = TARGET.forward(TARGET.new_cache(), tokens, hidden=True)
        feat = out.hidden
        emb = TARGET.model.get_input_embeddings().weight[torch.tensor(tokens[1:])]
        return head.unrolled(feat[None, :-1], emb[None], 1)[0][0]  # [T - 1, H]


@pytest.mark.parametrize("shape", [(1, 1), (3, 2)])
def test_the_head_cache_follows_commits_rollbacks_and_requests(head_file, shape):
    """Bug guarded: draft entries left in the head's cache after a step, or true entries fed
    at the wrong position, make later drafts read a context the target never had."""
    topk, width = shape
    e = engine(head_file, topk=topk, width=width)
    params = SamplingParams(max_tokens=20)
    # the second and third prompts share a prefix with the first (prefix reuse, rollback)
    for prompt in ([5, 9, 3, 7, 1, 2], [5, 9, 3, 7, 11, 4, 8], [5, 9, 3, 7, 11, 4, 8, 2, 6]):
        e.generate(prompt, params, drafter="eagle")
        drafter = e.plugins.drafter("eagle")
        assert isinstance(drafter, EagleDrafter) and drafter._head is not None
        fresh = _fresh_outputs(drafter._head, drafter._tokens)
        assert drafter._pos == list(range(len(drafter._pos)))
        assert len(drafter._pos) >= len(drafter._tokens) - 3
        # a batch of true entries computes the newest one's output only (the next root)
        done = [i for i, out in enumerate(drafter._outs) if out is not None]
        assert done and done[-1] == len(drafter._pos) - 1
        torch.testing.assert_close(torch.stack([drafter._outs[i] for i in done]), fresh[done])
        # one skipped is computed when it becomes the root (a request that stops there)
        drafter._outs[-1] = None
        with torch.inference_mode():
            torch.testing.assert_close(drafter._root(), fresh[len(drafter._pos) - 1])


def test_greedy_requests_feed_the_typed_tokens_with_the_first_step(head_file, monkeypatch):
    """Bug guarded: for a drafter that reads features, the tokens typed since the cached
    prompt were read in a prefill pass of their own, one target pass per keystroke more
    than for ``ngram``. They now go with the first step, whose features the head gets at
    its first commit."""
    e, plain = engine(head_file), engine(head_file)
    params = SamplingParams(max_tokens=12)
    # longer than the shortest prefix the prefix cache reuses
    prompt = [5, 9, 3, 7, 1, 2, 8, 4, 6, *range(10, 40)]
    e.generate(prompt, params, drafter="eagle")
    prefilled: list[int] = []
    real = TARGET.prefill

    def prefill(cache, tokens, *args, **kwargs):
        prefilled.append(len(tokens))
        return real(cache, tokens, *args, **kwargs)

    monkeypatch.setattr(TARGET, "prefill", prefill)
    for typed in (prompt + [7, 1], prompt + [7, 1, 2, 8, 4], prompt[:-3] + [6]):
        prefilled.clear()
        out = e.generate(typed, params, drafter="eagle")
        assert sum(prefilled) == 0, typed  # nothing read apart from the steps
        assert out.stats.drafted > 0
        assert out.token_ids == plain.generate(typed, params, drafter="none").token_ids
    # sampling reads the whole prompt first: a seed draws alike whatever was cached
    prefilled.clear()
    e.generate(prompt + [6, 6], SamplingParams(max_tokens=2, temperature=1.0, seed=1))
    assert sum(prefilled) > 0


def test_a_long_prompt_feeds_only_the_window(head_file):
    """Entries older than the window are never attended to, so a long prompt's catch-up
    computes the last ``window`` only, at their true positions."""
    window, prompt = 5, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    drafter = EagleDrafter(head=head_file, window=window)
    ctx = _ctx(prompt, SamplingParams())
    feat = ctx.hidden
    drafter.start(ctx)
    assert drafter.propose(ctx, 2) is not None
    pending = len(prompt) - 1
    assert drafter._pos == list(range(pending - window, pending))
    head = drafter._head
    assert head is not None
    with torch.inference_mode():
        # the same entries from scratch: features of tokens j, embeddings of tokens j + 1
        j = torch.arange(pending - window, pending)
        emb = TARGET.model.get_input_embeddings().weight[torch.tensor(prompt)[j + 1]]
        x = head.entries(feat[j][None], emb[None])
        q, k, v = head.keys_values(x, j)
        want = head.finish(x, q, k, v, None)[0, -1]
    torch.testing.assert_close(drafter._outs[-1], want)


def test_draft_entries_attend_to_the_window_their_ancestors_and_themselves(head_file):
    """Bug guarded: a draft entry that attends to true entries older than the window (or
    misses some inside it, or its ancestors) once the sequence outgrows the window: the
    head then drafts from a context it was not trained on. Checked against the head's layer
    over every cached entry with a mask that shows exactly those."""
    window = 4
    e = engine(head_file, window=window, topk=2, width=2)
    e.generate([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], SamplingParams(max_tokens=10), drafter="eagle")
    drafter = e.plugins.drafter("eagle")
    assert isinstance(drafter, EagleDrafter) and drafter._head is not None
    head, true = drafter._head, drafter._cache.length
    assert len(drafter._pos) == true > window + 2  # the window no longer covers them
    pending = drafter._pos[-1] + 1
    with torch.inference_mode():
        # the root computed alone (a request that stops where a batch skipped it): the
        # window's entries before it, and itself
        drafter._outs[-1] = None
        root = drafter._root()
        p, entry = drafter._pos[-1], drafter._ins[-1][None, None]
        x = head.entries(entry, drafter._embed[torch.tensor([drafter._tokens[p + 1]])][None])
        q, _, _ = head.keys_values(x, torch.tensor([p]))
        seen = torch.zeros(1, true, dtype=torch.bool)
        seen[:, true - 1 - window :] = True
        layer = drafter._cache.layer(0)
        keys, values = layer.keys[:, :, :true], layer.values[:, :, :true]
        torch.testing.assert_close(root, head.finish(x, q, keys, values, seen)[0, 0])
        feat = root[None]
        tokens = torch.tensor([7, 8])
        drafter._entries(feat, tokens[:1], [pending], [[]])  # a child of the root
        got = drafter._entries(feat, tokens[1:], [pending + 1], [[true]])  # its child
        keys, values = layer.keys[:, :, : true + 2], layer.values[:, :, : true + 2]
        x = head.entries(feat[None], drafter._embed[tokens[1:]][None])
        q, _, _ = head.keys_values(x, torch.tensor([pending + 1]))
        seen = torch.zeros(1, true + 2, dtype=torch.bool)
        seen[:, true - window : true] = True  # the window's true entries
        seen[:, true : true + 2] = True  # its parent and itself
        want = head.finish(x, q, keys, values, seen)[0]
        drafter._crop(true)
    torch.testing.assert_close(got, want)


def _ctx(prompt: list[int], params: SamplingParams) -> DraftContext:
    cache, hidden = TARGET.new_cache(), []
    TARGET.prefill(cache, prompt[:-1], None, hidden)
    return DraftContext(
        tokens=list(prompt),
        params=params,
        generator=torch.Generator().manual_seed(0),
        vocab_size=VOCAB,
        target=TARGET,
        cache=cache,
        hidden=torch.cat(hidden),
    )


def test_sampled_drafts_carry_q_over_the_full_vocabulary(head_file):
    drafter = EagleDrafter(head=head_file)
    ctx = _ctx([3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(temperature=1.0, seed=0))
    drafter.start(ctx)
    draft = drafter.propose(ctx, 4)
    assert draft is not None and draft.is_chain and draft.q is not None
    assert draft.q.shape == (len(draft), VOCAB)
    torch.testing.assert_close(draft.q.sum(-1).double(), torch.ones(len(draft)).double())
    # q is zero outside the draft vocabulary, and each token was drawn where q > 0
    assert (draft.q[:, DRAFT_VOCAB:] == 0).all()
    assert all(draft.q[i, t] > 0 for i, t in enumerate(draft.tokens))
    # row 0 is the softmax of the head's logits over its vocabulary, from the last entry
    with torch.no_grad():
        logits = torch.full((VOCAB,), float("-inf"), dtype=torch.float64)
        logits[:DRAFT_VOCAB] = drafter._outs[-1] @ TARGET.model.lm_head.weight[:DRAFT_VOCAB].T
    torch.testing.assert_close(draft.q[0], logits.softmax(-1).float())


def _paths(drafter: EagleDrafter, policy=None) -> dict[tuple[int, ...], float]:
    """The greedy tree ``drafter`` drafts after a fixed prompt (under exit ``policy``): each
    node's token path from the root, with its path log probability under the head."""
    ctx = _ctx([3, 1, 4, 1, 5, 9, 2, 6], SamplingParams())
    ctx.exit_policy = policy
    drafter.start(ctx)
    pending = len(ctx.tokens) - 1
    drafter._feed(ctx.tokens, pending)
    nodes = drafter._tree(ctx, 8, pending)
    paths: list[tuple[int, ...]] = []
    for n in nodes:  # parents come first
        paths.append((*(paths[n.parent] if n.parent >= 0 else ()), n.token))
    return {path: n.score for path, n in zip(paths, nodes)}


def test_min_prob_drafts_the_tree_without_the_nodes_the_head_finds_unlikely(head_file):
    full = _paths(EagleDrafter(head=head_file, topk=3, width=3))
    scores = sorted(full.values(), reverse=True)
    assert len(scores) == 8 and scores[0] > scores[-1]
    for floor in (scores[2], scores[5]):
        min_prob = math.exp(floor)
        kept = _paths(EagleDrafter(head=head_file, topk=3, width=3, min_prob=min_prob))
        assert kept == {p: s for p, s in full.items() if s >= math.log(min_prob)}
        assert 0 < len(kept) < len(full)
    assert _paths(EagleDrafter(head=head_file, min_prob=1.0)) == {}


def test_min_prob_price_drafts_a_node_where_its_probability_covers_its_price(head_file):
    """``min_prob=price`` (``hybrid``'s head part): under an exit policy that weighs drafts,
    the k-th most probable node is kept where its path probability is at least what the
    pass's (k + 1)-th token costs over its k-th (here as much for each: the nodes that
    ``min_prob`` keeps at that price); under one that does not (``fixed``), every node."""
    from specd.plugins.policies import AdaptivePolicy, FixedPolicy

    from specd.forward.pricing import PassCosts

    def drafter(**options) -> EagleDrafter:
        return EagleDrafter(head=head_file, topk=3, width=3, **options)

    full = _paths(drafter())
    probs = sorted((math.exp(v) for v in full.values()), reverse=True)
    # a price between the fourth and fifth most probable nodes' probabilities
    price = math.sqrt(probs[3] * probs[4])
    assert probs[3] > probs[4]
    priced = AdaptivePolicy(min_confidence=0.0)  # the tree grows as deep as without it
    priced.pass_cost = PassCosts({n: 1.0 + price * (n - 1) for n in (1, 2, 4, 8, 16)})
    kept = _paths(drafter(min_prob="price"), priced)
    assert kept == _paths(drafter(min_prob=price)) and len(kept) == 4
    fixed = FixedPolicy()
    fixed.pass_cost = priced.pass_cost
    assert _paths(drafter(min_prob="price"), fixed) == full
    with pytest.raises(BadInputError, match="min_prob='often'"):
        drafter(min_prob="often")


def test_a_catch_up_on_entries_is_told_apart_from_a_steps_own(head_file):
    """The seconds a proposal spends feeding the entries of earlier steps (or the prompt)
    are its catch-up (``catch_up_s``, which ``hybrid`` leaves out of a part's price); a
    proposal after one step feeds that step's entries alone and catches up on nothing."""
    e = engine(head_file)
    drafter = e.plugins.drafter("eagle")
    seen = []
    propose = EagleDrafter.propose

    def recorded(self, ctx, budget):
        out = propose(self, ctx, budget)
        seen.append(self.catch_up_s)
        return out

    EagleDrafter.propose = recorded  # type: ignore[method-assign]
    try:
        e.generate(list(range(3, 30)), SamplingParams(max_tokens=8), drafter="eagle")
    finally:
        EagleDrafter.propose = propose  # type: ignore[method-assign]
    assert drafter is not None and len(seen) >= 3
    assert seen[0] > 0 and all(s == 0 for s in seen[1:])


def test_drafting_with_the_targets_product_computes_what_the_layers_do(head_file):
    """Drafting multiplies through ``Target.linear`` (weight-major on CPUs where that is
    faster); the head's outputs must not depend on it. (Its norms compute in float32, as in
    training: a float64 head's outputs agree to float32 rounding, the products' row orders
    apart.)"""
    head = load_head(head_file, TARGET)
    shape, dtype = (1, 5, head.config.hidden), head.fc.weight.dtype
    torch.manual_seed(7)
    feat, emb = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    outs = []
    for product in (None, TARGET.linear, weight_major):
        head.product = product
        with torch.no_grad():
            x = head.entries(feat, emb)
            q, k, v = head.keys_values(x, torch.arange(5))
            outs.append(head.finish(x, q, k, v, None))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(outs[0], outs[2], atol=1e-6, rtol=1e-5)
    assert EagleDrafter(head=head_file)._load(TARGET).product == TARGET.linear


def test_on_a_target_run_on_blocks_the_head_reads_q8_blocks_for_a_few_rows():
    """Guards against a head that streams its float32 weights at every draft step where the
    target reads blocks (four times the bytes of Q8_0), against blocks read for a batch too
    large for the kernel's product (each call would de-quantize them), and against rounding
    a float target's head. Its products on blocks stay within Q8_0's rounding of float's."""
    from specd.forward import cpu_kernels
    from specd.forward.blocks import BlockWeight
    from specd.forward.tiny import tiny_blocks_target

    if not cpu_kernels.available():
        pytest.skip("the CPU kernels do not run here: no blocks product for a few rows")
    target = tiny_blocks_target(VOCAB, "q8", seed=3)
    head = EagleDrafter(head="random")._load(target)
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    groups = ((head.wq, head.wk, head.wv), (head.gate, head.up))
    stacked = {m for group in groups for m in group}  # a few rows read them stacked only
    assert head.few_rows == target.few_rows > 0
    assert set(head.small) == set(linears) - stacked and head.small
    assert all(isinstance(w, BlockWeight) and w.fmt.name == "q8_0" for w in head.small.values())
    torch.manual_seed(0)
    for rows in (1, target.few_rows, target.few_rows + 1):
        few = rows <= target.few_rows
        x = torch.randn(rows, head.config.hidden)
        with torch.inference_mode():
            got = head._lin(head.wo, x)
        want = x @ head.wo.weight.detach().T
        if not few:  # the float weight, as the float product computes it
            torch.testing.assert_close(got, target.linear(x, head.wo.weight))
        else:
            assert not torch.equal(got, want)  # rounded: the blocks were read
            torch.testing.assert_close(got, want, atol=0.02 * float(want.abs().max()), rtol=0)
        # the layers reading one input in one product of their stacked blocks: each output
        # row as its own layer's blocks compute it, bit for bit (its float weight for more rows)
        for group in groups:
            with torch.inference_mode():
                together = head._lins(group, x)
                alone = [
                    target.linear(x, target.small_weight(m.weight) if few else m.weight)
                    for m in group
                ]
            assert all(torch.equal(a, b) for a, b in zip(together, alone))
            if few:
                w = group[0].weight.detach()
                assert not torch.equal(together[0], x @ w.T)  # the blocks were read
    float_head = EagleDrafter(head="random")._load(TARGET)  # a float target: float weights
    assert all(torch.equal(w, m.weight) for m, w in float_head.small.items())


def test_the_training_time_test_sees_what_a_draft_chain_sees():
    """Bug guarded: an unroll mask that lets step s see entries a chain drafted after row r
    has not made (or hides ones it has) trains the head on a context drafting never has."""
    torch.manual_seed(0)
    head = random_head(TARGET).double()
    torch.nn.init.normal_(head.fc.weight, std=0.2)  # not the pass-through of head=random
    t, r = 10, 5
    feat = torch.randn(1, t, head.config.hidden, dtype=torch.float64)
    emb = torch.randn(1, t, head.config.hidden, dtype=torch.float64)
    unrolled = head.unrolled(feat, emb, 3)
    with torch.no_grad():
        # true entries 0..r in causal order, then a chain fed its own predictions
        x = head.entries(feat[:, : r + 1], emb[:, : r + 1])
        q, keys, values = head.keys_values(x, torch.arange(r + 1))
        out = head.finish(x, q, keys, values, None)[:, -1:]
        for step in (1, 2):
            pos = r + step
            x = head.entries(out, emb[:, pos : pos + 1])
            q, k, v = head.keys_values(x, torch.tensor([pos]))
            keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
            out = head.finish(x, q, keys, values, None)
            torch.testing.assert_close(out[0, 0], unrolled[step][0, pos])


def test_a_head_for_another_target_is_refused(head_file):
    other = Target(tiny_model(VOCAB, seed=3), TARGET.tokenizer, name="other-model")
    with pytest.raises(HeadMismatchError) as err:
        load_head(head_file, other)
    assert "'tiny'" in str(err.value) and "'other-model'" in str(err.value)
    # through the engine the request decodes plainly and says why
    e = Engine(other, drafter_options={"eagle": {"head": head_file}})
    out = e.generate([1, 2, 3], SamplingParams(max_tokens=4), drafter="eagle")
    assert "trained for 'tiny'" in out.stats.fallback
    assert load_head(head_file, TARGET).draft_vocab.tolist() == list(range(DRAFT_VOCAB))


def test_a_head_option_naming_no_file_is_the_users_error(tmp_path):
    e = Engine(TARGET, drafter_options={"eagle": {"head": str(tmp_path / "none.safetensors")}})
    with pytest.raises(BadInputError, match="head=.*none.safetensors.*no such file"):
        e.generate([1, 2, 3], SamplingParams(max_tokens=2), drafter="eagle")


def test_no_shipped_head_falls_back_with_the_command_to_train_one(caplog):
    assert shipped_head(TARGET) is None
    e = Engine(TARGET)
    with caplog.at_level("ERROR", logger="specd.plugins"):
        out = e.generate([1, 2], SamplingParams(max_tokens=3), drafter="eagle")
        assert "specd train eagle --model tiny" in out.stats.fallback
        e.generate([1, 2], SamplingParams(max_tokens=3), drafter="eagle")
    # said once, in one line (no traceback: nothing is broken), and not tried again
    (said,) = caplog.records
    assert "disabled for this session: no EAGLE head ships" in said.getMessage()
    assert said.exc_info is None
    assert e.guard.health("drafter:eagle").calls == 1


@pytest.mark.slow
def test_real_model_eagle_and_hybrid_are_exact(real_engine):
    if shipped_head(real_engine.target) is None:
        pytest.fail("no EAGLE head ships for the default model")
    prompt = "import os\n\n\ndef list_python_files(root):\n    "
    params = SamplingParams(max_tokens=32)
    e = Engine(real_engine.target)
    plain = e.generate(prompt, params, drafter="none").token_ids
    for name in ("eagle", "hybrid"):
        out = e.generate(prompt, params, drafter=name)
        assert out.stats.fallback is None and out.stats.drafted > 0
        assert out.token_ids == plain, name


def test_a_seed_gives_the_same_tokens_whatever_the_drafter_saw_before(head_file):
    """Bug guarded: after a prefix-cache hit on a prompt the drafter had no features for,
    its first steps were plain, so the same seed drew other tokens than on a cold start."""
    e = engine(head_file)
    prompt = [5, 9, 3, 7, 1, 2, 8, 4]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    cold = e.generate(prompt, params, drafter="eagle").token_ids
    e.generate([30, 31, 32], params, drafter="eagle")  # the drafter's own history moves on
    warm = e.generate(prompt, params, drafter="eagle")
    assert warm.stats.reused_tokens == len(prompt) - 1
    assert warm.token_ids == cold
