"""Exact-law properties of the rejection rule, in rational arithmetic.

Each property is a function returning None when it holds and a description of the
mismatch when it does not. The Hypothesis tests assert it holds for the rejection verifier on
random p and q (zeros, one-hots and p == q included); the negative controls at the bottom
ask Hypothesis to find a counterexample to the same function for each broken verifier.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from broken_plugin import BROKEN_VERIFIERS
from exact import (
    ExactDraft,
    ExactLM,
    emitted_law,
    fixed_draft,
    marginal,
    row,
    sampled_drafts,
    sequence_law_of,
    stack,
    target_rows,
    walk_law,
)
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from specd.plugins.rejection import RejectionVerifier

from specd.conformance.synthetic import scenario_models

REJECTION = RejectionVerifier()


# -- strategies ---------------------------------------------------------------------------


def weights(vocab: int):
    lists = st.lists(st.integers(0, 4), min_size=vocab, max_size=vocab)
    return lists.map(lambda w: w if any(w) else [1, *w[1:]])


@st.composite
def lm_pair(draw, vocab: int, horizon: int):
    """A target p and a draft model q. At each prefix q is independent of p, equal to it,
    or one-hot; rows have zeros often, so q(x) = 0 < p(x) and p(x) = 0 < q(x) both occur."""
    p_rows, q_rows = {}, {}
    for length in range(horizon):
        for prefix in itertools.product(range(vocab), repeat=length):
            p_rows[prefix] = row(draw(weights(vocab)))
            kind = draw(st.sampled_from(["independent", "equal", "one-hot"]))
            if kind == "equal":
                q_rows[prefix] = p_rows[prefix].copy()
            elif kind == "one-hot":
                x = draw(st.integers(0, vocab - 1))
                q_rows[prefix] = row([int(i == x) for i in range(vocab)])
            else:
                q_rows[prefix] = row(draw(weights(vocab)))
    return ExactLM(vocab, horizon, p_rows), ExactLM(vocab, horizon, q_rows)


@st.composite
def single_case(draw):
    vocab = draw(st.integers(2, 5))
    p, q = draw(lm_pair(vocab, 2))
    return p, q, draw(st.integers(0, vocab - 1))


# -- the properties -----------------------------------------------------------------------


def sampled_single_draft(verifier, p: ExactLM, q: ExactLM) -> str | None:
    """One draft token x ~ q: the emitted token has law p, and x is accepted with
    probability sum(min(p, q))."""
    law = emitted_law(verifier, sampled_drafts([-1], q), p)
    first = marginal(law, lambda k: k[1][0])
    want = {x: v for x, v in enumerate(p(())) if v > 0}
    if first != want:
        return f"first token law {first} != p {want}"
    accepted = marginal(law, lambda k: k[0]).get(1, Fraction(0))
    overlap = sum(min(a, b) for a, b in zip(p(()), q(())))
    if accepted != overlap:
        return f"P(accept) = {accepted} != sum(min(p, q)) = {overlap}"
    return None


def deterministic_single_draft(verifier, p: ExactLM, x: int) -> str | None:
    """One deterministic draft token x: the emitted token has law p; x is accepted with
    probability p(x)."""
    law = emitted_law(verifier, fixed_draft([-1], [x]), p)
    first = marginal(law, lambda k: k[1][0])
    want = {y: v for y, v in enumerate(p(())) if v > 0}
    if first != want:
        return f"first token law {first} != p {want}"
    accepted = marginal(law, lambda k: k[0]).get(1, Fraction(0))
    if accepted != p(())[x]:
        return f"P(accept) = {accepted} != p(x) = {p(())[x]}"
    return None


def chain_law(verifier, p: ExactLM, q: ExactLM, k: int) -> str | None:
    """A chain of k drafts from q: emitted tokens continued by p have p's sequence law, and
    P(at least i accepted) = sum over x_1..x_i of prod_t min(p, q)(x_t | x_<t)."""
    horizon = k + 1
    law = emitted_law(verifier, sampled_drafts(list(range(-1, k - 1)), q), p)
    got, want = sequence_law_of(law, p, horizon), p.sequence_law(horizon)
    if got != want:
        return f"sequence law differs: {_first_difference(got, want)}"
    accepted = marginal(law, lambda key: key[0])
    for i in range(1, k + 1):
        tail = sum((v for a, v in accepted.items() if a >= i), Fraction(0))
        closed = Fraction(0)
        for xs in itertools.product(range(p.vocab), repeat=i):
            term = Fraction(1)
            for t in range(i):
                term *= min(p(xs[:t])[xs[t]], q(xs[:t])[xs[t]])
            closed += term
        if tail != closed:
            return f"P(accepted >= {i}) = {tail} != {closed}"
    return None


def tree_law(verifier, p: ExactLM, drafts: list[ExactDraft], horizon: int) -> str | None:
    """Emitted tokens continued by p have p's sequence law."""
    law = emitted_law(verifier, drafts, p)
    got, want = sequence_law_of(law, p, horizon), p.sequence_law(horizon)
    if got != want:
        return f"sequence law differs: {_first_difference(got, want)}"
    return None


