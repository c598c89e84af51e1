"""The ``adaptive`` exit policy's contract (plugins/policies.py): its budget stays within
``max_budget``, grows after a draft accepted whole, never grows after a rejection, pauses
speculation when acceptance collapses and probes again later; drafters stop below its
confidence line; within its budget it drafts shorter where wide verify passes cost more.
``fixed`` asks for its budget, capped."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from specd.plugins.policies import AdaptivePolicy, FixedPolicy

from specd import registry
from specd.forward.pricing import PassCosts

#: a host where every pass costs a step (no table at all behaves the same)
FLAT = PassCosts({1: 1.0})
#: a host where an 8-token pass costs four steps
COSTLY = PassCosts({1: 1.0, 2: 1.5, 4: 2.2, 8: 4.0, 16: 8.0})
#: a host where wide passes cost little (a memory-bound step on a CPU)
CHEAP = PassCosts({1: 1.0, 2: 1.05, 4: 1.15, 8: 1.4, 16: 2.0})


def adaptive(max_budget: int = 8, costs: PassCosts | None = None, **options) -> AdaptivePolicy:
    policy = AdaptivePolicy(**options)
    policy.pass_cost = costs
    policy.start(max_budget)
    return policy


def step(policy: AdaptivePolicy, accepted: int | None, drafted: int | None = None) -> int:
    """One engine step: ask the budget, draft ``drafted`` (default: the whole budget) of
    which ``accepted`` are kept (None: all of them); a budget of 0 is a plain step, which
    the engine reports as ``observe(0, 0)``. :returns: the budget it was asked for."""
    budget = policy.draft_budget()
    if budget == 0:
        policy.observe(0, 0)
        return 0
    drafted = budget if drafted is None else min(drafted, budget)
    policy.observe(drafted, drafted if accepted is None else min(accepted, drafted))
    return budget


def test_adaptive_is_what_the_registry_builds_by_default_name():
    assert registry.exit_policy_class("adaptive") is AdaptivePolicy


def test_the_first_budget_is_the_start_budget_capped_by_max_budget():
    """Guards against a first step that ignores ``max_budget`` (the engine's ``max_draft``)."""
    assert adaptive(8, start_budget=4).draft_budget() == 4
    assert adaptive(3, start_budget=4).draft_budget() == 3


def test_full_acceptance_grows_the_budget_up_to_max_budget():
    """Guards against a budget that stays small while every draft is accepted (each step
    then drafts less than it could), and against one that outgrows ``max_budget``."""
    policy = adaptive(10, start_budget=2)
    budgets = [step(policy, None) for _ in range(5)]
    assert budgets[0] == 2
    assert all(b < a or a == 10 for b, a in zip(budgets, budgets[1:]))  # grows until the cap
    assert budgets[-1] == 10


def test_a_short_draft_accepted_whole_does_not_shrink_the_budget():
    """Guards against judging a draft the drafter cut short (it had fewer tokens to offer)
    as a poor one: all it drafted was accepted."""
    policy = adaptive(8, start_budget=4)
    step(policy, None, drafted=1)
    assert policy.draft_budget() >= 4


def test_a_rejection_never_grows_the_budget():
    """Guards against growing the budget after a draft the target cut short: a nearly
    accepted draft is still a rejection, and a longer next draft only wastes more."""
    for accepted in range(4):
        policy = adaptive(8, start_budget=4)
        step(policy, accepted)
        assert policy.draft_budget() <= 4, accepted


def test_a_poor_step_shrinks_the_budget_and_a_fair_one_holds_it():
    """Guards against a budget that does not come down when most of a draft is rejected,
    or that halves after a draft mostly accepted."""
    policy = adaptive(8, start_budget=8)
    step(policy, 0)
    assert 1 <= policy.draft_budget() < 8
    policy = adaptive(8, start_budget=8)
    step(policy, 6)
    assert policy.draft_budget() == 8


def test_the_budget_never_drops_below_one_while_speculating():
    """Guards against a budget of 0 reached by shrinking alone: a policy that pauses must
    also probe, and only a collapse pauses."""
    policy = adaptive(8, start_budget=8)
    seen = []
    for _ in range(4):  # not enough rejections to collapse the acceptance rate
        seen.append(step(policy, 0))
    assert seen[0] == 8 and all(b >= 1 for b in seen)
    assert seen[-1] == 1


def _collapse(policy: AdaptivePolicy, limit: int = 50) -> None:
    """Reject every draft until the policy asks for a plain step (that step included)."""
    for _ in range(limit):
        if step(policy, 0) == 0:
            return
    raise AssertionError(f"still drafting after {limit} rejected drafts")


def _probe(policy: AdaptivePolicy, accepted: int | None, limit: int = 50) -> tuple[int, int]:
    """Plain steps until the policy drafts again; that draft gets ``accepted`` (see
    :func:`step`). :returns: (plain steps taken here, the probe's budget)."""
    for plain in range(limit):
        if (budget := step(policy, accepted)) > 0:
            return plain, budget
    raise AssertionError(f"no probe after {limit} plain steps")


@pytest.mark.parametrize("probe_every", [1, 5, 8])
def test_collapsed_acceptance_pauses_speculation_then_probes_with_a_small_draft(probe_every):
    """Guards against drafting on forever when nothing is accepted (each rejected draft
    costs the target's work on it), a pause that never ends (speculation would be off for
    the rest of the request, though the text might turn repetitive), and a pause one plain
    step shorter than ``probe_every`` (with 1, no pause at all)."""
    policy = adaptive(8, probe_every=probe_every)
    _collapse(policy)
    plain, budget = _probe(policy, 0)
    assert 1 <= budget <= 2  # a probe risks little
    assert 1 + plain == probe_every  # plain steps between the collapse and the probe


def test_a_probe_is_small_even_when_the_budget_was_large():
    """Guards against probing with the budget speculation had before the collapse: a
    sudden collapse (a high ``collapse`` line) leaves it large, and the probe is the step
    most likely to be wasted."""
    policy = adaptive(8, start_budget=8, collapse=0.9, probe_every=3)
    _collapse(policy)
    assert 1 <= _probe(policy, 0)[1] <= 2


def test_a_failed_probe_pauses_again_and_a_successful_one_resumes():
    """Guards against a probe that, rejected, lets speculation run on at a loss, and one
    that, accepted, leaves speculation paused."""
    policy = adaptive(8, probe_every=4)
    _collapse(policy)
    _probe(policy, 0)  # rejected
    assert policy.draft_budget() == 0  # paused again
    policy.observe(0, 0)
    assert _probe(policy, None)[0] == 3  # and probes again after as many plain steps
    policy = adaptive(8, probe_every=4)
    _collapse(policy)
    _, probe = _probe(policy, None)  # accepted whole
    budgets = [step(policy, None) for _ in range(4)]
    assert all(b > 0 for b in budgets)
    assert budgets[0] >= probe and budgets[-1] == 8


def test_continue_drafting_stops_below_min_confidence():
    """Guards against a drafter asked to go on with tokens it barely believes (each one
    likely wasted) or stopped on tokens it is sure of."""
    policy = adaptive(8, min_confidence=0.3)
    assert policy.continue_drafting(0, 0.9)
    assert policy.continue_drafting(5, 0.3)
    assert not policy.continue_drafting(0, 0.29)
    assert not policy.continue_drafting(3, 0.0)
    assert adaptive(8, min_confidence=0.0).continue_drafting(7, 0.0)


# One engine step as the test below plays it: (tokens the drafter offers, tokens accepted),
# each cut to what the budget allows.
_STEPS = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), max_size=80)


