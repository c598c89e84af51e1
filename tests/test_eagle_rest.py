"""The ``eagle`` drafter named alone rests where its drafts do not pay
(plugins/eagle/rest.py); ``hybrid`` decides that for its head part itself."""

from __future__ import annotations

import pytest
import torch
from specd.plugins.eagle.drafter import EagleDrafter
from specd.plugins.eagle.hybrid import HybridDrafter
from specd.plugins.eagle.rest import REST_EVERY, REST_MAX, Rest

from specd import BadInputError, DraftContext, Engine, SamplingParams
from specd.forward.pricing import PassCosts
from specd.forward.tiny import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")


class Prices:
    """What an exit policy that weighs drafts holds of this host: pass and draft prices, in
    one-token steps."""

    prices_drafts = True

    def __init__(self, pass_cost, draft_cost=None) -> None:
        self.pass_cost, self.draft_cost = pass_cost, draft_cost


def ctx(prices) -> DraftContext:
    return DraftContext(
        tokens=[1], params=SamplingParams(), generator=torch.Generator(), vocab_size=8,
        exit_policy=prices,
    )  # fmt: skip


def test_drafts_at_a_loss_rest_the_next_requests_in_runs_that_grow():
    """3 requests rest, one drafts, then 7, 15, and 31 at most between two that draft."""
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.5 * (n - 1), lambda k: 0.25 * k))
    drafting = []
    for i in range(120):
        if not r.resting:  # a request that drafts: 4 nodes priced 2 + 1 steps, 1 accepted
            drafting.append(i)
            r.drafted(c, 4)
            r.committed(1)
        r.finished()
    runs = [b - a - 1 for a, b in zip(drafting, drafting[1:])]
    assert runs == [REST_EVERY - 1, 7, 15, REST_MAX - 1, REST_MAX - 1]
    assert REST_EVERY == 4 and REST_MAX == 32


def test_drafts_that_pay_never_rest():
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.1 * (n - 1)))
    for _ in range(3 * REST_EVERY):
        r.drafted(c, 4)
        r.committed(3)  # 3 tokens won for 0.4 steps
        assert r.finished() is False


def test_a_head_that_starts_to_pay_stops_resting():
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.5 * (n - 1)))
    r.drafted(c, 4)
    r.committed(0)
    assert r.finished() and r.finished() and r.finished()  # resting
    assert not r.finished()  # the request that drafts again
    for _ in range(6):  # its drafts win now
        r.drafted(c, 2)
        r.committed(2)
    assert r.finished() is False and r.rested == r.run == 0
    for _ in range(6):  # a loss again: the shortest run of rests, not a longer one
        r.drafted(c, 4)
        r.committed(0)
    assert r.finished() and r.run == REST_EVERY - 1


def test_without_priced_passes_or_a_policy_that_weighs_them_it_never_rests():
    """A target whose passes are not priced (no table of this host) gives no price to weigh;
    a policy that drafts whatever it costs (``fixed``) asks for drafts in every request."""
    r = Rest()
    unweighed = Prices(lambda n: 1.0 + 0.5 * (n - 1))
    unweighed.prices_drafts = False
    for prices in (None, Prices(None), unweighed):
        r.drafted(ctx(prices), 4)
        r.committed(0)
        assert r.finished() is False


def test_a_request_under_a_policy_that_does_not_weigh_drafts_never_rests():
    """Whatever the requests before it decided: a ``fixed`` request drafts, and counts as no
    loss for the ones after it."""
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.5 * (n - 1)))
    assert r.start(c) is False
    r.drafted(c, 4)
    r.committed(0)
    assert r.finished() is True and r.start(c) is True  # at a loss: the next one rests
    unweighed = Prices(lambda n: 1.0 + 0.5 * (n - 1))
    unweighed.prices_drafts = False
    assert r.start(ctx(unweighed)) is False
    assert r.finished() is False and r.rested == 0


