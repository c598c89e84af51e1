"""The hybrid drafter: who is asked when, one merged tree, exact output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specd.plugins.eagle import hybrid as hybrid_module
from specd.plugins.eagle.hybrid import (
    PROBE_EVERY,
    REST_EVERY,
    REST_MAX,
    HybridDrafter,
    Record,
    merge,
)

from specd import (
    BadInputError,
    Draft,
    DraftContext,
    Drafter,
    DrafterUnavailable,
    Engine,
    SamplingParams,
)
from specd.forward.tiny import tiny_target

VOCAB = 48
TARGET = tiny_target(VOCAB, seed=2, logit_scale=30.0, num_layers=2)

pytestmark = pytest.mark.usefixtures("one_thread")


class Fixed(Drafter):
    """Proposes a given draft, cut to the budget, and records the budgets it was given."""

    def __init__(self, draft: Draft | None) -> None:
        self.draft = draft
        self.budgets: list[int] = []

    def propose(self, ctx, budget):
        self.budgets.append(budget)
        if self.draft is None:
            return None
        return Draft.chain(
            self.draft.tokens[:budget], None if self.draft.q is None else self.draft.q[:budget]
        )


def hybrid(*drafts: Draft | None, min_len: int = 2) -> tuple[HybridDrafter, list[Fixed]]:
    h = HybridDrafter(drafters="ngram", min_len=min_len)
    h.parts = [Fixed(d) for d in drafts]
    h.records = [Record() for _ in h.parts]
    return h, h.parts  # type: ignore[return-value]


def ctx() -> DraftContext:
    return DraftContext(
        tokens=[1, 2], params=SamplingParams(), generator=torch.Generator(), vocab_size=VOCAB
    )


def test_a_long_enough_first_draft_is_used_and_the_rest_are_not_asked():
    h, (first, second) = hybrid(Draft.chain([5, 6, 7]), Draft.chain([9, 9]))
    assert h.propose(ctx(), 8).tokens == [5, 6, 7]
    assert second.budgets == []


def test_a_short_draft_is_merged_with_the_next_parts_draft_within_the_budget():
    h, (first, second) = hybrid(Draft.chain([5]), Draft.chain([5, 8, 9, 10]))
    draft = h.propose(ctx(), 4)
    # the shared first token is one node; the second part drafted with what was left
    assert second.budgets == [3]
    assert (draft.tokens, draft.parents) == ([5, 8, 9], [-1, 0, 1])


def test_a_sampled_draft_is_used_alone():
    q = torch.full((2, VOCAB), 1.0 / VOCAB)
    h, _ = hybrid(Draft.chain([5]), Draft.chain([7, 8], q=q))
    draft = h.propose(ctx(), 4)
    assert draft.tokens == [7, 8] and draft.q is not None


class Clock:
    """The drafter's clock, moved by hand: a step of the target takes ``step`` seconds and a
    part's proposal what its ``cost`` says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Priced:
    """A target with pass prices only: a pass of n tokens costs 1 + 0.4 (n - 1) steps."""

    def pass_cost(self, n: int) -> float:
        return 1.0 + 0.4 * (n - 1)


class Slow(Fixed):
    def __init__(self, draft: Draft, clock: Clock, seconds: float) -> None:
        super().__init__(draft)
        self.clock, self.seconds = clock, seconds

    def propose(self, ctx, budget):
        self.clock.now += self.seconds
        return super().propose(ctx, budget)


def steps(monkeypatch, h: HybridDrafter, accepted: int, n: int, clock: Clock) -> None:
    """``n`` steps of 10 s each, ``accepted`` draft tokens accepted each time."""
    monkeypatch.setattr(hybrid_module, "clock", clock)
    c = ctx()
    c.target = Priced()  # type: ignore[assignment]
    h.start(c)
    for _ in range(n):
        h.propose(c, 4)
        clock.now += 10.0 * Priced().pass_cost(1 + 2)  # the pass over the pending token and 2 nodes
        h.commit(c, [1] * (accepted + 1), accepted)