def _first_difference(got: dict, want: dict) -> str:
    for key in sorted(set(got) | set(want)):
        if got.get(key, 0) != want.get(key, 0):
            return f"{key}: {got.get(key, 0)} != {want.get(key, 0)}"
    return "none"


def matching_walk(parents: list[int], tokens: list[int], p: ExactLM) -> dict:
    """Law of (accepted count, emitted) when a target sample is walked down a deterministic
    tree: accepted = the longest prefix of the sample that is a path of the tree."""
    out: dict = {}

    def visit(node: int, prefix: tuple[int, ...], mass: Fraction) -> None:
        kids = {tokens[c]: c for c in range(len(tokens)) if parents[c] == node}
        for x, px in enumerate(p(prefix)):
            if px == 0:
                continue
            if x in kids:
                visit(kids[x], prefix + (x,), mass * px)
            else:
                out[(len(prefix), prefix + (x,))] = mass * px

    visit(-1, (), Fraction(1))
    return out


# -- Hypothesis: the rejection verifier satisfies every property --------------------------


@given(single_case())
def test_one_sampled_draft_emits_p(case):
    p, q, _ = case
    assert sampled_single_draft(REJECTION, p, q) is None


@given(single_case())
def test_one_deterministic_draft_emits_p(case):
    p, _, x = case
    assert deterministic_single_draft(REJECTION, p, x) is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_sampled_chain_gives_the_target_sequence_law(data):
    vocab = data.draw(st.integers(2, 3), label="vocab")
    k = data.draw(st.integers(1, 3 if vocab == 2 else 2), label="k")
    p, q = data.draw(lm_pair(vocab, k + 1), label="p, q")
    assert chain_law(REJECTION, p, q, k) is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_iid_tree_gives_the_target_sequence_law(data):
    vocab = data.draw(st.integers(2, 3), label="vocab")
    p, q = data.draw(lm_pair(vocab, 3), label="p, q")
    siblings = data.draw(st.integers(1, 3), label="root children")
    parents = [-1] * siblings
    for s in range(siblings):  # each root child gets 0, 1 or 2 i.i.d. children of its own
        parents += [s] * data.draw(
            st.integers(0, 2 if siblings < 3 else 1), label=f"children of {s}"
        )
    assert tree_law(REJECTION, p, sampled_drafts(parents, q), 3) is None


@settings(max_examples=150)
@given(st.data())
def test_distinct_tree_gives_the_target_law_and_accepts_the_longest_match(data):
    vocab = data.draw(st.integers(2, 4), label="vocab")
    p, _ = data.draw(lm_pair(vocab, 3), label="p")
    root = data.draw(st.permutations(range(vocab)), label="root order")[
        : data.draw(st.integers(1, vocab))
    ]
    tokens, parents = list(root), [-1] * len(root)
    for i in range(len(root)):
        order = data.draw(st.permutations(range(vocab)), label=f"order under {i}")
        for x in order[: data.draw(st.integers(0, vocab), label=f"children of {i}")]:
            tokens.append(x)
            parents.append(i)
    drafts = fixed_draft(parents, tokens)
    assert tree_law(REJECTION, p, drafts, 3) is None
    assert emitted_law(REJECTION, drafts, p) == matching_walk(parents, tokens, p)


@given(st.data())
def test_temperature_zero_is_greedy(data):
    """p one-hot (what warp gives at temperature 0): the output is the greedy one, surely."""
    vocab = data.draw(st.integers(2, 4))
    argmax = {}
    p_rows = {}
    for length in range(3):
        for prefix in itertools.product(range(vocab), repeat=length):
            argmax[prefix] = data.draw(st.integers(0, vocab - 1))
            p_rows[prefix] = row([int(i == argmax[prefix]) for i in range(vocab)])
    p = ExactLM(vocab, 3, p_rows)
    _, q = data.draw(lm_pair(vocab, 3))
    parents = data.draw(st.sampled_from([[-1], [-1, 0], [-1, -1, 0], [-1, -1, 1, 0]]))
    fixed = [data.draw(st.integers(0, vocab - 1)) for _ in parents]
    for d in sampled_drafts(parents, q) + fixed_draft(parents, fixed):
        law = walk_law(REJECTION, d.tokens, d.parents, target_rows(d, p), d.q)
        assert list(law.values()) == [1]  # no randomness left
        ((path, token),) = law
        assert [d.tokens[i] for i in path] + [token] == greedy_output(d, argmax)


def greedy_output(d: ExactDraft, argmax: dict) -> list[int]:
    """Follow the child carrying the argmax while there is one, then emit the argmax."""
    node, prefix, out = -1, (), []
    while True:
        want = argmax[prefix]
        out.append(want)
        nxt = next(
            (c for c in range(len(d.tokens)) if d.parents[c] == node and d.tokens[c] == want), None
        )
        if nxt is None:
            return out
        node, prefix = nxt, prefix + (want,)


