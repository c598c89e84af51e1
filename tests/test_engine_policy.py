"""What the engine tells the exit policy after each step: ``observe(drafted, accepted)``
with the draft's depth (a chain's length, a tree's deepest path) and the number of draft
tokens the verifier kept, which the drafter's ``commit`` hears too.

The drafter here knows the target's greedy continuation, so each step's draft is right for
a chosen number of tokens and then wrong; a recording verifier (``greedy``'s rule) and a
recording policy, registered for this module, say what was decided and what was told.
"""

from __future__ import annotations

import pytest
from specd.plugins.greedy import GreedyVerifier

from specd import Draft, Drafter, Engine, ExitPolicy, SamplingParams, hookimpl
from specd.forward.tiny import tiny_target
from specd.registry import get_plugin_manager

VOCAB = 48
TARGET = tiny_target(VOCAB, seed=3, logit_scale=8.0)
PROMPT = [5, 17, 3, 29, 11, 40, 2]
NEW_TOKENS = 40
BUDGET = 6

#: the plain greedy continuation of PROMPT, which the drafter copies from
REFERENCE: list[int] = []
#: what the policy was told, what the verifier decided, what the drafter proposed and heard
OBSERVED: list[tuple[int, int]] = []
DECIDED: list[int] = []
PROPOSED: list[Draft] = []
COMMITTED: list[int] = []


def _wrong(token: int) -> int:
    return (token + 1) % VOCAB


class _Oracle(Drafter):
    """Drafts from the reference continuation: step ``s`` gets a draft whose first
    ``right(s)`` tokens are the target's own and the rest not."""

    shape = "chain"

    def propose(self, ctx, budget):
        done = len(ctx.tokens) - len(PROMPT)
        ahead = REFERENCE[done:] + [0] * budget
        s = len(PROPOSED)
        draft = self.draft(s, ahead, budget)
        PROPOSED.append(draft)
        return draft

    def draft(self, s: int, ahead: list[int], budget: int) -> Draft:
        right = s % (budget + 1)  # 0 .. budget: rejected at once, partly, accepted whole
        return Draft.chain(ahead[:right] + [_wrong(t) for t in ahead[right:budget]])

    def commit(self, ctx, new_tokens, accepted):
        COMMITTED.append(accepted)


class ChainOracle(_Oracle):
    name = "test-oracle-chain"


