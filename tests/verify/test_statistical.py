"""The torch rejection verifier against its exact law, by sampling: a check of the
arithmetic, not of the algorithm.

The exact law of (accepted count, emitted tokens) for each synthetic scenario comes from
running the same walk code (``RejectionVerifier.walk``) on rational rows
(tests/verify/exact.py); the torch verifier is then sampled with fixed seeds and compared
per stopping position with G-tests at ALPHA = 1e-6: one test of the law of the stopping
position, one of the emitted tokens given each position. Since both sides run one walk, a
wrong rule in it (a bad threshold, an unnormalised residual) appears on both sides and
passes here; what this file catches is what only the torch run does: float rows, the
generator and its uniforms, ``torch.multinomial``, rounding in the residual. Whether the
walk itself preserves the target's distribution is checked against the law derived from p
alone, exactly, in tests/verify/test_exact_law.py.
The negative controls must fail these tests and the black-box check ``specd verify`` runs.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from broken_plugin import BROKEN_VERIFIERS
from exact import ExactLM, emitted_law, fixed_draft, sampled_drafts
from specd.plugins.rejection import RejectionVerifier, TorchChance

from specd import Draft, SamplingParams
from specd.conformance.gtest import ALPHA, g_test
from specd.conformance.synthetic import Scenario, scenarios
from specd.conformance.verifier_checks import (
    VERIFIER_SAMPLES,
    check_law,
    emitted,
)

SAMPLED = SamplingParams(temperature=1.0)
SAMPLED_PARENTS = {"chain-sampled": [-1, 0], "tree-iid": [-1, -1, 0]}
SCENARIOS = {s.name: s for s in scenarios()}


def exact_joint(verifier, scenario: Scenario) -> dict:
    """Exact law of (accepted count, emitted tokens), the drafter's randomness included."""
    p, q = ExactLM.from_table(scenario.target), ExactLM.from_table(scenario.drafter)
    if scenario.sampled:
        drafts = sampled_drafts(SAMPLED_PARENTS[scenario.shape], q)
    else:
        d = scenario.draft(random.Random(0))
        drafts = fixed_draft(d.parents, d.tokens)
    return {k: float(v) for k, v in emitted_law(verifier, drafts, p).items()}


def sample_joint(verifier, scenario: Scenario, n: int, seed: int) -> Counter:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    for _ in range(n):
        draft = scenario.draft(rng)
        verdict = verifier.verify(draft, scenario.target_rows(draft), scenario.params, generator)
        counts[(len(verdict.path), tuple(emitted(draft, verdict)))] += 1
    return counts


def per_stopping_position(counts: Counter, law: dict) -> dict:
    """G-tests: the law of the stopping position, and the emitted tokens given each one."""
    tests = {}
    positions: Counter = Counter()
    for (j, _), c in counts.items():
        positions[j] += c
    position_law: dict = {}
    for (j, _), v in law.items():
        position_law[j] = position_law.get(j, 0.0) + v
    tests["stopping position"] = g_test(positions, position_law)
    for j in sorted(position_law):
        observed = {seq: c for (jj, seq), c in counts.items() if jj == j}
        given = {seq: v for (jj, seq), v in law.items() if jj == j}
        tests[f"emitted | stopped at {j}"] = g_test(observed, given)
    # Anything observed at a position the law never stops at is caught by the first test.
    return tests


@pytest.mark.parametrize("shape", SCENARIOS)
def test_torch_rejection_matches_its_exact_law_per_stopping_position(shape):
    scenario = SCENARIOS[shape]
    verifier = RejectionVerifier()
    tests = per_stopping_position(
        sample_joint(verifier, scenario, VERIFIER_SAMPLES, seed=1), exact_joint(verifier, scenario)
    )
    failed = {name: t.describe() for name, t in tests.items() if t.rejects(ALPHA)}
    assert not failed, failed


@pytest.mark.slow
@pytest.mark.parametrize("broken", BROKEN_VERIFIERS, ids=lambda c: c.name)
def test_broken_verifiers_fail_the_per_position_tests(broken):
    scenario = SCENARIOS["chain-sampled"]
    tests = per_stopping_position(
        sample_joint(broken(), scenario, VERIFIER_SAMPLES, seed=1),
        exact_joint(RejectionVerifier(), scenario),
    )
    assert any(t.rejects(ALPHA) for t in tests.values())


