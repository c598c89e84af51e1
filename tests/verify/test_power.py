"""The statistics behind the sampled checks: the G-test is calibrated, and the sample sizes
meet the power analysis in docs/verification.md."""

from __future__ import annotations

import random

import pytest
import torch
from broken_plugin import BROKEN_VERIFIERS
from engine_law import engine_law, ngram_draft, target_rows
from exact import ExactLM, emitted_law, fixed_draft, sampled_drafts, sequence_law_of
from mutants import ExponentBias, ThresholdPlus

from specd.conformance import engine_checks as ec
from specd.conformance.gtest import (
    ALPHA,
    chi2_critical,
    chi2_sf,
    detection_probability,
    g_test,
    power,
    required_samples,
)
from specd.conformance.suite import plan
from specd.conformance.synthetic import scenario_models, scenarios
from specd.conformance.verifier_checks import VERIFIER_SAMPLES, VERIFIER_SENSITIVITY_KL


def test_chi_square_tail_matches_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_critical(1, 1e-6) == pytest.approx(23.928127, rel=1e-6)
    assert power(10, 0.0) == pytest.approx(ALPHA, rel=1e-6)


def test_the_g_test_holds_its_level_on_samples_from_the_law():
    """Under the law itself, p < 0.01 happens about 1 % of the time (pooling and degrees
    of freedom are right), so a threshold of 1e-6 means what it says."""
    law = {i: w for i, w in enumerate([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.04, 0.02, 0.006, 0.004])}
    probs = torch.tensor(list(law.values()), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    small = 0
    runs = 2000
    for _ in range(runs):
        draws = torch.multinomial(probs, 500, replacement=True, generator=gen).tolist()
        counts = {i: draws.count(i) for i in law}
        small += g_test(counts, law).p_value < 0.01
    assert 0.003 < small / runs < 0.025


def test_an_impossible_outcome_rejects_at_once():
    test = g_test({"a": 10, "b": 1}, {"a": 1.0})
    assert test.impossible == "b" and test.rejects()


def _pooled_df(law: dict, n: int) -> int:
    return g_test({k: round(v * n) for k, v in law.items()}, law).df


@pytest.mark.parametrize("scenario", scenarios(), ids=lambda s: s.shape)
def test_verifier_sample_size_meets_its_sensitivity(scenario):
    df = _pooled_df(scenario.target.sequence_law(), VERIFIER_SAMPLES)
    assert required_samples(VERIFIER_SENSITIVITY_KL, df) <= VERIFIER_SAMPLES


@pytest.mark.parametrize(
    "scenario",
    [*ec.engine_scenarios(), *ec.engine_scenarios(thorough=True)],
    ids=lambda s: f"{s.name}-{s.samples}",
)
def test_engine_sample_size_meets_its_sensitivity(scenario):
    target = ec.conformance_target()
    law = ec.sequence_law(target, scenario.prompt(target), scenario.sampling(), scenario.horizon)
    df = _pooled_df(law, scenario.samples)
    assert required_samples(scenario.sensitivity_kl, df) <= scenario.samples


@pytest.mark.parametrize("broken", BROKEN_VERIFIERS, ids=lambda c: c.name)
def test_each_negative_control_is_caught_by_the_first_scenario_with_near_certainty(broken):
    """Exact effect of each broken verifier on the first scenario ``specd verify`` samples:
    the check fails it with probability >= 0.999 (so a passing seed was not luck)."""
    target, drafter = scenario_models()
    p, q = ExactLM.from_table(target), ExactLM.from_table(drafter)
    law = sequence_law_of(emitted_law(broken(), sampled_drafts([-1, 0], q), p), p, 3)
    true = {k: float(v) for k, v in law.items()}
    claimed = {k: float(v) for k, v in p.sequence_law(3).items()}
    df = _pooled_df(claimed, VERIFIER_SAMPLES)
    assert detection_probability(true, claimed, VERIFIER_SAMPLES, df) >= 0.999


def test_the_sampled_scenarios_are_drawn_as_the_exact_law_assumes():
    """The harness draws chain drafts from q exactly: the first token's frequency matches q."""
    scenario = next(s for s in scenarios() if s.shape == "chain-sampled")
    rng = random.Random(0)
    counts: dict = {}
    for _ in range(4000):
        t = scenario.draft(rng).tokens[0]
        counts[t] = counts.get(t, 0) + 1
    q_root = dict(enumerate(scenario.drafter.probs(())))
    assert not g_test(counts, q_root).rejects()


# The smallest biases docs/verification.md says each check detects with probability >= 0.999:
# (check, accept-threshold delta, exponent above 1, exponent below 1). A bias this large, in
# an otherwise correct rejection verifier, must be detected by that check alone.
SMALLEST_BIAS = [
    ("verifier/law/chain-sampled", 0.0015, 1.50, 0.55),
    ("verifier/law/chain-deterministic", 0.038, 1.11, 0.90),
    ("verifier/law/tree-iid", 0.0011, 1.43, 0.61),
    ("verifier/law/tree-distinct", 0.001, 1.09, 0.91),
    ("verifier/law/warped", 0.0021, 1.15, 0.87),
    ("engine/law/sampled", 0.102, 1.37, 0.69),
    ("engine/law/warped", 0.0058, 1.47, 0.69),
]
VERIFIER_PARENTS = {"chain-sampled": [-1, 0], "tree-iid": [-1, -1, 0]}


def _verifier_detection(name: str):
    scenario = next(s for s in scenarios() if s.name == name)
    p, q = ExactLM.from_table(scenario.target), ExactLM.from_table(scenario.drafter)
    if scenario.sampled:
        drafts = sampled_drafts(VERIFIER_PARENTS[scenario.shape], q)
    else:
        d = scenario.draft(random.Random(0))
        drafts = fixed_draft(d.parents, d.tokens)
    truth = {k: float(v) for k, v in p.sequence_law(3).items()}
    df = _pooled_df(truth, VERIFIER_SAMPLES)

    def detect(verifier) -> float:
        law = sequence_law_of(emitted_law(verifier, drafts, p), p, 3)
        return detection_probability(
            {k: float(v) for k, v in law.items()}, truth, VERIFIER_SAMPLES, df
        )

    return detect


def _engine_detection(name: str):
    scenario = next(s for s in ec.SCENARIOS if s.name == name)
    target = ec.conformance_target()
    prompt = scenario.prompt(target)
    rows = target_rows(target, scenario.sampling())
    truth = ec.sequence_law(target, prompt, scenario.sampling(), scenario.horizon)
    df = _pooled_df(truth, scenario.samples)
    draft = ngram_draft(plan("ngram", None, None)[1])

    def detect(verifier) -> float:
        law = engine_law(verifier, draft, rows, prompt, scenario.horizon)
        return detection_probability(law, truth, scenario.samples, df)

    return detect


@pytest.mark.parametrize("check, delta, above, below", SMALLEST_BIAS, ids=lambda v: str(v))
def test_each_check_detects_the_smallest_bias_the_docs_state(check, delta, above, below):
    """Exact laws of a rejection verifier with a biased accept rule (behind ``ngram`` for the
    engine checks): each documented bias is detected with probability >= 0.999."""
    kind, _, name = check.partition("/law/")
    detect = _verifier_detection(name) if kind == "verifier" else _engine_detection(name)
    assert detect(ThresholdPlus(delta)) >= 0.999
    assert detect(ExponentBias(above)) >= 0.999
    assert detect(ExponentBias(below)) >= 0.999