def test_a_later_part_whose_drafts_do_not_pay_is_asked_only_to_probe(monkeypatch):
    """The exit policy prices hybrid as one drafter: a head whose drafts do not pay here
    would make it pause the n-gram drafts too. Guards against asking a part whose accepted
    tokens do not outweigh the pass width its nodes add, and against probing it as often
    as ever while it keeps not paying."""
    h, (first, second) = hybrid(None, Draft.chain([9, 9]))
    asked = []
    for n in range(400):
        before = len(second.budgets)
        steps(monkeypatch, h, 0, 1, Clock())
        if len(second.budgets) > before:
            asked.append(n)
    # the first step, then probes after 8, 16, 32, 64, 128, 128 steps without it
    assert asked == [0, 9, 26, 59, 124, 253, 382]
    assert len(first.budgets) == 400  # the first part is always asked
    h, (_, second) = hybrid(None, Draft.chain([9, 9]))
    steps(monkeypatch, h, 2, 3 * (PROBE_EVERY + 1), Clock())  # accepted whole: 2 > 0.8
    assert len(second.budgets) == 3 * (PROBE_EVERY + 1)


def test_calls_on_one_step_decide_alike_and_the_probes_count_steps(monkeypatch):
    """Bug guarded (``specd verify``'s q-honesty check): a priced-out part counted calls, not
    steps, so calling propose again on the same context probed it on the ninth call and
    drafted otherwise: a deterministic draft that changed with the call."""
    h, (_, second) = hybrid(None, Draft.chain([9, 9]))
    steps(monkeypatch, h, 0, 1, Clock())  # asked once, accepted nothing: priced out
    c = ctx()
    c.target = Priced()  # type: ignore[assignment]
    asked = len(second.budgets)
    drafts = [h.propose(c, 4) for _ in range(3 * PROBE_EVERY)]
    assert len(second.budgets) == asked and all(d is None for d in drafts)
    assert h.records[1].skipped == 0  # no step has passed yet
    h.commit(c, [1], 0)
    assert h.records[1].skipped == 1
    for _ in range(PROBE_EVERY - 1):
        h.propose(c, 4)
        h.commit(c, [1], 0)
    h.propose(c, 4)  # the probe, PROBE_EVERY steps on
    assert len(second.budgets) == asked + 1


def test_a_part_that_pays_again_is_probed_soon_after_it_stops(monkeypatch):
    """Guards against a wait that only grows: once the part paid, a new spell of not paying
    starts from PROBE_EVERY steps again."""
    h, (_, second) = hybrid(None, Draft.chain([9, 9]))
    steps(monkeypatch, h, 0, 60, Clock())  # priced out; the wait has grown to 64
    assert h.records[1].wait == 64
    steps(monkeypatch, h, 2, 70, Clock())  # accepted at its next probe: probed soon again
    assert h.records[1].wait == PROBE_EVERY
    asked = len(second.budgets)
    steps(monkeypatch, h, 0, PROBE_EVERY + 12, Clock())  # no longer accepted
    # probed PROBE_EVERY steps after the call that won (not 128), found wanting: doubled
    assert h.records[1].wait == 2 * PROBE_EVERY
    assert len(second.budgets) > asked