@pytest.mark.slow
@pytest.mark.parametrize("broken", BROKEN_VERIFIERS, ids=lambda c: c.name)
def test_broken_verifiers_fail_the_black_box_check(broken):
    """The check ``specd verify`` runs (which passes for the rejection verifier; see
    test_verify_command.py): the first scenario already rejects each of them."""
    result = check_law(broken(), SCENARIOS["chain-sampled"])
    assert not result.passed
    assert result.counterexample and "sequence" in result.counterexample


# -- u at its bounds, reproducibility, rounding ---------------------------------------------


class _FixedU(TorchChance):
    def __init__(self, generator, u):
        super().__init__(generator)
        self.u = u

    def uniform(self):
        return self.u


class _VerifierWithU(RejectionVerifier):
    def __init__(self, u: float) -> None:
        self.u = u

    def chance(self, generator):
        return _FixedU(generator, self.u)


def _verify(verifier, tokens, p_rows, q_rows=None, seed=0):
    draft = Draft.chain(
        tokens, None if q_rows is None else torch.tensor(q_rows, dtype=torch.float32)
    )
    p = torch.tensor(p_rows, dtype=torch.float32)
    return verifier.verify(draft, p, SAMPLED, torch.Generator().manual_seed(seed))


U_MAX = 1.0 - 2.0**-53  # the largest double below 1: torch.rand's upper bound


def test_u_zero_accepts_exactly_the_tokens_the_target_can_produce():
    v = _VerifierWithU(0.0)
    # p(x) = 0: rejected even at u = 0 (accept needs u < p(x) / q(x) = 0).
    assert _verify(v, [2], [[0.5, 0.5, 0.0], [1 / 3] * 3], [[0.2, 0.2, 0.6]]).path == []
    assert _verify(v, [2], [[0.5, 0.5, 0.0], [1 / 3] * 3]).path == []
    # p(x) tiny but positive: accepted at u = 0.
    assert _verify(v, [2], [[0.5, 0.5 - 1e-6, 1e-6], [1 / 3] * 3], [[0.0, 0.0, 1.0]]).path == [0]


def test_u_max_accepts_only_when_the_target_has_at_least_the_drafts_mass():
    v = _VerifierWithU(U_MAX)
    rows = [[0.25, 0.25, 0.5]] * 3
    assert _verify(v, [2, 2], rows, rows[:2]).path == [0, 1]  # p == q: ratio 1 > u
    assert (
        _verify(v, [2], [[0.3, 0.3, 0.4], [1 / 3] * 3], [[0.25, 0.25, 0.5]]).path == []
    )  # ratio 0.8
    assert _verify(v, [0], [[1.0, 0.0, 0.0], [1 / 3] * 3]).path == [0]  # deterministic, p(x) = 1


def test_the_same_seed_gives_the_same_verdicts_and_other_seeds_differ():
    scenario = SCENARIOS["tree-iid"]
    drafts = [scenario.draft(random.Random(i)) for i in range(50)]

    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        verifier = RejectionVerifier()
        return [
            (v.path, v.token)
            for v in (
                verifier.verify(d, scenario.target_rows(d), SAMPLED, generator) for d in drafts
            )
        ]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_residual_of_equal_rows_keeps_the_row():
    """p == q up to rounding: a rejection there had probability ~0, and must not divide by
    zero or produce NaN."""
    v = RejectionVerifier()
    r = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.equal(v.residual(r, r.clone()), r)
    out = v.residual(r, r + torch.tensor([1e-17, -1e-17, 0.0], dtype=torch.float64))
    assert torch.isfinite(out).all() and abs(float(out.sum()) - 1.0) < 1e-12


def test_large_vocabulary_draft_is_handled():
    """A real-model-sized row: the verifier returns a valid verdict with float32 rows."""
    vocab = 49152
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(3, vocab, generator=gen) * 3, -1)
    tokens = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(3)]
    verdict = RejectionVerifier().verify(Draft.chain(tokens, q), p, SAMPLED, gen)
    assert verdict.path == list(range(len(verdict.path))) and 0 <= verdict.token < vocab
