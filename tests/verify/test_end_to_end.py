"""End to end through :class:`specd.Engine`: tree-shaped drafts from a tiny draft model keep
the tiny target's exactly enumerated sequence law (chains, and the n-gram drafter, are
checked by ``specd verify`` in test_verify_command.py)."""

from __future__ import annotations

import math

import pytest

from specd.conformance.engine_checks import (
    SCENARIOS,
    conformance_target,
    engine_checks,
    sequence_law,
)
from specd.conformance.suite import DEFAULT_VERIFIERS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_enumerated_law_is_a_distribution_over_the_horizon(scenario):
    target = conformance_target()
    law = sequence_law(target, scenario.prompt(target), scenario.sampling(), scenario.horizon)
    assert all(len(seq) == scenario.horizon for seq in law)
    assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-9)
    assert len(law) > 8  # enough cells for the test to say something


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["iid", "topk"])
def test_tree_drafts_keep_the_target_law(tree):
    options = {"model": "tiny:0", "tree": tree, "branch": 2}
    results = list(engine_checks("draft_model", options, DEFAULT_VERIFIERS))
    failed = [(r.property, r.detail, r.counterexample) for r in results if not r.passed]
    assert not failed, failed
    law = next(r for r in results if r.property == "engine/law/sampled")
    assert law.info["accepted"] > 0.2 * law.info["drafted"]  # the accept paths were exercised