def test_a_request_that_never_asks_the_resting_part_leaves_the_probe_to_the_next(monkeypatch):
    """A run of rests grows only after a request that asked the part: where the n-gram
    drafts were long enough all through the request that was to probe it, the next probes."""
    h, (first, second) = hybrid(None, Draft.chain([9, 9]))
    second.wants_hidden = True
    h._features()
    reads = []
    for _ in range(REST_EVERY):
        steps(monkeypatch, h, 0, 3, Clock())  # asked in the first, priced out: 3 rest
        h.finish(ctx())
        reads.append(h.wants_hidden)
    assert reads == [False] * (REST_EVERY - 1) + [True]
    first.draft = Draft.chain([5, 6, 7])  # long enough: the probe request never asks it
    asked = len(second.budgets)
    steps(monkeypatch, h, 0, 3, Clock())
    h.finish(ctx())
    assert len(second.budgets) == asked and h.wants_hidden  # the next request probes
    assert h.records[1].run == REST_EVERY - 1
    first.draft = None
    steps(monkeypatch, h, 0, 3, Clock())  # asked, still priced out: a run twice as long
    h.finish(ctx())
    assert len(second.budgets) > asked and not h.wants_hidden and h.records[1].run == 7


def test_a_priced_out_feature_reader_rests_its_features_in_runs_that_grow(monkeypatch):
    """Guards against a head that does not pay on this host still costing every request its
    prompt's features (the prefill's last layer over its window) and every pass its rows'
    features, and against one that rests for good (it would never be found paying again):
    it reads them, and is asked at the first step, in the first request, after REST_EVERY - 1
    that rest, then after 7, 15, and REST_MAX - 1 at most."""
    h, (first, second) = hybrid(None, Draft.chain([9, 9]))
    second.wants_hidden = True
    second.feature_rows = 32  # type: ignore[attr-defined]
    h._features()
    assert h.wants_hidden and h.feature_rows == 32
    reads = []
    for _ in range(100):
        asked = len(second.budgets)
        steps(monkeypatch, h, 0, 3, Clock())  # accepted nothing: priced out
        reads.append((h.wants_hidden, len(second.budgets) > asked))
        h.finish(ctx())
    # each request that reads the features asks it; the others neither read nor ask
    assert all(read == asked for read, asked in reads)
    asking = [i for i, (read, _) in enumerate(reads) if read]
    runs = [b - a - 1 for a, b in zip(asking, asking[1:])]
    assert asking[0] == 0 and runs == [REST_EVERY - 1, 7, 15, REST_MAX - 1, REST_MAX - 1]
    assert len(first.budgets) == 3 * 100  # the first part drafts all along
    steps(monkeypatch, h, 0, 1, Clock())
    h.records[1].tokens = 5.0  # it paid at the last call: reads them in every request
    h.finish(ctx())
    assert h.wants_hidden and h.feature_rows == 32 and h.records[1].rested == 0


def test_a_later_part_pays_for_its_own_time_too(monkeypatch):
    """Guards against pricing a part by the pass alone: accepted whole (2 tokens for 0.8
    steps of wider pass), a part that takes 3 steps' time to draft still does not pay."""
    clock = Clock()
    h, _ = hybrid(None, Draft.chain([9, 9]))
    h.parts[1] = second = Slow(Draft.chain([9, 9]), clock, 30.0)
    steps(monkeypatch, h, 2, 2 * (PROBE_EVERY + 1), clock)
    assert len(second.budgets) == 2
    clock = Clock()
    h, _ = hybrid(None, Draft.chain([9, 9]))
    h.parts[1] = second = Slow(Draft.chain([9, 9]), clock, 5.0)  # half a step: pays
    steps(monkeypatch, h, 2, 2 * (PROBE_EVERY + 1), clock)
    assert len(second.budgets) == 2 * (PROBE_EVERY + 1)


class CatchingUp(Slow):
    """A part whose every call after the first spends ``seconds`` on its draft, and whose
    first also catches up for 40 s on entries of steps it was not asked at."""

    def propose(self, ctx, budget):
        self.catch_up_s = 40.0 if not self.budgets else 0.0
        self.clock.now += self.catch_up_s
        return super().propose(ctx, budget)


