"""The early-exit drafter shares the target's cache and never changes the output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specd import Engine, SamplingParams
from specd.forward.tiny import tiny_target

VOCAB = 48
TARGET = tiny_target(VOCAB, seed=2, logit_scale=30.0, num_layers=4)


def test_all_layers_equal_the_full_forward():
    cache = TARGET.new_cache()
    TARGET.prefill(cache, [1, 2, 3, 4])
    early = TARGET.forward_early(cache, [5, 6], TARGET.num_layers)
    cache.crop(4)
    full = TARGET.forward(cache, [5, 6]).logits
    torch.testing.assert_close(early, full)


def test_drafting_leaves_the_cache_as_it_was():
    cache = TARGET.new_cache()
    TARGET.prefill(cache, [1, 2, 3, 4])
    before = TARGET.forward(cache, [9]).logits
    cache.crop(4)
    TARGET.forward_early(cache, [7, 8, 9], 2)
    cache.crop(4)
    assert cache.length == 4
    torch.testing.assert_close(TARGET.forward(cache, [9]).logits, before)


@settings(max_examples=30)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), layer=st.integers(1, 3))
def test_greedy_early_exit_is_identical_to_plain(prompt, layer):
    engine = Engine(TARGET, drafter_options={"early_exit": {"layer": layer}}, exit_policy="fixed")
    params = SamplingParams(max_tokens=16)
    spec = engine.generate(prompt, params, drafter="early_exit")
    plain = engine.generate(prompt, params, drafter="none")
    assert spec.token_ids == plain.token_ids
    assert spec.stats.fallback is None


def test_bad_layer_falls_back_with_a_reason():
    engine = Engine(TARGET, drafter_options={"early_exit": {"layer": 99}})
    out = engine.generate([1, 2, 3], SamplingParams(max_tokens=4), drafter="early_exit")
    assert "layer=99: expected an integer from 1 to 3" in out.stats.fallback
    assert engine.plugin_health()["drafter:early_exit"]["disabled"]  # said once, not per request
    assert (
        out.token_ids
        == engine.generate([1, 2, 3], SamplingParams(max_tokens=4), drafter="none").token_ids
    )


@pytest.mark.slow
def test_real_model_early_exit_is_exact(real_engine):
    prompt = "def is_even(n):\n    return n % 2 == 0\n\ndef is_odd(n):\n"
    params = SamplingParams(max_tokens=24)
    engine = Engine(real_engine.target, drafter_options={"early_exit": {"layer": 22}})
    spec = engine.generate(prompt, params, drafter="early_exit")
    assert spec.token_ids == engine.generate(prompt, params, drafter="none").token_ids