# -- named edge cases ---------------------------------------------------------------------

EDGES = {
    "p == q": ([3, 2, 1], [3, 2, 1]),
    "q(x) = 0 < p(x)": ([1, 1, 1], [1, 1, 0]),
    "p(x) = 0 < q(x)": ([1, 1, 0], [1, 1, 1]),
    "disjoint supports": ([1, 1, 0, 0], [0, 0, 1, 1]),
    "p one-hot": ([0, 1, 0], [2, 1, 1]),
    "q one-hot": ([2, 1, 1], [0, 1, 0]),
    "both one-hot, same": ([0, 0, 1], [0, 0, 1]),
    "both one-hot, different": ([1, 0, 0], [0, 0, 1]),
}


def _single(p_root, q_root) -> tuple[ExactLM, ExactLM]:
    vocab = len(p_root)
    rest = {(x,): row([1] * vocab) for x in range(vocab)}
    return ExactLM(vocab, 2, {(): row(p_root), **rest}), ExactLM(
        vocab, 2, {(): row(q_root), **rest}
    )


@pytest.mark.parametrize("edge", EDGES)
def test_edge_cases(edge):
    p, q = _single(*EDGES[edge])
    assert sampled_single_draft(REJECTION, p, q) is None
    for x in range(p.vocab):
        assert deterministic_single_draft(REJECTION, p, x) is None


def test_p_equal_q_accepts_every_draft():
    p, q = _single([3, 2, 1], [3, 2, 1])
    law = emitted_law(REJECTION, sampled_drafts([-1], q), p)
    assert marginal(law, lambda k: k[0]) == {1: 1}


def test_a_token_the_target_cannot_produce_is_never_accepted():
    p, q = _single([1, 1, 0], [1, 1, 1])
    law = emitted_law(REJECTION, fixed_draft([-1], [2]), p)
    assert marginal(law, lambda k: k[0]) == {0: 1}


def test_planted_conformance_scenarios_are_exact():
    """The synthetic tables ``specd verify`` samples from, evaluated exactly."""
    from exact import ExactLM as _E

    target, drafter = scenario_models()
    p, q = _E.from_table(target), _E.from_table(drafter)
    assert chain_law(REJECTION, p, q, 2) is None
    assert tree_law(REJECTION, p, sampled_drafts([-1, -1, 0], q), 3) is None


# -- negative controls: the same properties reject every broken verifier ------------------

# Existence is what is asserted, so shrinking the counterexample is skipped.
FIND = settings(max_examples=300, derandomize=True, database=None, phases=[Phase.generate])


@pytest.mark.parametrize("broken", BROKEN_VERIFIERS, ids=lambda c: c.name)
def test_broken_verifiers_fail_the_exact_law(broken):
    verifier = broken()

    def fails(case) -> bool:
        p, q, x = case
        return bool(
            sampled_single_draft(verifier, p, q) or deterministic_single_draft(verifier, p, x)
        )

    p, q, x = find(single_case(), fails, settings=FIND)
    assert sampled_single_draft(verifier, p, q) or deterministic_single_draft(verifier, p, x)


@pytest.mark.parametrize("broken", BROKEN_VERIFIERS, ids=lambda c: c.name)
def test_broken_verifiers_fail_on_the_planted_scenarios(broken):
    target, drafter = scenario_models()
    p, q = ExactLM.from_table(target), ExactLM.from_table(drafter)
    verifier = broken()
    assert chain_law(verifier, p, q, 2) or tree_law(verifier, p, sampled_drafts([-1, -1, 0], q), 3)


def test_argmax_draft_reported_with_its_softmax_as_q_breaks_the_law():
    """A drafter that takes q's argmax but tells the verifier it sampled from q."""

    def fails(case) -> bool:
        p, q, _ = case
        x = max(range(q.vocab), key=lambda i: q(())[i])
        lying = [ExactDraft([x], [-1], stack([q(())]), Fraction(1))]
        return tree_law(REJECTION, p, lying, 2) is not None

    find(single_case(), fails, settings=FIND)


def test_dropping_a_drawn_token_for_low_confidence_breaks_the_law():
    """A drafter that draws x ~ q but withholds it when q(x) is small proposes x with a law
    other than q: the emitted law is no longer p."""

    def fails(case) -> bool:
        p, q, _ = case
        kept = [d for d in sampled_drafts([-1], q) if d.q[0][d.tokens[0]] >= Fraction(1, 3)]
        mass = sum(d.prob for d in kept)
        none = Fraction(1) - mass  # no draft: the target samples on its own
        law = {k: v * none for k, v in p.sequence_law(2).items()} if none else {}
        biased = sequence_law_of(emitted_law(REJECTION, kept, p), p, 2)
        for key, v in biased.items():
            law[key] = law.get(key, Fraction(0)) + v
        return law != p.sequence_law(2)

    find(single_case(), fails, settings=FIND)