def test_a_part_is_priced_by_its_calls_not_by_a_catch_up(monkeypatch):
    """Bug guarded: a head part asked after steps without it feeds their entries at once
    (the prompt's, or a probe's), and that catch-up was priced as what every call costs: a
    head that pays at every step (half a step a call) was priced out for good."""
    clock = Clock()
    h, _ = hybrid(None, Draft.chain([9, 9]))
    h.parts[1] = second = CatchingUp(Draft.chain([9, 9]), clock, 5.0)
    steps(monkeypatch, h, 2, 2 * (PROBE_EVERY + 1), clock)
    assert len(second.budgets) == 2 * (PROBE_EVERY + 1)


def test_a_part_is_credited_only_the_accepted_tokens_past_the_parts_before_it(monkeypatch):
    """Guards against crediting a later part with what the first part's node won: the first
    part's one token accepted, the later part's nodes after it rejected."""
    h, (_, second) = hybrid(Draft.chain([5]), Draft.chain([7, 8]))
    steps(monkeypatch, h, 1, 2 * (PROBE_EVERY + 1), Clock())
    assert len(second.budgets) == 2


def test_merge_shares_equal_paths_and_keeps_siblings_distinct():
    """Bug guarded: the same path drafted by two parts verified twice, as equal siblings
    (a deterministic draft's siblings must differ)."""
    merged = merge([Draft.chain([1, 2]), Draft.chain([1, 2, 3])], 8)
    assert (merged.tokens, merged.parents) == ([1, 2, 3], [-1, 0, 1])
    tree = Draft(tokens=[1, 7, 8], parents=[-1, 0, 0])
    merged = merge([Draft.chain([1, 2]), tree], 8)
    assert (merged.tokens, merged.parents) == ([1, 2, 7, 8], [-1, 0, 0, 0])
    assert merge([Draft.chain([1, 2]), Draft.chain([3, 4, 5])], 3).tokens == [1, 2, 3]


def test_bad_part_options_name_the_option():
    with pytest.raises(BadInputError, match="'eagle_head'"):
        HybridDrafter(eagle_head="x")
    with pytest.raises(BadInputError, match="other drafters"):
        HybridDrafter(drafters="hybrid")


@settings(max_examples=15)
@given(prompt=st.lists(st.integers(0, 7), min_size=1, max_size=30))
def test_greedy_hybrid_is_identical_to_plain(prompt):
    engine = Engine(
        TARGET, drafter_options={"hybrid": {"eagle.head": "random"}}, exit_policy="fixed"
    )
    params = SamplingParams(max_tokens=16)
    spec = engine.generate(prompt, params, drafter="hybrid")
    assert spec.stats.fallback is None and spec.stats.drafted > 0
    assert spec.token_ids == engine.generate(prompt, params, drafter="none").token_ids


def test_a_one_token_ngram_match_leaves_the_step_to_the_next_part():
    """Inside hybrid the n-gram part matches at least two tokens (``PART_DEFAULTS``): a
    continuation found from one token is a weak guess, and the head guesses better there."""
    tokens = [1, 2, 3, 1]  # the last token seen once before: a one-token match only
    for options, asked in (({}, True), ({"ngram.min_n": 1}, False)):
        h = HybridDrafter(drafters="ngram,eagle", **{"eagle.head": "random", **options})
        second = Fixed(Draft.chain([9, 9]))
        h.parts[1] = second
        c = DraftContext(
            tokens=tokens, params=SamplingParams(), generator=torch.Generator(), vocab_size=VOCAB
        )
        h.parts[0].start(c)
        draft = h.propose(c, 4)
        assert (second.budgets != []) is asked, options
        assert draft.tokens[0] == (9 if asked else 2)


