"""The lean forward computes what the model's own forward computes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specd import fastpath
from specd.target import Target
from specd.tiny import CharTokenizer, tiny_model

VOCAB = 50


def qwen2_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    return Qwen2ForCausalLM(cfg).double().eval()


MODELS = {"llama": tiny_model(VOCAB, num_layers=3, seed=1), "qwen2": qwen2_model()}


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_supported(arch):
    assert fastpath.supports(MODELS[arch])


@settings(max_examples=40)
@given(
    arch=st.sampled_from(sorted(MODELS)),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
    fed=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
    rnd=st.randoms(use_true_random=False),
    tree=st.booleans(),
)
def test_fast_forward_equals_the_model_forward(arch, prompt, fed, rnd, tree):
    model = MODELS[arch]
    fast = Target(model, CharTokenizer(VOCAB), fast=True)
    slow = Target(model, CharTokenizer(VOCAB), fast=False)
    assert fast.fast is not None and slow.fast is None
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, len(fed))] if tree else None
    outs = []
    for target in (fast, slow):
        cache = target.new_cache(capacity=8)
        target.prefill(cache, prompt)
        logits = target.forward(cache, fed, parents).logits
        cache.crop(len(prompt))
        early = target.forward_early(cache, fed[:1], 1)
        outs.append((logits, early))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-10, atol=1e-10)


def test_unsupported_models_use_their_own_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)
    ).eval()
    target = Target(model, CharTokenizer(VOCAB))
    assert target.fast is None
    cache = target.new_cache()
    target.prefill(cache, [1, 2, 3])
    got = target.forward(cache, [4]).logits[-1]
    with torch.inference_mode():
        want = model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