class TreeOracle(_Oracle):
    """Two branches from the root, so the tree's node count, its depth and the accepted
    length all differ: a right branch of ``right`` tokens (its last one or none wrong) and
    a deeper wrong branch."""

    name = "test-oracle-tree"

    def draft(self, s: int, ahead: list[int], budget: int) -> Draft:
        right = min(1 + s % 3, budget)  # the right branch's length: 1 .. 3
        kept = right - (s // 3) % 2  # all of it right, or all but its last token
        branch = ahead[:kept] + [_wrong(t) for t in ahead[kept:right]]
        deep = budget - right  # the wrong branch: deeper than the right one unless right == 3
        if deep < 1:  # the last steps' budget is small
            return Draft.chain(branch)
        tokens = branch + [(ahead[0] + 2) % VOCAB] + [7] * (deep - 1)
        parents = [i - 1 for i in range(right)] + [-1] + [right + i for i in range(deep - 1)]
        return Draft(tokens=tokens, parents=parents)


class RecordingGreedy(GreedyVerifier):
    name = "test-recording-greedy"

    def verify(self, draft, p, params, generator):
        verdict = super().verify(draft, p, params, generator)
        DECIDED.append(len(verdict.path))
        return verdict


class RecordingPolicy(ExitPolicy):
    """Asks for the whole budget every step and records what it is told."""

    name = "test-recording-policy"

    def start(self, max_budget):
        self.max_budget = max_budget

    def draft_budget(self):
        return self.max_budget

    def observe(self, drafted, accepted):
        OBSERVED.append((drafted, accepted))


class Starting(_Oracle):
    """Records its requests' starts and finishes; reads the target's features, as the EAGLE
    head does (a request that starts it computes the prompt's)."""

    name = "test-oracle-starting"
    wants_hidden = True
    STARTS: list[str] = []

    def start(self, ctx):
        self.STARTS.append("start")

    def finish(self, ctx):
        self.STARTS.append("finish")


class _Plugin:
    @hookimpl
    def specd_register_drafters(self, register):
        register(ChainOracle)
        register(TreeOracle)
        register(Starting)

    @hookimpl
    def specd_register_verifiers(self, register):
        register(RecordingGreedy)

    @hookimpl
    def specd_register_exit_policies(self, register):
        register(RecordingPolicy)


@pytest.fixture(scope="module", autouse=True)
def _plugins():
    pm = get_plugin_manager()
    plugin = _Plugin()
    pm.register(plugin, name="test-engine-policy")
    plain = Engine(TARGET, drafter="none").generate(PROMPT, SamplingParams(max_tokens=NEW_TOKENS))
    REFERENCE[:] = plain.token_ids
    yield
    pm.unregister(plugin)


def _run(drafter: str):
    for log in (OBSERVED, DECIDED, PROPOSED, COMMITTED):
        log.clear()
    engine = Engine(
        TARGET,
        drafter=drafter,
        verifier="test-recording-greedy",
        exit_policy="test-recording-policy",
        max_draft=BUDGET,
    )
    out = engine.generate(PROMPT, SamplingParams(max_tokens=NEW_TOKENS))
    assert not out.stats.fallback, out.stats.fallback
    assert out.token_ids == REFERENCE  # greedy: the drafts changed nothing but the speed
    return out


@pytest.mark.parametrize("drafter", ["test-oracle-chain", "test-oracle-tree"])
def test_observe_hears_the_drafts_depth_and_what_the_verifier_accepted(drafter):
    """Guards against the policy told a wrong accepted count (off by one, the draft's
    length, the count with the verifier's own token) or, for a tree, its node count as
    ``drafted``: an adaptive budget then grows after rejections and never pauses."""
    out = _run(drafter)
    depths = [max(d.depths()) for d in PROPOSED]
    assert len(DECIDED) == len(PROPOSED) > 5
    # one observation a step; a step the engine gave no room to draft (the last) is (0, 0)
    assert len(OBSERVED) == out.stats.target_steps
    assert [o for o in OBSERVED if o != (0, 0)] == list(zip(depths, DECIDED))
    assert COMMITTED == [a for _, a in OBSERVED]  # the drafter hears the same counts
    assert sum(DECIDED) == out.stats.accepted
    # the steps covered rejection at once, partial acceptance and a draft accepted whole
    full = [a == d for d, a in OBSERVED]
    assert 0 in DECIDED and any(full) and any(0 < a < d for d, a in OBSERVED)


def test_a_tree_is_reported_by_its_deepest_path_not_its_nodes():
    """Guards against ``drafted`` counting a tree's nodes: a tree of six nodes whose longest
    path is four deep could accept at most four, and is judged like a chain of four."""
    _run("test-oracle-tree")
    sizes = [len(d) for d in PROPOSED]
    depths = [max(d.depths()) for d in PROPOSED]
    assert any(n > d for n, d in zip(sizes, depths))  # the case where they differ is run
    assert [d for d, _ in OBSERVED if d] == depths


def test_a_request_with_no_room_for_a_draft_does_not_start_its_drafter(monkeypatch):
    """Guards against a one-token request starting its drafter: loading what it drafts with
    (the EAGLE head) and computing the prompt's features for it, for a draft that cannot be
    asked for (a draft needs a token of room beside the target's own)."""
    features: list[bool] = []
    prefill = TARGET.prefill

    def recording(cache, tokens, stop=None, hidden=None, **kw):
        features.append(hidden is not None)
        return prefill(cache, tokens, stop, hidden, **kw)

    prompt = PROMPT * 6  # long enough to be prefilled, not fed with the first step
    plain = Engine(TARGET, drafter="none").generate(prompt, SamplingParams(max_tokens=2))
    monkeypatch.setattr(TARGET, "prefill", recording)
    for tokens in (1, 2):
        engine = Engine(TARGET, drafter="test-oracle-starting", verifier="test-recording-greedy")
        Starting.STARTS.clear()
        features.clear()
        out = engine.generate(prompt, SamplingParams(max_tokens=tokens))
        assert out.token_ids == plain.token_ids[:tokens]
        assert not out.stats.fallback, out.stats.fallback
        started = tokens > 1
        assert Starting.STARTS == (["start", "finish"] if started else []), tokens
        assert features == [started], tokens