def test_a_one_token_match_is_drafted_where_no_later_part_drafts():
    """Bug guarded: where the head drafted nothing (or was priced out) hybrid drafted nothing
    on a one-token match that ``ngram`` alone drafts: fewer tokens a step than ``ngram``. The
    n-gram part's weak guess is asked then, unless the user set its ``min_n``."""
    tokens = [1, 2, 3, 1]  # the last token seen once before: a one-token match only
    for options, weak in (({}, True), ({"ngram.min_n": 2}, False)):
        h = HybridDrafter(drafters="ngram,eagle", **{"eagle.head": "random", **options})
        second = Fixed(None)
        h.parts[1] = second
        c = DraftContext(
            tokens=tokens, params=SamplingParams(), generator=torch.Generator(), vocab_size=VOCAB
        )
        h.parts[0].start(c)
        draft = h.propose(c, 4)
        assert second.budgets == [4], options  # the next part was asked first
        if weak:
            assert draft is not None and draft.tokens == [2, 3, 1]
        else:
            assert draft is None
        h.commit(c, [2], 1)
        assert h.records[1].tokens == 0  # the weak guess's token is not the head's


def test_the_ngram_default_gives_way_to_a_shorter_max_n():
    """Bug guarded: ``ngram.max_n=1`` inside hybrid was refused for a ``min_n`` the user
    never gave."""
    both = {"drafters": "ngram,eagle", "eagle.head": "random"}
    h = HybridDrafter(**both, **{"ngram.max_n": 1})
    assert (h.parts[0].min_n, h.parts[0].max_n) == (1, 1)
    h = HybridDrafter(**both, **{"ngram.max_n": 6})
    assert (h.parts[0].min_n, h.parts[0].max_n) == (2, 6)
    with pytest.raises(BadInputError, match="min_n"):
        HybridDrafter(**both, **{"ngram.min_n": 3, "ngram.max_n": 2})


def test_the_last_part_keeps_its_own_defaults():
    """Nothing comes after the last part, so a weak guess of its own is better than none."""
    assert HybridDrafter(drafters="ngram,eagle", **{"eagle.head": "random"}).parts[0].min_n == 2
    assert HybridDrafter(drafters="eagle,ngram", **{"eagle.head": "random"}).parts[1].min_n == 1
    assert HybridDrafter(drafters="ngram").parts[0].min_n == 1


class Unavailable(Drafter):
    """A part that cannot draft for any target."""

    def start(self, ctx):
        raise DrafterUnavailable("no head for this target")


def test_a_part_that_cannot_serve_the_target_is_dropped_and_the_rest_draft_alone(caplog):
    """Bug guarded: with no EAGLE head for the model every request fell back to plain
    decoding instead of drafting with the n-grams."""
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    params = SamplingParams(max_tokens=24)
    ref = Engine(TARGET, drafter="ngram").generate(prompt, params)
    engine = Engine(TARGET, drafter="hybrid")  # no head ships for the tiny target
    h = engine.plugins.drafter("hybrid")
    assert h.wants_hidden
    with caplog.at_level("WARNING", logger="specd.plugins"):
        for _ in range(2):
            out = engine.generate(prompt, params)
            assert out.token_ids == ref.token_ids
            # it drafts as ngram alone does: same steps, same acceptance
            assert out.stats.target_steps == ref.stats.target_steps
    assert [p.name for p in h.parts] == ["ngram"] and h.parts[0].min_n == 1
    assert not h.wants_hidden and not h.reads_cache
    said = [r for r in caplog.records if "hybrid drafts without eagle" in r.getMessage()]
    assert len(said) == 1 and "no EAGLE head ships" in said[0].getMessage()
    assert not engine.guard.disabled("drafter:hybrid")


def test_a_hybrid_with_no_part_left_is_unavailable_itself():
    h = HybridDrafter(drafters="ngram")
    h.names, h.parts = ["x"], [Unavailable()]
    with pytest.raises(DrafterUnavailable):
        h.start(ctx())


def test_the_prompt_features_read_are_its_eagle_parts_window():
    assert HybridDrafter(drafters="ngram,eagle", **{"eagle.window": 7}).feature_rows == 7
    assert HybridDrafter(drafters="ngram").feature_rows is None  # reads no features at all