@given(
    max_budget=st.integers(1, 16),
    start_budget=st.integers(1, 20),
    probe_every=st.integers(1, 12),
    collapse=st.floats(0.0, 0.9),
    steps=_STEPS,
    costs=st.sampled_from([None, FLAT, COSTLY, CHEAP]),
)
def test_any_history_keeps_the_budget_in_bounds_and_never_grows_it_after_a_rejection(
    max_budget, start_budget, probe_every, collapse, steps, costs
):
    """Guards against a budget over ``max_budget`` or negative, and a budget grown right
    after a rejection, whatever the history of acceptance before it and the price of a
    pass (a rejection raises the rates of the positions it accepted, which alone would
    make a longer priced draft look better)."""
    policy = adaptive(max_budget, costs, start_budget=start_budget, probe_every=probe_every,
                      collapse=collapse)  # fmt: skip
    for offered, accepted in steps:
        budget = policy.draft_budget()
        assert 0 <= budget <= max_budget
        if budget == 0:
            policy.observe(0, 0)
            continue
        drafted = min(offered, budget)
        accepted = min(accepted, drafted)
        policy.observe(drafted, accepted)
        if accepted < drafted:
            assert policy.draft_budget() <= budget, (drafted, accepted)
            policy.observe(0, 0)  # that question was a plain step


