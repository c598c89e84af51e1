"""The engine-level checks of ``specd verify`` catch verifier and drafter mutants on their
own, so a change that weakens them (a scenario dropped, fewer samples, a drafter option
that stops trees) fails here.

Each mutant (tests/verify/mutants.py) gets one detail of speculative sampling wrong. The
four verifier mutants run behind the ``ngram`` drafter, where the verifier-level checks are
not involved: only the engine's sampled law can see them. Their exact effect on the engine's
output law is computed by enumerating the engine's steps (engine_law.py), so the power
asserted here is not the luck of one seed; the sampled checks then confirm it on the real
engine.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import pytest
import torch
from engine_law import engine_law, ngram_draft, target_rows
from exact import ExactLM, emitted_law, row, sampled_drafts, sequence_law_of
from mutants import ENGINE_MUTANTS, QTwice, Rewarp
from specd.plugins.rejection import RejectionVerifier

from specd.conformance import engine_checks as ec
from specd.conformance.gtest import detection_probability, g_test
from specd.conformance.suite import plan
from specd.conformance.synthetic import scenarios
from specd.conformance.verifier_checks import VERIFIER_SAMPLES, check_law
from specd.sampling import warp


def ngram_options() -> dict:
    """What ``specd verify --drafter ngram`` runs the drafter with."""
    return plan("ngram", None, None)[1]


@cache
def _target():
    return ec.conformance_target()


def _law(verifier, scenario):
    target = _target()
    prompt = scenario.prompt(target)
    rows = target_rows(target, scenario.sampling())
    return engine_law(verifier, ngram_draft(ngram_options()), rows, prompt, scenario.horizon)


def _truth(scenario):
    target = _target()
    return ec.sequence_law(target, scenario.prompt(target), scenario.sampling(), scenario.horizon)


@pytest.mark.parametrize("scenario", ec.SCENARIOS, ids=lambda s: s.name)
def test_the_enumerated_engine_law_of_the_correct_verifier_is_the_target_law(scenario):
    """The enumeration the power analysis rests on reproduces the engine's promise."""
    truth = _truth(scenario)
    law = _law(RejectionVerifier(), scenario)
    assert law.keys() == truth.keys()
    assert max(abs(law[k] - truth[k]) for k in truth) < 1e-12


@pytest.mark.parametrize("mutant", ENGINE_MUTANTS, ids=lambda c: c.name)
def test_each_verifier_mutant_is_caught_behind_ngram_with_near_certainty(mutant):
    """Exactly: the engine checks ``specd verify --drafter ngram`` runs reject the mutant's
    output law with probability >= 0.999 (the sample sizes are enough, not lucky)."""
    best = 0.0
    for scenario in ec.SCENARIOS:
        truth = _truth(scenario)
        df = g_test({k: round(v * scenario.samples) for k, v in truth.items()}, truth).df
        law = _law(mutant(), scenario)
        best = max(best, detection_probability(law, truth, scenario.samples, df))
    assert best >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("mutant", ENGINE_MUTANTS, ids=lambda c: c.name)
def test_the_engine_check_fails_each_verifier_mutant_behind_ngram(mutant_plugins, mutant):
    """Sampled, through the real engine: the law check fails naming a sequence."""
    warped = [s for s in ec.SCENARIOS if s.name == "warped"]
    results = list(ec.check_sampled("ngram", ngram_options(), mutant.name, scenarios=warped))
    law = results[0]
    assert law.property == "engine/law/warped"
    assert not law.passed, law.detail
    assert law.counterexample["sequence"]


def test_a_verifier_that_warps_p_again_is_caught_with_near_certainty():
    """Exactly: warping the warped rows again is the rejection walk on other rows, and the
    warped scenario's sample size rejects the law it emits with probability >= 0.999."""
    scenario = next(s for s in scenarios() if s.name == "warped")
    p, q = ExactLM.from_table(scenario.target), ExactLM.from_table(scenario.drafter)
    rewarped = ExactLM(
        p.vocab,
        p.horizon,
        {
            k: row(
                Fraction(float(v))
                for v in warp(torch.tensor([float(x) for x in r]).log(), scenario.params)
            )
            for k, r in p.rows.items()
        },
    )
    emitted = emitted_law(RejectionVerifier(), sampled_drafts([-1, 0], q), rewarped)
    law = {k: float(v) for k, v in sequence_law_of(emitted, p, 3).items()}
    truth = {k: float(v) for k, v in p.sequence_law(3).items()}
    df = g_test({k: round(v * VERIFIER_SAMPLES) for k, v in truth.items()}, truth).df
    assert detection_probability(law, truth, VERIFIER_SAMPLES, df) >= 0.999


@pytest.mark.slow
def test_a_verifier_that_warps_p_again_fails_the_warped_scenario():
    """At temperature 1 without a cut, warping twice is warping once; the warped verifier
    scenario hands over already-warped rows with parameters that warp."""
    warped = next(s for s in scenarios() if s.name == "warped")
    result = check_law(Rewarp(), warped)
    assert not result.passed, result.detail


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, "target"])
def test_a_drafter_whose_q_applies_the_temperature_twice_fails(mutant_plugins, model):
    """Visible only away from temperature 1 and with a draft model peaked enough for the
    temperature to matter: ``specd verify``'s own draft model (the drafter's
    conformance_options), and the target itself as draft model."""
    verifiers, options = plan(QTwice.name, None, {"model": model} if model else None)
    results = list(
        ec.check_sampled(
            QTwice.name,
            options,
            verifiers["sampled"],
            scenarios=[s for s in ec.SCENARIOS if s.name == "warped"],
        )
    )
    assert results[0].property == "engine/law/warped"
    assert not results[0].passed, results[0].detail


@pytest.mark.slow
def test_the_correct_draft_model_passes_where_its_q_twice_mutant_fails():
    """The same scenario, seeds and draft model: the failure above is the mutant's."""
    verifiers, options = plan("draft_model", None, None)
    warped = [s for s in ec.SCENARIOS if s.name == "warped"]
    results = list(ec.check_sampled("draft_model", options, verifiers["sampled"], warped))
    assert results[0].property == "engine/law/warped"
    assert results[0].passed, results[0].detail
    assert results[0].info["accepted"] < results[0].info["drafted"]  # rejections happen
