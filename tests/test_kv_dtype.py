"""``--kv-dtype``: what the KV cache stores keys and values as (every command that loads a
model takes it: tests/test_weights_option.py). ``auto`` stores halves where
specd's step kernel serves a float32 model on the CPU and the model's dtype elsewhere; a
float16 cache hands every forward the rounded values it holds; what cannot be honoured is
refused with a message that names it."""

from __future__ import annotations

import pytest
import torch

from specd import BadInputError
from specd.forward import cpu_kernels, models
from specd.forward import weights as stored
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model
from specd.kvcache import KVCache

VOCAB = 40


def _target(dtype: torch.dtype = torch.float32, hidden: int = 64) -> Target:
    """A tiny Llama (16-wide heads at 64 wide: the step kernel takes it)."""
    model = tiny_model(VOCAB, hidden_size=hidden, num_layers=2, seed=3, dtype=dtype)
    return Target(model, CharTokenizer(VOCAB))


def test_a_bad_value_through_the_api_is_refused_before_loading():
    with pytest.raises(BadInputError, match="auto, float16, float32.*'half'"):
        models.serving_target("no-such-model", kv_dtype="half")  # no lookup of the model


@pytest.mark.skipif(not cpu_kernels.available(), reason=f"no kernels: {cpu_kernels.reason}")
def test_auto_stores_halves_where_the_step_kernel_serves():
    target = _target()
    target.compile("on", backend="kernel")
    assert target.compiled is not None and target.compiled.backend == "kernel"
    assert stored.choose_kv_dtype(target, "auto") == torch.float16
    assert stored.choose_kv_dtype(target, "float32") == torch.float32
    target.kv_dtype = stored.choose_kv_dtype(target)
    cache = target.new_cache()
    target.prefill(cache, [1, 2, 3])
    assert cache.layer(0).keys.dtype == torch.float16


def test_auto_keeps_the_model_dtype_elsewhere():
    eager = _target()  # no compiled step
    assert stored.choose_kv_dtype(eager, "auto") == torch.float32
    assert stored.choose_kv_dtype(eager, "float16") == torch.float16  # eager passes read halves
    bf16 = _target(torch.bfloat16)
    assert stored.choose_kv_dtype(bf16, "auto") == torch.bfloat16
    with pytest.raises(BadInputError, match="float32 needs a float32 model.*bfloat16"):
        stored.choose_kv_dtype(bf16, "float32")
    with pytest.raises(BadInputError, match="float16 is for a float32 model on the CPU"):
        stored.choose_kv_dtype(bf16, "float16")


def test_eager_passes_over_a_float16_cache_attend_to_the_rounded_values():
    """The lean forward over a cache of halves computes what it computes over a float32
    cache holding the same rounded values (every key and value is rounded once, when the
    cache takes it)."""
    target = _target()
    prompt, fed = [5, 1, 9, 12, 3], [7, 7, 2]
    target.kv_dtype = torch.float16
    half = target.new_cache()
    target.prefill(half, prompt)
    got = target.forward(half, fed).logits
    target.kv_dtype = torch.float32
    full = target.new_cache()
    target.prefill(full, prompt)
    with torch.inference_mode():  # the prompt's keys and values as the halves hold them
        for i in range(target.num_layers):
            layer = full.layer(i)
            n = layer.length
            layer._k[:, :, :n] = half.layer(i).keys[:, :, :n].float()
            layer._v[:, :, :n] = half.layer(i).values[:, :, :n].float()
    want = target.forward(full, fed).logits
    # the new tokens' own keys and values: rounded in one, not in the other
    assert not torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_a_float16_cache_returns_what_it_holds_in_the_callers_dtype():
    cache = KVCache(1, capacity=4, dtype=torch.float16)
    k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    keys, values = cache.layer(0).update(k, v)
    assert keys.dtype == values.dtype == torch.float32
    assert torch.equal(keys, k.half().float()) and torch.equal(values, v.half().float())
    assert cache.nbytes() == 2 * 1 * 2 * 4 * 16 * 2  # halves, capacity 4
    more = torch.randn(1, 2, 2, 16)
    keys, _ = cache.layer(0).update(more, more)  # grows, still halves
    assert cache.layer(0).keys.dtype == torch.float16 and keys.shape[2] == 5
    assert torch.equal(keys[:, :, 3:], more.half().float())


def test_the_memory_estimate_counts_the_cache_as_stored():
    from specd.limits import request_memory

    target = _target()
    full = request_memory(target, 1000, 8)
    target.kv_dtype = torch.float16
    half = request_memory(target, 1000, 8)
    assert 2 * half.kv_cache == full.kv_cache
    assert half.activations > full.activations  # one layer's keys and values converted back
    cache = target.new_cache()
    target.prefill(cache, [1] * 1000)
    assert 0 < cache.nbytes() <= half.kv_cache