def test_fixed_asks_for_its_budget_capped_by_max_budget():
    """Guards against ``fixed`` exceeding ``max_budget`` or ignoring its own budget."""
    policy = FixedPolicy()
    policy.start(6)
    assert policy.draft_budget() == 6
    policy = FixedPolicy(budget=3)
    policy.start(6)
    assert policy.draft_budget() == 3
    policy.start(2)
    assert policy.draft_budget() == 2


def _accepted(seed: int, steps: int, rate: float) -> list[int]:
    """Per step, how many leading draft tokens a target accepts when each is accepted with
    probability ``rate`` once the ones before it were (cut to the draft later)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(steps):
        n = 0
        while n < 16 and rnd.random() < rate:
            n += 1
        out.append(n)
    return out


def _budgets(costs: PassCosts | None, accepted: list[int], **options) -> list[int]:
    policy = adaptive(8, costs, **options)
    return [step(policy, a) for a in accepted]


def test_a_flat_price_table_changes_nothing():
    """Guards against a policy that drafts differently where every pass costs a step than
    where passes were never priced (a test host, a model without a lean forward)."""
    history = _accepted(seed=1, steps=60, rate=0.8)
    assert _budgets(FLAT, history, start_budget=8) == _budgets(None, history, start_budget=8)


@pytest.mark.parametrize("rate", [0.6, 0.8])
def test_where_wide_passes_cost_more_it_drafts_shorter(rate):
    """Guards against pricing that is read but not weighed: where an 8-token pass costs
    four steps, drafting eight tokens that are each accepted 60-80% of the time yields fewer
    tokens per unit of time than drafting three, and the policy must draft shorter than on
    a host where every pass costs a step."""
    history = _accepted(seed=2, steps=60, rate=rate)
    flat = _budgets(FLAT, history, start_budget=8)
    costly = _budgets(COSTLY, history, start_budget=8)
    cheap = _budgets(CHEAP, history, start_budget=8)
    assert sum(costly) < sum(cheap) <= sum(flat)
    late = slice(20, None)  # once the rates are learnt
    assert max(costly[late]) < max(flat[late])


def test_the_priced_choice_is_the_length_with_the_most_tokens_per_unit_of_time():
    """Guards against an off-by-one between a draft and the pass that verifies it (``k``
    draft tokens are a pass over ``k + 1``) and against maximising tokens per step instead
    of per unit of time. With every position accepted at rate 0.5, a k-token draft yields
    ``2 - 0.5**k`` tokens; over passes priced 1, 1.2, 2, 4 ... the best is k = 1."""
    policy = adaptive(8, PassCosts({1: 1.0, 2: 1.2, 4: 2.0, 8: 4.0}), start_budget=8)
    policy._accept = [0.5] * 8
    assert policy.draft_budget() == 1  # 1.5 / 1.2 beats 1.75 / (2 - 0.4) and the rest
    policy = adaptive(8, PassCosts({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 9: 3.0}), start_budget=8)
    policy._accept = [0.9] * 8
    assert policy.draft_budget() == 7  # an 8-token pass is free, a 9-token one is not


def test_a_position_not_drafted_for_a_while_is_judged_by_recent_acceptance():
    """Guards against a priced policy stuck at one-token drafts: after a few early
    rejections at the second position it drafts one token, so that position's own rate
    is never measured again. With every token accepted 80% of the time and an 8-token pass
    costing four steps, three-token drafts yield the most per unit of time."""
    history = _accepted(seed=2, steps=60, rate=0.8)
    costly = _budgets(COSTLY, history, start_budget=8)
    assert sorted(costly[20:])[20] >= 2  # the median, once the rates are learnt


def test_a_draft_that_costs_more_than_it_saves_gives_plain_steps_and_probes():
    """Guards against a policy that prices the verify pass but not the draft: a drafter
    whose call costs two steps never pays for itself at a 50% acceptance rate, so the
    policy takes plain steps, and after ``probe_every`` of them drafts a short probe, so
    that a drafter that became right again is noticed."""
    policy = adaptive(8, CHEAP, start_budget=8, probe_every=4)
    policy.draft_cost = lambda k: 2.0
    policy._accept = [0.5] * 8
    assert [policy.draft_budget() for _ in range(4)] == [0, 0, 0, 0]
    assert policy.draft_budget() == 2  # the probe
    policy.draft_cost = None  # drafting free again: a 50% rate pays on cheap passes
    policy.observe(2, 1)
    assert policy.draft_budget() > 0


def test_the_draft_cost_shortens_the_draft():
    """Guards against drafting as deep as free passes allow when each draft token costs
    time of its own: at a 90% rate, passes free and 0.3 steps a draft token, five tokens
    yield the most per unit of time (4.69 / 2.5), where free drafting would take all 8."""
    policy = adaptive(8, FLAT, start_budget=8)
    policy._accept = [0.9] * 8
    assert policy.draft_budget() == 8
    policy.draft_cost = lambda k: 0.3 * k
    assert policy.draft_budget() == 5


def _no_pay(policy: AdaptivePolicy) -> None:
    """Drafting at a loss: a draft costs two steps, a draft token is accepted half the time."""
    policy.draft_cost = lambda k: 2.0
    policy._accept = [0.5] * 8


def _plain_steps_to_probe(policy: AdaptivePolicy, limit: int = 1000) -> tuple[int, int]:
    """Plain steps until the next probe, and its budget."""
    for plain in range(limit):
        budget = policy.draft_budget()
        if budget:
            return plain, budget
        policy.observe(0, 0)
    raise AssertionError(f"no probe within {limit} steps")


def test_rejected_probes_wait_longer_each_time_and_one_accepted_whole_resets_the_wait():
    """Guards against a drafter that does not pay on this host probing every few steps
    forever (each probe pays its call and a wider pass for nothing), against waits that grow
    without bound (a drafter that starts to pay would never be noticed), and against a probe
    accepted whole that still leaves the next one far off."""
    policy = adaptive(8, CHEAP, probe_every=4, probe_max=16)
    _no_pay(policy)
    waits = []
    for _ in range(5):
        plain, budget = _plain_steps_to_probe(policy)
        waits.append(plain)
        policy.observe(budget, 0)  # rejected
    assert waits == [4, 8, 16, 16, 16]
    plain, budget = _plain_steps_to_probe(policy)
    policy.observe(budget, budget)  # accepted whole, yet drafting still at a loss here
    policy._accept = [0.5] * 8
    assert _plain_steps_to_probe(policy)[0] == 4