def test_a_request_that_drafts_nothing_leaves_the_next_to_draft():
    """Only a request that drafted at a loss starts or lengthens a run of rests: one that
    was to draft again and did not (too short a request) hands that to the next."""
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.5 * (n - 1)))
    r.drafted(c, 4)
    r.committed(0)
    assert [r.finished() for _ in range(REST_EVERY)] == [True] * (REST_EVERY - 1) + [False]
    assert r.finished() is False  # it drafted nothing: the next one drafts
    r.drafted(c, 4)
    r.committed(0)
    assert r.finished() is True and r.run == 7


def test_a_plain_step_after_a_draft_is_not_a_draft():
    r, c = Rest(), ctx(Prices(lambda n: 1.0 + 0.5 * (n - 1)))
    r.drafted(c, 2)
    r.committed(2)
    r.committed(0)  # a plain step: no draft was priced
    assert r.won == 2.0


def test_hybrid_keeps_its_head_part_from_resting_itself():
    h = HybridDrafter(drafters="ngram,eagle", **{"eagle.head": "random"})
    assert h.parts[1].rest is False
    h = HybridDrafter(drafters="ngram,eagle", **{"eagle.head": "random", "eagle.rest": True})
    assert h.parts[1].rest is True  # what was given wins


def test_a_rest_option_that_is_no_boolean_is_refused():
    with pytest.raises(BadInputError, match="eagle option rest='maybe'"):
        EagleDrafter(head="random", rest="maybe")  # type: ignore[arg-type]


def test_eagle_alone_rests_its_features_and_drafts_where_they_do_not_pay(monkeypatch):
    """Guards against a head that does not pay on this host making every request slower than
    plain decoding (the prompt's features, a hopeful first draft, probes), and against one
    that rests for good: it reads features and drafts in the first request and again after
    REST_EVERY - 1 that rest; every request writes plain decoding's tokens."""
    target = tiny_target(48, seed=2, logit_scale=30.0, num_layers=2)
    costs = PassCosts({1: 1.0, 2: 3.0, 3: 5.0})  # priced: each node costs 2 steps
    monkeypatch.setattr(target, "pass_costs", costs)
    monkeypatch.setattr(target, "price_passes", lambda: costs)
    seen = _requests(Engine(target, drafter_options={"eagle": {"head": "random"}}))
    assert seen == ([(True, True)] + [(False, False)] * (REST_EVERY - 1)) + [(True, True)] + [
        (False, False)
    ] * (REST_EVERY - 1)
    # under a policy that drafts whatever it costs, every request reads features and drafts
    fixed = Engine(target, drafter_options={"eagle": {"head": "random"}}, exit_policy="fixed")
    assert _requests(fixed) == [(True, True)] * 2 * REST_EVERY
    # a request under `fixed` on the engine whose requests rested it drafts all the same,
    # from the features of its first pass on (its prompt's were not read)
    engine = Engine(target, drafter_options={"eagle": {"head": "random"}})
    params = SamplingParams(max_tokens=24)
    prompt = list(range(5, 17))
    assert engine.generate(prompt[::-1], params, drafter="eagle").stats.drafted > 0
    assert engine.plugins.drafter("eagle").wants_hidden is False  # the next request rests
    out = engine.generate(prompt, params, drafter="eagle", exit_policy="fixed")
    assert out.stats.drafted > 0
    assert out.token_ids == engine.generate(prompt, params, drafter="none").token_ids


def _requests(e: Engine) -> list[tuple[bool, bool]]:
    """2 REST_EVERY requests with eagle: whether each read features and drafted; each
    wrote plain decoding's tokens."""
    drafter = e.plugins.drafter("eagle")
    assert drafter is not None
    params = SamplingParams(max_tokens=24)
    seen = []
    for i in range(2 * REST_EVERY):
        prompt = [(3 * i + j) % 48 for j in range(12)]
        reads = drafter.wants_hidden
        out = e.generate(prompt, params, drafter="eagle")
        assert out.token_ids == e.generate(prompt, params, drafter="none").token_ids
        seen.append((reads, out.stats.drafted > 0))
    return seen
