"""Acceptance of n-gram drafting, fast: a tiny target that repeats its context with a known
period, so what a correct index drafts is known exactly.

The target is a one-layer Llama whose only working part is one attention head: query and
key are constant (biases), so with rotary embeddings the score depends only on the
distance between positions, and it peaks sharply at distance ``PERIOD - 1``. The value
carries the attended token to the output. So the next token is always the token
``PERIOD`` positions back: the model continues any context as a sequence of period
``PERIOD``.

The prompt is two periods of a de Bruijn sequence: every pair of tokens occurs once per
period, but every single token occurs four times, each time followed by a different token.
An index that matches the longest n-gram (up to 4) always finds the right place and every
drafted token is accepted; one that matches the shortest n-gram first copies from the
wrong place almost every time, and one that stops growing as tokens are committed keeps
proposing the same continuation of the prompt.
"""

from __future__ import annotations

import math

import pytest
import torch

from specd import Engine, SamplingParams, Target
from specd.forward.tiny import CharTokenizer

#: de Bruijn sequence B(4, 2): all 16 ordered pairs of {0, 1, 2, 3}, each once (cyclically)
PATTERN = [0, 0, 1, 0, 2, 0, 3, 1, 1, 2, 1, 3, 2, 2, 3, 3]
PERIOD = len(PATTERN)
VOCAB = 8
MAX_DRAFT = 8
NEW = 96


def periodic_model(vocab: int, period: int, hidden: int = 64, sharpness: float = 400.0):
    """A one-layer Llama whose next token is the token ``period`` positions back."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        attention_bias=True,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).double().eval()
    model.generation_config.eos_token_id = None
    block = model.model.layers[0]
    attn = block.self_attn
    inv_freq = model.model.rotary_emb.inv_freq.double()  # [D/2]
    half = hidden // 2
    lag = period - 1  # the query at position t attends to the key at t - lag
    eye = torch.eye(vocab, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # the MLP, and everything not set below, contributes nothing
        for norm in (block.input_layernorm, block.post_attention_layernorm, model.model.norm):
            norm.weight.fill_(1.0)
        model.model.embed_tokens.weight[:, :vocab] = eye  # token t -> unit vector t
        # Rotary turns the pair (x[f], x[f + D/2]) into the complex number x_f e^{i w_f t}.
        # With k_f = 1 and q_f = s e^{-i w_f lag}, the score between positions t and u is
        # s * sum_f cos(w_f (t - u - lag)): largest, by s * 1.08 / sqrt(D) at least, at
        # t - u = lag.
        attn.q_proj.bias[:half] = sharpness * torch.cos(-inv_freq * lag)
        attn.q_proj.bias[half:] = sharpness * torch.sin(-inv_freq * lag)
        attn.k_proj.bias[:half] = 1.0
        attn.v_proj.weight[:vocab, :vocab] = eye / math.sqrt(hidden)  # undo RMSNorm's scale
        attn.o_proj.weight[vocab : 2 * vocab, :vocab] = 10.0 * eye  # write the attended token
        model.lm_head.weight[:, vocab : 2 * vocab] = eye  # and read it out
    return model


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(periodic_model(VOCAB, PERIOD), CharTokenizer(VOCAB), name="periodic")


def generate(target: Target, drafter: str, **options):
    engine = Engine(
        target,
        drafter=drafter,
        exit_policy="fixed",
        max_draft=MAX_DRAFT,
        drafter_options={drafter: options} if options else None,
    )
    return engine.generate(PATTERN * 2, SamplingParams(max_tokens=NEW))


def test_the_target_continues_the_period(target):
    plain = generate(target, "none")
    assert plain.token_ids == (PATTERN * 10)[:NEW]
    assert plain.stats.target_steps == NEW


@pytest.mark.parametrize("branches", [1, 3])
def test_ngram_drafts_are_all_accepted_on_a_repetitive_context(target, branches):
    """Guards against an index that goes stale (stops growing with the committed tokens)
    or prefers the shortest n-gram: with either, the mean acceptance length here is 2.0
    and 1.0, against 96 / 11 = 8.7."""
    out = generate(target, "ngram", branches=branches)
    s = out.stats
    assert out.token_ids == (PATTERN * 10)[:NEW]
    # Each step drafts MAX_DRAFT tokens from one period back, all right, plus the bonus:
    # 96 tokens in ceil(96 / 9) = 11 steps (the last step drafts only what is left).
    assert s.mean_acceptance_length == pytest.approx(NEW / math.ceil(NEW / (MAX_DRAFT + 1)))
    assert s.target_steps == 11
    assert s.accepted == s.drafted == NEW - s.target_steps
    assert s.position_acceptance[:MAX_DRAFT] == [1.0] * MAX_DRAFT
